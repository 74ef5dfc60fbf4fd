"""Writes docs/settings.md, the settings reference, from the typed settings (gateway.settings.Settings): every
field, section by section, with its LLMGW_* variable, type, default and description.

Change a setting, run `.venv/bin/python docs/build_settings_reference.py`, commit both; a test
(tests/test_settings_reference.py) fails while the committed page is not what this writes. A field's
description is its `Field(description=...)`, else the comment written with it in its config module (the
comment lines just above it, or at its end).
"""

import ast
import inspect
import io
import json
import re
import textwrap
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, SecretStr, TypeAdapter
from pydantic.fields import FieldInfo

from core.renamed import old_names
from gateway.settings import Settings

PAGE = Path(__file__).resolve().parent / "settings.md"
_BOUNDS = (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<"), ("min_length", "length ≥"),
           ("max_length", "length ≤"), ("pattern", "matching"))  # fmt: skip
_PLACEHOLDER = re.compile(r"(?<!`)\b(LLMGW_\w*<\w+>)")
_NOT_DESCRIPTIONS = ("fmt: skip", "noqa", "type: ignore")
_LONGEST_DEFAULT = 60  # characters; a longer default is described instead

HEADER = """# Settings reference

[← README](../README.md) · [manual](README.md) · [configuration](configuration.md)

Generated from the typed settings (`gateway/settings.py` and each package's config module) by
`docs/build_settings_reference.py`; do not edit by hand. Every setting is an `LLMGW_*` environment variable
(nested sections joined by `__`) and the same key in the YAML file named by `LLMGW_CONFIG_FILE`
(environment variables win). Lists and mappings are JSON in a variable. Sections named `…[]` describe a list's
items and `….<key>` a mapping's entries (the shipped ones, with their values): give them in the YAML file or as
JSON in the list's or mapping's variable, each item or entry whole (its required fields too).
"""


@dataclass(frozen=True)
class Section:
    path: str  # the YAML path, e.g. "policies.redis" or "models[].deployments[]"
    env: str | None  # the variable prefix, e.g. "LLMGW_POLICIES__REDIS__"; None inside a list
    model: type[BaseModel]
    instance: BaseModel | None = None  # a shipped entry of a mapping: its values are shown as the defaults


def sections() -> Iterator[Section]:
    """Settings' own fields first, then each nested section depth-first, in field order."""
    pending = [Section("", "LLMGW_", Settings)]
    while pending:
        section = pending.pop(0)
        yield section
        pending[0:0] = list(_children(section))


def _children(section: Section) -> Iterator[Section]:
    for name, field in section.model.model_fields.items():
        path = f"{section.path}.{name}".lstrip(".")
        env = f"{section.env}{name.upper()}__" if section.env else None
        annotation = _without_none(field.annotation)
        if _is_model(annotation):
            yield Section(path, env, annotation)
        elif get_origin(annotation) is list and _is_model(item := get_args(annotation)[0]):
            yield Section(f"{path}[]", None, item)
        elif get_origin(annotation) is dict and _is_model(value := get_args(annotation)[1]):
            default = _default(section, name, field) or {}
            for key, entry in default.items() or [("<key>", None)]:
                yield Section(f"{path}.{key}", None, value, entry)


def render() -> str:
    parts = [HEADER]
    for section in sections():
        rows = [_row(section, name, field) for name, field in section.model.model_fields.items()]
        rows = [row for row in rows if row]
        if not rows:
            continue
        title = f"`{section.path}`" if section.path else "Top level"
        parts.append(f"## {title}\n")
        if section.path and (doc := _doc(section.model)):
            parts.append(doc + "\n")
        head = "| Setting | Variable | Type | Default | Description |\n|---|---|---|---|---|"
        parts.append("\n".join([head, *rows]) + "\n")
    return "\n".join(parts)


