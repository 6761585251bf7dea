"""A TorchEngine that records each step's accumulated gradients instead of stepping: the
tests compare whole updates gradient by gradient."""

from __future__ import annotations

import torch

from grpo_core.contracts.training import OptimizerSettings
from grpo_core.engines.train import TorchEngine


class RecordingEngine(TorchEngine):
    """Records the accumulated gradient at each step instead of stepping."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__(model, OptimizerSettings(lr=1e-3))
        self.grads: list[list[torch.Tensor]] = []

    def step(self) -> float:
        self.grads.append([p.grad.clone() for p in self.params if p.grad is not None])
        self.zero_grad()
        return 0.0


def assert_same_gradients(
    got: list[list[torch.Tensor]], want: list[list[torch.Tensor]], atol: float
) -> None:
    """Equal step counts, and every step's every gradient within `atol` (and not all ~0)."""
    assert len(got) == len(want) > 0
    for step_got, step_want in zip(got, want, strict=True):
        assert len(step_got) == len(step_want) > 0
        for a, b in zip(step_got, step_want, strict=True):
            assert torch.allclose(a, b, atol=atol)
    assert any(float(g.abs().max()) > 1e-4 for g in want[0])
