"""GRPO update settings (pydantic, shown as a Prefect form) and the named presets."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

KLEstimator = Literal["k1", "k2", "k3"]
LossAgg = Literal["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"]
AdvScaling = Literal["group_std", "none"]
Supervision = Literal["outcome", "process"]
AdvEstimatorName = Literal["grpo_outcome", "grpo_process", "dr_grpo", "rft", "online_rft", "sft"]
LRSchedule = Literal["constant", "cosine"]


class GRPOConfig(BaseModel):
    """Hyper-parameters of one GRPO policy update (GRPO_SPEC sections 1-6)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    beta: float = Field(
        default=0.04,
        ge=0.0,
        le=10.0,
        description="KL penalty weight in the loss, from 0 to 10 (paper: 0.04). "
        "0 skips the reference model entirely.",
    )
    kl_estimator: KLEstimator = Field(
        default="k3",
        description="KL estimator: 'k3' (paper, unbiased and non-negative), 'k1' (log ratio) "
        "or 'k2' (half squared log ratio).",
    )
    eps_low: float = Field(
        default=0.2,
        gt=0.0,
        lt=1.0,
        description="Lower clip range: ratios below 1 - eps_low are clipped; "
        "more than 0 and less than 1 (paper: 0.2).",
    )
    eps_high: float = Field(
        default=0.2,
        gt=0.0,
        le=10.0,
        description="Upper clip range: ratios above 1 + eps_high are clipped; more than 0, "
        "at most 10 (paper: 0.2, DAPO clip-higher: 0.28).",
    )
    loss_agg: LossAgg = Field(
        default="seq-mean-token-mean",
        description="Loss aggregation: 'seq-mean-token-mean' (paper, mean over tokens then "
        "sequences), 'token-mean' (DAPO, mean over all response tokens) or "
        "'seq-mean-token-sum-norm' (Dr. GRPO, token sum over the constant max_len_norm).",
    )
    adv_scaling: AdvScaling = Field(
        default="group_std",
        description="Outcome advantage scaling: 'group_std' (paper, divide by the group std) "
        "or 'none' (Dr. GRPO, reward minus group mean).",
    )
    supervision: Supervision = Field(
        default="outcome",
        description="'outcome' (one reward per output) or 'process' (one reward per step).",
    )
    adv_estimator: AdvEstimatorName | None = Field(
        default=None,
        description="Advantage estimator by name for ablations: 'grpo_outcome', 'grpo_process', "
        "'dr_grpo', 'rft', 'online_rft' or 'sft'. Empty: derived from supervision and "
        "adv_scaling.",
    )
    adv_eps: float = Field(
        default=1e-4,
        gt=0.0,
        le=1.0,
        description="Added to the group std before dividing; more than 0, at most 1 (paper: 1e-4).",
    )
    mu: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Inner epochs over each rollout batch, 1 to 64 (paper: 1).",
    )
    lr: float = Field(
        default=1e-6,
        gt=0.0,
        le=1.0,
        description="Policy learning rate (AdamW), more than 0, at most 1 (paper: 1e-6).",
    )
    weight_decay: float = Field(
        default=0.0, ge=0.0, le=1.0, description="AdamW weight decay, from 0 to 1."
    )
    adam_beta1: float = Field(
        default=0.9, ge=0.0, lt=1.0, description="AdamW beta1, from 0 up to (not including) 1."
    )
    adam_beta2: float = Field(
        default=0.999, ge=0.0, lt=1.0, description="AdamW beta2, from 0 up to (not including) 1."
    )
    max_grad_norm: float = Field(
        default=1.0,
        gt=0.0,
        le=1e6,
        description="Gradient-norm clipping threshold, more than 0, at most 1e6 (paper: 1.0).",
    )
    micro_batch_size: int = Field(
        default=8,
        ge=1,
        le=65536,
        description="Rows per forward/backward pass (gradient accumulation), 1 to 65536. "
        "Changes memory use only, never the gradient.",
    )
    mini_batches_per_epoch: int = Field(
        default=1,
        ge=1,
        le=4096,
        description="Optimizer steps per inner epoch, 1 to 4096 (1: one step per epoch).",
    )
    warmup_steps: int = Field(
        default=0, ge=0, le=1_000_000, description="Linear LR warm-up steps, 0 to 1,000,000."
    )
    lr_schedule: LRSchedule = Field(
        default="constant",
        description="LR after warm-up: 'constant' or 'cosine' (decays to 0 at the last step).",
    )
    max_len_norm: int = Field(
        default=1024,
        ge=1,
        le=1_000_000,
        description="Constant length dividing token sums in 'seq-mean-token-sum-norm', "
        "1 to 1,000,000; set it to the rollout's max new tokens (paper: 1024).",
    )
    use_sampling_logprobs_as_old: bool = Field(
        default=False,
        description="Use the rollout engine's sampling log-probs as pi_old instead of "
        "recomputing them with the training model.",
    )
    temperature: float = Field(
        default=1.0,
        gt=0.0,
        le=10.0,
        description="Sampling temperature the log-probs are computed at, more than 0, at most 10.",
    )

    @model_validator(mode="after")
    def _estimator_fits_supervision(self) -> GRPOConfig:
        """Step rewards exist only under process supervision, and only grpo_process reads them."""
        chosen = self.adv_estimator
        if chosen == "grpo_process" and self.supervision != "process":
            raise ValueError(
                "grpo.algo.adv_estimator = grpo_process needs per-step rewards: set "
                "grpo.algo.supervision: process (and train a PRM), or leave adv_estimator empty"
            )
        if self.supervision == "process" and chosen not in (None, "grpo_process"):
            raise ValueError(
                f"grpo.algo.supervision = process gives per-step rewards that adv_estimator = "
                f"{chosen} ignores: leave adv_estimator empty (or grpo_process), or set "
                "supervision: outcome"
            )
        return self

    @property
    def advantage_estimator(self) -> AdvEstimatorName:
        """The registry name of the advantage estimator this config selects."""
        if self.adv_estimator is not None:
            return self.adv_estimator
        if self.supervision == "process":
            return "grpo_process"
        return "grpo_outcome" if self.adv_scaling == "group_std" else "dr_grpo"

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> GRPOConfig:
        """A config from a named preset of GRPO_PRESETS, with field overrides."""
        if name not in GRPO_PRESETS:
            raise ValueError(f"unknown GRPO preset {name!r}: choose one of {sorted(GRPO_PRESETS)}")
        return cls(**{**GRPO_PRESETS[name], **overrides})


GRPO_PRESETS: dict[str, dict[str, Any]] = {
    # DeepSeekMath section 4: beta 0.04, clip 0.2, per-sequence length norm, z-scored groups.
    "paper": {
        "beta": 0.04,
        "eps_low": 0.2,
        "eps_high": 0.2,
        "loss_agg": "seq-mean-token-mean",
        "adv_scaling": "group_std",
        "mu": 1,
        "lr": 1e-6,
    },
    # Dr. GRPO (Liu et al. 2025): no std division, constant length normaliser.
    "dr_grpo": {"adv_scaling": "none", "loss_agg": "seq-mean-token-sum-norm"},
    # DAPO (Yu et al. 2025): clip-higher, token-level mean, no KL term.
    "dapo": {"eps_high": 0.28, "loss_agg": "token-mean", "beta": 0.0},
}


def merge_trees(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` on top of `base`, key by key: a mapping merges into a mapping, a value replaces."""
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_trees(merged[key], value)
        else:
            merged[key] = value
    return merged
