"""Settings of asynchronous GRPO (grpo.async): how many policy versions the sampler may run
behind the trainer and what becomes of a batch older than that, docs/algorithm.md section 15.
Torch-free, so a config loads without torch."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# wait: the sampler waits for the weights that keep every batch inside the bound (exact,
# reproducible); drop: it never waits, and a batch found beyond the bound is dropped and its
# step sampled again on the current weights (rows then depend on timing).
OnStale = Literal["wait", "drop"]


class AsyncSettings(BaseModel):
    """Sampling the next steps' batches while the current one trains, at most max_staleness
    policy versions behind (verl's one-step-off at 1, AReaL's max_head_offpolicyness)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    max_staleness: int = Field(
        default=0,
        ge=0,
        le=64,
        description="Policy versions the batch of a step may lag behind the policy it trains "
        "(0 to 64): 0 samples each step with the current policy, after the previous update "
        "(synchronous, today's rows exactly); k samples step s with the policy after step "
        "s-k-1's update (version max(0, s-k)) while steps s-k..s-1 train, so sampling overlaps "
        "training. Needs the sampler's log-probs in the loss: grpo.algo.use_sampling_logprobs_"
        "as_old (pi_old = the sampling policy) or grpo.algo.rollout_correction (the decoupled "
        "objective).",
    )
    on_stale: OnStale = Field(
        default="wait",
        description="A batch older than max_staleness: 'wait' (the sampler waits for the "
        "weights that keep every batch inside the bound: reproducible, and exact on resume) or "
        "'drop' (the sampler never waits and runs one batch further ahead; a batch beyond the "
        "bound is dropped, counted in async_dropped, and its step sampled again on the current "
        "weights: rows depend on timing).",
    )

    @property
    def on(self) -> bool:
        """Sampling runs beside training (a background sampler), not before each update."""
        return self.max_staleness > 0
