"""PPO's settings (grpo.algo.ppo): the critic, GAE and the KL penalty in the reward. Read only
when grpo.algo.adv_estimator is `ppo` (grpo.preset: ppo)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

CriticInit = Literal["policy", "orm"]
KLControl = Literal["fixed", "adaptive"]


class PPOConfig(BaseModel):
    """PPO with a learned value model (the seeds' PPO, which GRPO drops the critic of)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    gamma: float = Field(
        default=1.0,
        ge=0.0,
        le=1.0,
        description="GAE discount, from 0 to 1 (1.0 as in verl and OpenRLHF: an output is one "
        "short episode whose reward comes at its end).",
    )
    lam: float = Field(
        default=0.95,
        ge=0.0,
        le=1.0,
        description="GAE lambda, from 0 (one-step TD, leans on the critic) to 1 (Monte Carlo "
        "returns, no bias from the critic, more variance); 0.95 as in verl and OpenRLHF.",
    )
    kl_coef: float = Field(
        default=0.04,
        ge=0.0,
        le=10.0,
        description="beta of the KL penalty in the reward, r_t = reward on the last token - "
        "beta * log(pi_old / pi_ref) on every token (the seeds' PPO), from 0 to 10; the start "
        "value when kl_ctl = adaptive. 0 skips the reference model unless grpo.algo.beta > 0.",
    )
    kl_ctl: KLControl = Field(
        default="fixed",
        description="'fixed' keeps kl_coef; 'adaptive' moves it each step towards target_kl "
        "(Ziegler et al. 2019: by at most 20% x outputs per step / horizon).",
    )
    target_kl: float = Field(
        default=6.0,
        gt=0.0,
        le=1e6,
        description="KL to the reference (summed over an output's tokens, averaged over "
        "outputs) the adaptive controller steers to; more than 0 (Ziegler et al.: 6).",
    )
    horizon: int = Field(
        default=10000,
        ge=1,
        le=100_000_000,
        description="Adaptive KL horizon in outputs: the smaller, the faster kl_coef moves "
        "(Ziegler et al.: 10000).",
    )
    whiten_advantages: bool = Field(
        default=True,
        description="Whiten the GAE advantages over the step's response tokens (zero mean, "
        "unit variance), as verl and OpenRLHF do.",
    )
    vf_coef: float = Field(
        default=0.5,
        gt=0.0,
        le=100.0,
        description="Weight of the value loss in the critic's objective, more than 0; with "
        "its own AdamW it scales the critic's gradient before clipping at max_grad_norm.",
    )
    vf_clip: float = Field(
        default=0.2,
        gt=0.0,
        le=1e6,
        description="Value clipping: a value may move at most this far from its value at "
        "sampling before the clipped loss stops rewarding it; more than 0 (set it large to "
        "turn clipping off).",
    )
    critic_gradient_checkpointing: bool = Field(
        default=False,
        description="Recompute the critic's decoder layers in backward (transformers' "
        "gradient checkpointing, non-reentrant): less activation memory, about one more "
        "forward of time; same gradients (verl: critic.model.enable_gradient_checkpointing).",
    )
    critic_lr: float = Field(
        default=1e-5,
        gt=0.0,
        le=1.0,
        description="The critic's AdamW learning rate, more than 0, at most 1 (verl: 1e-5); "
        "betas, weight decay, gradient clipping and micro-batches are the policy's.",
    )
    critic_init: CriticInit = Field(
        default="policy",
        description="What the critic's backbone starts from in the first iteration: "
        "'policy' (policy_0's backbone under a new scalar head) or 'orm' (the ORM of that "
        "iteration, head included; needs reward_models.use_orm). Later iterations continue "
        "from the critic the previous one trained.",
    )
