"""The parts of iteration k's GRPO stage, each built from the run context (grpo.py's
setup_grpo puts them together): policy_k and its LoRA adapters, the reference, RM_k, the
rewarder, where the training outputs come from, and the update path."""

from __future__ import annotations

from pathlib import Path

from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from flows.context import RunContext
from flows.engines.lora_updater import LoRAUpdater
from flows.engines.policy_updaters import (
    LAUNCH_JOBS,
    PolicyUpdater,
    build_policy_updater,
    stage_holds_policy_weights,
)
from flows.engines.sampling import SleepingEngine, SleepsAfterSampling
from flows.names import GRPO, POLICY
from flows.progress import log
from flows.stages.grpo_async import sampling_copy
from flows.stages.grpo_prompts import pairs_rollout
from grpo_core.contracts.rollout import RolloutEngine, Sampler
from grpo_core.data.tasks.base import Problem
from grpo_core.engines.gold_rollout import GoldSolutionRollout
from grpo_core.model.lora import LoRAAdapters
from reward_models.config import RMKind
from reward_models.grpo_reward import GRPORewarder, models_needed
from reward_models.models import RewardModel


def policy_k(
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


def reference_model(ctx: RunContext, k: int, adapters: LoRAAdapters | None) -> nn.Module | None:
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


def reward_models_k(ctx: RunContext, k: int) -> dict[RMKind, RewardModel]:
    """RM_k of each kind the scored reward parts and the estimator read."""
    grpo = ctx.cfg.grpo
    needed = models_needed(grpo.rewards, grpo.algo.process_supervision)
    return {
        kind: RewardModel.load(
            ctx.require_checkpoint(kind, k), device=ctx.device, dtype=ctx.cfg.reward_models.dtype
        ).eval()
        for kind in sorted(needed)
    }


def step_rewarder(
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


def training_data(
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


def policy_updater(
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
