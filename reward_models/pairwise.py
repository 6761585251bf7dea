"""The pairwise (Bradley-Terry) ORM's training: (better, worse) pairs of one prompt's outputs
from the verifier's labels, the replay of history's pairs, the loss, and the trainer's side
of the `pairwise` objective (docs/algorithm.md section 13).

A prompt's outputs are one training item (a PairGroup): each output is read once per step
for all its pairs, as Ouyang et al. 2022 put every comparison of a prompt in one batch element.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from reward_models.labelling import OrmLabel
from reward_models.models import RewardModel
from reward_models.pointwise import check_examples, example_tokens, read_logits, trained_rows
from reward_models.training import (
    ObjectiveTraining,
    RMExample,
    SampleText,
    Source,
    TrainedRow,
    orm_examples,
)
from reward_models.views import RMEncoder

Pair = tuple[int, int]  # (better, worse): indices of two outputs of one prompt


def bradley_terry_loss(better: Tensor, worse: Tensor) -> Tensor:
    """Per pair -log sigmoid(r_better - r_worse) (section 13), as softplus(r_worse - r_better):
    finite at any margin."""
    return F.softplus(worse - better)


def outcome_pairs(labels: Sequence[int]) -> list[Pair]:
    """Every output the verifier passed against every one it failed, in index order: c right
    and w wrong outputs make c * w pairs; two outputs with one label (a tie) make none."""
    right = [i for i, y in enumerate(labels) if y == 1]
    wrong = [i for i, y in enumerate(labels) if y == 0]
    return [(b, w) for b in right for w in wrong]


@dataclass(frozen=True)
class PairGroup:
    """The outputs of one prompt at one iteration that are in a pair, each read as the ORM
    reads its outcome (target: the verifier's label), and the pairs as indices into them."""

    outputs: tuple[RMExample, ...]
    pairs: tuple[Pair, ...]

    def __post_init__(self) -> None:
        first = self.outputs[0] if self.outputs else None
        where = f"pair group {first.problem_id if first else '(no outputs)'}"
        if first is None or not self.pairs:
            raise ValueError(f"{where}: needs outputs and at least one pair")
        origin = (first.problem_id, first.source, first.origin_iteration)
        for e in self.outputs:
            if (e.problem_id, e.source, e.origin_iteration) != origin or len(e.targets) != 1:
                raise ValueError(
                    f"{where}: outputs of one prompt, source and iteration, one "
                    f"outcome each (got {e.problem_id}#{e.sample_index})"
                )
        for b, w in self.pairs:
            if not (0 <= b < len(self.outputs) and 0 <= w < len(self.outputs)):
                raise ValueError(f"{where}: pair {(b, w)} out of range")
            if self.outputs[b].targets[0] <= self.outputs[w].targets[0]:
                raise ValueError(f"{where}: pair {(b, w)} does not rank a right over a wrong one")
        if {i for pair in self.pairs for i in pair} != set(range(len(self.outputs))):
            raise ValueError(f"{where}: every output must be in a pair")

    @property
    def source(self) -> Source:
        return self.outputs[0].source


TrainingMix = Sequence[RMExample] | Sequence[PairGroup]


def pair_counts(rows: Sequence[OrmLabel]) -> dict[str, int]:
    """Pairs each problem's outputs make (right x wrong), problems with none included."""
    right: dict[str, int] = {}
    total: dict[str, int] = {}
    for r in rows:
        right[r.problem_id] = right.get(r.problem_id, 0) + r.label
        total[r.problem_id] = total.get(r.problem_id, 0) + 1
    return {p: right[p] * (total[p] - right[p]) for p in total}


def pair_groups(
    rows: Sequence[OrmLabel],
    texts: Mapping[tuple[str, int], SampleText],
    encoder: RMEncoder,
    source: Source,
    origin_iteration: int,
    kept: Mapping[str, int] | None = None,
) -> list[PairGroup]:
    """The pair group of each problem of `rows` (labels of one iteration) with a right and a
    wrong output, in problem order, its outputs in sample order; kept: only those problems,
    each with its first kept[problem] pairs (the replay's cut)."""
    by_problem: dict[str, list[OrmLabel]] = {}
    for r in sorted(rows, key=lambda r: (r.problem_id, r.sample_index)):
        if kept is None or r.problem_id in kept:
            by_problem.setdefault(r.problem_id, []).append(r)
    chosen: list[tuple[list[OrmLabel], list[Pair]]] = []
    for problem, labels in by_problem.items():
        pairs = outcome_pairs([r.label for r in labels])
        pairs = pairs if kept is None else pairs[: kept[problem]]
        read = sorted({i for pair in pairs for i in pair})  # the outputs the pairs read
        at = {old: new for new, old in enumerate(read)}
        if pairs:
            chosen.append(([labels[i] for i in read], [(at[b], at[w]) for b, w in pairs]))
    examples = orm_examples(
        [r for outputs, _ in chosen for r in outputs], texts, encoder, source, origin_iteration
    )
    groups, start = [], 0
    for outputs, pairs in chosen:
        groups.append(PairGroup(tuple(examples[start : start + len(outputs)]), tuple(pairs)))
        start += len(outputs)
    return groups


def replay_cut(
    available: Mapping[tuple[int, str], int], n_pairs: int, seed: int
) -> dict[tuple[int, str], int]:
    """The history pairs replayed: of the groups (origin iteration, problem_id) -> their pair
    count, whole groups in the order of a seeded hash until n_pairs are taken, the last cut to
    the pairs still wanted; group -> pairs taken."""
    if not 0 <= n_pairs <= sum(available.values()):
        raise ValueError(f"cannot replay {n_pairs} pairs of {sum(available.values())}")
    order = sorted(available, key=lambda group: (_draw(seed, *group), group))
    taken: dict[tuple[int, str], int] = {}
    left = n_pairs
    for group in order:
        if left == 0:
            break
        if available[group]:
            taken[group] = min(available[group], left)
            left -= taken[group]
    return taken


def _draw(seed: int, iteration: int, problem_id: str) -> bytes:
    """A group's place in the replay order: the same for a seed on any machine and version."""
    key = f"{seed}/{iteration}/{problem_id}".encode()
    return hashlib.blake2b(key, digest_size=8).digest()


def pack_groups(groups: Sequence[PairGroup], order: list[int], size: int) -> list[list[PairGroup]]:
    """Whole groups in `order`, as many per mini-batch as fit in `size` outputs (sequences
    read); a group of more outputs than that is a mini-batch of its own."""
    batches: list[list[PairGroup]] = []
    batch: list[PairGroup] = []
    outputs = 0
    for i in order:
        if batch and outputs + len(groups[i].outputs) > size:
            batches.append(batch)
            batch, outputs = [], 0
        batch.append(groups[i])
        outputs += len(groups[i].outputs)
    return batches + ([batch] if batch else [])


def _pairs(batch: Sequence[PairGroup]) -> int:
    return sum(len(g.pairs) for g in batch)


def _pair_loss(
    model: torch.nn.Module,
    batch: Sequence[PairGroup],
    pad_id: int,
    device: torch.device,
    normaliser: int | None = None,
) -> Tensor:
    """Mean Bradley-Terry loss over the batch's pairs, each output read once; with a
    `normaliser`, their sum divided by it."""
    scores = read_logits(model, [o for g in batch for o in g.outputs], pad_id, device)
    better: list[int] = []
    worse: list[int] = []
    offset = 0
    for g in batch:
        better += [offset + b for b, _ in g.pairs]
        worse += [offset + w for _, w in g.pairs]
        offset += len(g.outputs)
    losses = bradley_terry_loss(scores[torch.tensor(better)], scores[torch.tensor(worse)])
    return losses.mean() if normaliser is None else losses.sum() / normaliser


def _group_shape(group: PairGroup) -> tuple[int, int]:
    return len(group.outputs), max(example_tokens(o) for o in group.outputs)


def _check_groups(model: RewardModel, groups: Sequence[PairGroup], max_length: int) -> None:
    if not groups:
        raise ValueError(
            "no ORM training pairs: no prompt's outputs were both right and wrong; a pairwise "
            "ORM needs some (more rollout.group_size, a warm start, or "
            "reward_models.orm.objective: pointwise)"
        )
    check_examples(model, [o for g in groups for o in g.outputs], max_length)


def _group_rows(batch: Sequence[PairGroup], epoch: int) -> list[TrainedRow]:
    return trained_rows([o for g in batch for o in g.outputs], epoch)


def _group_counts(groups: Sequence[PairGroup]) -> dict[str, float]:
    def count(source: Source | None, of_outputs: bool) -> float:
        chosen = [g for g in groups if source is None or g.source == source]
        return float(sum(len(g.outputs) if of_outputs else len(g.pairs) for g in chosen))

    return {
        "examples": count(None, True),
        "examples_new": count("new", True),
        "examples_replay": count("replay", True),
        "groups": float(len(groups)),
        "pairs": count(None, False),
        "pairs_new": count("new", False),
        "pairs_replay": count("replay", False),
    }


PAIRWISE_TRAINING: ObjectiveTraining[PairGroup] = ObjectiveTraining(
    check=_check_groups,
    batches=pack_groups,
    terms=_pairs,
    shape=_group_shape,
    loss=_pair_loss,
    records=_group_rows,
    counts=_group_counts,
)
