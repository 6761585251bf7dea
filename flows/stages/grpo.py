"""The GRPO stage of iteration k: M steps of online sampling -> reward -> advantages -> update.

policy_k is both the starting point and the frozen reference (reference := policy); with
grpo.lora, new adapters on policy_k train and the reference is policy_k with them off. The
stage checkpoints weights, optimizer, RNG and the step cursor every `checkpoint_every`
steps; a rerun resumes from there, and the rows of finished steps travel with the
checkpoint so the committed `policy_samples` hold every step exactly once.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from flows.context import RunContext
from flows.engines.lora_updater import ADAPTERS_DIR, LoRAUpdater
from flows.engines.policy_updaters import (
    LAUNCH_JOBS,
    PolicyUpdater,
    build_policy_updater,
    stage_holds_policy_weights,
)
from flows.engines.sampling import SleepingEngine, SleepsAfterSampling
from flows.guards import GuardChecks
from flows.interrupts import INTERRUPT
from flows.names import CRITIC, GRPO, GRPO_PROGRESS, POLICY, POLICY_LORA, TRAIN_SPLIT
from flows.progress import ProgressFn, log
from flows.stages.critic import commit_critic, open_critic, save_critic_progress
from flows.stages.grpo_steps import check_step_rewards, policy_sample_rows, report_step
from flows.stages.results import StageResult, mean, metric_rows
from grpo_core.algo.critic_update import CriticLearner
from grpo_core.algo.step import (
    SKIPPED,
    grpo_step,
    prompt_indices_at,
    step_parts,
)
from grpo_core.contracts.rollout import RolloutEngine, Sampler
from grpo_core.data.tasks.base import Problem
from grpo_core.engines.cost import (
    MIB,
    PEAK_MEMORY_MIB,
    STEP_SECONDS,
    TRAINING_STATE_MIB,
    PeakMemory,
    adamw_training_state_bytes,
)
from grpo_core.engines.gold_rollout import GoldSolutionRollout
from grpo_core.engines.registry import ROLLOUT_ENGINES
from grpo_core.model.lora import ADAPTER_WEIGHTS, LoRAAdapters
from grpo_core.model.policy import holds_weights, load_weights_into
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
    next_prompt: int,
    critic: CriticLearner | None = None,
    adapters: LoRAAdapters | None = None,
) -> None:
    def write(tmp: Path) -> None:
        if adapters is not None:  # LoRA: the base is policy_k's checkpoint, never changed
            adapters.save(tmp / ADAPTERS_DIR)
        else:
            updater.save_weights(model, tmp)
        tokenizer.save_pretrained(tmp)
        save_training_state(
            tmp,
            optimizer_state=updater.save_state(tmp),
            rng_state=capture_rng_state(),
            extra={"next_step": next_step, "next_prompt": next_prompt},
        )
        pq.write_table(pa.Table.from_pylist(sample_rows), tmp / SAMPLES_FILE)
        pq.write_table(pa.Table.from_pylist(metric_log), tmp / METRICS_FILE)
        save_critic_progress(tmp, critic)

    save_checkpoint(path, write, overwrite=True)


def save_policy(
    path: Path, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, updater: PolicyUpdater
) -> None:
    """policy_{k+1}: the updater's weights and the tokenizer, atomically."""

    def write(tmp: Path) -> None:
        updater.save_weights(model, tmp)
        tokenizer.save_pretrained(tmp)

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
    if holds_weights(model):  # else the training ranks load them (updater.load_state)
        load_weights_into(model, path)
    return True


def _resume_point(
    path: Path, updater: PolicyUpdater, per_step: int
) -> tuple[int, list[dict[str, Any]], list[dict[str, Any]], int]:
    """(next step, its sample rows, its metric rows, the prompt cursor) of the last progress
    checkpoint; a checkpoint of a version without the cursor had it at step x per_step."""
    state = load_training_state(path)
    updater.load_state(path, state["optimizer_state"])
    restore_rng_state(state["rng_state"])
    samples = pq.read_table(path / SAMPLES_FILE).to_pylist()
    metrics = pq.read_table(path / METRICS_FILE).to_pylist()
    log.info("GRPO: resuming at step %d from %s", state["extra"]["next_step"], path)
    next_step = int(state["extra"]["next_step"])
    return next_step, samples, metrics, int(state["extra"].get("next_prompt", next_step * per_step))


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
    cfg, k = ctx.cfg, iteration
    with PeakMemory(ctx.device) as peak:  # the stage's models and steps (a resumed one: since)
        sample_rows, metric_log = _train_policy(ctx, k, progress)
    checks = check_step_rewards(GuardChecks(cfg.guards, ctx.run_id), k, metric_log)
    metric_log += metric_rows(GRPO, {**checks.metrics, PEAK_MEMORY_MIB: peak.mib})
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


