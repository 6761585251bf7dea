"""Evaluation as the paper reports it: greedy accuracy, Pass@K (unbiased), Maj@K, per-K curves.

Maj@K tie rule: among answers with the most votes, the one whose first vote comes earliest
in sample order wins; samples without a `####` answer do not vote.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

from grpo_core.contracts.rollout import Sampler, SamplingParams
from grpo_core.data.answer_formats import ANSWER_FORMATS, AnswerFormat
from grpo_core.data.answers import normalize_number
from grpo_core.data.tasks.base import Problem, Task
from grpo_core.model.config import EvalConfig


@dataclass(frozen=True)
class MetricRow:
    """One number of an evaluation: `metric` at `k` (1 where K does not apply) with its SE."""

    metric: str
    k: int
    value: float
    stderr: float
    n: int


@dataclass(frozen=True)
class ProblemScore:
    """One problem's value of a per-problem metric (the metric's row is their mean): the
    pairing unit when two policies are compared on the same problems. `index` is the problem's
    position in the evaluated list (a list drawn with repeats may hold a question twice), and
    `question` its text: comparisons count a question's draws as one cluster."""

    index: int
    problem_id: str
    metric: str
    k: int
    value: float
    question: str = ""


@dataclass(frozen=True)
class PolicyEvaluation:
    """An evaluation's metric rows and, for the metrics averaged over problems, each problem's
    value (greedy and sampled accuracy, Pass@K and Maj@K)."""

    metrics: list[MetricRow]
    problems: list[ProblemScore]


GSM8K = ANSWER_FORMATS["gsm8k"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased Pass@K from n samples with c correct: 1 - C(n-c, k) / C(n, k), product form."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n (got n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def majority_answer(
    answers: Sequence[str | None], canonical: Callable[[str], str] = normalize_number
) -> str | None:
    """The most voted answer, votes grouped by `canonical` (answers stating the same value
    count together); ties go to the group voted first; its first answer as stated; None if
    nobody voted."""
    stated = [a for a in answers if a is not None]
    if not stated:
        return None
    keys = [canonical(a) for a in stated]
    counts = Counter(keys)
    top = max(counts.values())
    return next(a for a, key in zip(stated, keys, strict=True) if counts[key] == top)


def maj_at_k(
    answers: Sequence[str | None], gold: str, k: int, answer_format: AnswerFormat = GSM8K
) -> float:
    """1.0 when the majority answer of the first k samples equals `gold` in `answer_format`."""
    if not 1 <= k <= len(answers):
        raise ValueError(f"maj_at_k needs 1 <= k <= {len(answers)} samples (got k={k})")
    winner = majority_answer(answers[:k], answer_format.canonical)
    return float(winner is not None and answer_format.equal(gold, winner))


def clustered_mean_se(values: Sequence[float], clusters: Sequence[Hashable]) -> tuple[float, float]:
    """The mean of `values` and its standard error with values of one cluster counted as
    correlated (the cluster-robust estimate, small-sample factor C / (C - 1)):

        se^2 = C / (C - 1) * sum_c (sum_{i in c} (x_i - mean))^2 / n^2

    Evaluation draws problems with repeats (the demo's 300 are 24 different questions), and a
    question's draws are not independent: its greedy output is the same every time. With every
    cluster a single value this is the usual s / sqrt(n); repeating every value k times leaves
    it unchanged, where the usual formula would shrink by sqrt(k). 0.0 with fewer than two
    clusters (nothing to estimate the spread from)."""
    n = len(values)
    if n != len(clusters):
        raise ValueError(
            f"clustered_mean_se needs one cluster per value (got {n} and {len(clusters)})"
        )
    if n == 0:
        raise ValueError("clustered_mean_se needs at least one value")
    mean = sum(values) / n
    residuals: dict[Hashable, float] = {}
    for value, cluster in zip(values, clusters, strict=True):
        residuals[cluster] = residuals.get(cluster, 0.0) + (value - mean)
    c = len(residuals)
    if c < 2:
        return mean, 0.0
    var = c / (c - 1) * sum(r * r for r in residuals.values()) / (n * n)
    return mean, math.sqrt(var)


