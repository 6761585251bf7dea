"""The warm-start stage: policy_0, the initial policy, SFT-warm-started on gold solutions (as
DeepSeekMath starts RL from an instruction-tuned model), saved and evaluated."""

from __future__ import annotations

import torch

from flows.context import RunContext
from flows.model_io import save_model, to_device
from flows.names import POLICY, WARM_START
from flows.progress import ProgressFn
from flows.stage_results import StageResult, metric_rows
from flows.stages.evaluate import policy_eval_rows
from grpo_core.engines.hf_rollout import HFRolloutEngine
from grpo_core.model.policy import build_policy
from grpo_core.model.warm_start import warm_start


def warm_start_stage(ctx: RunContext, iteration: int, progress: ProgressFn) -> StageResult:
    """policy_0: the initial policy, SFT-warm-started on gold solutions, and its evaluation."""
    cfg = ctx.cfg
    torch.manual_seed(ctx.seed(WARM_START))
    model, tokenizer = build_policy(cfg.policy)
    to_device(model, ctx.device)
    metrics: dict[str, float] = {}
    if cfg.run.warm_start:
        progress(0.0, "warm start (SFT)")
        ws = cfg.warm_start.model_copy(update={"seed": ctx.seed(WARM_START)})
        greedy = HFRolloutEngine(model, tokenizer, show_progress=False)
        done = warm_start(
            model, tokenizer, ctx.task, ws, greedy_sampler=greedy, prompter=ctx.prompter(tokenizer)
        )
        metrics = {k: float(v) for k, v in done.items()}
    save_model(ctx.checkpoint(POLICY, 0), model, tokenizer)
    progress(0.8, "evaluating policy_0")
    rows = policy_eval_rows(ctx, model, tokenizer, policy_iteration=0)
    with ctx.run.stage(iteration, WARM_START) as attempt:
        rows.write(attempt)
        attempt.write("metrics", metric_rows(WARM_START, metrics))
    return StageResult(WARM_START, iteration, metrics=metrics)
