"""PPO's critic in the GRPO stage: where the critic of iteration k comes from, the engine it
trains on (engines.train in this process, as the reward models), how it travels in the
stage's progress checkpoint (weights, optimizer, KL coefficient) and where the trained one
is stored (checkpoints/<run>/critic/iter-<k+1>/, like policy_{k+1})."""

from __future__ import annotations

from pathlib import Path

from torch import nn
from transformers import PreTrainedModel

from flows.context import RunContext
from flows.engines.train_engines import build_train_engine
from flows.names import CRITIC, ORM, POLICY
from flows.progress import log
from grpo_core.algo.critic_update import CriticLearner, critic_optimizer_settings
from grpo_core.contracts.errors import SettingError
from grpo_core.engines.train import with_policy_precision
from grpo_core.model.critic import CRITIC_FILE, ValueModel
from storage.checkpoints import load_training_state, save_checkpoint, save_training_state

PROGRESS_DIR = "critic"  # the critic inside a GRPO progress checkpoint
ENGINE_STATE = "engine"  # DeepSpeed's own checkpoint of the critic, inside PROGRESS_DIR


def _initial_critic(ctx: RunContext, k: int) -> ValueModel:
    """critic_k when an earlier iteration stored one, else a new one from critic_init's
    source of iteration k (policy_k, or ORM_k with its head)."""
    dtype, attention = ctx.cfg.policy.dtype, ctx.cfg.policy.attn_implementation
    stored = ctx.checkpoint(CRITIC, k)
    if (stored / CRITIC_FILE).is_file():
        return ValueModel.load(stored, dtype, attention)
    source = ctx.cfg.grpo.algo.ppo.critic_init
    path = ctx.require_checkpoint(ORM if source == "orm" else POLICY, k)
    log.info("PPO: critic of iteration %d starts from %s", k, path)
    return ValueModel.from_backbone(path, dtype, ctx.seed(CRITIC, k), attention)


def open_critic(
    ctx: RunContext,
    k: int,
    policy: PreTrainedModel,
    reference: nn.Module | None,
    progress_dir: Path,
    resumed: bool,
) -> CriticLearner | None:
    """The stage's critic learner when the estimator reads values (PPO), else None; resumed
    from the progress checkpoint when the stage resumes."""
    algo = ctx.cfg.grpo.algo
    if not algo.estimator.needs_values:
        return None
    saved = progress_dir / PROGRESS_DIR
    policy_cfg = ctx.cfg.policy
    critic = (
        ValueModel.load(saved, policy_cfg.dtype, policy_cfg.attn_implementation)
        if resumed
        else _initial_critic(ctx, k)
    )
    if critic.vocab_size != policy.config.vocab_size:
        raise SettingError(
            f"grpo.algo.ppo.critic_init = {algo.ppo.critic_init}: the critic's vocabulary "
            f"({critic.vocab_size}) is not the policy's ({policy.config.vocab_size}), so it "
            "cannot read the policy's tokens: set critic_init: policy"
        )
    # weights first: DeepSpeed copies them into its optimizer when the engine is built
    critic.to(ctx.device)
    optim = with_policy_precision(critic_optimizer_settings(algo), ctx.cfg.policy.dtype)
    engine = build_train_engine(ctx.cfg.engines, critic, optim)
    learner = CriticLearner(critic, engine, policy, reference, algo)
    if resumed:
        state = load_training_state(saved)["optimizer_state"]
        learner.load_state(saved / ENGINE_STATE, state)
    return learner


def save_critic_progress(directory: Path, learner: CriticLearner | None) -> None:
    """Critic weights, optimizer and KL coefficient into a progress checkpoint being written."""
    if learner is None:
        return
    saved = learner.critic.save(directory / PROGRESS_DIR, learner.weights())
    state = learner.save_state(saved / ENGINE_STATE)
    save_training_state(saved, optimizer_state=state, rng_state=None)


def commit_critic(path: Path, learner: CriticLearner | None) -> None:
    """The trained critic as critic_{k+1} at `path`, atomically (iteration k+1 continues
    from it)."""
    if learner is None:
        return
    critic, weights = learner.critic, learner.weights()

    def write(tmp: Path) -> None:
        critic.save(tmp, weights)

    save_checkpoint(path, write, overwrite=True)
