"""The pairwise (Bradley-Terry) ORM: its loss (docs/algorithm.md section 13), pairs from one
prompt's labelled outputs, the replay's cut of history, batching by prompt, and training."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_core.model.config import PolicyConfig
from grpo_core.model.policy import build_char_tokenizer, create_tiny_policy
from reward_models.config import RewardModelConfig, RewardModelSettings
from reward_models.evaluate import pairwise_accuracy
from reward_models.labelling import OrmLabel
from reward_models.models import RewardModel
from reward_models.objectives import RM_OBJECTIVES
from reward_models.pairwise import (
    PAIRWISE_TRAINING,
    PairGroup,
    bradley_terry_loss,
    outcome_pairs,
    pack_groups,
    pair_counts,
    pair_groups,
    replay_cut,
)
from reward_models.pointwise import read_logits
from reward_models.scoring import score_outcome
from reward_models.training import SampleText, objective_training, train_reward_model
from reward_models.views import RMEncoder
from tests.recording_engine import RecordingEngine, assert_same_gradients

TOKENIZER = build_char_tokenizer()
SMALL = PolicyConfig(n_layers=1, hidden_size=32, n_heads=2, intermediate_size=64, seed=1)
PAIRWISE = RewardModelConfig(orm=RewardModelSettings(objective="pairwise"), lr=3e-3)


def fresh_rm() -> RewardModel:
    return RewardModel.from_policy(create_tiny_policy(SMALL, TOKENIZER), "orm", TOKENIZER)


def labelled(
    labels: dict[str, list[int]],
) -> tuple[list[OrmLabel], dict[tuple[str, int], SampleText]]:
    """ORM label rows of each problem's outputs (sample index = position), with distinct texts:
    a right output answers 5, a wrong one its own sample index + 6."""
    rows = [OrmLabel(p, i, y) for p, ys in labels.items() for i, y in enumerate(ys)]
    texts = {
        (r.problem_id, r.sample_index): SampleText(
            f"Q: {r.problem_id}\nA:\n", f"3+4=7\n7-2={5 if r.label else r.sample_index + 6}"
        )
        for r in rows
    }
    return rows, texts


def groups_of(
    labels: dict[str, list[int]], source: str = "new", iteration: int = 0
) -> list[PairGroup]:
    rows, texts = labelled(labels)
    return pair_groups(rows, texts, RMEncoder(TOKENIZER), source, iteration)  # type: ignore[arg-type]


def test_bradley_terry_loss_by_hand_spec_13() -> None:
    better = torch.tensor([2.0, 0.0, -1.0, 40.0])
    worse = torch.tensor([0.0, 0.0, 1.0, -40.0])
    # -log sigmoid(2) = log(1 + e^-2); equal scores: log 2; a margin of -2: 2 + log(1 + e^-2)
    want = [0.126928, math.log(2.0), 2.126928, 0.0]
    assert bradley_terry_loss(better, worse).tolist() == pytest.approx(want, abs=1e-6)


scores = st.floats(-30.0, 30.0, allow_nan=False)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(scores, scores), min_size=1, max_size=8), scores)
def test_bt_loss_is_bce_on_the_score_difference_and_ignores_a_shared_shift(
    pairs: list[tuple[float, float]], shift: float
) -> None:
    better = torch.tensor([b for b, _ in pairs], dtype=torch.float64)
    worse = torch.tensor([w for _, w in pairs], dtype=torch.float64)
    loss = bradley_terry_loss(better, worse)
    bce = F.binary_cross_entropy_with_logits(
        better - worse, torch.ones_like(better), reduction="none"
    )
    assert torch.allclose(loss, bce, atol=1e-9)
    assert bool((loss >= 0).all())
    # swapping the pair's roles changes the loss by the margin: softplus(x) - softplus(-x) = x
    assert torch.allclose(bradley_terry_loss(worse, better) - loss, better - worse, atol=1e-9)
    # a prompt's scores are only compared: adding one constant to both changes nothing
    assert torch.allclose(bradley_terry_loss(better + shift, worse + shift), loss, atol=1e-9)


def test_every_right_output_is_paired_with_every_wrong_one_and_ties_make_none() -> None:
    assert outcome_pairs([1, 0, 0, 1]) == [(0, 1), (0, 2), (3, 1), (3, 2)]
    assert outcome_pairs([1, 1]) == outcome_pairs([0, 0, 0]) == outcome_pairs([]) == []


@given(st.lists(st.sampled_from([0, 1]), max_size=12))
def test_c_right_and_w_wrong_outputs_make_c_times_w_pairs(labels: list[int]) -> None:
    c = sum(labels)
    assert len(outcome_pairs(labels)) == c * (len(labels) - c)
    assert pair_counts([OrmLabel("p", i, y) for i, y in enumerate(labels)]).get("p", 0) == c * (
        len(labels) - c
    )


def test_pair_groups_keep_the_prompts_with_a_pair_and_the_replays_cut() -> None:
    rows, texts = labelled({"a": [1, 0, 0, 1], "b": [1, 1], "c": [0, 1, 0]})
    encoder = RMEncoder(TOKENIZER)
    a, c = pair_groups(rows, texts, encoder, "new", 2)  # b: both right, a tie, no pair
    assert [(o.problem_id, o.sample_index, o.targets) for o in a.outputs] == [
        ("a", 0, [1.0]),
        ("a", 1, [0.0]),
        ("a", 2, [0.0]),
        ("a", 3, [1.0]),
    ]
    assert a.pairs == ((0, 1), (0, 2), (3, 1), (3, 2)) and c.pairs == ((1, 0), (1, 2))
    assert {(o.source, o.origin_iteration) for o in a.outputs + c.outputs} == {("new", 2)}
    # the replay keeps a group's first pairs, and only the outputs they read
    (cut,) = pair_groups(rows, texts, encoder, "replay", 1, kept={"c": 1})
    assert [o.sample_index for o in cut.outputs] == [0, 1] and cut.pairs == ((1, 0),)
    assert cut.source == "replay"


def test_a_pair_group_refuses_what_is_not_a_ranking() -> None:
    (group,) = groups_of({"a": [1, 0]})
    right, wrong = group.outputs
    with pytest.raises(ValueError, match="does not rank a right over a wrong one"):
        PairGroup((right, wrong), ((1, 0),))
    with pytest.raises(ValueError, match="every output must be in a pair"):
        PairGroup((right, wrong, wrong), ((0, 1),))
    with pytest.raises(ValueError, match="at least one pair"):
        PairGroup((right, wrong), ())


def test_replay_cut_by_hand() -> None:
    available = {(0, "a"): 4, (0, "b"): 0, (1, "a"): 2}
    assert replay_cut(available, 6, seed=3) == {(0, "a"): 4, (1, "a"): 2}
    assert replay_cut(available, 0, seed=3) == {}
    with pytest.raises(ValueError, match="cannot replay 7 pairs of 6"):
        replay_cut(available, 7, seed=3)


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(
        st.tuples(st.integers(0, 3), st.sampled_from("abcdefgh")), st.integers(0, 9), max_size=12
    ),
    st.integers(0, 2**31),
    st.data(),
)
def test_replay_takes_whole_groups_in_one_order_and_cuts_only_the_last(
    available: dict[tuple[int, str], int], seed: int, data: st.DataObject
) -> None:
    total = sum(available.values())
    n = data.draw(st.integers(0, total))
    taken = replay_cut(available, n, seed)
    assert sum(taken.values()) == n
    assert all(0 < k <= available[g] for g, k in taken.items())
    assert sum(k < available[g] for g, k in taken.items()) <= 1  # one group cut at most
    # a larger count extends a smaller one: the same order of groups, whatever n
    more = replay_cut(available, total, seed)
    assert all(k <= more[g] for g, k in taken.items())
    assert taken == replay_cut(dict(reversed(list(available.items()))), n, seed)


def test_batches_hold_whole_groups_up_to_the_batch_size_in_outputs() -> None:
    sizes = [4, 2, 3, 4, 2, 8]
    groups = groups_of({f"p{i}": [1] + [0] * (n - 1) for i, n in enumerate(sizes)})
    batches = pack_groups(groups, [0, 1, 2, 3, 4, 5], 6)
    # 4 + 2 fit; 3 + 4 do not; 4 + 2 fit; 8 outputs are a batch of their own
    assert [[len(g.outputs) for g in b] for b in batches] == [[4, 2], [3], [4, 2], [8]]
    reverse = pack_groups(groups, [5, 4, 3, 2, 1, 0], 6)
    assert [[len(g.outputs) for g in b] for b in reverse] == [[8], [2, 4], [3, 2], [4]]


def test_a_batchs_loss_reads_each_output_once_and_averages_its_pairs() -> None:
    rm = fresh_rm()
    groups = groups_of({"a": [1, 0, 0, 1], "c": [0, 1, 0]})
    forward = rm.forward
    rows_read: list[int] = []

    def counted(*args: torch.Tensor) -> torch.Tensor:
        rows_read.append(args[0].shape[0])
        return forward(*args)

    rm.forward = counted  # type: ignore[method-assign]
    loss = PAIRWISE_TRAINING.loss(rm, groups, TOKENIZER.pad_token_id, torch.device("cpu"), None)
    assert rows_read == [7]  # 4 + 3 outputs in one pass, for 4 + 2 pairs
    with torch.no_grad():
        a = read_logits(rm, groups[0].outputs, TOKENIZER.pad_token_id, torch.device("cpu"))
        c = read_logits(rm, groups[1].outputs, TOKENIZER.pad_token_id, torch.device("cpu"))
    by_hand = [
        -F.logsigmoid(scores[b] - scores[w])
        for scores, group in ((a, groups[0]), (c, groups[1]))
        for b, w in group.pairs
    ]
    assert loss.item() == pytest.approx(float(sum(by_hand)) / 6, abs=1e-6)
    assert PAIRWISE_TRAINING.terms(groups) == 6


def test_pairwise_training_ranks_right_outputs_above_wrong_ones_and_is_seeded() -> None:
    rows, texts = labelled({f"q{i}": [*[1, 0, 0, 1][i % 2 :], 0] for i in range(6)})
    groups = pair_groups(rows, texts, RMEncoder(TOKENIZER), "new", 0)
    cfg = PAIRWISE.model_copy(update={"epochs": 6, "batch_size": 8})
    rm = fresh_rm()
    outputs = [o for g in groups for o in g.outputs]
    prompts, completions = zip(*(texts[o.problem_id, o.sample_index] for o in outputs), strict=True)
    labels = [o.targets[0] for o in outputs]
    owners = [o.problem_id for o in outputs]
    before = pairwise_accuracy(score_outcome(rm, prompts, completions), labels, owners)
    metrics, records = train_reward_model(rm, groups, cfg, seed=4, progress=False)
    after = pairwise_accuracy(score_outcome(rm, prompts, completions), labels, owners)
    assert metrics["loss_last_epoch"] < metrics["loss_first_epoch"]
    assert after == 1.0 > before
    pairs = sum(len(g.pairs) for g in groups)
    assert (metrics["groups"], metrics["pairs"], metrics["pairs_new"]) == (6, pairs, pairs)
    assert (metrics["examples"], metrics["pairs_replay"]) == (len(outputs), 0)
    # every output read is recorded once per epoch with its label
    assert Counter((r.problem_id, r.sample_index, r.label) for r in records) == Counter(
        {(o.problem_id, o.sample_index, o.targets[0]): 6 for o in outputs}
    )
    again = train_reward_model(fresh_rm(), groups, cfg, seed=4, progress=False)
    assert again == (metrics, records)


def test_no_pair_to_train_on_is_an_error_naming_the_fix() -> None:
    with pytest.raises(ValueError, match=r"no ORM training pairs.*objective: pointwise"):
        train_reward_model(fresh_rm(), [], PAIRWISE, seed=0, progress=False)


class RankEngine(RecordingEngine):
    """Rank `rank` of `world` data-parallel ranks, each recording its own gradients."""

    def __init__(self, model: torch.nn.Module, rank: int, world: int) -> None:
        super().__init__(model)
        self.data_parallel_rank, self.data_parallel_size = rank, world


def test_the_ranks_shares_of_a_batch_add_up_to_its_gradient() -> None:
    groups = groups_of({"a": [1, 0, 0, 1], "b": [0, 1], "c": [0, 1, 0], "d": [1, 0, 1]})
    cfg = PAIRWISE.model_copy(update={"batch_size": 16})
    model = fresh_rm()
    whole = RecordingEngine(model)
    train_reward_model(model, groups, cfg, seed=1, progress=False, engine=whole)
    ranks = []
    for rank in range(2):  # every rank holds the same model and passes the same groups
        model = fresh_rm()
        ranks.append(RankEngine(model, rank, 2))
        train_reward_model(model, groups, cfg, seed=1, progress=False, engine=ranks[-1])
    summed = [
        [a + b for a, b in zip(step0, step1, strict=True)]
        for step0, step1 in zip(ranks[0].grads, ranks[1].grads, strict=True)
    ]
    assert_same_gradients(summed, whole.grads, atol=1e-6)


def test_the_objectives_are_registered_with_the_rms_they_train() -> None:
    assert RM_OBJECTIVES.names() == ["pointwise", "pairwise"]
    assert RM_OBJECTIVES["pairwise"].kinds == {"orm"}
    assert objective_training("pairwise") is PAIRWISE_TRAINING
