"""Where a LoRA GRPO stage resumes from: its own progress checkpoint's adapters, never a
checkpoint written with other grpo.lora settings or with full weights (then the stage starts
over, as a clean run with the new settings would)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from flows.engines.lora_updater import ADAPTERS_DIR
from flows.stages.grpo_progress import resume_weights
from grpo_core.model.config import LoRAConfig
from grpo_core.model.lora import LoRAAdapters
from storage.checkpoints import TRAINING_STATE_FILE
from tests.models import tiny_llama

pytest.importorskip("peft", reason="the lora extra (pip install -e '.[lora]') is not installed")
pytestmark = pytest.mark.usefixtures("one_torch_thread")
LORA = LoRAConfig(enabled=True, r=2, alpha=4)


def trained_adapters(cfg: LoRAConfig = LORA) -> LoRAAdapters:
    adapters = LoRAAdapters(tiny_llama(), cfg, seed=0)
    with torch.no_grad():
        for p in adapters.trainable():
            p.fill_(0.1)
    return adapters


def lora_b(adapters: LoRAAdapters) -> list[torch.Tensor]:
    return [p for n, p in adapters.model.named_parameters() if "lora_B" in n]


def progress_with(path: Path, adapters: LoRAAdapters | None) -> Path:
    path.mkdir()
    (path / TRAINING_STATE_FILE).write_bytes(b"")  # the optimizer's file: present in both kinds
    if adapters is None:
        (path / "config.json").write_text("{}")  # a full-weights progress checkpoint
    else:
        adapters.save(path / ADAPTERS_DIR)
    return path


def test_its_own_adapters_are_loaded(tmp_path: Path) -> None:
    progress = progress_with(tmp_path / "p", trained_adapters())
    fresh = LoRAAdapters(tiny_llama(), LORA, seed=1)
    assert resume_weights(progress, fresh.model, fresh)
    assert all(bool((b == 0.1).all()) for b in lora_b(fresh))


@pytest.mark.parametrize("saved", ["full weights", "rank 4", "other modules"])
def test_a_checkpoint_of_other_settings_starts_the_stage_over(tmp_path: Path, saved: str) -> None:
    other = {
        "full weights": None,
        "rank 4": trained_adapters(LoRAConfig(enabled=True, r=4, alpha=4)),
        "other modules": trained_adapters(
            LoRAConfig(enabled=True, r=2, alpha=4, target_modules=["q_proj"])
        ),
    }[saved]
    progress = progress_with(tmp_path / "p", other)
    fresh = LoRAAdapters(tiny_llama(), LORA, seed=1)
    assert not resume_weights(progress, fresh.model, fresh)
    assert all(bool((b == 0).all()) for b in lora_b(fresh))  # untouched: new adapters


def test_a_full_weights_stage_starts_over_on_a_lora_checkpoint(tmp_path: Path) -> None:
    progress = progress_with(tmp_path / "p", trained_adapters())
    model = tiny_llama()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert not resume_weights(progress, model)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
