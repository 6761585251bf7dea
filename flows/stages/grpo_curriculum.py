"""grpo.curriculum: the GRPO stage's pool drawn by pass rate over the run's earlier iterations,
and the problem_pass_rates rows its commit stores (docs/curriculum.md)."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from statistics import mean

from flows.context import RunContext
from flows.names import GRPO, TRAIN_SPLIT
from flows.progress import log
from flows.stages.grpo_progress import Row
from grpo_core.data.curriculum import difficulty_weight, question_key, weighted_draw
from grpo_core.data.tasks.base import Problem
from storage.store import RunStore


@dataclass(frozen=True)
class PoolDraw:
    """The stage's problems and, under the curriculum, what each question was drawn with: its
    outcomes in the earlier iterations (correct, samples) and its weight."""

    problems: list[Problem]
    prior: dict[str, tuple[int, int]] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)

    @property
    def weighted(self) -> bool:
        return bool(self.weights)


def earlier_outcomes(store: RunStore, run_id: str, iteration: int) -> dict[str, tuple[int, int]]:
    """(correct, samples) of each question over the GRPO stages of iterations < `iteration`."""
    rows = store.read(
        "problem_pass_rates",
        run_id=run_id,
        iterations=range(iteration),
        columns=["question_key", "n_correct", "n_samples"],
    ).to_pylist()
    totals: dict[str, tuple[int, int]] = {}
    for r in rows:
        correct, samples = totals.get(r["question_key"], (0, 0))
        totals[r["question_key"]] = (correct + r["n_correct"], samples + r["n_samples"])
    return totals


def draw_pool(ctx: RunContext, k: int) -> PoolDraw:
    """Iteration k's steps x prompts_per_step problems: the task's uniform draw, or under
    grpo.curriculum a weighted draw from `candidates` times as many (seeded by the stage)."""
    g = ctx.cfg.grpo
    count, seed, settings = g.steps * g.prompts_per_step, ctx.seed(GRPO, k), g.curriculum
    if settings.mode == "off":
        return PoolDraw(ctx.task.problems(TRAIN_SPLIT, count, seed=seed))
    prior = earlier_outcomes(ctx.store, ctx.run_id, k)
    candidates = ctx.task.problems(TRAIN_SPLIT, settings.candidates * count, seed=seed)
    keys = [question_key(p.question) for p in candidates]
    weights = [difficulty_weight(*prior.get(key, (0, 0)), settings.floor) for key in keys]
    picked = weighted_draw(weights, count, random.Random(f"curriculum/{seed}"))
    draw = PoolDraw(
        [candidates[i] for i in picked],
        {keys[i]: prior[keys[i]] for i in picked if keys[i] in prior},
        {keys[i]: weights[i] for i in picked},
    )
    seen = sum(1 for i in picked if keys[i] in prior)
    drawn_weight = mean(weights[i] for i in picked)
    log.info(
        f"curriculum: {count} of {len(candidates)} candidate problems drawn by pass rate; "
        f"{seen} seen in earlier iterations, mean weight {drawn_weight:.3f} drawn "
        f"({mean(weights):.3f} over all candidates)"
    )
    return draw


def pass_rate_rows(draw: PoolDraw, sample_rows: list[Row]) -> list[Row]:
    """One row per question the stage sampled: its outcomes here and what it was drawn with.
    Empty without the curriculum."""
    if not draw.weighted:
        return []
    question_of = {p.problem_id: p.question for p in draw.problems}
    draws = Counter(question_key(p.question) for p in draw.problems)
    outcomes: dict[str, list[bool]] = {}
    for r in sample_rows:
        question = question_of[str(r["problem_id"])]
        outcomes.setdefault(question, []).append(bool(r["correct"]))
    rows: list[Row] = []
    for question, correct in outcomes.items():
        key = question_key(question)
        prior_correct, prior_samples = draw.prior.get(key, (0, 0))
        rows.append(
            {
                "question_key": key,
                "question": question,
                "draws": draws[key],
                "n_samples": len(correct),
                "n_correct": sum(correct),
                "pass_rate": sum(correct) / len(correct),
                "prior_samples": prior_samples,
                "prior_correct": prior_correct,
                "weight": draw.weights[key],
            }
        )
    return rows
