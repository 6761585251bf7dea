"""Stage functions `stage(ctx, iteration, progress) -> StageResult`, one module per stage.

A stage reads its inputs from the store and checkpoints (through the run context), calls the
component libraries, writes its rows inside one stage attempt and commits. A stage that
crashes leaves nothing visible; checkpoints it wrote are overwritten by the rerun. What each
stage declares (tables, config keys, checkpoints) is registered in flows/stage_table.py.
"""

from __future__ import annotations

from flows.stage_table import STAGES, StageFn, StageResult, StageSpec

__all__ = ["STAGES", "StageFn", "StageResult", "StageSpec"]