def _train_policy(
    ctx: RunContext, k: int, progress: ProgressFn
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The stage's steps, resumed from its progress checkpoint; policy_{k+1} (and the critic)
    saved. Returns its `policy_samples` rows and its metric rows, per step and its training
    state."""
    cfg = ctx.cfg
    g, algo = cfg.grpo, cfg.grpo.algo
    policy_dir = ctx.require_checkpoint(POLICY, k)
    keeps_weights = stage_holds_policy_weights(cfg.engines, g)
    model, tokenizer = ctx.policy(k, weights=keeps_weights)
    if not keeps_weights:
        log.info("GRPO: policy_%d's weights live on the training ranks only", k)
    adapters = None
    if g.lora.enabled:  # new adapters on policy_k each iteration: the base is the reference
        adapters = LoRAAdapters(model, g.lora, ctx.seed(GRPO, k, "lora"), policy_dir)
    reference = None
    # no KL term or penalty: no reference (no forward pass, no memory); launched jobs and Ray
    # training ranks load their own for the loss, but PPO's KL penalty is computed here
    if algo.needs_reference and (cfg.engines.updates_in_process or algo.estimator.needs_values):
        reference = (
            ctx.policy(k)[0].eval().requires_grad_(False)
            if adapters is None
            else adapters.reference()  # the adapted model with adapters off: no second copy
        )
    reward_models = _load_reward_models(ctx, k)
    progress_dir = ctx.checkpoint(GRPO_PROGRESS, k)
    resumed = _resume_weights(progress_dir, model, adapters)
    pool = ctx.task.problems(TRAIN_SPLIT, g.steps * g.prompts_per_step, seed=ctx.seed(GRPO, k))
    # The sampling engine first: vLLM engines on Ray actors that start a local Ray own it for
    # the run; started after the training ranks, they would stop with the ranks' Ray.
    sampler, follower = _training_data(ctx, k, model, tokenizer, pool)
    settings = cfg.engines.settings_of(cfg.engines.grpo_rollout)
    if getattr(settings, "sleep_while_training", False) and isinstance(follower, SleepingEngine):
        sampler = SleepsAfterSampling(follower)
    jobs_dir = ctx.checkpoint(LAUNCH_JOBS, k)
    updater = build_policy_updater(
        cfg.engines,
        g,
        ctx.threads,
        model,
        reference,
        policy_dir,
        jobs_dir,
        cfg.policy.dtype,
        ray_address=cfg.cluster.ray_address,
        ranks=ctx.training_ranks(),
    )
    if adapters is not None:
        updater = LoRAUpdater(updater, adapters)
    start = 0
    sample_rows: list[dict[str, Any]] = []
    metric_log: list[dict[str, Any]] = []
    next_prompt = 0
    if resumed:
        start, sample_rows, metric_log, next_prompt = _resume_point(
            progress_dir, updater, g.prompts_per_step
        )
    critic = open_critic(ctx, k, model, reference, progress_dir, resumed)
    cursor = PromptCursor(pool, next_prompt)
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
        steps = step_parts(
            sampler,
            updater,
            algo,
            group_size=g.group_size,
            max_new_tokens=g.max_new_tokens,
            pad_token_id=tokenizer.pad_token_id,
            critic=critic,
        )
        for step in range(start, g.steps):
            started = time.perf_counter()
            if updated:  # the sampling engine (or the stage's model) gets the updated policy
                updater.hand_on(follower)
            drawn = cursor.take(g.prompts_per_step)
            prompts = [prompter(p.question) for p in drawn]
            more_prompts = functools.partial(_extra_round, cursor, drawn, prompter, rewarder)
            out = grpo_step(
                steps,
                prompts,
                functools.partial(rewarder, list(drawn), prompts),
                seed=ctx.seed(GRPO, k, step),
                where=f"GRPO iteration {k}, step {step}",
                more_prompts=more_prompts,
            )
            kept = out.kept_prompts or range(len(prompts))
            problems = [drawn[i] for i in kept]
            updated = updated or out.skipped is None
            seconds = time.perf_counter() - started  # sampling, reward, the update(s)
            metric_log += metric_rows(GRPO, {**out.stats, STEP_SECONDS: seconds}, step)
            sample_rows += policy_sample_rows(step, problems, out, g.group_size)
            report_step(k, step, g.steps, out, progress)
            done = step + 1
            if done % g.checkpoint_every == 0 or done == g.steps or INTERRUPT.requested:
                _save_progress(
                    progress_dir,
                    model,
                    tokenizer,
                    updater,
                    done,
                    sample_rows,
                    metric_log,
                    cursor.position,
                    critic,
                    adapters,
                )
            INTERRUPT.check()
        save_policy(ctx.checkpoint(POLICY, k + 1), model, tokenizer, updater)
        commit_critic(ctx.checkpoint(CRITIC, k + 1), critic)
        if adapters is not None:  # policy_{k+1} is stored merged; the adapters beside it
            save_checkpoint(ctx.checkpoint(POLICY_LORA, k + 1), adapters.save, overwrite=True)
    finally:
        updater.close()
    trained = [model] if critic is None else [model, critic.critic]
    state_mib = sum(adamw_training_state_bytes(m) for m in trained) / MIB
    return sample_rows, metric_log + metric_rows(GRPO, {TRAINING_STATE_MIB: state_mib})


def _extra_round(
    cursor: PromptCursor,
    drawn: list[Problem],
    prompter: Any,
    rewarder: GRPORewarder,
    round_index: int,
    count: int,
) -> tuple[list[str], Any]:
    """Dynamic sampling's further prompts: the next `count` of the cursor, appended to the
    step's `drawn` problems (StepOutcome.kept_prompts indexes them), with their reward. A
    step never draws a problem twice: once it has drawn the whole pool, no more come."""
    extra = cursor.take(min(count, len(cursor.pool) - len(drawn)))
    drawn.extend(extra)
    texts = [prompter(p.question) for p in extra]
    return texts, functools.partial(rewarder, extra, texts)


@dataclass
class PromptCursor:
    """The stage's place in its prompt pool: each step takes prompts_per_step from here, and
    dynamic sampling's extra rounds the further ones they need; stored with the progress
    checkpoint so a resumed stage draws exactly the prompts the uninterrupted one would."""

    pool: list[Problem]
    position: int = 0

    def take(self, count: int) -> list[Problem]:
        """The next `count` problems (wrapping round the pool; at most the whole pool)."""
        problems = [self.pool[i] for i in prompt_indices_at(len(self.pool), self.position, count)]
        self.position += count
        return problems
