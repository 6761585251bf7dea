"""Rollout contract: sampling parameters, the batch of sampled outputs, the sampler and the
rollout engine protocols (torch-free: tensors appear in annotations only)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    from torch import Tensor

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. temperature 0 means greedy decoding."""

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0


@dataclass
class RolloutBatch:
    """Outputs for P prompts x n samples, flattened prompt-major (row r -> prompt r // n).

    Token ids are unpadded python lists; `logprobs[r][t]` is the sampling log-prob of
    `completion_ids[r][t]` under the sampling distribution (temperature applied, before
    top-p truncation), reusable as pi_old when mu = 1. Completions exclude the EOS token
    from `text` but keep it in `completion_ids` when generation stopped on it.
    """

    prompt_index: list[int]
    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    texts: list[str]
    finish_reasons: list[FinishReason]
    logprobs: list[list[float]]

    def __len__(self) -> int:
        return len(self.texts)


class Sampler(Protocol):
    """Samples completions of prompt strings (already formatted for the model): what a
    consumer that only samples (evaluation, labelling, a GRPO step) needs of an engine."""

    def generate(
        self, prompts: list[str], n: int, params: SamplingParams, seed: int
    ) -> RolloutBatch:
        """n samples per prompt; the same (prompts, n, params, seed) give the same batch on CPU."""
        ...


class RolloutEngine(Sampler, Protocol):
    """A sampler that owns its life: it is given the policy's weights (a checkpoint, or the
    trained tensors), samples, and releases what it holds (a worker process, a cache)."""

    def load(self, checkpoint_dir: Path) -> None:
        """Sample from the policy saved at `checkpoint_dir` from now on (same architecture)."""
        ...

    def receive_weights(self, weights: Mapping[str, Tensor]) -> None:
        """Sample from these weights (the policy's state_dict names) from now on."""
        ...

    def close(self) -> None:
        """Release the engine's resources; it samples no more."""
        ...
