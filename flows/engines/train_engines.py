"""Training engines from `engines.train` (grpo_core/engines/registry.py), built with the
optimizer settings of the GRPO stage or of the reward models."""

from __future__ import annotations

from torch import nn

from flows.config import GRPOStageSection
from flows.engines_config import EnginesSection
from grpo_core.contracts.training import OptimizerSettings, TrainEngine
from grpo_core.engines.registry import TRAIN_ENGINES
from grpo_core.engines.train import with_policy_precision
from reward_models.config import RewardModelConfig
from reward_models.models import RewardModel
from reward_models.training import rm_optimizer_settings


def build_train_engine(
    engines: EnginesSection, model: nn.Module, optim: OptimizerSettings
) -> TrainEngine:
    """engines.train on `model`, in this process (several DeepSpeed processes are the launched
    GRPO updater's, flows/engines/policy_updaters.py)."""
    return TRAIN_ENGINES[engines.train].build(model, optim, engines.settings_of(engines.train))


def grpo_total_steps(grpo: GRPOStageSection) -> int:
    """Optimizer steps of one GRPO stage (the cosine schedule's length)."""
    return grpo.steps * grpo.algo.mu * grpo.algo.mini_batches_per_epoch


def build_policy_engine(
    engines: EnginesSection, grpo: GRPOStageSection, model: nn.Module, policy_dtype: str
) -> TrainEngine:
    """The GRPO stage's in-process engine, with the optimizer settings of grpo.algo and the
    forward autocast of policy.dtype."""
    optim = with_policy_precision(
        grpo.algo.optimizer_settings(grpo_total_steps(grpo)), policy_dtype
    )
    return build_train_engine(engines, model, optim)


def build_rm_engine(
    engines: EnginesSection, rm_cfg: RewardModelConfig, model: RewardModel
) -> TrainEngine:
    """The engine a reward model trains with (same settings as train_reward_model's default).

    With several DeepSpeed processes configured, reward models still train in the stage's
    process (one DeepSpeed process, the configured ZeRO stage and bf16).
    """
    return build_train_engine(engines, model, rm_optimizer_settings(rm_cfg))
