"""Stage functions `stage(cfg, run, iteration, progress) -> StageResult`.

Each stage reads its inputs from the store and checkpoints, calls the component libraries,
writes its rows inside one stage attempt and commits. A stage that crashes leaves nothing
visible; checkpoints it wrote are overwritten by the rerun. The GRPO stage is in
`flows/grpo_stage.py` and the reward-model stage (training and drift) in `flows/rm_stage.py`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from flows.config import ItergrpoConfig
from flows.engines.sampling import stage_sampler
from flows.grpo_stage import grpo_stage
from flows.model_io import policy_at, save_model, to_device
from flows.names import EVAL_SPLIT, EVALUATE, LABEL, POLICY, ROLLOUT, TRAIN_SPLIT, WARM_START
from flows.progress import ProgressFn, log
from flows.rm_stage import labelled_samples, train_rm_stage
from flows.stage_io import StageResult, ckpt, derive_seed, metric_rows
from grpo_core.contracts.rollout import SamplingParams
from grpo_core.data.answers import extract_answer
from grpo_core.data.tasks.base import Task
from grpo_core.data.tasks.registry import make_task
from grpo_core.engines.hf_rollout import HFRolloutEngine
from grpo_core.model.evaluate import evaluate_policy
from grpo_core.model.policy import build_policy, format_prompt
from grpo_core.model.warm_start import warm_start
from reward_models.labelling import (
    PrmLabel,
    label_agreement,
    orm_labels,
    prm_labels_monte_carlo,
)
from storage.run_writer import RunWriter

__all__ = [
    "evaluate_stage",
    "grpo_stage",
    "label_stage",
    "rollout_stage",
    "train_rm_stage",
    "warm_start_stage",
]


def _evaluate(
    cfg: ItergrpoConfig,
    run: RunWriter,
    task: Task,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    policy_iteration: int,
) -> list[dict[str, Any]]:
    """Eval rows of policy_{policy_iteration} on the held-out prompts (the RMs are measured
    by the train_rm stage, see flows/rm_stage.py)."""
    problems = task.problems(EVAL_SPLIT, cfg.evaluation.n_prompts, seed=cfg.run.seed)
    # With cluster.ray_address: Ray shards that load policy_{policy_iteration} from the store.
    engine = stage_sampler(
        cfg, run, policy_iteration, "evaluate", model, tokenizer, cfg.rollout.batch_size
    )
    metrics = evaluate_policy(
        engine,
        tokenizer,
        task,
        problems,
        cfg.evaluation,
        seed=derive_seed(cfg.run.seed, EVALUATE, policy_iteration),
    )
    rows = [{"split": EVAL_SPLIT, **dataclasses.asdict(m)} for m in metrics]
    return [{"policy_iteration": policy_iteration, **row} for row in rows]


def warm_start_stage(
    cfg: ItergrpoConfig, run: RunWriter, iteration: int, progress: ProgressFn
) -> StageResult:
    """policy_0: the initial policy, SFT-warm-started on gold solutions, and its evaluation."""
    task = make_task(cfg.task)
    torch.manual_seed(derive_seed(cfg.run.seed, WARM_START))
    model, tokenizer = build_policy(cfg.policy)
    to_device(model, cfg)
    metrics: dict[str, float] = {}
    if cfg.run.warm_start:
        progress(0.0, "warm start (SFT)")
        ws = cfg.warm_start.model_copy(update={"seed": derive_seed(cfg.run.seed, WARM_START)})
        greedy = HFRolloutEngine(model, tokenizer, show_progress=False)
        done = warm_start(model, tokenizer, task, ws, greedy_sampler=greedy)
        metrics = {k: float(v) for k, v in done.items()}
    save_model(ckpt(cfg, run.run_id, POLICY, 0), model, tokenizer)
    progress(0.8, "evaluating policy_0")
    rows = _evaluate(cfg, run, task, model, tokenizer, policy_iteration=0)
    with run.stage(iteration, WARM_START) as attempt:
        attempt.write("eval", rows)
        attempt.write("metrics", metric_rows(WARM_START, metrics))
    return StageResult(WARM_START, iteration, metrics=metrics)


def rollout_stage(
    cfg: ItergrpoConfig, run: RunWriter, iteration: int, progress: ProgressFn
) -> StageResult:
    """G samples per train prompt from policy_k: the raw material of the RM labels."""
    task = make_task(cfg.task)
    model, tokenizer = policy_at(cfg, run, iteration)
    seed = derive_seed(cfg.run.seed, ROLLOUT, iteration)
    problems = task.problems(TRAIN_SPLIT, cfg.rollout.prompts, seed=seed)
    prompts = [format_prompt(tokenizer, p.question) for p in problems]
    params = SamplingParams(
        max_new_tokens=cfg.rollout.max_new_tokens,
        temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p,
    )
    engine = stage_sampler(cfg, run, iteration, "rollout", model, tokenizer, cfg.rollout.batch_size)
    batch = engine.generate(prompts, cfg.rollout.group_size, params, seed=seed)
    progress(0.9, f"writing {len(batch)} rollouts")
    # Relative to the store root, so a moved or copied store still resolves it.
    policy_dir = str(ckpt(cfg, run.run_id, POLICY, iteration).relative_to(run.store.root))
    rollouts = []
    for r, text in enumerate(batch.texts):
        i = batch.prompt_index[r]
        rollouts.append(
            {
                "problem_id": problems[i].problem_id,
                "sample_index": r % cfg.rollout.group_size,
                "prompt_text": prompts[i],
                "completion": text,
                "n_prompt_tokens": len(batch.prompt_ids[r]),
                "n_completion_tokens": len(batch.completion_ids[r]),
                "finish_reason": batch.finish_reasons[r],
                "temperature": params.temperature,
                "top_p": params.top_p,
                "seed": seed,
                "policy_checkpoint": policy_dir,
                "correct": task.is_correct(problems[i], text),
                "extracted_answer": extract_answer(text),
            }
        )
    accuracy = _mean(r["correct"] for r in rollouts)
    prompt_rows = [
        {
            "problem_id": p.problem_id,
            "split": TRAIN_SPLIT,
            "question": p.question,
            "answer": p.answer,
            "prompt_text": text,
        }
        for p, text in zip(problems, prompts, strict=True)
    ]
    with run.stage(iteration, ROLLOUT) as attempt:
        attempt.write("prompts", prompt_rows)
        attempt.write("rollouts", rollouts)
        attempt.write("metrics", metric_rows(ROLLOUT, {"accuracy": accuracy}))
    return StageResult(ROLLOUT, iteration, metrics={"accuracy": accuracy})


def label_stage(
    cfg: ItergrpoConfig, run: RunWriter, iteration: int, progress: ProgressFn
) -> StageResult:
    """ORM labels from the verifier; PRM labels by Math-Shepherd Monte-Carlo completions."""
    task = make_task(cfg.task)
    model, tokenizer = policy_at(cfg, run, iteration)
    samples = labelled_samples(run, iteration, tokenizer)
    orm_rows = orm_labels(task, samples)
    metrics = {"orm_positive_rate": _mean(r.label for r in orm_rows)}
    prm_rows: list[PrmLabel] = []
    if cfg.reward_models.use_prm:
        progress(
            0.1, f"Math-Shepherd labelling of {len(samples[: cfg.labelling.prm_outputs])} outputs"
        )
        engine = stage_sampler(
            cfg, run, iteration, "label", model, tokenizer, cfg.labelling.batch_size
        )
        prm_rows = prm_labels_monte_carlo(
            engine,
            tokenizer,
            task,
            samples[: cfg.labelling.prm_outputs],
            cfg.labelling,
            seed=derive_seed(cfg.run.seed, LABEL, iteration),
        )
        metrics["prm_steps"] = float(len(prm_rows))
        agreement = label_agreement(prm_rows, mc_only=True)
        if not math.isnan(agreement):
            metrics["mc_exact_agreement"] = agreement
    progress(0.9, f"writing {len(orm_rows)} ORM and {len(prm_rows)} PRM labels")
    with run.stage(iteration, LABEL) as attempt:
        attempt.write("orm_labels", [dataclasses.asdict(r) for r in orm_rows])
        if prm_rows:
            attempt.write("prm_labels", [dataclasses.asdict(r) for r in prm_rows])
        attempt.write("metrics", metric_rows(LABEL, metrics))
    return StageResult(LABEL, iteration, metrics=metrics)


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


def _mean(values: Iterable[Any]) -> float:
    vals = [float(v) for v in values]
    return sum(vals) / len(vals) if vals else math.nan


def evaluate_stage(
    cfg: ItergrpoConfig, run: RunWriter, iteration: int, progress: ProgressFn
) -> StageResult:
    """policy_{k+1} on held-out prompts: greedy accuracy, Pass@K, Maj@K."""
    task = make_task(cfg.task)
    model, tokenizer = policy_at(cfg, run, iteration + 1)
    rows = _evaluate(cfg, run, task, model, tokenizer, iteration + 1)
    progress(0.9, f"writing {len(rows)} eval rows")
    with run.stage(iteration, EVALUATE) as attempt:
        attempt.write("eval", rows)
    metrics = eval_summary(rows)
    log.info("policy_%d: %s", iteration + 1, {k: round(v, 4) for k, v in metrics.items()})
    return StageResult(EVALUATE, iteration, metrics=metrics)
