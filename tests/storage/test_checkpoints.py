"""Checkpoints: atomic directories, training state with weights_only loading, RNG round trip."""

from __future__ import annotations

import os
import random
import stat
from pathlib import Path

import numpy as np
import pytest
import torch

from storage.checkpoints import (
    capture_rng_state,
    checkpoint_path,
    latest_checkpoint,
    load_training_state,
    restore_rng_state,
    save_checkpoint,
    save_training_state,
)
from tests.models import tiny_llama


def draws() -> tuple[float, float, float]:
    return random.random(), float(np.random.rand()), float(torch.rand(1))


def test_layout_and_latest(tmp_path: Path) -> None:
    assert checkpoint_path(tmp_path, "r1", "policy", 3) == tmp_path / "checkpoints/r1/policy/iter-3"
    assert latest_checkpoint(tmp_path, "r1", "policy") is None
    for k in (0, 2, 10):
        save_checkpoint(checkpoint_path(tmp_path, "r1", "policy", k), lambda d: (d / "w").touch())
    with pytest.raises(RuntimeError):
        save_checkpoint(checkpoint_path(tmp_path, "r1", "policy", 11), _crash)
    assert latest_checkpoint(tmp_path, "r1", "policy") == checkpoint_path(
        tmp_path, "r1", "policy", 10
    )


def _crash(directory: Path) -> None:
    (directory / "half-written").touch()
    raise RuntimeError("crash while saving")


def test_training_state_round_trip_restores_rng(tmp_path: Path) -> None:
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    rng = capture_rng_state()
    expected = draws()
    save_training_state(
        tmp_path, optimizer_state=opt.state_dict(), rng_state=rng, extra={"next_step": 7}
    )
    state = load_training_state(tmp_path)
    assert state["extra"] == {"next_step": 7}
    opt2 = torch.optim.AdamW(torch.nn.Linear(3, 2).parameters(), lr=1e-3)
    opt2.load_state_dict(state["optimizer_state"])
    assert torch.equal(
        opt2.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"]
    )
    restore_rng_state(state["rng_state"])
    assert draws() == expected


def test_loading_refuses_arbitrary_pickles(tmp_path: Path) -> None:
    torch.save({"optimizer_state": object(), "rng_state": None}, tmp_path / "training_state.pt")
    with pytest.raises(Exception, match=r"[Ww]eights only"):
        load_training_state(tmp_path)


@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_checkpoint_files_honour_the_umask(tmp_path: Path, umask: int) -> None:
    """safetensors writes its file 0600 whatever the umask; a checkpoint's files get the mode
    a plain create would (teammates and workers under another user must read the weights)."""

    model = tiny_llama()
    previous = os.umask(umask)
    try:
        final = save_checkpoint(
            checkpoint_path(tmp_path, "r1", "policy", 0),
            lambda d: model.save_pretrained(d / "weights", safe_serialization=True),
        )
    finally:
        os.umask(previous)
    weights = final / "weights" / "model.safetensors"
    assert weights.is_file()
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in [final, *final.rglob("*")]}
    expected_file, expected_dir = 0o666 & ~umask, 0o777 & ~umask
    assert modes["model.safetensors"] == expected_file
    assert modes["config.json"] == expected_file
    assert modes["weights"] == expected_dir
    assert modes[final.name] == expected_dir
