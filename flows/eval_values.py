"""The evaluation's stored metric names and one evaluation's per-problem values in problem
order: what the run's report (flows/policy_change.py) and the ablation (flows/ablate/) share."""

from __future__ import annotations

from dataclasses import dataclass

# Names of the per-problem eval metrics (grpo_core/model/evaluate.py); '@k' ones per K.
GREEDY = "greedy_accuracy"
SAMPLED = "sampled_accuracy"
MAJ, PASS = "maj@k", "pass@k"


@dataclass(frozen=True)
class ProblemValues:
    """One seed's per-problem values of a metric, in problem order, with the problems' ids
    (two arms pair on a seed only if they saw the same problems) and questions (None where
    stored before questions were: then the pairing counts problems, not questions)."""

    problem_ids: tuple[str, ...]
    values: tuple[float, ...]
    questions: tuple[str | None, ...] = ()


def in_problem_order(found: list[tuple[int, str, float, str | None]]) -> ProblemValues:
    """(problem_index, problem_id, value, question) entries of one evaluation as ProblemValues."""
    ordered = sorted(found, key=lambda e: e[:2])  # (problem_index, problem_id, value, question)
    return ProblemValues(
        tuple(e[1] for e in ordered), tuple(e[2] for e in ordered), tuple(e[3] for e in ordered)
    )
