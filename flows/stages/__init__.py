"""Stage functions `stage(ctx, iteration, progress) -> StageResult`, one module per stage.

Each stage reads its inputs from the store and checkpoints (through the run context),
calls the component libraries, writes its rows inside one stage attempt and commits. A stage
that crashes leaves nothing visible; checkpoints it wrote are overwritten by the rerun.
STAGE_FUNCTIONS is the table the loop runs, by the stage names of flows/names.py.
"""

from __future__ import annotations

from collections.abc import Callable

from flows.context import RunContext
from flows.names import EVALUATE, GRPO, LABEL, ROLLOUT, TRAIN_RM, WARM_START
from flows.progress import ProgressFn
from flows.stages.evaluate import evaluate_stage
from flows.stages.grpo import grpo_stage
from flows.stages.label import label_stage
from flows.stages.results import StageResult
from flows.stages.rollout import rollout_stage
from flows.stages.train_rm import train_rm_stage
from flows.stages.warm_start import warm_start_stage

StageFn = Callable[[RunContext, int, ProgressFn], StageResult]

STAGE_FUNCTIONS: dict[str, StageFn] = {
    WARM_START: warm_start_stage,
    ROLLOUT: rollout_stage,
    LABEL: label_stage,
    TRAIN_RM: train_rm_stage,
    GRPO: grpo_stage,
    EVALUATE: evaluate_stage,
}

__all__ = ["STAGE_FUNCTIONS", "StageFn", "StageResult"]
