"""docs/configuration.md, generated from the config's own field descriptions so that the page
cannot drift from the code: `python -m flows.config_docs > docs/configuration.md` writes it,
and a test fails when the committed page differs from what this module generates."""

from __future__ import annotations

import json
import sys
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from flows.config import ItergrpoConfig

HEADER = """# Configuration reference

Every field of a run's config, by section: its type, its default and what it does. Set them
in a YAML file (`itergrpo run --config my.yaml`; presets in `configs/`) or one at a time
(`--set grpo.steps=20`); a Prefect deployment's form has the same fields. Fields of a
component (`task`, `policy`, `reward_models`, ...) are defined next to the code that uses
them. A YAML preset in `configs/` (`--config NAME`, with `base:`) is a whole run: task,
model, budgets and every stage. `grpo.preset` names how the GRPO stage trains and sets only
the `grpo` fields you did not set ([presets.md](presets.md#how-a-preset-applies)).

This page is generated from the code (`python -m flows.config_docs > docs/configuration.md`);
`tests/flows/test_config_docs.py` fails when it is out of date.
"""


def _model_of(field: FieldInfo) -> type[BaseModel] | None:
    annotation = field.annotation
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _type_name(annotation: Any) -> str:
    """`int`, `str or None`, `one of: a, b` (a Literal), `list[str]`, ..."""
    origin = get_origin(annotation)
    if origin is Literal:
        return "one of: " + ", ".join(str(v) for v in get_args(annotation))
    if origin in (Union, UnionType):
        return " or ".join(_type_name(a) for a in get_args(annotation))
    if annotation is type(None):
        return "None"
    if origin is not None:
        return str(annotation).replace("typing.", "")
    return getattr(annotation, "__name__", None) or str(annotation)


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "(required)"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    try:
        return f"`{json.dumps(value)}`"
    except TypeError:
        return f"`{value}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _section(path: str, model: type[BaseModel], out: list[str]) -> None:
    doc = " ".join((model.__doc__ or "").split())
    out += [f"## `{path}`", ""] + ([doc, ""] if doc else [])
    nested: list[tuple[str, type[BaseModel]]] = []
    rows = ["| field | type | default | description |", "|---|---|---|---|"]
    for attribute, field in model.model_fields.items():
        name = field.alias or attribute  # grpo.async: `async_` in code
        sub = _model_of(field)
        if sub is not None:
            nested.append((f"{path}.{name}", sub))
            what = _cell(field.description or "")
            rows.append(f"| `{name}` | section | see `{path}.{name}` | {what} |")
            continue
        kind = _cell(_type_name(field.annotation))
        rows.append(
            f"| `{name}` | {kind} | {_cell(_default(field))} | {_cell(field.description or '')} |"
        )
    out += [*rows, ""]
    for sub_path, sub in nested:
        _section(sub_path, sub, out)


def configuration_page() -> str:
    """The whole reference page, one section per config section."""
    out = [HEADER]
    for name, field in ItergrpoConfig.model_fields.items():
        model = _model_of(field)
        assert model is not None, f"top-level config field {name} is not a section"
        _section(name, model, out)
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    del argv
    sys.stdout.write(configuration_page())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
