"""The GRPO stage of iteration k: M steps of online sampling -> reward -> advantages -> update.

Built like a recipe: `setup_grpo` builds the stage's parts once (policy_k, its LoRA adapters,
the reference, RM_k, the sampler, the updater, the critic, the rewarder, the resume point),
`train_grpo` runs the steps on them, `commit_grpo` stores the rows. policy_k is both the
starting point and the frozen reference (with grpo.lora: new adapters on policy_k train and
the reference is policy_k with them off). The stage checkpoints weights, optimizer, RNG and
the step cursor every `checkpoint_every` steps (grpo_progress.py); a rerun resumes from
there, and the rows of finished steps travel with the checkpoint so the committed
`policy_samples` hold every step exactly once.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from flows.config import GRPOStageSection
from flows.context import RunContext
from flows.engines.lora_updater import LoRAUpdater
from flows.engines.policy_updaters import (
    LAUNCH_JOBS,
    PolicyUpdater,
    build_policy_updater,
    stage_holds_policy_weights,
)
from flows.engines.sampling import SleepingEngine, SleepsAfterSampling
from flows.guards import NOT_JUDGED_INFO, GuardChecks
from flows.interrupts import INTERRUPT
from flows.names import CRITIC, GRPO, GRPO_PROGRESS, POLICY, POLICY_LORA
from flows.progress import ProgressFn, log
from flows.stage_results import StageResult, mean, metric_rows
from flows.stages.critic import commit_critic, open_critic
from flows.stages.grpo_async import in_flight_rows, sampling_copy, start_async_sampler
from flows.stages.grpo_curriculum import PoolDraw, draw_pool, pass_rate_rows
from flows.stages.grpo_progress import (
    ResumePoint,
    Row,
    remove_committed_progress,
    resume_point,
    resume_weights,
    save_policy,
    save_progress,
)
from flows.stages.grpo_prompts import PromptCursor, extra_round, pairs_pool, pairs_rollout
from flows.stages.grpo_steps import check_step_rewards, policy_sample_rows, report_step
from grpo_core.algo.critic_update import CriticLearner
from grpo_core.algo.step import SKIPPED, StepOutcome, StepParts, grpo_step, step_parts
from grpo_core.contracts.rollout import RolloutEngine, Sampler
from grpo_core.data.tasks.base import Problem
from grpo_core.engines.async_sampler import AsyncSampler
from grpo_core.engines.cost import (
    MIB,
    PEAK_MEMORY_MIB,
    STEP_SECONDS,
    TRAINING_STATE_MIB,
    PeakMemory,
    adamw_training_state_bytes,
)
from grpo_core.engines.gold_rollout import GoldSolutionRollout
from grpo_core.model.lora import LoRAAdapters
from grpo_core.model.prompts import Prompter
from reward_models.config import RMKind
from reward_models.grpo_reward import GRPORewarder, models_needed
from reward_models.models import RewardModel
from storage.checkpoints import save_checkpoint


@dataclass(frozen=True)
class GRPOOutputs:
    """Where iteration k's GRPO stage writes: its progress checkpoint, policy_{k+1}, and
    beside it the adapters (grpo.lora) and critic_{k+1} (PPO)."""

    progress: Path
    policy: Path
    policy_lora: Path
    critic: Path


@dataclass(frozen=True)
class GRPOParts:
    """What iteration k's GRPO stage builds once (setup_grpo) and its steps use. A bench or a
    test swaps a part with dataclasses.replace to time or watch it."""

    iteration: int
    settings: GRPOStageSection
    model: PreTrainedModel  # policy_k, trained in place (a skeleton when ranks hold it)
    tokenizer: PreTrainedTokenizerBase
    adapters: LoRAAdapters | None  # grpo.lora: what trains (the base is frozen)
    reference: nn.Module | None  # pi_ref = policy_k; None: no KL term computed here
    reward_models: dict[RMKind, RewardModel]  # RM_k of each kind the reward reads
    sampler: Sampler
    follower: RolloutEngine | None  # the engine given each updated policy
    updater: PolicyUpdater
    critic: CriticLearner | None  # PPO's
    rewarder: GRPORewarder
    prompter: Prompter
    cursor: PromptCursor  # advances as steps draw prompts
    draw: PoolDraw  # the cursor's pool, and what grpo.curriculum drew it with
    resume: ResumePoint
    outputs: GRPOOutputs
    step_seed: Callable[[int], int]


def grpo_stage(ctx: RunContext, iteration: int, progress: ProgressFn) -> StageResult:
    """M GRPO steps on policy_k against reference policy_k and rm_k -> policy_{k+1}."""
    with PeakMemory(ctx.device) as peak:  # the stage's models and steps (a resumed one: since)
        parts = setup_grpo(ctx, iteration)
        sample_rows, metric_log = train_grpo(parts, progress)
    return commit_grpo(ctx, iteration, sample_rows, metric_log, peak.mib, parts.draw)


def setup_grpo(ctx: RunContext, k: int) -> GRPOParts:
    """The parts of iteration k's GRPO stage, resumed from its progress checkpoint if any.
    Their order matters (see the comments): a resumed stage is byte-identical to one that
    never stopped."""
    g = ctx.cfg.grpo
    model, tokenizer, adapters = _policy_k(ctx, k)
    reference = _reference(ctx, k, adapters)
    reward_models = _load_reward_models(ctx, k)
    outputs = _outputs(ctx, k)
    # the weights before the update engine is built: DeepSpeed copies them at its start
    resumed = resume_weights(outputs.progress, model, adapters)
    if g.pairs_file:  # data_source pairs_file: offline DPO's prompts
        draw = PoolDraw(pairs_pool(Path(g.pairs_file), ctx.seed(GRPO, k)))
    else:
        draw = draw_pool(ctx, k)
    pool = draw.problems
    # The sampling engine first: vLLM engines on Ray actors that start a local Ray own it for
    # the run; started after the training ranks, they would stop with the ranks' Ray.
    sampler, follower = _training_data(ctx, k, model, tokenizer, pool)
    updater = _policy_updater(ctx, k, model, reference, adapters)
    try:
        resume = ResumePoint()  # restoring one restores the RNG: every draw after continues
        if resumed:
            resume = resume_point(outputs.progress, updater, g.prompts_per_step)
        critic = open_critic(ctx, k, model, reference, outputs.progress, resumed)
        cursor, prompter = PromptCursor(pool, resume.next_prompt), ctx.prompter(tokenizer)
        rewarder = _rewarder(ctx, tokenizer, reward_models)
    except BaseException:
        updater.close()
        raise
    return GRPOParts(
        iteration=k,
        settings=g,
        model=model,
        tokenizer=tokenizer,
        adapters=adapters,
        reference=reference,
        reward_models=reward_models,
        sampler=sampler,
        follower=follower,
        updater=updater,
        critic=critic,
        rewarder=rewarder,
        prompter=prompter,
        cursor=cursor,
        draw=draw,
        resume=resume,
        outputs=outputs,
        step_seed=functools.partial(ctx.seed, GRPO, k),
    )


def train_grpo(parts: GRPOParts, progress: ProgressFn) -> tuple[list[Row], list[Row]]:
    """The stage's steps from parts.resume on, with a progress checkpoint every
    grpo.checkpoint_every steps (and on an interrupt); then policy_{k+1} saved (with the
    adapters, the critic) and parts.updater closed; under grpo.async a sampler on
    parts.follower samples the next steps meanwhile (grpo_async.py). Returns the
    `policy_samples` rows and the metric rows, per step and of the training state."""
    g, k, resume = parts.settings, parts.iteration, parts.resume
    sample_rows, metric_log = list(resume.sample_rows), list(resume.metric_rows)
    updated = resume.resumed  # the policy differs from what the sampling engine was given
    ahead: AsyncSampler | None = None  # grpo.async: samples the next steps meanwhile
    try:
        steps = _step_parts(parts)
        if g.async_.on:
            ahead = start_async_sampler(
                parts.follower, steps, parts.cursor, parts.prompter, parts.step_seed, g, resume
            )
            steps = replace(steps, sampler=ahead)
        for step in range(resume.next_step, g.steps):
            started = time.perf_counter()
            # the sampling engine (or the stage's model) gets the updated policy (grpo.async: each)
            if updated or (ahead is not None and step > 0):
                parts.updater.hand_on(parts.follower if ahead is None else ahead)
            out, problems = _run_step(parts, steps, step)
            updated = updated or out.skipped is None
            seconds = time.perf_counter() - started  # sampling, reward, the update(s)
            stats = {**out.stats, STEP_SECONDS: seconds}
            if ahead is not None:
                stats.update(ahead.step_stats(step))
            metric_log += metric_rows(GRPO, stats, step)
            sample_rows += policy_sample_rows(step, problems, out, g.group_size)
            report_step(k, step, g.steps, out, progress)
            done = step + 1
            if done % g.checkpoint_every == 0 or done == g.steps or INTERRUPT.requested:
                _save_progress(parts, done, sample_rows, metric_log, in_flight_rows(ahead, done))
            INTERRUPT.check()
        _save_outputs(parts)
    finally:
        if ahead is not None:
            ahead.close()
        parts.updater.close()
    trained = [parts.model] if parts.critic is None else [parts.model, parts.critic.critic]
    state_mib = sum(adamw_training_state_bytes(m) for m in trained) / MIB
    return sample_rows, metric_log + metric_rows(GRPO, {TRAINING_STATE_MIB: state_mib})


def commit_grpo(
    ctx: RunContext,
    k: int,
    sample_rows: list[Row],
    metric_log: list[Row],
    peak_mib: float,
    draw: PoolDraw,
) -> StageResult:
    """The guards on the steps' rewards, then the stage's rows committed (with the pass rates
    of grpo.curriculum's draw); its summary."""
    pass_rates = pass_rate_rows(draw, sample_rows)
    checks = check_step_rewards(GuardChecks(ctx.cfg.guards, ctx.run_id), k, metric_log)
    metric_log = metric_log + metric_rows(GRPO, {**checks.metrics, PEAK_MEMORY_MIB: peak_mib})
    with ctx.run.stage(k, GRPO) as attempt:
        if checks.not_judged:
            attempt.info[NOT_JUDGED_INFO] = checks.not_judged
        attempt.write("policy_samples", sample_rows)
        attempt.write("metrics", metric_log)
        if pass_rates:
            attempt.write("problem_pass_rates", pass_rates)
    if ctx.cfg.store.progress_checkpoints == "remove":  # only after the commit: resume needs it
        committed = functools.partial(ctx.run.is_committed, stage=GRPO)
        remove_committed_progress(ctx.store.root, ctx.run_id, GRPO_PROGRESS, committed)
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


def _step_parts(parts: GRPOParts) -> StepParts:
    g = parts.settings
    return step_parts(
        parts.sampler,
        parts.updater,
        g.algo,
        group_size=g.group_size,
        max_new_tokens=g.max_new_tokens,
        pad_token_id=parts.tokenizer.pad_token_id,
        critic=parts.critic,
    )


def _run_step(parts: GRPOParts, steps: StepParts, step: int) -> tuple[StepOutcome, list[Problem]]:
    """Step `step` on the cursor's next prompts (dynamic sampling's extra rounds: the ones
    after); its outcome and the problem of each group it kept."""
    drawn = parts.cursor.take(parts.settings.prompts_per_step)
    prompts = [parts.prompter(p.question) for p in drawn]
    reward = functools.partial(parts.rewarder, list(drawn), prompts)
    more = functools.partial(extra_round, parts.cursor, drawn, parts.prompter, parts.rewarder)
    where = f"GRPO iteration {parts.iteration}, step {step}"
    out = grpo_step(
        steps, prompts, reward, seed=parts.step_seed(step), where=where, more_prompts=more
    )
    kept = out.kept_prompts or range(len(prompts))
    return out, [drawn[i] for i in kept]


def _save_progress(
    parts: GRPOParts,
    done: int,
    samples: list[Row],
    metrics: list[Row],
    in_flight: list[Row] | None,
) -> None:
    """The progress checkpoint after `done` steps: the next one resumes from here."""
    save_progress(
        parts.outputs.progress,
        parts.model,
        parts.tokenizer,
        parts.updater,
        done,
        samples,
        metrics,
        parts.cursor.position,
        parts.critic,
        parts.adapters,
        in_flight,
    )


def _save_outputs(parts: GRPOParts) -> None:
    """policy_{k+1} (stored merged under grpo.lora, the adapters beside it) and critic_{k+1}."""
    save_policy(parts.outputs.policy, parts.model, parts.tokenizer, parts.updater)
    commit_critic(parts.outputs.critic, parts.critic)
    if parts.adapters is not None:
        save_checkpoint(parts.outputs.policy_lora, parts.adapters.save, overwrite=True)


def _policy_k(
    ctx: RunContext, k: int
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, LoRAAdapters | None]:
    """policy_k (a meta-device skeleton when the training ranks alone hold its weights), its
    tokenizer, and with grpo.lora the new adapters on it that train (the base: the reference)."""
    g = ctx.cfg.grpo
    policy_dir = ctx.require_checkpoint(POLICY, k)
    keeps_weights = stage_holds_policy_weights(ctx.cfg.engines, g)
    model, tokenizer = ctx.policy(k, weights=keeps_weights)
    if not keeps_weights:
        log.info("GRPO: policy_%d's weights live on the training ranks only", k)
    if not g.lora.enabled:
        return model, tokenizer, None
    return model, tokenizer, LoRAAdapters(model, g.lora, ctx.seed(GRPO, k, "lora"), policy_dir)


def _outputs(ctx: RunContext, k: int) -> GRPOOutputs:
    return GRPOOutputs(
        progress=ctx.checkpoint(GRPO_PROGRESS, k),
        policy=ctx.checkpoint(POLICY, k + 1),
        policy_lora=ctx.checkpoint(POLICY_LORA, k + 1),
        critic=ctx.checkpoint(CRITIC, k + 1),
    )


def _reference(ctx: RunContext, k: int, adapters: LoRAAdapters | None) -> nn.Module | None:
    """pi_ref = policy_k, where this process computes a KL term: none without a KL term or
    penalty (no forward pass, no memory); launched jobs and Ray training ranks load their own
    for the loss, but PPO's KL penalty is computed here."""
    cfg, algo = ctx.cfg, ctx.cfg.grpo.algo
    if not algo.needs_reference:
        return None
    if not (cfg.engines.updates_in_process or algo.estimator.needs_values):
        return None
    if adapters is not None:  # the adapted model with adapters off: no second copy
        return adapters.reference()
    return ctx.policy(k)[0].eval().requires_grad_(False)


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


def _rewarder(
    ctx: RunContext, tokenizer: PreTrainedTokenizerBase, reward_models: dict[RMKind, RewardModel]
) -> GRPORewarder:
    """Scores a step's outputs: the grpo.rewards parts, RM_k's among them (and the models the
    parts load, a teacher, on the run's device)."""
    g = ctx.cfg.grpo
    return GRPORewarder(
        ctx.task,
        g.rewards,
        tokenizer,
        g.max_new_tokens,
        reward_models,
        g.algo.process_supervision,
        temperature=g.algo.temperature,
        device=str(ctx.device),
    )


def _training_data(
    ctx: RunContext,
    k: int,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    pool: list[Problem],
) -> tuple[Sampler, RolloutEngine | None]:
    """Where grpo.data_source says the outputs come from: the current policy (online), the
    warm-started policy_0 (RFT: the same distribution every step), gold solutions (SFT), or
    the stored pairs of grpo.pairs_file (offline DPO);
    and the engine that must be given each updated policy (None: none follows the policy, or
    it samples `model` itself, which the update changes in place). An engine that sleeps while
    the update trains (engines.vllm.sleep_while_training) is put to sleep after sampling."""
    cfg = ctx.cfg
    batch = cfg.rollout.batch_size
    if cfg.grpo.data_source == "online":
        name, ahead = cfg.engines.grpo_rollout, cfg.grpo.async_.on
        checkpoint = ctx.checkpoint(POLICY, k)
        sampled = sampling_copy(model) if ahead else model  # grpo.async: sampled meanwhile
        engine = ctx.engines.engine(
            name, "grpo", checkpoint, sampled, tokenizer, batch, show_progress=False
        )
        can = cfg.engines.rollout_capabilities(name)
        follower = None if can.shares_model and not ahead else engine
        if can.sleeps_while_training and isinstance(follower, SleepingEngine):
            return SleepsAfterSampling(follower), follower
        return engine, follower
    if cfg.grpo.pairs_file:  # data_source pairs_file; preflight checked every line
        return pairs_rollout(Path(cfg.grpo.pairs_file), ctx.prompter(tokenizer), tokenizer), None
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


def _policy_updater(
    ctx: RunContext,
    k: int,
    model: PreTrainedModel,
    reference: nn.Module | None,
    adapters: LoRAAdapters | None,
) -> PolicyUpdater:
    """The stage's update path (engines.train, deepspeed launcher or Ray ranks); with
    grpo.lora, it trains the adapters and hands on the merged policy."""
    cfg = ctx.cfg
    updater = build_policy_updater(
        cfg.engines,
        cfg.grpo,
        ctx.threads,
        model,
        reference,
        ctx.checkpoint(POLICY, k),
        ctx.checkpoint(LAUNCH_JOBS, k),
        cfg.policy.dtype,
        ray_address=cfg.cluster.ray_address,
        ranks=ctx.training_ranks(),
        attn_implementation=cfg.policy.attn_implementation,
    )
    return updater if adapters is None else LoRAUpdater(updater, adapters)
