"""The DeepSpeed training engine (ZeRO 0-3, bf16) behind the TrainEngine interface.

Same AdamW, LR schedule and clipping as TorchEngine (the optimizer object is built by the
same function and handed to DeepSpeed), same loss code (grpo_update drives both engines).
In one process it runs in-process (CPU: gloo); several processes come from the deepspeed
launcher (grpo_core.engines.deepspeed_launch). deepspeed is imported lazily:
`pip install -e '.[gpu]'`.
"""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Callable
from contextlib import AbstractContextManager
from functools import partial
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor, nn

from grpo_core.algo.config import merge_trees
from grpo_core.contracts.policy_batch import PolicyBatch
from grpo_core.contracts.training import OptimizerSettings
from grpo_core.engines.config import DeepSpeedConfig
from grpo_core.engines.train import (
    adamw_kernel,
    autocast_context,
    build_adamw,
    build_lr_schedule,
    check_schedule,
)
from grpo_core.model.deepspeed_import import import_deepspeed
from grpo_core.model.forward import sequence_outputs


def set_single_process_env() -> None:
    """torch.distributed env vars of a 1-process world, unless a launcher set them.

    They stay set: ZeRO-3 reads LOCAL_RANK while training. run_update_job drops them from
    the launcher's environment.
    """
    if "RANK" in os.environ or "WORLD_SIZE" in os.environ:
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", LOCAL_RANK="0", WORLD_SIZE="1"
    )


def deepspeed_config_dict(cfg: DeepSpeedConfig, max_grad_norm: float) -> dict[str, Any]:
    """The DeepSpeed JSON config: ZeRO stage, bf16, clipping, caller-owned accumulation."""
    generated: dict[str, Any] = {
        # grpo_update decides the micro-batches: backward() only accumulates, every step()
        # is an optimizer step, and the batch-size keys are bookkeeping only.
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "managed_gradient_accumulation": False,
        "gradient_clipping": max_grad_norm,
        "zero_optimization": {"stage": cfg.zero_stage},
        "bf16": {"enabled": cfg.bf16},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }
    return merge_trees(generated, cfg.extra)


class _ClippingAdamW(torch.optim.AdamW):
    """AdamW that clips the (already all-reduced) gradients and skips a non-finite step.

    For ZeRO-0 in fp32, the one DeepSpeed mode that neither reports the gradient norm nor
    skips a non-finite step; DeepSpeed reads `overflow` and then skips the LR step too.
    """

    def __init__(self, params: list[nn.Parameter], max_grad_norm: float, **kwargs: Any) -> None:
        super().__init__(params, **kwargs)
        self.max_grad_norm = max_grad_norm
        self.grad_norm = 0.0
        self.overflow = False

    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        params = [p for group in self.param_groups for p in group["params"] if p.grad is not None]
        self.grad_norm = float(torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm))
        self.overflow = not math.isfinite(self.grad_norm)
        return None if self.overflow else super().step(closure)


