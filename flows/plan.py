"""The plan of a run: its (stage, iteration) pairs in execution order, read by the loop, forks
and ablations. The warm start runs first, then `run.stages` in every iteration; the config
checks that each stage finds what it reads (flows/stage_registry.py)."""

from __future__ import annotations

from flows.config import ItergrpoConfig
from flows.stage_table import STAGES, Stage, stage_plan


def planned_stages(cfg: ItergrpoConfig) -> list[Stage]:
    """Every (stage, iteration) of the run, in order. The warm start also evaluates policy_0."""
    return stage_plan(cfg.run.stages, cfg.run.iterations)


def ends_an_iteration(cfg: ItergrpoConfig, stage: str) -> bool:
    """Whether `stage` is the last of each iteration (once it commits, the iteration is done)."""
    return stage == cfg.run.stages[-1]


def plan_writes(cfg: ItergrpoConfig, role: str) -> bool:
    """Whether a stage of the run writes checkpoints of `role` (a reward model's source, say,
    is read only by a plan with a stage that trains it)."""
    names = {name for name, _ in planned_stages(cfg)}
    return any(r == role for name in names for r, _ in STAGES[name].writes)
