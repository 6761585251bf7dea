"""User errors of a deployment run (`itergrpo serve`, the Prefect UI) in the deployment's
terms: its parameters (`force_config`, the `config` form's fields), not the CLI's flags."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

from grpo_core.contracts.errors import UserError
from storage.layout import STORE_ENV

# (a CLI flag as the messages phrase it, the same fix as a deployment parameter). A message
# that names a flag not listed here reads as it does in the terminal.
CLI_TO_PARAMETERS: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(r"`?itergrpo run --force-config`?"),
        "the deployment parameter `force_config` set to true",
    ),
    (
        re.compile(rf"pass a new or empty directory as --store \(or {STORE_ENV}\)"),
        "set the `config` parameter's `store.root` to a new or empty directory",
    ),
    (
        re.compile(rf"pass (?:another )?--store(?: DIR)? or set {STORE_ENV}"),
        "set the `config` parameter's `store.root` to another directory",
    ),
)


def in_deployment_terms(message: str) -> str:
    """`message` with each CLI flag it names replaced by the deployment parameter to set."""
    for flag, parameter in CLI_TO_PARAMETERS:
        message = flag.sub(parameter, message)
    return message


def resume_hint(run_id: str) -> str:
    """How a deployment run stopped at a safe point is resumed."""
    return f"run the deployment again with the `config` parameter's `run.run_id` = {run_id!r}"


def is_deployment_run() -> bool:
    """Whether the current flow run was started from a deployment (the UI, a schedule,
    `prefect deployment run`), not by the CLI calling the flow."""
    from prefect.runtime import deployment

    try:
        return bool(deployment.id)
    except Exception:  # the API that would say is unreachable: keep the message as it is
        return False


@contextlib.contextmanager
def user_errors_in_deployment_terms() -> Iterator[None]:
    """Re-raise a UserError of a deployment run with its message in the deployment's terms
    (the same exception, type and traceback kept); outside a deployment, untouched."""
    try:
        yield
    except UserError as exc:
        if is_deployment_run() and exc.args and isinstance(exc.args[0], str):
            exc.args = (in_deployment_terms(exc.args[0]), *exc.args[1:])
        raise
