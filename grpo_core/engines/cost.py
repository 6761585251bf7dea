"""What training costs, measured where it runs: the bytes a trained model's state holds, and
a stage's peak memory (CUDA's allocator peak, or on CPU the resident set's rise).

The GRPO stage records them as `metrics` rows (flows/stages/grpo.py) so that every run and
every ablation arm carries its cost beside its accuracy (docs/ppo.md, "What each arm costs").
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from types import TracebackType
from typing import Literal

import torch
from torch import nn

MIB = 2**20
STEP_SECONDS = "step_seconds"  # wall time of one GRPO step: sampling, reward, update(s)
PEAK_MEMORY_MIB = "peak_memory_mib"  # the stage's PeakMemory.mib
TRAINING_STATE_MIB = "training_state_mib"  # adamw_training_state_bytes summed, in MiB
# Figures two runs of one config do not share (wall time, memory): comparisons of a resumed
# run with an uninterrupted one, or of two engines, leave them out.
MEASURED_METRICS = frozenset({STEP_SECONDS, PEAK_MEMORY_MIB})

MemoryKind = Literal["cuda_max_allocated", "rss_above_start"]
_STATM = Path("/proc/self/statm")
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def adamw_training_state_bytes(model: nn.Module) -> int:
    """Bytes training `model` with AdamW holds: every parameter's weights (frozen ones are
    held too, e.g. a LoRA base), a gradient the size of each trainable one, AdamW's two
    moments (exp_avg, exp_avg_sq: the parameter's shape and dtype) and its per-parameter
    `step` counter (a float32 scalar). Activations are not state and are not counted."""
    total = 0
    for param in model.parameters():
        # DeepSpeed ZeRO-3 leaves an empty tensor in the module; ds_numel is the whole one's
        size = int(getattr(param, "ds_numel", param.numel())) * param.element_size()
        total += size
        if param.requires_grad:
            total += size + 2 * size + 4  # gradient, two moments, step
    return total


def resident_bytes() -> int:
    """This process's resident set size now (Linux /proc/self/statm, its second field)."""
    return int(_STATM.read_text().split()[1]) * _PAGE_BYTES


class PeakMemory:
    """The peak memory of what runs inside `with PeakMemory(device) as peak:`, read as
    `peak.mib` after the block. On CUDA: torch.cuda.max_memory_allocated after a reset at
    the start (the tensors' bytes, the allocator's cache not counted). On CPU: the highest
    resident set size a daemon thread saw (sampling every `interval_s`, and at both ends)
    minus the one at the start: memory the process held before the block and reuses inside
    it is not counted, and a spike shorter than the interval can be missed."""

    def __init__(self, device: torch.device | str, interval_s: float = 0.02) -> None:
        self.device = torch.device(device)
        self.kind: MemoryKind = (
            "cuda_max_allocated" if self.device.type == "cuda" else "rss_above_start"
        )
        self.interval_s = interval_s
        self._start = 0
        self._high = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> PeakMemory:
        if self.kind == "cuda_max_allocated":
            torch.cuda.reset_peak_memory_stats(self.device)
            return self
        self._start = self._high = resident_bytes()
        self._thread = threading.Thread(target=self._sample, name="peak-rss", daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._high = max(self._high, resident_bytes())

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._high = max(self._high, resident_bytes())

    @property
    def mib(self) -> float:
        """The peak in MiB (so far, when read inside the block)."""
        if self.kind == "cuda_max_allocated":
            return torch.cuda.max_memory_allocated(self.device) / MIB
        return max(self._high - self._start, 0) / MIB
