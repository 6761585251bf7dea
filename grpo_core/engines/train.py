"""The plain-PyTorch training engine (the `TrainEngine` of grpo_core/contracts/training.py)
and what every engine builds from `OptimizerSettings`: the AdamW, the LR schedule and the
forward passes' autocast (policy.dtype bf16-mixed)."""

from __future__ import annotations

import contextlib
import logging
import math
from contextlib import AbstractContextManager
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor, nn

from grpo_core.contracts.policy_batch import PolicyBatch
from grpo_core.contracts.training import LRSchedule, OptimizerSettings
from grpo_core.model.config import AUTOCAST_DTYPES
from grpo_core.model.forward import sequence_outputs

log = logging.getLogger(__name__)

_KERNEL_NOTED: set[bool] = set()
_AUTOCAST_NOTED: set[str] = set()
# OptimizerSettings.autocast names and the torch dtypes they mean
AUTOCAST_TORCH_DTYPES = {"bfloat16": torch.bfloat16}


def lr_multiplier(
    step: int, warmup_steps: int, schedule: LRSchedule, total_steps: int | None
) -> float:
    """LR factor: linear warm-up to 1 over warmup_steps, then constant or cosine to 0."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    if total_steps is None or total_steps <= warmup_steps:
        raise ValueError(
            f"cosine schedule needs total_steps > warmup_steps "
            f"(got total_steps={total_steps}, warmup_steps={warmup_steps})"
        )
    progress = min((step - warmup_steps) / (total_steps - warmup_steps), 1.0)
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def check_schedule(optim: OptimizerSettings) -> None:
    """Refuse a schedule lr_multiplier cannot follow, when the engine is built."""
    lr_multiplier(optim.warmup_steps, optim.warmup_steps, optim.lr_schedule, optim.total_steps)


def adamw_kernel(params: list[nn.Parameter]) -> dict[str, bool]:
    """AdamW's implementation argument: the fused kernel (one launch per step for all
    parameters) when every parameter is on CUDA, else torch's default (the CPU for-loop, so a
    CPU run steps exactly as before). Logged once per process for each choice."""
    fused = bool(params) and all(p.is_cuda for p in params)
    if fused not in _KERNEL_NOTED:
        _KERNEL_NOTED.add(fused)
        if fused:
            log.info("AdamW: fused CUDA kernel (parameters on CUDA)")
        else:
            log.info("AdamW: torch's default implementation (fused AdamW is CUDA-only here)")
    return {"fused": True} if fused else {}


def build_adamw(params: list[nn.Parameter], optim: OptimizerSettings) -> torch.optim.AdamW:
    """The AdamW every engine steps with (DeepSpeed gets this same optimizer object); fused
    on CUDA (adamw_kernel)."""
    return torch.optim.AdamW(
        params,
        lr=optim.lr,
        betas=optim.betas,
        weight_decay=optim.weight_decay,
        **adamw_kernel(params),
    )


def with_policy_precision(optim: OptimizerSettings, policy_dtype: str) -> OptimizerSettings:
    """`optim` with the forward autocast policy.dtype asks for (bf16-mixed: bfloat16; a
    plain parameter dtype: none)."""
    return replace(optim, autocast=AUTOCAST_DTYPES.get(policy_dtype))


def autocast_context(
    device: torch.device, autocast: Literal["bfloat16"] | None
) -> AbstractContextManager[None]:
    """torch.autocast to `autocast` on `device`'s type (CPU and CUDA both run bfloat16
    autocast), or nothing; logged once per process and device type."""
    if autocast is None:
        return contextlib.nullcontext()
    if device.type not in _AUTOCAST_NOTED:
        _AUTOCAST_NOTED.add(device.type)
        log.info(
            "bf16-mixed (policy.dtype or reward_models.dtype): training's forward passes under "
            "torch.autocast(%s, %s); parameters and AdamW state keep their own dtype (float32)",
            device.type,
            autocast,
        )
    return torch.autocast(device.type, dtype=AUTOCAST_TORCH_DTYPES[autocast])


def build_lr_schedule(
    optimizer: torch.optim.Optimizer, optim: OptimizerSettings
) -> torch.optim.lr_scheduler.LambdaLR:
    """lr_multiplier as a torch scheduler on `optimizer`, stepped once per optimizer step."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: lr_multiplier(step, optim.warmup_steps, optim.lr_schedule, optim.total_steps),
    )


