"""The one base class of user errors: something the user can fix (a setting, a path, the data,
the run store), shown as one line that names the fix. Every other exception is a bug and keeps
its traceback (flows/cli).

It lives in this leaf, which imports nothing, so that every package can derive from it:
`storage/errors.py` imports this module and nothing else of `grpo_core`.
"""

from __future__ import annotations


class UserError(Exception):
    """Base class of every error whose message tells the user what to change."""


class SettingError(UserError, ValueError):
    """A setting (a config field, an argument) that cannot be used; names the field and fix."""


class MissingPathError(UserError, FileNotFoundError):
    """A path the user named (a model directory, a data file, an installed package's file)
    that does not exist or is not what it should be."""
