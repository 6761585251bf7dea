"""Training engines from `engines.train`: TorchEngine, or DeepSpeedEngine in this process,
with the optimizer settings of the GRPO stage or of the reward models."""

from __future__ import annotations

from torch import nn

from flows.config import ItergrpoConfig
from flows.engines.availability import require_deepspeed
from flows.stage_io import set_deepspeed_accelerator
from grpo_core.contracts.training import OptimizerSettings, TrainEngine
from grpo_core.engines.train import TorchEngine
from reward_models.models import RewardModel
from reward_models.training import rm_optimizer_settings


def build_train_engine(
    cfg: ItergrpoConfig, model: nn.Module, optim: OptimizerSettings
) -> TrainEngine:
    """engines.train on `model`: TorchEngine, or DeepSpeedEngine in this process.

    DeepSpeed here always runs one process; the launcher path (several processes) is
    build_policy_updater's, for the GRPO update only.
    """
    if cfg.engines.train == "torch":
        return TorchEngine(model, optim)
    require_deepspeed()
    set_deepspeed_accelerator(cfg)
    from grpo_core.engines.deepspeed_engine import DeepSpeedEngine

    ds = cfg.engines.deepspeed.model_copy(update={"processes_per_node": 1, "hostfile": None})
    return DeepSpeedEngine(model, optim, config=ds)


def grpo_total_steps(cfg: ItergrpoConfig) -> int:
    """Optimizer steps of one GRPO stage (the cosine schedule's length)."""
    algo = cfg.grpo.algo
    return cfg.grpo.steps * algo.mu * algo.mini_batches_per_epoch


def build_policy_engine(cfg: ItergrpoConfig, model: nn.Module) -> TrainEngine:
    """The GRPO stage's in-process engine, with the optimizer settings of grpo.algo."""
    return build_train_engine(cfg, model, cfg.grpo.algo.optimizer_settings(grpo_total_steps(cfg)))


def build_rm_engine(cfg: ItergrpoConfig, model: RewardModel) -> TrainEngine:
    """The engine a reward model trains with (same settings as train_reward_model's default).

    With several DeepSpeed processes configured, reward models still train in the stage's
    process (one DeepSpeed process, the configured ZeRO stage and bf16).
    """
    return build_train_engine(cfg, model, rm_optimizer_settings(cfg.reward_models))
