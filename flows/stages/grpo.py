"""The GRPO stage of iteration k: M steps of online sampling -> reward -> advantages -> update.

policy_k is both the starting point and the frozen reference (reference := policy); with
grpo.lora, new adapters on policy_k train and the reference is policy_k with them off. The
stage checkpoints weights, optimizer, RNG and the step cursor every `checkpoint_every`
steps; a rerun resumes from there, and the rows of finished steps travel with the
checkpoint so the committed `policy_samples` hold every step exactly once.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from flows.context import RunContext
from flows.engines.lora_updater import ADAPTERS_DIR, LoRAUpdater
from flows.engines.policy_updaters import LAUNCH_JOBS, PolicyUpdater, build_policy_updater
from flows.guards import (
    EQUAL_REWARDS,
    OVER_OPTIMISATION,
    GuardChecks,
    equal_rewards_finding,
    over_optimisation_finding,
)
from flows.interrupts import INTERRUPT
from flows.model_io import save_model
from flows.names import GRPO, GRPO_PROGRESS, POLICY, POLICY_LORA, TRAIN_SPLIT
from flows.progress import ProgressFn, log
from flows.stages.results import StageResult, mean, metric_rows
from grpo_core.algo.step import (
    SKIP_EXPLAINED,
    SKIPPED,
    StepOutcome,
    grpo_step,
    step_prompt_indices,
)
from grpo_core.contracts.rollout import RolloutEngine, Sampler
from grpo_core.data.tasks.base import Problem
from grpo_core.engines.gold_rollout import GoldSolutionRollout
from grpo_core.engines.registry import ROLLOUT_ENGINES
from grpo_core.model.lora import ADAPTER_WEIGHTS, LoRAAdapters
from grpo_core.model.policy import load_weights_into
from reward_models.config import RMKind
from reward_models.grpo_reward import GRPORewarder, models_needed
from reward_models.models import RewardModel
from storage.checkpoints import (
    TRAINING_STATE_FILE,
    capture_rng_state,
    load_training_state,
    restore_rng_state,
    save_checkpoint,
    save_training_state,
)

SAMPLES_FILE = "policy_samples.parquet"
METRICS_FILE = "metrics.parquet"


def _load_reward_models(ctx: RunContext, k: int) -> dict[RMKind, RewardModel]:
    """RM_k of each kind the scored reward parts and the estimator read."""
    grpo = ctx.cfg.grpo
    needed = models_needed(grpo.rewards, grpo.algo.process_supervision)
    return {
        kind: RewardModel.load(
            ctx.require_checkpoint(kind, k), device=ctx.device, dtype=ctx.cfg.reward_models.dtype
        ).eval()
        for kind in sorted(needed)
    }


def _save_progress(
    path: Path,
    model: Any,
    tokenizer: Any,
    updater: PolicyUpdater,
    next_step: int,
    sample_rows: list[dict[str, Any]],
    metric_log: list[dict[str, Any]],
    adapters: LoRAAdapters | None = None,
) -> None:
    def write(tmp: Path) -> None:
        if adapters is not None:  # LoRA: the base is policy_k's checkpoint, never changed
            adapters.save(tmp / ADAPTERS_DIR)
        else:
            model.save_pretrained(tmp, safe_serialization=True, state_dict=updater.weights())
        tokenizer.save_pretrained(tmp)
        save_training_state(
            tmp,
            optimizer_state=updater.save_state(tmp),
            rng_state=capture_rng_state(),
            extra={"next_step": next_step},
        )
        pq.write_table(pa.Table.from_pylist(sample_rows), tmp / SAMPLES_FILE)
        pq.write_table(pa.Table.from_pylist(metric_log), tmp / METRICS_FILE)

    save_checkpoint(path, write, overwrite=True)


def _resume_weights(path: Path, model: Any, adapters: LoRAAdapters | None = None) -> bool:
    """Load the weights of the stage's last progress checkpoint, if there is one (with LoRA:
    its adapters).

    Before the engine is built: DeepSpeed copies the weights into its optimizer at start.
    """
    if adapters is not None:
        saved = path / ADAPTERS_DIR
        if not (saved / ADAPTER_WEIGHTS).is_file() or adapters.differences(saved):
            if (path / TRAINING_STATE_FILE).is_file():  # grpo.lora changed since: start over
                log.info("GRPO: %s was saved with other grpo.lora settings; starting over", path)
            return False
        adapters.load(saved)
        return True
    if not (path / "config.json").is_file():
        return False
    load_weights_into(model, path)
    return True


def _resume_point(
    path: Path, updater: PolicyUpdater
) -> tuple[int, list[dict[str, Any]], list[dict[str, Any]]]:
    state = load_training_state(path)
    updater.load_state(path, state["optimizer_state"])
    restore_rng_state(state["rng_state"])
    samples = pq.read_table(path / SAMPLES_FILE).to_pylist()
    metrics = pq.read_table(path / METRICS_FILE).to_pylist()
    log.info("GRPO: resuming at step %d from %s", state["extra"]["next_step"], path)
    return int(state["extra"]["next_step"]), samples, metrics


def _training_data(
    ctx: RunContext,
    k: int,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    pool: list[Problem],
) -> tuple[Sampler, RolloutEngine | None]:
    """Where grpo.data_source says the outputs come from: the current policy (online), the
    warm-started policy_0 (RFT: the same distribution every step), or gold solutions (SFT);
    and the engine that must be given each updated policy (None: none follows the policy, or
    it samples `model` itself, which the update changes in place)."""
    cfg = ctx.cfg
    batch = cfg.rollout.batch_size
    if cfg.grpo.data_source == "online":
        name = cfg.engines.grpo_rollout
        checkpoint = ctx.checkpoint(POLICY, k)
        engine = ctx.engines.engine(
            name, "grpo", checkpoint, model, tokenizer, batch, show_progress=False
        )
        return engine, None if ROLLOUT_ENGINES[name].shares_model else engine
    if cfg.grpo.data_source == "gold":  # preflight checked every problem has a solution
        prompter = ctx.prompter(tokenizer)
        solutions = {prompter(p.question): prompter.gold_output(p.solution or "") for p in pool}
        return GoldSolutionRollout(tokenizer, solutions), None
    policy_0 = ctx.policy(0)[0].eval().requires_grad_(False)
    name, checkpoint = cfg.engines.rollout, ctx.checkpoint(POLICY, 0)
    engine = ctx.engines.engine(
        name, "grpo", checkpoint, policy_0, tokenizer, batch, show_progress=False
    )
    return engine, None


def grpo_stage(ctx: RunContext, iteration: int, progress: ProgressFn) -> StageResult:
    """M GRPO steps on policy_k against reference policy_k and rm_k -> policy_{k+1}."""
    cfg = ctx.cfg
    g, algo, k = cfg.grpo, cfg.grpo.algo, iteration
    policy_dir = ctx.require_checkpoint(POLICY, k)
    model, tokenizer = ctx.policy(k)
    adapters = None
    if g.lora.enabled:  # new adapters on policy_k each iteration: the base is the reference
        adapters = LoRAAdapters(model, g.lora, ctx.seed(GRPO, k, "lora"), policy_dir)
    reference = None
    if algo.beta > 0:  # beta = 0 never loads the reference (no forward pass, no memory)
        reference = (
            ctx.policy(k)[0].eval().requires_grad_(False)
            if adapters is None
            else adapters.reference()  # the adapted model with adapters off: no second copy
        )
    reward_models = _load_reward_models(ctx, k)
    progress_dir = ctx.checkpoint(GRPO_PROGRESS, k)
    resumed = _resume_weights(progress_dir, model, adapters)
    jobs_dir = ctx.checkpoint(LAUNCH_JOBS, k)
    updater = build_policy_updater(
        cfg.engines, g, ctx.threads, model, reference, policy_dir, jobs_dir, cfg.policy.dtype
    )
    if adapters is not None:
        updater = LoRAUpdater(updater, adapters)
    start = 0
    sample_rows: list[dict[str, Any]] = []
    metric_log: list[dict[str, Any]] = []
    if resumed:
        start, sample_rows, metric_log = _resume_point(progress_dir, updater)
    pool = ctx.task.problems(TRAIN_SPLIT, g.steps * g.prompts_per_step, seed=ctx.seed(GRPO, k))
    sampler, follower = _training_data(ctx, k, model, tokenizer, pool)
    prompter = ctx.prompter(tokenizer)
    updated = resumed  # the policy differs from what the sampling engine was given
    try:
        rewarder = GRPORewarder(
            ctx.task,
            g.rewards,
            tokenizer,
            g.max_new_tokens,
            reward_models,
            algo.process_supervision,
        )
        for step in range(start, g.steps):
            if updated and follower is not None:  # the engine samples the updated policy
                follower.receive_weights(updater.weights() or model.state_dict())
            indices = step_prompt_indices(len(pool), step, g.prompts_per_step)
            problems = [pool[i] for i in indices]
            prompts = [prompter(p.question) for p in problems]
            out = grpo_step(
                prompts,
                sampler,
                functools.partial(rewarder, problems, prompts),
                updater,
                algo,
                group_size=g.group_size,
                max_new_tokens=g.max_new_tokens,
                pad_token_id=tokenizer.pad_token_id,
                seed=ctx.seed(GRPO, k, step),
                where=f"GRPO iteration {k}, step {step}",
            )
            updated = updated or out.skipped is None
            stats = out.stats
            metric_log += metric_rows(GRPO, stats, step)
            sample_rows += _sample_rows(step, problems, out, g.group_size)
            _report_step(k, step, g.steps, out, progress)
            done = step + 1
            if done % g.checkpoint_every == 0 or done == g.steps or INTERRUPT.requested:
                _save_progress(
                    progress_dir, model, tokenizer, updater, done, sample_rows, metric_log, adapters
                )
            INTERRUPT.check()
        save_model(ctx.checkpoint(POLICY, k + 1), model, tokenizer, updater.weights())
        if adapters is not None:  # policy_{k+1} is stored merged; the adapters beside it
            save_checkpoint(ctx.checkpoint(POLICY_LORA, k + 1), adapters.save, overwrite=True)
    finally:
        updater.close()
    checks = check_step_rewards(GuardChecks(cfg.guards, ctx.run_id), k, metric_log)
    metric_log += metric_rows(GRPO, checks.metrics)
    with ctx.run.stage(k, GRPO) as attempt:
        attempt.write("policy_samples", sample_rows)
        attempt.write("metrics", metric_log)
    # means over the steps that report each figure (a step skipped without prompts has none)
    summary = {
        name: mean(r["value"] for r in metric_log if r["name"] == name)
        for name in ("reward_mean", "rm_reward_mean", "verifier_accuracy", "kl")
        if any(r["name"] == name for r in metric_log)
    }
    skipped = sum(1 for r in metric_log if r["name"] == SKIPPED)
    if skipped:
        summary["skipped_steps"] = float(skipped)
    return StageResult(GRPO, k, metrics=summary, warnings=checks.warnings)


def check_step_rewards(
    checks: GuardChecks, k: int, metric_log: list[dict[str, Any]]
) -> GuardChecks:
    """The guards on what the stage's steps were paid: the learned reward over-paying against
    the verifier (steps with an RM reward), and steps with no reward contrast at all."""
    per_step: dict[int, dict[str, float]] = {}
    for row in metric_log:
        if row["step"] is not None:
            per_step.setdefault(int(row["step"]), {})[str(row["name"])] = float(row["value"])
    steps = [per_step[s] for s in sorted(per_step)]
    paid = [s for s in steps if "rm_reward_mean" in s]
    guards = checks.guards
    if paid:
        finding = over_optimisation_finding(
            [s["rm_reward_mean"] for s in paid],
            [s["verifier_accuracy"] for s in paid],
            guards.over_optimisation_gap,
            guards.over_optimisation_steps,
            k,
        )
        checks.check(OVER_OPTIMISATION, finding)
    shares = [s["equal_reward_groups"] for s in steps if "equal_reward_groups" in s]
    checks.check(EQUAL_REWARDS, equal_rewards_finding(shares, guards.equal_rewards_share, k))
    return checks


def _report_step(k: int, step: int, steps: int, out: StepOutcome, progress: ProgressFn) -> None:
    """The progress line and log line of one step (a skipped step says why)."""
    stats = out.stats
    if out.skipped is not None:
        progress((step + 1) / steps, f"GRPO step {step + 1}/{steps}: skipped ({out.skipped})")
        log.warning(
            "GRPO iter %d step %d: skipped, no update (%s: %s)",
            k,
            step,
            out.skipped,
            SKIP_EXPLAINED[out.skipped],
        )
        return
    progress((step + 1) / steps, f"GRPO step {step + 1}/{steps}: reward {stats['reward_mean']:.3f}")
    log.info(
        "GRPO iter %d step %d: reward %.3f (RM %.3f) verifier acc %.3f kl %.4f",
        k,
        step,
        stats["reward_mean"],
        stats.get("rm_reward_mean", float("nan")),
        stats["verifier_accuracy"],
        stats.get("kl", float("nan")),
    )


def _sample_rows(
    step: int, problems: list[Problem], out: StepOutcome, group_size: int
) -> list[dict[str, Any]]:
    """Rows of `policy_samples` for one step: each output, its rewards and its mean advantage."""
    batch, rewards, advantages, stats = out.batch, out.rewards, out.advantages, out.stats
    lengths = [len(ids) for ids in batch.completion_ids]
    seq_adv = [
        float(advantages[r, : max(n, 1)].mean()) if n else 0.0 for r, n in enumerate(lengths)
    ]
    return [
        {
            "step": step,
            "problem_id": problems[batch.prompt_index[r]].problem_id,
            "sample_index": r % group_size,
            "completion": batch.texts[r],
            "reward": float(rewards.per_output[r]),
            "reward_parts": {name: float(score[r]) for name, score in rewards.parts.items()},
            "reward_rm": None if rewards.rm is None else float(rewards.rm[r]),
            "advantage": seq_adv[r],
            "kl": stats.get("kl", 0.0),
            "ratio_mean": stats.get("ratio_mean", 1.0),
            "ratio_max": stats.get("ratio_max", 1.0),
            "n_completion_tokens": lengths[r],
            "correct": bool(rewards.verifier[r] > 0),
        }
        for r in range(len(batch))
    ]
