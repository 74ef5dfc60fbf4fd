"""Issue 42: the README is a front door and the manual lives in docs/; every relative Markdown link resolves,
and the README's test command is the one .ci/run runs, character for character."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE = re.compile(r"`[^`\n]*`")


def _pages() -> list[Path]:
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    pages += [p for p in (REPO / "bench" / "README.md", REPO / "studies" / "README.md") if p.exists()]
    return pages


def test_docs_links_resolve() -> None:
    broken = []
    for page in _pages():
        for target in LINK.findall(CODE.sub("", page.read_text())):  # `a](b` in code is no link
            if "://" in target or target.startswith(("#", "mailto:")):
                continue
            if not (page.parent / target.split("#")[0]).exists():
                broken.append(f"{page.relative_to(REPO)} → {target}")
    assert not broken, broken


def test_readme_test_command_is_ci_s() -> None:
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    command = next(line for line in ci if line.startswith("test -d .venv ||") and "pytest" in line)
    assert "    " + command in (REPO / "README.md").read_text().splitlines()


def test_readme_is_a_front_door() -> None:
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 160
    long = [
        n for n, line in enumerate(lines, 1) if len(line) > 300 and not line.startswith("    test -d .venv")
    ]
    assert not long, long
