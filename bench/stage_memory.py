"""What the GRPO stage process holds when Ray ranks train the policy and vLLM samples it: its
own copy of policy_k (as before the skeleton; forced here) against the meta-device skeleton
it holds now, read from the stage's stored `peak_memory_mib` (on CPU: the highest resident
set size above the stage's start) with the machine-speed reference.

    OMP_NUM_THREADS=1 .venv/bin/python bench/stage_memory.py     # needs ray and make vllm-env

One fresh run per variant of the micro preset with bench/train_workers.py's `small` shape
(8 layers x 512), one iteration, two torch ranks, one vLLM worker process on the CPU.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from machine_speed import reference_line
from train_workers import CONFIG_SETS

from flows.config_files import load_config
from flows.loop import execute_run
from flows.names import POLICY
from flows.stages import grpo as grpo_stage_module
from storage.checkpoints import checkpoint_path
from storage.store import RunStore

VARIANTS = ["policy copy", "skeleton"]
VLLM_ON_CPU = [
    "engines.rollout=vllm",
    "engines.vllm.dtype=float32",
    "engines.vllm.enforce_eager=true",
    "engines.vllm.max_model_len=256",
    "engines.vllm.env={VLLM_CPU_OMP_THREADS_BIND: nobind}",
]
RANKS = ["engines.train_workers=ray", "engines.train=torch", "engines.workers.ranks=2"]


def stage_memory(variant: str, root: Path) -> dict[str, Any]:
    """One run; the GRPO stage's stored peak memory, its weights' size, and its wall."""
    decide = grpo_stage_module.stage_holds_policy_weights
    if variant == "policy copy":
        grpo_stage_module.stage_holds_policy_weights = lambda *a: True  # type: ignore[assignment]
    try:
        run_id = f"mem-{variant.replace(' ', '-')}"
        sets = [*CONFIG_SETS["small"], *VLLM_ON_CPU, *RANKS, f"store.root={root}"]
        started = time.perf_counter()
        execute_run(load_config("micro", [*sets, f"run.run_id={run_id}"]))
        seconds = time.perf_counter() - started
    finally:
        grpo_stage_module.stage_holds_policy_weights = decide  # type: ignore[assignment]
    rows = RunStore(root).read("metrics", run_id=run_id).to_pylist()
    peak = [r["value"] for r in rows if r["stage"] == "grpo" and r["name"] == "peak_memory_mib"]
    policy = checkpoint_path(root, run_id, POLICY, 1) / "model.safetensors"
    return {"peak": peak[0], "weights": policy.stat().st_size / 2**20, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--variants", nargs="+", default=VARIANTS, choices=VARIANTS)
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    print(reference_line(), flush=True)
    rows = []
    for variant in args.variants:
        with tempfile.TemporaryDirectory() as tmp:
            got = stage_memory(variant, Path(tmp))
        rows.append(
            f"| {variant} | {got['peak']:.0f} MiB | {got['weights']:.0f} MiB "
            f"| {got['seconds']:.0f} s |"
        )
        print("RESULT " + rows[-1], flush=True)
    print("\n| GRPO stage holds | stored peak_memory_mib | policy_1 weights | run wall |")
    print("|---|---|---|---|")
    print("\n".join(rows))
    print(reference_line(), flush=True)


if __name__ == "__main__":
    main()