def paired_difference(
    a: Sequence[float], b: Sequence[float], clusters: Sequence[Hashable]
) -> tuple[float, float]:
    """The mean of the per-problem differences a_i - b_i of two evaluations of the same problems
    (problem i's value under each), and its standard error over questions: clustered_mean_se of
    the differences, problem i in cluster clusters[i].

    Pairing is what makes a change between two policies measurable on few questions: what the
    two share (a question's difficulty) cancels in a_i - b_i, so the standard error is that of
    the differences, not of either accuracy. 0.0 when every question changed alike."""
    if not len(a) == len(b) == len(clusters):
        raise ValueError(
            "paired_difference needs one value on each side and one cluster per problem "
            f"(got {len(a)}, {len(b)} and {len(clusters)})"
        )
    return clustered_mean_se([x - y for x, y in zip(a, b, strict=True)], clusters)


def evaluate_policy(
    engine: Sampler,
    prompter: Callable[[str], str],
    task: Task,
    problems: list[Problem],
    cfg: EvalConfig,
    seed: int,
) -> PolicyEvaluation:
    """Greedy accuracy / format rate / length, then sampled accuracy, Pass@K and Maj@K per K.

    Standard errors are over questions (clustered_mean_se): the draws of a question drawn
    several times are one cluster. Maj@K averages the n_samples // K disjoint blocks of K
    consecutive samples of each problem (unbiased, less noisy than the first block alone).
    Correctness uses `task.is_correct`.
    """
    problems = problems[: cfg.n_prompts]
    prompts = [prompter(p.question) for p in problems]
    greedy = engine.generate(
        prompts, 1, SamplingParams(cfg.max_new_tokens, temperature=0.0), seed=seed
    )
    sampled = engine.generate(
        prompts,
        cfg.n_samples,
        SamplingParams(cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p),
        seed=seed,
    )
    ns = cfg.n_samples
    rows: list[MetricRow] = []
    scores: list[ProblemScore] = []
    questions = [p.question for p in problems]
    sample_questions = [q for q in questions for _ in range(ns)]

    def add(metric: str, k: int, values: Sequence[float], clusters: list[str] = questions) -> None:
        mean, se = clustered_mean_se(values, clusters)
        rows.append(MetricRow(metric, k, mean, se, len(values)))

    def add_per_problem(metric: str, k: int, values: Sequence[float]) -> None:
        add(metric, k, values)
        scores.extend(
            ProblemScore(i, p.problem_id, metric, k, float(v), p.question)
            for i, (p, v) in enumerate(zip(problems, values, strict=True))
        )

    add_per_problem(
        "greedy_accuracy",
        1,
        [float(task.is_correct(p, t)) for p, t in zip(problems, greedy.texts, strict=True)],
    )
    fmt = task.answer_format
    add("greedy_format_rate", 1, [fmt.ends_with_answer(t) for t in greedy.texts])
    add("greedy_mean_length", 1, [float(len(c)) for c in greedy.completion_ids])
    correct = [
        [task.is_correct(p, sampled.texts[i * ns + j]) for j in range(ns)]
        for i, p in enumerate(problems)
    ]
    add_per_problem("sampled_accuracy", 1, [sum(c) / ns for c in correct])
    add("format_rate", 1, [fmt.ends_with_answer(t) for t in sampled.texts], sample_questions)
    add("mean_length", 1, [float(len(c)) for c in sampled.completion_ids], sample_questions)
    add("stop_rate", 1, [float(r == "stop") for r in sampled.finish_reasons], sample_questions)
    for k in cfg.k_values():
        add_per_problem("pass@k", k, [pass_at_k(ns, sum(c), k) for c in correct])
        maj = []
        for i, p in enumerate(problems):
            texts = sampled.texts[i * ns : (i + 1) * ns]
            answers = [fmt.extract(t) for t in texts]
            blocks = [answers[b : b + k] for b in range(0, ns - k + 1, k)]
            maj.append(sum(maj_at_k(blk, p.answer, k, fmt) for blk in blocks) / len(blocks))
        add_per_problem("maj@k", k, maj)
    return PolicyEvaluation(rows, scores)
