"""A default run's console: no warnings from dependencies, with Prefect and without."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.flow_helpers import REPO

# What a dependency's warning line holds: Python's `FutureWarning:` / `UserWarning:` ...,
# and transformers' logged deprecation notices ("... are deprecated. Use `cache` instead.").
WARNING_MARKERS = ("Warning", "deprecated")


def warning_lines(output: str) -> list[str]:
    """The lines of a console transcript (progress bars' carriage returns split) that warn."""
    lines = output.replace("\r", "\n").splitlines()
    return [line for line in lines if any(marker in line for marker in WARNING_MARKERS)]


def test_warning_lines_finds_python_and_logged_warnings() -> None:
    transcript = (
        "INFO itergrpo: iteration 0 (1 of 2): rollout\n"
        "rollout:   0%|  | 0/24\r/x/module.py:1789: FutureWarning: `past_key_values` is gone\n"
        "[transformers] `past_key_values`/`cache_params` are deprecated. Use `cache` instead.\n"
        "policy   greedy acc\n"
    )
    assert warning_lines(transcript) == [
        "/x/module.py:1789: FutureWarning: `past_key_values` is gone",
        "[transformers] `past_key_values`/`cache_params` are deprecated. Use `cache` instead.",
    ]


@pytest.mark.slow
def test_a_micro_run_prints_no_warning(tmp_path: Path) -> None:
    # Under Prefect, the default: the same stages as --no-prefect plus Prefect's own output
    # (one run, not both: the suite must stay under CI's 15 minutes).
    command = [sys.executable, "-m", "flows.cli", "run", "--config", "micro"]
    command += ["--store", str(tmp_path / "store"), "--run-id", "quiet"]
    # A user's shell: no test-only settings that hide a dependency's warning.
    env = {k: v for k, v in os.environ.items() if k not in ("TOKENIZERS_PARALLELISM",)}
    env.pop("PYTHONWARNINGS", None)
    done = subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert "run quiet finished" in output
    # under the table, what the two iterations changed, paired by problem
    assert "\npolicy_2 - policy_0 on the same " in output
    assert "\ngreedy " in output and "  sampled " in output and "  Maj@" in output
    assert warning_lines(output) == []
