"""The GRPO stage's updater when grpo.lora is on: the in-process update trains only the
adapters (the base weights are frozen, so the engine's optimizer holds the adapters alone);
the policy it hands on is the merged model. The stage saves and restores the adapters in its
progress checkpoint (before the engine is built, as full weights are)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import Tensor
from transformers import PreTrainedModel

from flows.engines.policy_updaters import PolicyUpdater
from grpo_core.contracts.policy_batch import PolicyBatch
from grpo_core.contracts.rollout import RolloutEngine
from grpo_core.model.lora import LoRAAdapters

ADAPTERS_DIR = "adapters"  # the adapters (PEFT format) inside a GRPO progress checkpoint


class LoRAUpdater:
    """`inner` (an InProcessUpdater on the adapted model) with the LoRA view of the policy."""

    def __init__(self, inner: PolicyUpdater, adapters: LoRAAdapters) -> None:
        self.inner = inner
        self.adapters = adapters

    def update(
        self, batch: PolicyBatch, advantages: Tensor, old_logprobs: Tensor | None, seed: int
    ) -> dict[str, float]:
        return self.inner.update(batch, advantages, old_logprobs, seed)

    def hand_on(self, follower: RolloutEngine | None) -> None:
        if follower is not None:  # else the stage's (adapted) model was trained in place
            follower.receive_weights(self.adapters.merged_state_dict())

    def save_weights(self, model: PreTrainedModel, directory: Path) -> None:
        """The merged weights, under the base model's keys (what a sampling engine that does
        not share the model receives): policy_{k+1} is a plain HF model."""
        model.save_pretrained(
            directory, safe_serialization=True, state_dict=self.adapters.merged_state_dict()
        )

    def save_state(self, directory: Path) -> dict[str, Any] | None:
        """The optimizer's state (the adapters themselves are saved by the stage beside it)."""
        return self.inner.save_state(directory)

    def load_state(self, directory: Path, state: dict[str, Any] | None) -> None:
        self.inner.load_state(directory, state)

    def close(self) -> None:
        self.inner.close()
