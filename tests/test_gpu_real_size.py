"""bench/gpu_real_size.py on CPU: one line and exit 0 without CUDA, every section's code path at
toy size (--dry-run) giving its table, and the update's FLOP count by hand."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture
def bench_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bench scripts import each other as top-level modules, as `python bench/x.py` does."""
    monkeypatch.syspath_prepend(str(BENCH))


def run_dry(sections: list[str], tmp_path: Path) -> dict:
    from gpu_real_size import main

    out = tmp_path / "real-size.json"
    assert main(["--dry-run", "--sections", *sections, "--out", str(out)]) == 0
    tables: dict = json.loads(out.read_text())
    return tables


def column(table: dict, name: str) -> list:
    at = table["columns"].index(name)
    return [row[at] for row in table["rows"]]


def test_without_cuda_it_prints_one_line_and_exits_0() -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(
        [sys.executable, str(BENCH / "gpu_real_size.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["gpu_real_size: no CUDA device: nothing measured"]


def test_update_flops_by_hand(bench_modules: None) -> None:
    from real_size_common import mfu, update_flops, update_passes

    # reference forward only at mu = 1 with one mini-batch (pi_old = detached current policy)
    assert update_passes(beta=0.04, mu=1, mini_batches_per_epoch=1) == (1, 1)
    assert update_passes(beta=0.0, mu=1, mini_batches_per_epoch=1) == (0, 1)
    assert update_passes(beta=0.04, mu=2, mini_batches_per_epoch=1) == (2, 2)
    assert update_passes(beta=0.04, mu=1, mini_batches_per_epoch=4) == (2, 1)
    # 1,000 parameters, 10 tokens: one forward (2 N) and two training passes (6 N each)
    assert update_flops(1000, 10, forward_only=1, training=2) == 10 * 1000 * (2 + 12)
    # 1 PFLOP in 2 s is 500 TFLOP/s: half of a 1,000 TFLOP/s peak
    assert mfu(1e15, 2.0, 1000.0) == pytest.approx(0.5)


def test_update_and_decode_tables_at_toy_size(bench_modules: None, tmp_path: Path) -> None:
    tables = run_dry(["update", "decode"], tmp_path)
    update, decode = tables["update"], tables["decode"]
    assert update["columns"][-5:] == ["s/update", "tokens/s", "TFLOP/s", "MFU", "peak GiB"]
    assert column(update, "row tokens") == [32, 64]
    for name in ("s/update", "tokens/s", "TFLOP/s", "peak GiB"):
        assert all(value > 0 for value in column(update, name)), name
    assert any(note.startswith("memory settings on: ") for note in update["notes"])
    assert column(decode, "engine")[:2] == ["hf", "hf_generate"]
    assert {"hf, static+compile", "hf_generate, static+compile"} <= set(column(decode, "engine"))
    assert sorted(set(column(decode, "batch"))) == [4, 8]
    for name in ("completion tokens", "tokens/s", "floor tokens/s", "share of floor"):
        assert all(value > 0 for value in column(decode, name)), name


def test_trl_section_runs_our_step_and_names_what_to_carry(
    bench_modules: None, tmp_path: Path
) -> None:
    table = run_dry(["trl"], tmp_path)["trl"]
    ours = dict(zip(table["columns"], table["rows"][0], strict=True))
    assert ours["side"] == "ours"
    assert ours["s/step (median)"] > 0
    assert ours["completion tokens/step"] > 0
    trl = table["rows"][1]
    assert trl[0] == "TRL"
    try:
        import trl as _  # noqa: F401
    except ImportError:
        assert trl[1] == "TRL not installed: skipped"
        assert any("trl==1.16.0" in note for note in table["notes"])
    else:
        assert trl[1] > 0


def test_loop_section_times_every_stage_of_one_iteration(
    bench_modules: None, tmp_path: Path
) -> None:
    table = run_dry(["loop"], tmp_path)["loop"]
    stages = column(table, "stage")
    assert stages == ["warm_start", "rollout", "label", "train_rm", "grpo", "evaluate"]
    assert set(column(table, "iteration")) == {0}
    assert all(seconds > 0 for seconds in column(table, "seconds"))
