"""Reward-model evaluation: AUROC (with bootstrap intervals), accuracy, majority baseline,
best-of-N; rows for `eval`.

Uncertainty is over questions where the caller names them: the drift measurement samples
several outputs per prompt and draws prompts with repeats (the demo's 64 test draws are 24
questions), and outputs of one question are not independent draws. So the AUROC bootstrap
resamples questions and the accuracies' standard errors are clustered by question
(grpo_core.model.evaluate.clustered_mean_se); without question names, by output (steps of
one PRM output) or by prompt (samples of one prompt)."""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch

from grpo_core.model.evaluate import clustered_mean_se

ArrayLike = Sequence[float] | Sequence[bool] | npt.NDArray[np.generic] | torch.Tensor


@dataclass(frozen=True)
class EvalRow:
    """One row of the `eval` table (the flow adds run_id and iteration)."""

    split: str
    metric: str
    k: int | None
    value: float
    stderr: float | None
    n: int
    # A 95% interval where one is computed (AUROCs: bootstrap over questions); else None.
    ci_low: float | None = None
    ci_high: float | None = None


def _as_array(values: ArrayLike, name: str) -> npt.NDArray[np.float64]:
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().numpy()
    out = np.asarray(values, dtype=np.float64)
    if np.isnan(out).any():
        raise ValueError(f"{name} contains NaN; every score and label must be a number")
    return out


def _binary_labels(labels: ArrayLike) -> npt.NDArray[np.float64]:
    y = _as_array(labels, "labels")
    if not np.isin(y, (0.0, 1.0)).all():
        raise ValueError(f"labels must be 0/1 (got values {sorted(set(y.tolist()))[:5]})")
    return y


