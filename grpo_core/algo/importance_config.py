"""Importance-ratio choices of the GRPO loss: the level of the policy ratio (token, GSPO's
sequence, GSPO-token) and the rollout correction's settings (grpo.algo.rollout_correction),
docs/algorithm.md sections 10-11. Torch-free, so a config loads without torch."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# token: PPO/GRPO's per-token ratio; sequence: GSPO's length-normalised sequence ratio on
# every token of the row; sequence_token: GSPO-token (the sequence ratio's value, each
# token's own gradient).
ImportanceSampling = Literal["token", "sequence", "sequence_token"]
# off: no correction; tis: truncated importance weights; mis: masked importance weights.
CorrectionMode = Literal["off", "tis", "mis"]
CorrectionLevel = Literal["token", "sequence"]


class RolloutCorrection(BaseModel):
    """Weights pi_old / pi_sampler on the policy-gradient term, correcting for the sampler's
    log-probs differing from the trainer's (e.g. vLLM in bf16, training in fp32)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    mode: CorrectionMode = Field(
        default="off",
        description="'off' (no correction), 'tis' (truncated importance sampling: the weight "
        "pi_old / pi_sampler, capped at cap; Yao et al. 2025, verl rollout_is, TRL "
        "*_truncate) or 'mis' (masked importance sampling: the weight where it lies in "
        "[1/cap, cap], 0 outside, as verl's rollout_rs bounds; TRL masks above cap only). "
        "Needs the sampler's log-probs: not with data_source gold, nor with "
        "use_sampling_logprobs_as_old (the weight would be 1).",
    )
    level: CorrectionLevel = Field(
        default="token",
        description="'token' (each token its own weight) or 'sequence' (one weight per output, "
        "the product of its tokens' weights, on all its tokens; verl and TRL's sequence level).",
    )
    cap: float = Field(
        default=2.0,
        gt=1.0,
        le=1e6,
        description="Truncation cap (tis) or the mask's bounds [1/cap, cap] (mis), more than 1 "
        "(a cap of 1 would leave no weight above 1), at most 1e6 (verl: 2.0).",
    )

    @property
    def on(self) -> bool:
        """The correction weighs the policy-gradient term (it reads the sampler's log-probs)."""
        return self.mode != "off"