# Where DDP ranks keep the optimizer state in a checkpoint's state directory (rank 0 writes
# it: flows/engines/policy_rank.py), rather than passing it to the stage process.
OPTIMIZER_STATE_FILE = "optimizer_state.pt"


class TorchEngine:
    """AdamW with grad-norm clipping and LR warm-up on a plain PyTorch model."""

    data_parallel_size = 1
    data_parallel_rank = 0

    def __init__(self, model: nn.Module, optim: OptimizerSettings) -> None:
        check_schedule(optim)
        self.model = model
        self.max_grad_norm = optim.max_grad_norm
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = build_adamw(self.params, optim)
        self.scheduler = build_lr_schedule(self.optimizer, optim)
        self.autocast = optim.autocast

    def forward_context(self) -> AbstractContextManager[None]:
        """torch.autocast for OptimizerSettings.autocast (policy.dtype bf16-mixed), else
        nothing."""
        return autocast_context(self.device, self.autocast)

    def forward_logprobs(
        self,
        batch: PolicyBatch,
        temperature: float,
        with_entropy: bool = False,
        logits_chunk_tokens: int | None = None,
        packed: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Completion-token log-probs (B, L) with grad, and entropies (B, L) if asked, through
        forward_model, under forward_context."""
        with self.forward_context():
            return sequence_outputs(
                self.forward_model, batch, temperature, with_entropy, logits_chunk_tokens, packed
            )

    def backward(self, loss: Tensor) -> None:
        """Accumulate the gradient of `loss`."""
        loss.backward()

    def step(self) -> float:
        """Clip to max_grad_norm, step AdamW and the LR schedule; skip on a non-finite norm."""
        norm = float(torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm))
        if math.isfinite(norm):
            self.optimizer.step()
            self.scheduler.step()
        self.zero_grad()
        return norm

    def zero_grad(self) -> None:
        """Drop accumulated gradients."""
        self.optimizer.zero_grad(set_to_none=True)

    def current_lr(self) -> float:
        """The learning rate the next step uses."""
        return float(self.optimizer.param_groups[0]["lr"])

    @property
    def device(self) -> torch.device:
        """Where the model's parameters are."""
        return next(self.model.parameters()).device

    @property
    def forward_model(self) -> nn.Module:
        """The model itself: one process, nothing to reduce."""
        return self.model

    def state_dict(self) -> dict[str, Any]:
        """Optimizer and LR-schedule state."""
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what state_dict returned."""
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])

    def full_state_dict(self) -> dict[str, Tensor]:
        """The model's own state_dict: it holds the trained weights, in its own dtype."""
        return self.model.state_dict()

    def save_optimizer_state(self, directory: Path) -> dict[str, Any] | None:
        """state_dict(), always a dict: nothing is written to `directory`."""
        return self.state_dict()

    def load_optimizer_state(self, directory: Path, state: dict[str, Any] | None) -> None:
        """load_state_dict(state); without one, the OPTIMIZER_STATE_FILE in `directory` (what
        rank 0 of DDP ranks writes there: the same state, whole), so a checkpoint written by
        ranks resumes in one process too."""
        path = directory / OPTIMIZER_STATE_FILE
        if state is None and path.is_file():
            state = torch.load(path, map_location="cpu", weights_only=True)
        if state is None:
            raise ValueError(
                f"no optimizer state to resume TorchEngine from (none given, no {path}): the "
                "checkpoint was saved by another engine or engines setting"
            )
        self.load_state_dict(state)

    def all_reduce(self, values: Tensor, op: Literal["sum", "max"]) -> Tensor:
        """One process: the values themselves."""
        return values

    def train(self) -> None:
        """Put the model in training mode."""
        self.model.train()

    def eval(self) -> None:
        """Put the model in evaluation mode."""
        self.model.eval()
