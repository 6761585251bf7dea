"""Training contract: the optimizer settings every training engine is built from, and the
`TrainEngine` protocol the GRPO update (and reward-model training) runs on."""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:  # annotations only: the settings load without torch (config loading)
    import torch
    from torch import Tensor, nn

    from grpo_core.contracts.policy_batch import PolicyBatch

LRSchedule = Literal["constant", "cosine"]


@dataclass(frozen=True)
class OptimizerSettings:
    """What every training engine's AdamW, clipping, LR schedule and forward precision are
    built from: one object, made by GRPOConfig.optimizer_settings for the policy (with the
    autocast of policy.dtype, grpo_core/engines/train.py with_policy_precision) and by
    reward_models.training.rm_optimizer_settings for the reward models."""

    lr: float
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    max_grad_norm: float = 1.0
    warmup_steps: int = 0
    lr_schedule: LRSchedule = "constant"
    total_steps: int | None = None  # the cosine schedule's length (None: constant only)
    # forward passes under torch.autocast to this dtype (policy.dtype bf16-mixed), the
    # parameters and optimizer state staying in theirs; None: no autocast
    autocast: Literal["bfloat16"] | None = None


class TrainEngine(Protocol):
    """A policy model with its optimizer: forward, backward, step (DeepSpeed fits the same).

    With data_parallel_size > 1 every rank holds the whole batch, runs the same number of
    forward/backward passes on its share of each mini-batch, and backward must give the
    gradient of the *sum* of the ranks' losses (each loss is already normalised by the
    whole mini-batch).
    """

    model: nn.Module
    data_parallel_size: int  # processes splitting each mini-batch's rows (1: this one does all)
    data_parallel_rank: int  # this process's index among them, 0 .. data_parallel_size - 1

    @property
    def device(self) -> torch.device:
        """Where the model computes: inputs go there (DeepSpeed may have moved the model)."""
        ...

    @property
    def forward_model(self) -> nn.Module:
        """What to call for a forward pass whose loss goes to `backward`: the model, or the
        wrapper whose hooks reduce gradients over the ranks (DDP, DeepSpeed's engine)."""
        ...

    def forward_context(self) -> AbstractContextManager[None]:
        """What every forward pass of the model runs under, with or without gradients
        (torch.autocast for OptimizerSettings.autocast; else nothing)."""
        ...

    def forward_logprobs(
        self,
        batch: PolicyBatch,
        temperature: float,
        with_entropy: bool = False,
        logits_chunk_tokens: int | None = None,
        packed: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Completion-token log-probs (B, L) with grad, and entropies (B, L) if asked;
        logits_chunk_tokens positions at a time through the output layer where the model's
        head allows it (grpo_core/model/chunked_head.py; a DDP or DeepSpeed wrapper's own
        forward takes the whole logits); packed: the rows as one row without padding (the
        caller checked grpo_core/model/packing.py's packs)."""
        ...

    def backward(self, loss: Tensor) -> None:
        """Accumulate the gradient of `loss`."""
        ...

    def step(self) -> float:
        """Clip gradients, take an optimizer + LR step, clear gradients; the pre-clip norm."""
        ...

    def zero_grad(self) -> None:
        """Drop accumulated gradients."""
        ...

    def current_lr(self) -> float:
        """The learning rate the next step uses."""
        ...

    def full_state_dict(self) -> dict[str, Tensor]:
        """The trained weights to save, whole, under the keys of the model's own state_dict
        (TorchEngine: that state_dict; DeepSpeed: ZeRO-3 gathered, in fp32). Every rank calls
        it (collective under ZeRO-3)."""
        ...

    def save_optimizer_state(self, directory: Path) -> dict[str, Any] | None:
        """What resumes the optimizer and LR schedule, given the model's saved weights: a dict
        of tensors when one holds it (torch.load(weights_only=True) safe), else the engine's
        own checkpoint written into `directory` (returns None)."""
        ...

    def load_optimizer_state(self, directory: Path, state: dict[str, Any] | None) -> None:
        """Restore what save_optimizer_state gave: `state`, or the checkpoint in `directory`
        when it returned None (the model's weights are already loaded)."""
        ...

    def all_reduce(self, values: Tensor, op: Literal["sum", "max"]) -> Tensor:
        """Element-wise sum or max of a 1-D float64 tensor over the data-parallel ranks."""
        ...

    def train(self) -> None:
        """Put the model in training mode."""
        ...

    def eval(self) -> None:
        """Put the model in evaluation mode."""
        ...
