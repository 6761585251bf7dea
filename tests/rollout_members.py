"""Members of a sharded rollout engine without vLLM: `PlaceSeededEngine` samples as a vLLM
worker seeds its rows; `GlooReceiver`'s "worker" is a thread that joins a weight-sync group
over real gloo and receives each broadcast, as a vLLM worker does."""

from __future__ import annotations

import random
import threading
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from grpo_core.contracts.rollout import RolloutBatch, SamplingParams
from grpo_core.engines.weight_sync import make_group


class PlaceSeededEngine:
    """Samples row (p, j) of a call from random.Random((seed, offset + p, j)): what a vLLM
    worker's per-row seeds give, here without vLLM."""

    def __init__(self, fail_close: bool = False) -> None:
        self.calls: list[tuple[int, int]] = []  # (prompt_offset, prompts) per generate
        self.loaded: list[Path] = []
        self.weights: list[Mapping[str, Tensor]] = []
        self.closed, self.fail_close = False, fail_close
        self.slept = 0

    def generate(
        self, prompts: list[str], n: int, params: SamplingParams, seed: int, prompt_offset: int = 0
    ) -> RolloutBatch:
        self.calls.append((prompt_offset, len(prompts)))
        batch = RolloutBatch([], [], [], [], [], [])
        for p, prompt in enumerate(prompts):
            for j in range(n):
                rng = random.Random(f"{seed}/{prompt_offset + p}/{j}")
                ids = [rng.randrange(100) for _ in range(params.max_new_tokens)]
                batch.prompt_index.append(p)
                batch.prompt_ids.append([ord(c) for c in prompt])
                batch.completion_ids.append(ids)
                batch.texts.append(f"{prompt}:{ids}")
                batch.finish_reasons.append("length")
                batch.logprobs.append([-rng.random() for _ in ids])
        return batch

    def load(self, checkpoint_dir: Path) -> None:
        self.loaded.append(checkpoint_dir)

    def receive_weights(self, weights: Mapping[str, Tensor]) -> None:
        self.weights.append(weights)

    def sleep(self) -> None:
        self.slept += 1

    def close(self) -> None:
        self.closed = True
        if self.fail_close:
            raise RuntimeError("worker gone")


class GlooReceiver(PlaceSeededEngine):
    """A member whose 'worker' is a thread joining the shared sync group over real gloo and
    receiving each broadcast, as a vLLM worker does."""

    sync_ranks = 1

    def __init__(self) -> None:
        super().__init__()
        self.group: Any = None
        self.received: list[dict[str, Tensor]] = []
        self.thread: threading.Thread | None = None

    def start_join(
        self, host: str, port: int, backend: str, timeout_s: float, rank: int = 1, world: int = 2
    ) -> None:
        def join() -> None:
            store = dist.TCPStore(host, port, world, is_master=False, timeout=timedelta(seconds=30))
            self.group = make_group(store, rank, backend, timedelta(seconds=30), world)

        self.thread = threading.Thread(target=join)
        self.thread.start()

    def start_update(self, tensors: list[list[object]]) -> None:
        def receive() -> None:
            got = {}
            for name, dtype, shape in tensors:
                assert isinstance(shape, list)
                out = torch.empty(shape, dtype=getattr(torch, str(dtype)))
                self.group.broadcast(out, 0).wait()
                got[str(name)] = out
            self.received.append(got)

        self.thread = threading.Thread(target=receive)
        self.thread.start()

    def finish_sync(self) -> None:
        assert self.thread is not None
        self.thread.join(timeout=60)
