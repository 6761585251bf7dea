"""Paths a config names on the local disk (data files, model directories, a hostfile): made
absolute when the config is read, so the config a run stores names the same file whatever
directory the run is later resumed, forked or reported from."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator


def absolute_path(value: str | None) -> str | None:
    """`value` as an absolute path (`~` expanded; a relative one is taken from the current
    directory, symlinks kept as spelled); None and "" (not set) unchanged."""
    if value is None or not value.strip():
        return value
    return str(Path(value).expanduser().absolute())


# A config field that names a file or directory; relative: to the directory the config is read in.
LocalPath = Annotated[str | None, AfterValidator(absolute_path)]
