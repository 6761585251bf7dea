"""The recipe layer's user errors. Like every user error they derive from
grpo_core.contracts.errors.UserError, the one type the CLI prints as a line with exit 2."""

from __future__ import annotations

from grpo_core.contracts.errors import SettingError, UserError


class ConfigError(SettingError):
    """A config file, override or field that cannot be used; the message names the field."""


class OutputPathError(UserError):
    """A file a command was asked to write (--output, --out) that cannot be written."""


class PreflightError(UserError):
    """A run that cannot succeed, found before it starts; the message names the fix."""


class PrefectApiError(UserError):
    """The Prefect API the run would report to (PREFECT_API_URL) does not answer."""


class DataChangedError(UserError):
    """Data a run's committed stages read (a file or folder its config names) that is not what
    they read any more: changed, or gone. The message names the file and the choices."""
