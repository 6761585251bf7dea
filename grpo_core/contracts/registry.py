"""Named extension points: advantage estimators, reward parts, rollout and train engines are
each a `Registry` of entries that carry their own requirements. A config field that names an
entry is a plain `str` checked against the registry, with the registry's names as the choices
shown in the Prefect form, so no list of names is written twice."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Generic, TypeVar

from grpo_core.contracts.errors import SettingError

Entry = TypeVar("Entry")


class Registry(Generic[Entry]):
    """Entries of one kind by name, in registration order."""

    def __init__(self, what: str) -> None:
        self.what = what  # e.g. "advantage estimator", in error messages
        self._entries: dict[str, Entry] = {}

    def add(self, name: str, entry: Entry) -> Entry:
        """Register `entry` under `name` (a name is registered once)."""
        if name in self._entries:
            raise ValueError(f"{self.what} {name!r} is registered twice")
        self._entries[name] = entry
        return entry

    def remove(self, name: str) -> None:
        """Unregister `name` (a test's own entry, once the test is done)."""
        del self._entries[name]

    def __getitem__(self, name: str) -> Entry:
        if name not in self._entries:
            raise SettingError(f"unknown {self.what} {name!r}: choose one of {self.names()}")
        return self._entries[name]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def names(self) -> list[str]:
        """The registered names, in registration order."""
        return list(self._entries)

    def items(self) -> list[tuple[str, Entry]]:
        return list(self._entries.items())

    def check(self, name: str) -> str:
        """`name` if registered, else a SettingError listing the choices (a pydantic validator)."""
        self[name]
        return name

    def json_schema(self, schema: dict[str, Any]) -> None:
        """Pydantic `json_schema_extra`: the names as the field's choices (a dropdown in the
        Prefect form), read when the schema is built, so later registrations show too."""
        schema["enum"] = self.names()
