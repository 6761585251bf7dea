"""The guards' checks on hand-made numbers, and what each action does with a finding."""

from __future__ import annotations

import logging

import pytest

from flows.guards import (
    EQUAL_REWARDS,
    RM_LABELS,
    GuardChecks,
    GuardsConfig,
    GuardTripped,
    NotJudged,
    auroc_finding,
    equal_rewards_finding,
    label_balance_finding,
    over_optimisation_finding,
)
from flows.stages.grpo_steps import check_step_rewards


def test_one_class_labels_name_the_class_and_the_fixes() -> None:
    finding = label_balance_finding("orm", correct=0, total=24, iteration=0, min_minority=2)
    assert finding is not None
    assert "one class: all 24 labels are 0 (no output was correct)" in finding
    assert "warm_start" in finding and "verifier alone" in finding
    every = label_balance_finding("prm", correct=60, total=60, iteration=1, min_minority=2)
    assert every is not None and "all 60 step labels are 1 (every output was correct)" in every


def test_too_few_of_the_rarer_class() -> None:
    # 23 correct, 1 wrong: the rarer class (wrong) has 1 < 2 labels
    few = label_balance_finding("orm", correct=23, total=24, iteration=2, min_minority=2)
    assert few is not None and "only 1 wrong of 24 labels" in few
    assert label_balance_finding("orm", correct=22, total=24, iteration=2, min_minority=2) is None
    assert label_balance_finding("orm", 0, 0, 0, 2) is not None  # nothing to train on at all


def test_auroc_under_the_floor_and_below_chance() -> None:
    assert auroc_finding("orm_auroc", 0.6, floor=0.6, iteration=0) is None  # at the floor: fine
    low = auroc_finding("orm_auroc", 0.55, floor=0.6, iteration=0)
    assert low is not None and "0.550" in low and "below chance" not in low
    worse = auroc_finding("prm_step_auroc", 0.359, floor=0.6, iteration=1)
    assert worse is not None and "below chance" in worse
    undefined = auroc_finding("orm_auroc", None, floor=0.6, iteration=2)
    assert isinstance(undefined, NotJudged)
    assert "orm_auroc of iteration 2 is undefined" in undefined.why
    assert "all right or all wrong" in undefined.why


def test_over_optimisation_needs_the_gap_at_each_of_the_last_steps() -> None:
    rm = [0.50, 0.70, 0.80, 0.90]
    acc = [0.40, 0.40, 0.45, 0.50]
    # gaps 0.10, 0.30, 0.35, 0.40: the last 3 all exceed 0.25, the last 4 do not
    hit = over_optimisation_finding(rm, acc, gap=0.25, steps=3, iteration=1)
    assert hit is not None and "paid 0.35 more" in hit  # (0.30 + 0.35 + 0.40) / 3
    assert over_optimisation_finding(rm, acc, gap=0.25, steps=4, iteration=1) is None
    few = over_optimisation_finding(rm[:2], acc[:2], gap=0.25, steps=3, iteration=1)
    assert isinstance(few, NotJudged) and "2 step(s) with a learned reward, fewer" in few.why


def test_equal_rewards_share_of_flat_steps() -> None:
    # steps whose groups were all rewarded alike: 2 of 4 (share 1.0 each), a half-flat one is not
    shares = [1.0, 0.5, 1.0, 0.0]
    found = equal_rewards_finding(shares, share=0.5, iteration=0)
    assert found is not None and "2 of 4 steps" in found
    assert equal_rewards_finding(shares, share=0.75, iteration=0) is None
    nothing = equal_rewards_finding([], share=0.5, iteration=0)
    assert isinstance(nothing, NotJudged) and "no step sampled a group" in nothing.why


def test_each_action_stop_warn_off(caplog: pytest.LogCaptureFixture) -> None:
    finding = "ORM training data of iteration 0 has one class"
    with pytest.raises(GuardTripped, match=r"itergrpo resume r1 --set guards\.rm_labels=warn"):
        GuardChecks(GuardsConfig(rm_labels="stop"), "r1").check(RM_LABELS, finding, "orm")

    warned = GuardChecks(GuardsConfig(rm_labels="warn"), "r1")
    with caplog.at_level(logging.WARNING, logger="itergrpo"):
        warned.check(RM_LABELS, finding, "orm")
        warned.check(EQUAL_REWARDS, None)
    assert warned.metrics == {"guard_rm_labels_orm": 1.0, "guard_equal_rewards": 0.0}
    assert warned.warnings == [f"rm_labels: {finding}"]
    assert "guard rm_labels: ORM training data" in caplog.text

    off = GuardChecks(GuardsConfig(rm_labels="off"), "r1")
    off.check(RM_LABELS, finding, "orm")
    assert off.metrics == {} and off.warnings == []


def test_a_bad_action_names_the_field() -> None:
    with pytest.raises(ValueError, match="rm_labels"):
        GuardsConfig(rm_labels="maybe")  # type: ignore[arg-type]


def test_the_grpo_stage_judges_its_steps_from_their_metric_rows() -> None:
    # 3 steps: two with every group rewarded alike (equal_reward_groups 1.0); the RM pays
    # 0.40, 0.45, 0.50 while the verifier scores 0.1 each: gaps 0.30, 0.35, 0.40 > 0.25
    log = []
    for step, (flat, rm) in enumerate([(1.0, 0.40), (0.0, 0.45), (1.0, 0.50)]):
        values = {"equal_reward_groups": flat, "rm_reward_mean": rm, "verifier_accuracy": 0.1}
        log += [{"stage": "grpo", "step": step, "name": n, "value": v} for n, v in values.items()]
    guards = GuardsConfig(over_optimisation_steps=3, equal_rewards_share=0.5)
    checks = check_step_rewards(GuardChecks(guards, "r"), 0, log)
    assert checks.metrics == {"guard_over_optimisation": 1.0, "guard_equal_rewards": 1.0}
    assert any("2 of 3 steps" in w for w in checks.warnings)
    stop_flat = GuardChecks(guards.model_copy(update={"equal_rewards": "stop"}), "r")
    with pytest.raises(GuardTripped, match="1 of 1 steps had every group"):
        check_step_rewards(stop_flat, 0, log[:3])  # step 0 alone: flat, too few for the gap


def test_a_guard_with_too_few_steps_stores_no_verdict_and_says_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Issue 55, Why 3: a stage of 3 steps, each over-paid by 0.4, under the default window of
    # 5 steps stored guard_over_optimisation = 0 ("passed"). It cannot judge: no verdict.
    log = []
    for step in range(3):
        values = {"equal_reward_groups": 0.0, "rm_reward_mean": 0.5, "verifier_accuracy": 0.1}
        log += [{"stage": "grpo", "step": step, "name": n, "value": v} for n, v in values.items()]
    checks = GuardChecks(GuardsConfig(over_optimisation="stop"), "r")
    with caplog.at_level(logging.WARNING, logger="itergrpo"):
        check_step_rewards(checks, 1, log)  # not judged: no stop, whatever the action
    assert checks.metrics == {"guard_equal_rewards": 0.0}
    why = checks.not_judged["guard_over_optimisation"]
    assert "GRPO iteration 1 had 3 step(s) with a learned reward" in why
    assert "guards.over_optimisation_steps = 5" in why
    assert "guard over_optimisation: not judged: GRPO iteration 1" in caplog.text
    assert checks.warnings == [f"over_optimisation: not judged: {why}"]
    # off: not checked, so not reported either
    off = check_step_rewards(GuardChecks(GuardsConfig(over_optimisation="off"), "r"), 1, log)
    assert off.not_judged == {}
