"""Shared by the CLI tests: one `itergrpo run` that a bug stops in its first stage."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.flow_helpers import cli

# A ValueError (what a bug raises) at the warm start's first progress report.
BUG_AT_WARM_START = "ValueError@warm_start:0:1"


@pytest.fixture(scope="session")
def bug_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """`itergrpo run --config micro --run-id bug` stopped by BUG_AT_WARM_START, in a child
    process (its console and exit status are the user's): (its result, its store). Read only:
    one test checks the console, another the stored failure (a child costs ~5 s of CPU)."""
    store = tmp_path_factory.mktemp("bug-run")
    done = cli(store, "run", "--config", "micro", "--run-id", "bug", fault=BUG_AT_WARM_START)
    return done, store