def _row(section: Section, name: str, field: FieldInfo) -> str | None:
    annotation = _without_none(field.annotation)
    if _is_model(annotation):
        return None  # a section of its own
    path = f"{section.path}.{name}".lstrip(".")
    env = f"`{section.env}{name.upper()}`" if section.env else ""
    text = field.description or _comments(_owner(section.model, name)).get(name, "")
    if old := old_names(field):
        formerly = ", ".join(
            f"`{o}`" + (f" (`{section.env}{o.upper()}`)" if section.env else "") for o in old
        )
        text = (
            f"{text}<br>Deprecated former name, still read: {formerly}." if text else f"Formerly {formerly}."
        )
    cells = [
        f"`{path}`",
        env,
        f"`{_type(field.annotation)}`" + _bounds(field),
        _default_cell(section, name, field),
    ]
    return "| " + " | ".join(c.replace("|", "\\|") for c in [*cells, text]) + " |"


def _default_cell(section: Section, name: str, field: FieldInfo) -> str:
    required = " (required)" if field.is_required() else ""
    if required and section.instance is None:
        return "required"
    value = _default(section, name, field)
    if isinstance(value, SecretStr):
        value = value.get_secret_value()
    shown = json.dumps(TypeAdapter(Any).dump_python(value, mode="json"), ensure_ascii=False)
    return f"`{shown}`{required}" if len(shown) <= _LONGEST_DEFAULT else "(see below)"


def _default(section: Section, name: str, field: FieldInfo) -> Any:
    if section.instance is not None:
        return getattr(section.instance, name)
    return field.get_default(call_default_factory=True)


def _type(annotation: Any) -> str:
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Literal:
        return " | ".join(json.dumps(a) for a in args)
    if origin in (Union, UnionType):
        return " | ".join("None" if a is type(None) else _type(a) for a in args)
    if origin is not None:
        return f"{getattr(origin, '__name__', origin)}[{', '.join(_type(a) for a in args)}]"
    return "any" if annotation is Any else getattr(annotation, "__name__", str(annotation))


def _bounds(field: FieldInfo) -> str:
    found = [
        f"{sign} {_bound(getattr(m, key))}"
        for m in field.metadata
        for key, sign in _BOUNDS
        if hasattr(m, key)
    ]
    return f" ({', '.join(found)})" if found else ""


def _bound(value: object) -> str:
    return f"`{value}`" if isinstance(value, str) else str(value)  # a pattern: code, not Markdown


def _without_none(annotation: Any) -> Any:
    if get_origin(annotation) in (Union, UnionType):
        rest = [a for a in get_args(annotation) if a is not type(None)]
        return rest[0] if len(rest) == 1 else annotation
    return annotation


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _doc(model: type[BaseModel]) -> str:
    """The model's own docstring, its paragraphs each on one line (Markdown would read indents as code)."""
    doc = inspect.cleandoc(model.__dict__.get("__doc__") or "")
    text = "\n\n".join(" ".join(paragraph.split()) for paragraph in doc.split("\n\n") if paragraph.strip())
    return _PLACEHOLDER.sub(r"`\1`", text)  # LLMGW_X__<FIELD> as code: Markdown would take <FIELD> for HTML


def _owner(model: type[BaseModel], name: str) -> type:
    """The class (model or a base) whose body declares field `name`."""
    return next(c for c in model.__mro__ if name in c.__dict__.get("__annotations__", {}))


@cache
def _comments(cls: type) -> dict[str, str]:
    """Field name → the comment written with it in the class body: the lines just above, then the line's end."""
    source = textwrap.dedent("".join(inspect.getsourcelines(cls)[0]))
    by_line: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        text = token.string.lstrip("#").strip()
        if token.type == tokenize.COMMENT and not any(text.startswith(n) for n in _NOT_DESCRIPTIONS):
            by_line[token.start[0]] = text
    code = source.splitlines()
    found = {}
    for node in ast.parse(source).body[0].body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            above, line = [], node.lineno - 1
            while line >= 1 and code[line - 1].lstrip().startswith("#"):
                above.insert(0, by_line.get(line, ""))
                line -= 1
            inline = [
                by_line[n] for n in range(node.lineno, (node.end_lineno or node.lineno) + 1) if n in by_line
            ]
            found[node.target.id] = " ".join(t for t in [*above, *inline] if t)
    return found


def main() -> None:
    PAGE.write_text(render())
    print(f"wrote {PAGE}")


if __name__ == "__main__":
    main()
