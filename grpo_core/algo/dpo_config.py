"""Settings of the DPO loss (grpo.algo.dpo: its beta, the sigmoid / IPO form, conservative
DPO's label smoothing, how a sequence's log-prob is formed), docs/algorithm.md section 12.
Torch-free, so a config loads without torch."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# sigmoid: DPO (Rafailov et al. 2023), with label_smoothing conservative DPO; ipo: IPO's
# squared loss around the target margin 1 / (2 beta) (Azar et al. 2023). TRL's loss_type names.
DPOLoss = Literal["sigmoid", "ipo"]
# sum: log pi(o | q) = the sum of its tokens' log-probs (both papers); mean: over its tokens
# (DeepSeekMath's appendix A.1.4 DPO, TRL's IPO).
SequenceLogprob = Literal["sum", "mean"]


class DPOConfig(BaseModel):
    """The DPO loss on (chosen, rejected) pairs against the frozen reference pi_ref."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    beta: float = Field(
        default=0.1,
        gt=0.0,
        le=100.0,
        description="DPO's beta, the weight of the implicit KL to the reference: the implicit "
        "reward is beta * log(pi / pi_ref); IPO's target margin is 1 / (2 beta). More than 0, "
        "at most 100 (TRL: 0.1).",
    )
    loss: DPOLoss = Field(
        default="sigmoid",
        description="'sigmoid' (DPO, Rafailov et al. 2023: -log sigmoid(beta * margin)) or "
        "'ipo' (IPO, Azar et al. 2023: (margin - 1 / (2 beta))^2), where margin is the chosen "
        "output's log(pi / pi_ref) minus the rejected one's.",
    )
    label_smoothing: float = Field(
        default=0.0,
        ge=0.0,
        lt=0.5,
        description="Conservative DPO (TRL's label_smoothing): the probability that a pair's "
        "preference is flipped; the loss is -(1 - e) log sigmoid(beta m) - e log sigmoid(-beta "
        "m). From 0 (plain DPO) up to (not including) 0.5; loss 'sigmoid' only.",
    )
    sequence_logprob: SequenceLogprob = Field(
        default="sum",
        description="How an output's log-prob is formed from its response tokens: 'sum' "
        "(log pi(o | q), both papers) or 'mean' (divided by its token count: DeepSeekMath's "
        "appendix DPO, TRL's IPO).",
    )

    @model_validator(mode="after")
    def _smoothing_is_dpo_s(self) -> DPOConfig:
        if self.label_smoothing > 0 and self.loss != "sigmoid":
            raise ValueError(
                f"grpo.algo.dpo.label_smoothing = {self.label_smoothing} smooths the sigmoid "
                f"loss, not {self.loss}: set loss: sigmoid, or label_smoothing: 0"
            )
        return self
