"""The GRPO step's log line shows the learned reward models' part only where they reward:
a verifier-only run printed "(RM nan)" for a reward it never had."""

from __future__ import annotations

import logging
from typing import Any, cast

import pytest

from flows.stages.grpo_steps import report_step
from grpo_core.algo.step import StepOutcome

STATS = {"reward_mean": 0.5, "verifier_accuracy": 0.5, "kl": 0.01}


def logged_line(stats: dict[str, float], caplog: pytest.LogCaptureFixture) -> str:
    # report_step reads the stats and the skip reason only
    nothing = cast(Any, None)
    outcome = StepOutcome(batch=nothing, rewards=nothing, advantages=nothing, stats=stats)
    with caplog.at_level(logging.INFO, logger="itergrpo"):
        report_step(0, 3, 8, outcome, lambda fraction, text: None)
    return caplog.records[-1].getMessage()


def test_a_verifier_only_step_shows_no_learned_reward(caplog: pytest.LogCaptureFixture) -> None:
    line = logged_line(STATS, caplog)
    assert line == "GRPO iter 0 step 3: reward 0.500 verifier acc 0.500 kl 0.0100"


def test_a_step_rewarded_by_a_reward_model_shows_its_part(
    caplog: pytest.LogCaptureFixture,
) -> None:
    line = logged_line({**STATS, "rm_reward_mean": 0.75}, caplog)
    assert line == "GRPO iter 0 step 3: reward 0.500 (RM 0.750) verifier acc 0.500 kl 0.0100"
