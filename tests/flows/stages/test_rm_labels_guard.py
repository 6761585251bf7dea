"""The rm_labels guard on a pairwise ORM's mix: no pair trips it with a message naming the
objective; otherwise it reads the labels of the outputs the pairs read."""

from __future__ import annotations

import pytest

from flows.guards import RM_LABELS, GuardChecks, GuardsConfig, GuardTripped
from flows.stages.train_rm import _check_label_balance
from grpo_core.model.policy import build_char_tokenizer
from reward_models.labelling import OrmLabel
from reward_models.pairwise import pair_groups
from reward_models.training import SampleText
from reward_models.views import RMEncoder


def test_a_pairwise_mix_without_a_pair_trips_the_guard_naming_the_objective() -> None:
    checks = GuardChecks(GuardsConfig(rm_labels="stop"), "r1")
    with pytest.raises(GuardTripped, match=r"iteration 2 has no pair: .*orm\.objective: pointwise"):
        _check_label_balance(checks, "orm", 2, [], pairwise=True)


def test_a_pairwise_mix_is_judged_on_the_outputs_its_pairs_read() -> None:
    rows = [OrmLabel("a", i, y) for i, y in enumerate([1, 0, 0])]
    rows += [OrmLabel("b", i, y) for i, y in enumerate([1, 1, 1])]  # no pair: not read
    texts = {(r.problem_id, r.sample_index): SampleText("Q\n", f"{r.sample_index}") for r in rows}
    mix = pair_groups(rows, texts, RMEncoder(build_char_tokenizer()), "new", 0)
    checks = GuardChecks(GuardsConfig(rm_labels="warn", min_minority_labels=2), "r1")
    _check_label_balance(checks, "orm", 0, mix, pairwise=True)
    # 1 right of the 3 outputs read (b's three right ones are in no pair): too few right ones
    assert checks.metrics == {f"guard_{RM_LABELS}_orm": 1.0}
    assert "only 1 correct of 3 labels" in checks.warnings[0]
