"""The layering of pyproject.toml's [tool.importlinter] contracts holds, and breaking one fails.

The second test copies the packages into a temporary folder, adds one forbidden import per contract
and runs the same `lint-imports` there: each contract must report BROKEN, so the first test can fail.
"""

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = (
    "core",
    "gateway",
    "policies",
    "routing",
    "cache",
    "backends",
    "migrations",
    "bench",
    "studies",
    "training",
)
CONTRACTS = (
    "core imports no other package of the project",
    "the engine (backends.local_engine) imports only core",
    "no package imports gateway",
    "the engine's rooms are layered",
    "no import circle between the engine's modules",
    "no package, maintained benchmark or weight builder imports studies",
    "no package and no maintained benchmark imports training",
    "no import circle between the modules of bench, studies or training",
)
VIOLATIONS = {  # one forbidden import per contract
    "core/_violation.py": "from routing.retry import backoff_s\n",
    "backends/local_engine/_violation.py": "from backends.base import UpstreamError\n",
    "cache/_violation.py": "import gateway.sse\n",
    "backends/local_engine/kernels/_violation.py": "from backends.local_engine.engine import sequence\n",
    "backends/local_engine/model/_circle_a.py": "from backends.local_engine.model import _circle_b\n",
    "backends/local_engine/model/_circle_b.py": "from backends.local_engine.model import _circle_a\n",
    "bench/_violation.py": "from studies import gpu_timing\n",
    "routing/_violation.py": "from training import train_router\n",
    "studies/_circle_a.py": "from studies import _circle_b\n",
    "studies/_circle_b.py": "from studies import _circle_a\n",
}


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """`lint-imports` with the packages under `root` first on the path (not an installed copy)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    command = [str(Path(sys.executable).with_name("lint-imports")), "--no-cache"]
    return subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=120)


def test_the_contracts_are_kept() -> None:
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    for contract in CONTRACTS:
        assert f"{contract} KEPT" in result.stdout
    assert f"Contracts: {len(CONTRACTS)} kept, 0 broken." in result.stdout


def test_a_forbidden_import_breaks_its_contract(tmp_path: Path) -> None:
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=_not_python)
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    for path, line in VIOLATIONS.items():
        (tmp_path / path).write_text(line)
    result = lint_imports(tmp_path)
    assert result.returncode != 0
    for contract in CONTRACTS:
        assert f"{contract} BROKEN" in result.stdout, result.stdout
    assert f"Contracts: 0 kept, {len(CONTRACTS)} broken." in result.stdout


def test_no_test_imports_a_study() -> None:
    """tests/ is no package, so import-linter cannot see it: its imports of studies/ are looked for here."""
    found = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            found += [
                f"{path.relative_to(ROOT)}:{node.lineno}" for n in names if n.split(".")[0] == "studies"
            ]
    assert not found, found


def _not_python(folder: str, names: list[str]) -> list[str]:
    """What copytree leaves out: caches, and files other than Python sources (models, data)."""
    kept = [n for n in names if n.endswith(".py") or ((Path(folder) / n).is_dir() and n != "__pycache__")]
    return sorted(set(names) - set(kept))
