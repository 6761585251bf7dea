"""Reward-model training by token budget (reward_models.max_tokens_per_micro_batch): items
sorted and packed under the budget, the same gradients and loss as the whole mini-batch in
one pass, for the pointwise ORM and PRM and the pairwise ORM.

Tolerance: fp32 sums of the same per-term losses in another grouping (and padded to other
widths, which a right-padded causal model never reads) differ by rounding, ~1e-7 here; 1e-6
still catches a micro-batch lost or counted twice (its share of the gradient is ~1e-2)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reward_models.config import RewardModelConfig, RewardModelSettings
from reward_models.labelling import OrmLabel, PrmLabel
from reward_models.models import RewardModel
from reward_models.pairwise import pair_groups
from reward_models.token_budget import token_micro_batches
from reward_models.training import (
    SampleText,
    objective_training,
    orm_examples,
    prm_examples,
    train_reward_model,
)
from reward_models.views import RMEncoder
from tests.recording_engine import RecordingEngine, assert_same_gradients
from tests.reward_models.test_pairwise import RankEngine
from tests.reward_models.test_training import PROMPT, TOKENIZER, fresh_rm

ATOL = 1e-6
BUDGET = 96  # tokens: the examples below are 20-60 tokens, so 1-4 of them per pass


def _texts(n: int) -> dict[tuple[str, int], SampleText]:
    """n completions of 1 to 4 steps: lengths spread over 20-60 tokens."""
    return {
        ("p", i): SampleText(PROMPT, "".join(f"{i}+{s}={i + s}\n" for s in range(1 + i % 4)))
        for i in range(n)
    }


def _orm_examples(n: int) -> list[Any]:
    rows = [OrmLabel("p", i, i % 2) for i in range(n)]
    return orm_examples(rows, _texts(n), RMEncoder(TOKENIZER), "new", 0)


def _prm_examples(n: int) -> list[Any]:
    rows = [
        PrmLabel("p", i, step, "?", 0, 4, (i + step) % 5, 1, (i + step) % 5 / 4, None)
        for i in range(n)
        for step in range(1 + i % 4)
    ]
    return prm_examples(rows, _texts(n), RMEncoder(TOKENIZER), "soft", "new", 0)


def _pair_groups(n: int) -> list[Any]:
    rows = [OrmLabel(f"q{i // 3}", i % 3, int(i % 3 != 1)) for i in range(n)]
    texts = {(r.problem_id, r.sample_index): _texts(n)[("p", i)] for i, r in enumerate(rows)}
    return pair_groups(rows, texts, RMEncoder(TOKENIZER), "new", 0)


CASES = {
    "orm pointwise": ("orm", RewardModelConfig(), _orm_examples),
    "prm pointwise": ("prm", RewardModelConfig(), _prm_examples),
    "orm pairwise": (
        "orm",
        RewardModelConfig(orm=RewardModelSettings(objective="pairwise")),
        _pair_groups,
    ),
}


def _train(
    kind: str, cfg: RewardModelConfig, items: list[Any], engine_of: Any = RecordingEngine
) -> tuple[dict[str, float], list[Any], RecordingEngine, int]:
    """Train a fresh RM for 2 epochs of 8-item mini-batches; metrics, records, the engine
    and how many forward passes the RM ran."""
    model: RewardModel = fresh_rm(kind)
    passes = 0

    def count(*_: Any) -> None:
        nonlocal passes
        passes += 1

    model.register_forward_hook(count)
    engine = engine_of(model)
    cfg = cfg.model_copy(update={"epochs": 2, "batch_size": 8})
    metrics, records = train_reward_model(model, items, cfg, seed=3, progress=False, engine=engine)
    return metrics, records, engine, passes


@pytest.mark.parametrize("case", CASES)
def test_a_token_budget_gives_the_whole_mini_batchs_gradients_and_loss(case: str) -> None:
    kind, cfg, items_of = CASES[case]
    items = items_of(16)
    whole_metrics, whole_records, whole, whole_passes = _train(kind, cfg, items)
    budget = cfg.model_copy(update={"max_tokens_per_micro_batch": BUDGET})
    metrics, records, packed, passes = _train(kind, budget, items)
    assert passes > whole_passes  # the budget did split the mini-batches
    assert_same_gradients(packed.grads, whole.grads, atol=ATOL)
    for key in ("loss_first_epoch", "loss_last_epoch"):
        assert metrics[key] == pytest.approx(whole_metrics[key], abs=ATOL)
    assert records == whole_records


def test_the_ranks_token_budget_passes_add_up_to_the_gradient() -> None:
    kind, cfg, items_of = CASES["orm pairwise"]
    items = items_of(16)
    whole = _train(kind, cfg, items)[2]
    budget = cfg.model_copy(update={"max_tokens_per_micro_batch": BUDGET})
    ranks = [
        _train(kind, budget, items, lambda m, r=rank: RankEngine(m, r, 2))[2] for rank in range(2)
    ]
    summed = [
        [a + b for a, b in zip(step0, step1, strict=True)]
        for step0, step1 in zip(ranks[0].grads, ranks[1].grads, strict=True)
    ]
    assert_same_gradients(summed, whole.grads, atol=ATOL)


def test_micro_batches_hold_sequences_within_the_budget_longest_first() -> None:
    groups = _pair_groups(16)
    shape = objective_training("pairwise").shape
    plan = token_micro_batches(groups, shape, BUDGET)
    widths = [max(shape(g)[1] for g in part) for part in plan]
    assert widths == sorted(widths, reverse=True)
    for part in plan:
        assert len(part) == 1 or sum(shape(g)[0] for g in part) * shape(part[0])[1] <= BUDGET


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 5), st.integers(0, 300)), max_size=40),
    st.integers(1, 1000),
)
def test_every_item_is_planned_once_within_the_budget_or_alone(
    items: list[tuple[int, int]], budget: int
) -> None:
    """Items are (sequences, longest tokens); each is planned exactly once, and a micro-batch
    of several items pads to within the budget."""
    indexed = list(enumerate(items))
    plan = token_micro_batches(indexed, lambda item: item[1], budget)
    assert sorted(i for part in plan for i, _ in part) == list(range(len(items)))
    for part in plan:
        width = max(max(longest, 1) for _, (_, longest) in part)
        sequences = sum(rows for _, (rows, _) in part)
        assert len(part) == 1 or sequences * width <= budget


def test_the_budget_is_a_positive_token_count() -> None:
    with pytest.raises(ValueError, match="max_tokens_per_micro_batch"):
        RewardModelConfig(max_tokens_per_micro_batch=0)


def test_an_item_over_the_budget_runs_alone_and_the_log_says_so_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr("reward_models.token_budget._BUDGETS_NOTED", set())
    kind, cfg, items_of = CASES["orm pairwise"]  # a group of 3 outputs pads to 3 x its longest
    budget = cfg.model_copy(update={"max_tokens_per_micro_batch": 40})
    for _ in range(2):
        _train(kind, budget, items_of(6))
    notes = [r.getMessage() for r in caplog.records if "runs alone" in r.getMessage()]
    assert len(notes) == 1 and "max_tokens_per_micro_batch = 40" in notes[0]
    plan = token_micro_batches(items_of(6), objective_training("pairwise").shape, 40)
    assert [len(part) for part in plan] == [1, 1]
