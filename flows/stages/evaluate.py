"""The evaluation stage: policy_{k+1} on held-out prompts (greedy accuracy, Pass@K, Maj@K).
The warm start evaluates policy_0 the same way."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from flows.context import RunContext
from flows.names import EVAL_SPLIT, EVALUATE
from flows.progress import ProgressFn, log
from flows.stage_results import StageResult
from grpo_core.contracts.progress import rounded
from grpo_core.model.evaluate import evaluate_policy
from storage.run_writer import StageAttempt


@dataclass(frozen=True)
class PolicyEvalRows:
    """A policy's evaluation as stored: its `eval` rows and its `eval_problems` rows."""

    metrics: list[dict[str, Any]]
    problems: list[dict[str, Any]]

    def write(self, attempt: StageAttempt) -> None:
        attempt.write("eval", self.metrics)
        attempt.write("eval_problems", self.problems)


def policy_eval_rows(
    ctx: RunContext,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    policy_iteration: int,
) -> PolicyEvalRows:
    """Eval rows of policy_{policy_iteration} on the held-out prompts, and each problem's
    values (the RMs are measured by the train_rm stage, see flows/stages/train_rm.py)."""
    cfg = ctx.cfg
    problems = ctx.task.problems(EVAL_SPLIT, cfg.evaluation.n_prompts, seed=cfg.run.seed)
    # With cluster.ray_address: Ray shards that load policy_{policy_iteration} from the store.
    engine = ctx.sampler("evaluate", policy_iteration, model, tokenizer, cfg.rollout.batch_size)
    evaluation = evaluate_policy(
        engine,
        ctx.prompter(tokenizer),
        ctx.task,
        problems,
        cfg.evaluation,
        seed=ctx.seed(EVALUATE, policy_iteration),
    )
    at = {"policy_iteration": policy_iteration, "split": EVAL_SPLIT}
    return PolicyEvalRows(
        [{**at, **dataclasses.asdict(m)} for m in evaluation.metrics],
        [
            {**at, "problem_index": p.index, "problem_id": p.problem_id, "question": p.question}
            | {"metric": p.metric, "k": p.k, "value": p.value}
            for p in evaluation.problems
        ],
    )


def eval_summary(rows: list[dict[str, Any]]) -> dict[str, float]:
    """One value per metric: scalar ones as they are, K-metrics at the largest K ('maj@8')."""
    top_k = max((int(r["k"]) for r in rows if r.get("k") is not None), default=None)
    summary: dict[str, float] = {}
    for r in rows:
        if r.get("k") is None:
            summary[r["metric"]] = float(r["value"])
        elif int(r["k"]) == top_k:
            summary[str(r["metric"]).replace("@k", f"@{top_k}")] = float(r["value"])
    return summary


def evaluate_stage(ctx: RunContext, iteration: int, progress: ProgressFn) -> StageResult:
    """policy_{k+1} on held-out prompts: greedy accuracy, Pass@K, Maj@K."""
    model, tokenizer = ctx.policy(iteration + 1)
    rows = policy_eval_rows(ctx, model, tokenizer, iteration + 1)
    progress(0.9, f"writing {len(rows.metrics)} eval rows")
    with ctx.run.stage(iteration, EVALUATE) as attempt:
        rows.write(attempt)
    metrics = eval_summary(rows.metrics)
    log.info("policy_%d: %s", iteration + 1, rounded(metrics))
    return StageResult(EVALUATE, iteration, metrics=metrics)
