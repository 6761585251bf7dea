"""Trainer side of the in-memory weight sync to vLLM workers: a process group (trainer rank 0,
workers ranks 1..N; gloo, or NCCL where no two ranks share a GPU: `sync_backend`) over which
the policy's tensors are broadcast one by one, in the order of a manifest sent beforehand:
one broadcast reaches every engine of a group (engines.vllm.engines).

The worker side (grpo_core/engines/vllm_worker.py) mirrors `make_group`: it runs in vLLM's
environment and imports nothing of ours. The group is a standalone c10d object, not
torch.distributed's default group, so it coexists with DeepSpeed's or vLLM's own.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

TRAINER_RANK, WORKER_RANK, WORLD_SIZE = 0, 1, 2
LOOPBACK = "127.0.0.1"  # where the group meets when every rank runs on this machine
TIMEOUT_SETTING = "engines.vllm.sync_timeout_s"


def sync_backend(setting: str, device: torch.device, sender_owns_gpu: bool) -> str:
    """The weight-sync group's backend for tensors on `device`. NCCL refuses two ranks on one
    GPU ("Duplicate GPU detected"), and the engines' workers may share the sender's GPU: so
    `auto` is NCCL only for CUDA tensors of a sender on a GPU of its own (a Ray-placed
    training rank) towards engines on GPUs of their own (the engines' setting stays `auto`
    only then: registry.vllm_engine_options), and gloo otherwise (CUDA tensors then go
    through host memory). `gloo` and `nccl` are taken as given."""
    if setting in ("gloo", "nccl"):
        return setting
    if setting != "auto":
        raise ValueError(f"weight-sync backend must be auto, gloo or nccl (got {setting!r})")
    return "nccl" if device.type == "cuda" and sender_owns_gpu else "gloo"


def make_group(
    store: dist.Store, rank: int, backend: str, timeout: timedelta, world_size: int = WORLD_SIZE
) -> Any:
    """A c10d backend of world_size ranks on `store` (typed Any: torch's stubs lack its
    `broadcast`); blocks until the other ranks join or `timeout` passes."""
    if backend == "gloo":
        return dist.ProcessGroupGloo(store, rank, world_size, timeout)
    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, world_size, options)
    raise ValueError(f"weight-sync backend must be gloo or nccl (got {backend!r})")


def manifest(weights: dict[str, Tensor]) -> list[list[object]]:
    """[name, dtype, shape] per tensor, in broadcast order (what the worker allocates)."""
    return [[n, str(t.dtype).removeprefix("torch."), list(t.shape)] for n, t in weights.items()]


def unique_tensors(weights: dict[str, Tensor]) -> dict[str, Tensor]:
    """Weights minus names whose tensor is one already listed (a tied lm_head is the input
    embedding: vLLM loads it with the embedding and skips the name)."""
    seen: set[tuple[int, torch.device]] = set()
    unique = {}
    for name, tensor in weights.items():
        key = (tensor.data_ptr(), tensor.device)
        if key not in seen:
            seen.add(key)
            unique[name] = tensor
    return unique


class WeightSender:
    """Rank 0 of the sync group: opens a TCP store on a free port, then `connect` joins the
    group once the worker has been told where it is; `send` broadcasts a manifest's tensors."""

    def __init__(
        self, timeout_s: float, host: str = LOOPBACK, world_size: int = WORLD_SIZE
    ) -> None:
        self.timeout = timedelta(seconds=timeout_s)
        self.host, self.world_size = host, world_size
        self.store = dist.TCPStore(
            host, 0, world_size, is_master=True, timeout=self.timeout, wait_for_workers=False
        )
        self.port: int = self.store.port
        self.group: Any = None
        self.backend = ""

    def connect(self, backend: str) -> None:
        """Join the group (the workers join as ranks 1.. at the same time)."""
        try:
            self.group = make_group(
                self.store, TRAINER_RANK, backend, self.timeout, self.world_size
            )
        except RuntimeError as err:
            raise RuntimeError(
                f"vLLM weight sync: the worker(s) did not join the {backend} group on "
                f"{self.host}:{self.port} within {self.timeout.total_seconds():.0f} s "
                f"({TIMEOUT_SETTING}); set engines.vllm.weight_sync: disk to reload "
                f"checkpoints instead. Cause: {err}"
            ) from err
        self.backend = backend

    def send(self, weights: dict[str, Tensor]) -> int:
        """Broadcast every tensor (contiguous, on the backend's device); the bytes sent."""
        if self.group is None:
            raise RuntimeError("WeightSender.send before connect")
        device = torch.device("cuda") if self.backend == "nccl" else torch.device("cpu")
        sent = 0
        for tensor in weights.values():
            data = tensor.detach().to(device).contiguous()
            self.group.broadcast(data, TRAINER_RANK).wait()
            sent += data.numel() * data.element_size()
        return sent
