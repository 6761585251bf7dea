"""The torch engine as one rank of a torch.distributed group (DistributedDataParallel), for
training ranks where DeepSpeed is not installed (engines.train = torch with several ranks).

Same AdamW, clipping and LR schedule as TorchEngine (it is one): DDP all-reduces each
backward's gradients as a mean over the ranks, so the loss is scaled by the world size and
the ranks together accumulate the sum grpo_update asks for, as DeepSpeedEngine does.
Every rank then holds the same gradients, clips and steps identically, so its weights and
optimizer state are the same on all ranks: rank 0's state_dict resumes any of them.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from grpo_core.contracts.training import OptimizerSettings
from grpo_core.engines.train import TorchEngine


class DistributedTorchEngine(TorchEngine):
    """TorchEngine whose forward and backward go through DDP on the default process group
    (initialised by the caller: gloo for CPU, NCCL for CUDA)."""

    def __init__(self, model: nn.Module, optim: OptimizerSettings) -> None:
        if not dist.is_initialized():
            raise RuntimeError("DistributedTorchEngine needs torch.distributed initialised")
        super().__init__(model, optim)
        self.data_parallel_size = dist.get_world_size()
        self.data_parallel_rank = dist.get_rank()
        device = next(model.parameters()).device
        self.ddp = DistributedDataParallel(
            model, device_ids=None if device.type == "cpu" else [device]
        )

    @property
    def forward_model(self) -> nn.Module:
        """DDP's wrapper: its forward prepares the gradients' all-reduce in backward."""
        return self.ddp

    def backward(self, loss: Tensor) -> None:
        """Accumulate the gradient of `loss` summed over the ranks (DDP averages)."""
        (loss * self.data_parallel_size).backward()

    def all_reduce(self, values: Tensor, op: Literal["sum", "max"]) -> Tensor:
        """Element-wise sum or max over the ranks; a CPU tensor."""
        device = next(self.model.parameters()).device
        reduced = values.to(device)
        reduce_op = dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX
        dist.all_reduce(reduced, op=reduce_op)
        return reduced.cpu()

    def train(self) -> None:
        """Put the model in training mode."""
        self.ddp.train()

    def eval(self) -> None:
        """Put the model in evaluation mode."""
        self.ddp.eval()


def init_process_group(rank: int, world: int, address: str, port: int, cuda: bool) -> str:
    """Join the default torch.distributed group (NCCL for CUDA ranks, gloo otherwise) over
    TCP at address:port; returns the backend."""
    backend = "nccl" if cuda else "gloo"
    if cuda:
        torch.cuda.set_device(0)  # Ray shows each GPU rank its own device as cuda:0
    dist.init_process_group(
        backend, init_method=f"tcp://{address}:{port}", rank=rank, world_size=world
    )
    return backend
