"""Reward-model evaluation: AUROC, accuracy, majority baseline, best-of-N; rows for `eval`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch

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


def auroc_stderr(auc: float, n_pos: int, n_neg: int) -> float | None:
    """Hanley-McNeil (1982) standard error of an AUROC; None when it is undefined."""
    if math.isnan(auc) or n_pos == 0 or n_neg == 0:
        return None
    q1 = auc / (2.0 - auc)
    q2 = 2.0 * auc * auc / (1.0 + auc)
    var = (auc * (1.0 - auc) + (n_pos - 1) * (q1 - auc * auc) + (n_neg - 1) * (q2 - auc * auc)) / (
        n_pos * n_neg
    )
    return math.sqrt(max(var, 0.0))


def _proportion_stderr(p: float, n: int) -> float | None:
    return math.sqrt(p * (1.0 - p) / n) if n > 0 else None


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
    s = _as_array(scores, "scores")
    c = _binary_labels(correct)
    if s.ndim != 2 or s.shape != c.shape:
        raise ValueError(f"scores {s.shape} and correct {c.shape} must both be (P, N)")
    top = s == s.max(axis=1, keepdims=True)
    return float(((top * c).sum(axis=1) / top.sum(axis=1)).mean())


def orm_eval_rows(probs: ArrayLike, labels: ArrayLike, split: str) -> list[EvalRow]:
    """ORM AUROC, accuracy at 0.5 and the majority-class baseline on held-out outputs."""
    y = _binary_labels(labels)
    n = len(y)
    n_pos = int(y.sum())
    auc = auroc(probs, y)
    acc = accuracy(probs, y)
    base = majority_baseline(y)
    return _defined(
        [
            EvalRow(split, "orm_auroc", None, auc, auroc_stderr(auc, n_pos, n - n_pos), n),
            EvalRow(split, "orm_accuracy", None, acc, _proportion_stderr(acc, n), n),
            EvalRow(split, "orm_majority_baseline", None, base, _proportion_stderr(base, n), n),
        ]
    )


def prm_eval_rows(
    step_probs: Sequence[Sequence[float]], step_labels: Sequence[Sequence[float]], split: str
) -> list[EvalRow]:
    """PRM step AUROC, step accuracy at 0.5 and the majority baseline; labels exact when
    known, else MC."""
    if len(step_probs) != len(step_labels):
        raise ValueError(f"{len(step_probs)} score lists but {len(step_labels)} label lists")
    for i, (p, y) in enumerate(zip(step_probs, step_labels, strict=True)):
        if len(p) != len(y):
            raise ValueError(f"output {i}: {len(p)} step scores but {len(y)} step labels")
    probs = np.array([v for row in step_probs for v in row], dtype=np.float64)
    labels = np.array([v for row in step_labels for v in row], dtype=np.float64)
    n = len(labels)
    n_pos = int((labels >= 0.5).sum())
    auc = auroc(probs, (labels >= 0.5).astype(np.float64))  # soft MC labels: majority
    acc = accuracy(probs, labels)
    base = majority_baseline(labels)
    return _defined(
        [
            EvalRow(split, "prm_step_auroc", None, auc, auroc_stderr(auc, n_pos, n - n_pos), n),
            EvalRow(split, "prm_step_accuracy", None, acc, _proportion_stderr(acc, n), n),
            EvalRow(
                split, "prm_step_majority_baseline", None, base, _proportion_stderr(base, n), n
            ),
        ]
    )


def _defined(rows: list[EvalRow]) -> list[EvalRow]:
    """Rows whose metric is defined: an AUROC over one class (or any metric over nothing)
    has no row, so the store holds no NaN and a missing row reads as 'undefined'."""
    return [r for r in rows if not math.isnan(r.value)]


def best_of_n_rows(scores: ArrayLike, correct: ArrayLike, split: str) -> list[EvalRow]:
    """Best-of-N accuracy reranking with the RM, beside the mean accuracy of one sample."""
    c = _binary_labels(correct)
    if c.ndim != 2:
        raise ValueError(f"correct must be (P, N) (got shape {c.shape})")
    n_prompts, n = c.shape
    best = best_of_n_accuracy(scores, c)
    mean = float(c.mean())
    best_err = _proportion_stderr(best, n_prompts)
    return [
        EvalRow(split, "best_of_n_accuracy", n, best, best_err, n_prompts),
        EvalRow(split, "sample_accuracy", n, mean, _proportion_stderr(mean, c.size), c.size),
    ]
