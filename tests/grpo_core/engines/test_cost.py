"""The training-state count on a tiny module by hand and against a real AdamW step, and the
CPU peak-memory sampler seeing a large tensor that lives only inside its window."""

from __future__ import annotations

import time

import torch
from torch import nn

from grpo_core.engines.cost import MIB, PeakMemory, adamw_training_state_bytes, resident_bytes


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.trained = nn.Linear(3, 2)  # 6 + 2 float32 = 24 + 8 bytes
        self.wide = nn.Parameter(torch.zeros(5, dtype=torch.float64))  # 5 x 8 = 40 bytes
        self.frozen = nn.Linear(2, 1, bias=False).requires_grad_(False)  # 2 x 4 = 8 bytes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.frozen(self.trained(x)).sum() + self.wide.sum()


def test_training_state_counts_weights_grads_moments_and_steps_by_hand() -> None:
    # weights: 24 + 8 + 40 + 8 = 80; gradients (trainable only): 24 + 8 + 40 = 72;
    # AdamW's exp_avg and exp_avg_sq: 2 x 72 = 144; a float32 step per trainable tensor: 3 x 4
    assert adamw_training_state_bytes(Tiny()) == 80 + 72 + 144 + 12  # = 308


def test_training_state_equals_the_tensors_after_an_adamw_step() -> None:
    torch.manual_seed(0)
    model = Tiny()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    model(torch.randn(4, 3)).backward()
    optimizer.step()
    params = list(model.parameters())
    held = sum(p.numel() * p.element_size() for p in params)
    held += sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None)
    held += sum(
        v.numel() * v.element_size() for st in optimizer.state.values() for v in st.values()
    )
    assert adamw_training_state_bytes(model) == held


def test_peak_memory_on_cpu_sees_a_tensor_freed_before_the_window_ends() -> None:
    size_mib = 128
    with PeakMemory("cpu", interval_s=0.01) as peak:
        block = torch.ones(size_mib * MIB // 4)  # written, so its pages are resident
        deadline = time.monotonic() + 10.0  # the sampler thread may wait for a core
        while peak.mib < 0.9 * size_mib and time.monotonic() < deadline:
            time.sleep(0.01)
        del block  # freed inside the window: only the sampler can have seen it
    assert peak.kind == "rss_above_start"
    assert peak.mib >= 0.9 * size_mib
    assert resident_bytes() > 0
