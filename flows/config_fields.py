"""The config's fields by dotted path, read from its pydantic models: the names close to an
unknown key ("did you mean"), and whether a field takes only text, so that YAML 1.1's bare
off/no/yes reach it as typed (flows/config_files.py)."""

from __future__ import annotations

import difflib
import re
import types
from collections.abc import Sequence
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel

from flows.config import ItergrpoConfig

# A field whose description names an unknown key in words (`learning_rate` for `lr`, whose
# description says "learning rate") matches at this similarity or above.
_DESCRIBED_CUTOFF = 0.85


def _members(annotation: Any) -> list[Any]:
    """The types an annotation allows, unions unwrapped (`str | None` -> [str, None])."""
    if get_origin(annotation) in (Union, types.UnionType):
        return [m for arg in get_args(annotation) for m in _members(arg)]
    return [annotation]


def _child(annotation: Any, key: str) -> Any:
    """The annotation of entry `key` below a field of type `annotation`; None where there is
    none (an unknown key, or a value that has no entries)."""
    for member in _members(annotation):
        if isinstance(member, type) and issubclass(member, BaseModel):
            field = member.model_fields.get(key)
            if field is not None:
                return field.annotation
        elif get_origin(member) is dict:  # a free-form mapping: any key, its value type
            args = get_args(member)
            return args[1] if len(args) == 2 else Any
    return None


def field_annotation(path: Sequence[str]) -> Any:
    """The annotation of the field at `path` (keys from the top of the config tree), None
    where the path leaves the typed tree."""
    annotation: Any = ItergrpoConfig
    for key in path:
        annotation = _child(annotation, str(key))
        if annotation is None:
            return None
    return annotation


def takes_text_only(annotation: Any) -> bool:
    """Whether a field (or a list's items) of this type accepts text and never a boolean: a
    choice of names (`stop | warn | off`), a name or a path."""
    members = _members(annotation)
    if any(get_origin(m) in (list, tuple) for m in members):
        members = [i for m in members for i in _members(next(iter(get_args(m)), Any))]
    if any(m is bool or m is Any for m in members):
        return False
    return any(
        (isinstance(m, type) and issubclass(m, str))
        or (get_origin(m) is Literal and all(isinstance(a, str) for a in get_args(m)))
        for m in members
    )


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def _described_similarity(key: str, description: str) -> float:
    """How closely some run of words in `description` spells `key` (its words split at '_')."""
    wanted, words = " ".join(_words(key)), _words(description)
    width = len(_words(key))
    runs = (" ".join(words[i : i + width]) for i in range(len(words) - width + 1))
    return max((difflib.SequenceMatcher(None, wanted, run).ratio() for run in runs), default=0.0)


def close_fields(section: Sequence[str], key: str) -> list[str]:
    """The fields of the section at `section` that an unknown `key` there may have meant:
    those spelled alike, else those whose description says it in words (`learning_rate` ->
    lr); at most three, best first."""
    model = next(
        (
            m
            for m in _members(field_annotation(section))
            if isinstance(m, type) and issubclass(m, BaseModel)
        ),
        None,
    )
    if model is None:
        return []
    fields = model.model_fields
    alike = difflib.get_close_matches(key, list(fields), n=3, cutoff=0.6)
    if alike:
        return alike
    scored = [
        (similarity, -position, name)
        for position, (name, field) in enumerate(fields.items())
        if (similarity := _described_similarity(key, field.description or "")) >= _DESCRIBED_CUTOFF
    ]
    return [name for *_, name in sorted(scored, reverse=True)[:3]]