def _midranks(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """1-based ranks of x, ties sharing their average rank."""
    order = np.argsort(x, kind="mergesort")
    sorted_x = x[order]
    ranks = np.empty(len(x), dtype=np.float64)
    start = 0
    while start < len(x):
        end = start
        while end + 1 < len(x) and sorted_x[end + 1] == sorted_x[start]:
            end += 1
        ranks[order[start : end + 1]] = (start + end) / 2.0 + 1.0
        start = end + 1
    return ranks


def auroc(scores: ArrayLike, labels: ArrayLike) -> float:
    """P(score of a positive > score of a negative), ties counted 1/2 (Mann-Whitney U).

    NaN when the labels hold only one class (AUROC is undefined then).
    """
    s = _as_array(scores, "scores")
    y = _binary_labels(labels)
    if s.shape != y.shape or s.ndim != 1:
        raise ValueError(f"scores {s.shape} and labels {y.shape} must be equal-length vectors")
    n_pos = int(y.sum())
    n_neg = len(y) - n_pos
    if n_pos == 0 or n_neg == 0:
        return math.nan
    rank_sum = _midranks(s)[y == 1].sum()
    return float((rank_sum - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


# Resamples per AUROC interval: with 1000, the interval's ends move by ~0.001 (s.d.) between
# bootstrap seeds on 256-512 outputs, below the third decimal the report prints; a PRM's
# 3000 steps take ~0.15 s.
BOOTSTRAP_RESAMPLES = 1000


@dataclass(frozen=True)
class AurocInterval:
    """An AUROC with its bootstrap standard error and percentile interval."""

    estimate: float
    stderr: float
    low: float
    high: float


def bootstrap_auroc(
    scores: ArrayLike,
    labels: ArrayLike,
    groups: ArrayLike | Sequence[Hashable] | None = None,
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    level: float = 0.95,
    seed: int = 0,
) -> AurocInterval | None:
    """The AUROC of `scores` against 0/1 `labels` with a percentile bootstrap interval.

    Each resample draws as many outputs as there are, with replacement, and scores the
    drawn items weighted by how often their output was drawn; `groups` names each item's
    output or question (the steps of one PRM output, the outputs of one question, share it:
    they are not independent draws), None: every item is its own output. Resamples that hold
    one class only are dropped (their AUROC is undefined). stderr: the resampled AUROCs'
    standard deviation; low / high: their (1 - level) / 2 and (1 + level) / 2 quantiles.
    None when the AUROC itself is undefined or fewer than two resamples hold both classes.
    """
    if resamples < 2 or not 0.0 < level < 1.0:
        raise ValueError(f"resamples must be >= 2 and level in (0, 1) (got {resamples}, {level})")
    s = _as_array(scores, "scores")
    y = _binary_labels(labels)
    estimate = auroc(s, y)  # checks the shapes
    owner_ids = np.arange(len(s)) if groups is None else np.asarray(groups)
    if owner_ids.shape != s.shape:
        raise ValueError(f"groups {owner_ids.shape} and scores {s.shape} differ in shape")
    if math.isnan(estimate):
        return None
    _, owner = np.unique(owner_ids, return_inverse=True)
    n_outputs = int(owner.max()) + 1
    rng = np.random.default_rng(seed)
    draws = rng.multinomial(n_outputs, np.full(n_outputs, 1.0 / n_outputs), size=resamples)
    weight = draws[:, owner].astype(np.float64)  # (resamples, items)
    levels, level_of = np.unique(s, return_inverse=True)
    pos = y == 1
    # per score level and resample: the drawn weight of negatives at that level, and below it
    neg_at = np.zeros((len(levels), resamples))
    np.add.at(neg_at, level_of[~pos], weight[:, ~pos].T)
    neg_below = np.cumsum(neg_at, axis=0) - neg_at
    # Mann-Whitney with weights: each positive beats the negatives below it, ties count 1/2
    beaten = neg_below[level_of[pos]] + 0.5 * neg_at[level_of[pos]]  # (positives, resamples)
    wins = (weight[:, pos].T * beaten).sum(axis=0)
    w_pos, w_neg = weight[:, pos].sum(axis=1), weight[:, ~pos].sum(axis=1)
    both = (w_pos > 0) & (w_neg > 0)
    if int(both.sum()) < 2:
        return None
    aucs = wins[both] / (w_pos[both] * w_neg[both])
    low, high = np.quantile(aucs, [(1.0 - level) / 2.0, (1.0 + level) / 2.0])
    return AurocInterval(estimate, float(aucs.std(ddof=1)), float(low), float(high))


def _auroc_row(
    split: str,
    metric: str,
    scores: ArrayLike,
    labels: ArrayLike,
    groups: ArrayLike | Sequence[Hashable] | None,
) -> EvalRow:
    """An AUROC row with its bootstrap interval (NaN value, dropped later, if undefined)."""
    y = _binary_labels(labels)
    interval = bootstrap_auroc(scores, y, groups)
    if interval is None:
        return EvalRow(split, metric, None, auroc(scores, y), None, len(y))
    return EvalRow(
        split,
        metric,
        None,
        interval.estimate,
        interval.stderr,
        len(y),
        ci_low=interval.low,
        ci_high=interval.high,
    )


def _share_row(
    split: str,
    metric: str,
    k: int | None,
    hits: npt.NDArray[np.bool_] | npt.NDArray[np.float64],
    clusters: Sequence[Hashable],
) -> EvalRow:
    """The share of `hits` (a half hit counts 1/2) with its standard error over `clusters` (NaN
    value, dropped later, when there is nothing to count)."""
    if len(hits) == 0:
        return EvalRow(split, metric, k, math.nan, None, 0)
    mean, se = clustered_mean_se(hits.astype(np.float64).tolist(), clusters)
    return EvalRow(split, metric, k, mean, se, len(hits))


def _named(questions: Sequence[Hashable] | None, n: int, what: str) -> Sequence[Hashable]:
    """The question of each of n items, or each item its own when none are named."""
    if questions is None:
        return range(n)
    if len(questions) != n:
        raise ValueError(f"{len(questions)} questions for {n} {what}: name one per {what[:-1]}")
    return questions


def accuracy(probs: ArrayLike, labels: ArrayLike, threshold: float = 0.5) -> float:
    """Share of predictions (prob >= threshold) equal to the 0/1 label."""
    p = _as_array(probs, "scores")
    y = _binary_labels(labels)
    if p.shape != y.shape:
        raise ValueError(f"scores {p.shape} and labels {y.shape} differ in shape")
    if len(y) == 0:
        return math.nan
    return float(((p >= threshold) == (y == 1)).mean())


def majority_baseline(labels: ArrayLike) -> float:
    """Accuracy of always predicting the more frequent class of `labels`."""
    y = _binary_labels(labels)
    if len(y) == 0:
        return math.nan
    rate = float(y.mean())
    return max(rate, 1.0 - rate)


def best_of_n_accuracy(scores: ArrayLike, correct: ArrayLike) -> float:
    """Accuracy when each prompt keeps its top-scored of N samples; scores, correct: (P, N).

    Tied top scores count as a uniform random pick among them (expected accuracy).
    """
    return float(_best_of_n_per_prompt(scores, correct).mean())


def _best_of_n_per_prompt(scores: ArrayLike, correct: ArrayLike) -> npt.NDArray[np.float64]:
    """Each prompt's expected correctness of its top-scored sample (ties: a uniform pick)."""
    s = _as_array(scores, "scores")
    c = _binary_labels(correct)
    if s.ndim != 2 or s.shape != c.shape:
        raise ValueError(f"scores {s.shape} and correct {c.shape} must both be (P, N)")
    top = s == s.max(axis=1, keepdims=True)
    return np.asarray((top * c).sum(axis=1) / top.sum(axis=1), dtype=np.float64)


def orm_eval_rows(
    probs: ArrayLike, labels: ArrayLike, split: str, questions: Sequence[Hashable] | None = None
) -> list[EvalRow]:
    """ORM AUROC, accuracy at 0.5 and the majority-class baseline on held-out outputs;
    questions: each output's question (uncertainty over questions), None: outputs."""
    y = _binary_labels(labels)
    p = _as_array(probs, "scores")
    if p.shape != y.shape:
        raise ValueError(f"scores {p.shape} and labels {y.shape} differ in shape")
    owners = _named(questions, len(y), "outputs")
    majority = 1.0 if y.mean() >= 0.5 else 0.0  # majority_baseline's class
    return _defined(
        [
            _auroc_row(split, "orm_auroc", p, y, None if questions is None else owners),
            _share_row(split, "orm_accuracy", None, (p >= 0.5) == (y == 1), owners),
            _share_row(split, "orm_majority_baseline", None, y == majority, owners),
        ]
    )


def pair_hits(
    scores: ArrayLike, labels: ArrayLike, groups: Sequence[Hashable]
) -> tuple[npt.NDArray[np.float64], list[Hashable]]:
    """One value per (right, wrong) pair of outputs of one group (a prompt's outputs): 1 when
    the right one scores higher, 1/2 on a tie, 0 below; and each pair's group. Their mean is
    the pairwise accuracy; within one group it is that group's AUROC."""
    s = _as_array(scores, "scores")
    y = _binary_labels(labels)
    if s.shape != y.shape or s.ndim != 1 or len(groups) != len(s):
        raise ValueError(f"scores {s.shape}, labels {y.shape}, {len(groups)} groups: one each")
    members: dict[Hashable, list[int]] = {}
    for i, group in enumerate(groups):
        members.setdefault(group, []).append(i)
    hits: list[npt.NDArray[np.float64]] = []
    owners: list[Hashable] = []
    for group, idx in members.items():
        right = s[idx][y[idx] == 1]
        wrong = s[idx][y[idx] == 0]
        margin = right[:, None] - wrong[None, :]  # (right, wrong) pairs
        hits.append(((margin > 0) + 0.5 * (margin == 0)).astype(np.float64).reshape(-1))
        owners += [group] * margin.size
    return np.concatenate([np.zeros(0), *hits]), owners


def pairwise_accuracy(scores: ArrayLike, labels: ArrayLike, groups: Sequence[Hashable]) -> float:
    """Share of (right, wrong) pairs of one group's outputs that the scores order right (ties
    1/2); NaN when no group has both a right and a wrong output."""
    hits, _ = pair_hits(scores, labels, groups)
    return float(hits.mean()) if len(hits) else math.nan


def orm_pair_rows(
    probs: ArrayLike, labels: ArrayLike, split: str, questions: Sequence[Hashable]
) -> list[EvalRow]:
    """The ORM's pairwise accuracy over the (right, wrong) pairs of each question's outputs,
    with its standard error over questions (no row when no question has a pair)."""
    hits, owners = pair_hits(probs, labels, questions)
    return _defined([_share_row(split, "orm_pair_accuracy", None, hits, owners)])


def prm_eval_rows(
    step_probs: Sequence[Sequence[float]],
    step_labels: Sequence[Sequence[float]],
    split: str,
    questions: Sequence[Hashable] | None = None,
) -> list[EvalRow]:
    """PRM step AUROC, step accuracy at 0.5 and the majority baseline; labels exact when
    known, else MC. questions: each output's question (uncertainty over questions), None:
    over outputs (the steps of one output are never counted as independent)."""
    if len(step_probs) != len(step_labels):
        raise ValueError(f"{len(step_probs)} score lists but {len(step_labels)} label lists")
    for i, (p, y) in enumerate(zip(step_probs, step_labels, strict=True)):
        if len(p) != len(y):
            raise ValueError(f"output {i}: {len(p)} step scores but {len(y)} step labels")
    output_owner = _named(questions, len(step_probs), "outputs")
    probs = np.array([v for row in step_probs for v in row], dtype=np.float64)
    labels = np.array([v for row in step_labels for v in row], dtype=np.float64)
    owner_of_step = [output_owner[i] for i, row in enumerate(step_probs) for _ in row]
    hard = labels >= 0.5  # soft MC labels: majority
    majority = float(labels.mean()) >= 0.5 if len(labels) else True
    return _defined(
        [
            _auroc_row(split, "prm_step_auroc", probs, hard.astype(np.float64), owner_of_step),
            _share_row(split, "prm_step_accuracy", None, (probs >= 0.5) == hard, owner_of_step),
            _share_row(split, "prm_step_majority_baseline", None, hard == majority, owner_of_step),
        ]
    )


def _defined(rows: list[EvalRow]) -> list[EvalRow]:
    """Rows whose metric is defined: an AUROC over one class (or any metric over nothing)
    has no row, so the store holds no NaN and a missing row reads as 'undefined'."""
    return [r for r in rows if not math.isnan(r.value)]


def best_of_n_rows(
    scores: ArrayLike, correct: ArrayLike, split: str, questions: Sequence[Hashable] | None = None
) -> list[EvalRow]:
    """Best-of-N accuracy reranking with the RM, beside the mean accuracy of one sample;
    questions: each prompt row's question (uncertainty over questions), None: prompts."""
    c = _binary_labels(correct)
    if c.ndim != 2:
        raise ValueError(f"correct must be (P, N) (got shape {c.shape})")
    n_prompts, n = c.shape
    owners = _named(questions, n_prompts, "prompts")
    best, best_err = clustered_mean_se(_best_of_n_per_prompt(scores, c).tolist(), owners)
    sample_owners = [owner for owner in owners for _ in range(n)]
    _, sample_err = clustered_mean_se(c.reshape(-1).tolist(), sample_owners)
    return [
        EvalRow(split, "best_of_n_accuracy", n, best, best_err, n_prompts),
        EvalRow(split, "sample_accuracy", n, float(c.mean()), sample_err, c.size),
    ]