class DeepSpeedEngine:
    """A DeepSpeed engine (ZeRO 0-3, optional bf16) with TorchEngine's optimizer settings.

    `model` is the DeepSpeed engine module (its forward gathers ZeRO-3 shards); inputs must
    be on `device`. Save weights from full_state_dict(), not model.state_dict(): under ZeRO-3
    the module holds partitions, and with bf16 it holds bf16 copies.
    """

    def __init__(
        self, model: nn.Module, optim: OptimizerSettings, config: DeepSpeedConfig | None = None
    ) -> None:
        check_schedule(optim)
        self.config = config or DeepSpeedConfig()
        self._deepspeed = import_deepspeed()
        params = [p for p in model.parameters() if p.requires_grad]
        self._clips_itself = self.config.zero_stage == 0 and not self.config.bf16
        if self._clips_itself:
            optimizer: torch.optim.AdamW = _ClippingAdamW(
                params,
                optim.max_grad_norm,
                lr=optim.lr,
                betas=optim.betas,
                weight_decay=optim.weight_decay,
                **adamw_kernel(params),
            )
        else:
            optimizer = build_adamw(params, optim)
        clip = 0.0 if self._clips_itself else optim.max_grad_norm
        ds_config = deepspeed_config_dict(self.config, clip)
        self._adamw = optimizer
        set_single_process_env()
        self.engine, *_ = self._deepspeed.initialize(
            model=model,
            optimizer=optimizer,
            lr_scheduler=partial(build_lr_schedule, optim=optim),
            config=ds_config,
        )
        self.model: nn.Module = self.engine
        self.device = torch.device(self.engine.device)
        self.data_parallel_size = int(self.engine.dp_world_size)
        self.data_parallel_rank = torch.distributed.get_rank() if self.data_parallel_size > 1 else 0
        self.autocast = optim.autocast

    @property
    def forward_model(self) -> nn.Module:
        """DeepSpeed's engine (ZeRO gathers and gradient reduction run in its hooks)."""
        return self.model

    def forward_logprobs(
        self,
        batch: PolicyBatch,
        temperature: float,
        with_entropy: bool = False,
        logits_chunk_tokens: int | None = None,
        packed: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Completion-token log-probs (B, L) with grad, and entropies (B, L) if asked, under
        forward_context."""
        with self.forward_context():
            return sequence_outputs(
                self.engine, batch, temperature, with_entropy, logits_chunk_tokens, packed
            )

    def forward_context(self) -> AbstractContextManager[None]:
        """torch.autocast for OptimizerSettings.autocast (policy.dtype bf16-mixed, with
        DeepSpeed's own bf16 off: fp32 parameters), else nothing."""
        return autocast_context(self.device, self.autocast)

    def backward(self, loss: Tensor) -> None:
        """Accumulate the gradient of `loss`; DeepSpeed averages over ranks, grpo_update sums."""
        if self.data_parallel_size > 1:
            loss = loss * self.data_parallel_size
        self.engine.backward(loss, scale_wrt_gas=False)

    def step(self) -> float:
        """Reduce, clip to max_grad_norm, step AdamW and the LR schedule; the pre-clip norm.

        A non-finite norm skips the step (and the LR step) as in TorchEngine, except in bf16
        without ZeRO, where DeepSpeed's BF16 optimizer does not check.
        """
        self.engine.step()
        if self._clips_itself:
            assert isinstance(self._adamw, _ClippingAdamW)
            return self._adamw.grad_norm
        norm = self.engine.get_global_grad_norm()
        if norm is None:
            raise RuntimeError("DeepSpeed reported no gradient norm after step()")
        return float(norm)

    def zero_grad(self) -> None:
        """Drop accumulated gradients."""
        self.engine.optimizer.zero_grad(set_to_none=True)
        self.engine.zero_grad()

    def current_lr(self) -> float:
        """The learning rate the next step uses."""
        return float(self.engine.get_lr()[0])

    def state_dict(self) -> dict[str, Any]:
        """AdamW and LR-schedule state as plain tensors (torch.load(weights_only=True) safe).

        One fp32 process with ZeRO 0-2 only (has_plain_state): the model's weights then equal
        the optimizer's fp32 master copy, so weights + this state resume exactly. Otherwise
        use save_checkpoint().
        """
        self._require_plain_state("state_dict")
        return {
            "optimizer": self.engine.basic_optimizer.state_dict(),
            "scheduler": self.engine.lr_scheduler.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what state_dict returned, into an engine of the same config and weights."""
        self._require_plain_state("load_state_dict")
        self.engine.basic_optimizer.load_state_dict(state["optimizer"])
        self.engine.lr_scheduler.load_state_dict(state["scheduler"])

    def save_checkpoint(self, directory: Path) -> None:
        """DeepSpeed's sharded checkpoint (weights, optimizer, schedule); every rank calls it."""
        self.engine.save_checkpoint(str(directory), tag="state")

    def load_checkpoint(self, directory: Path) -> None:
        """Restore what save_checkpoint wrote, with the same number of ranks."""
        path, _ = self.engine.load_checkpoint(str(directory), tag="state")
        if path is None:
            raise FileNotFoundError(f"no DeepSpeed checkpoint with tag 'state' in {directory}")

    def save_optimizer_state(self, directory: Path) -> dict[str, Any] | None:
        """state_dict() when has_plain_state, else save_checkpoint(directory) and None."""
        if self.has_plain_state:
            return self.state_dict()
        self.save_checkpoint(directory)
        return None

    def load_optimizer_state(self, directory: Path, state: dict[str, Any] | None) -> None:
        """load_state_dict(state) when has_plain_state, else load_checkpoint(directory)."""
        if not self.has_plain_state:
            self.load_checkpoint(directory)
        elif state is None:
            raise ValueError(
                f"no optimizer state to resume DeepSpeed (one fp32 process, ZeRO-"
                f"{self.config.zero_stage}) from (got None, {directory} is not read): the "
                "checkpoint was saved by another engine or engines setting"
            )
        else:
            self.load_state_dict(state)

    def full_state_dict(self) -> dict[str, Tensor]:
        """Every parameter and persistent buffer, whole, on CPU and in fp32, on every rank.

        Collective under ZeRO-3 (each parameter is gathered in turn), so every rank calls it.
        Floating-point tensors are widened to fp32 (bf16 training keeps fp32 checkpoints).
        Pass it to save_pretrained(state_dict=...).
        """
        module: nn.Module = self.engine.module
        out = {name: value.detach().cpu().clone() for name, value in module.state_dict().items()}
        if self.config.zero_stage == 3:
            for name, param in module.named_parameters(remove_duplicate=False):
                with self._deepspeed.zero.GatheredParameters([param], modifier_rank=None):
                    out[name] = param.detach().cpu().clone()
        out = {n: v.float() if v.is_floating_point() else v for n, v in out.items()}
        # Tied parameters (lm_head = embed_tokens) stay one tensor, so save_pretrained stores
        # them once, as it does for the module itself.
        first: dict[int, str] = {}
        for name, value in module.state_dict(keep_vars=True).items():
            owner = first.setdefault(id(value), name)
            if owner != name:
                out[name] = out[owner]
        return out

    def all_reduce(self, values: Tensor, op: Literal["sum", "max"]) -> Tensor:
        """Element-wise sum or max over the data-parallel ranks; a CPU tensor."""
        if self.data_parallel_size == 1:
            return values
        reduced = values.to(self.device)
        reduce_op = (
            torch.distributed.ReduceOp.SUM if op == "sum" else torch.distributed.ReduceOp.MAX
        )
        torch.distributed.all_reduce(reduced, op=reduce_op)
        return reduced.cpu()

    def train(self) -> None:
        """Put the model in training mode."""
        self.engine.train()

    def eval(self) -> None:
        """Put the model in evaluation mode."""
        self.engine.eval()

    @property
    def has_plain_state(self) -> bool:
        """Whether state_dict() + the model's weights resume exactly: one fp32 process, ZeRO
        0-2 (ZeRO-3 keys its optimizer state by partitions, not by parameters)."""
        return self.data_parallel_size == 1 and not self.config.bf16 and self.config.zero_stage < 3

    def _require_plain_state(self, what: str) -> None:
        if not self.has_plain_state:
            raise RuntimeError(
                f"{what}() covers one fp32 process with ZeRO 0-2 (got {self.data_parallel_size} "
                f"ranks, bf16={self.config.bf16}, ZeRO-{self.config.zero_stage}): partitions and "
                "fp32 master weights live in DeepSpeed's optimizer; use "
                "save_checkpoint()/load_checkpoint() (a directory)"
            )
