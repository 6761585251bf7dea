"""Peak memory of one GRPO stage at policy.dtype float32 and bfloat16, same model, side by side.

For each dtype: a store is prepared with policy_0 (warm start skipped: a seeded random Llama,
widened to ~25M parameters so the weights matter next to the process's own memory), then a
fresh process runs the GRPO stage of iteration 0 alone (policy, reference, AdamW, sampling,
updates; the verifier as the reward, no reward model) and reports its peak RSS. A fixed
float32 matmul measured in the same run is the machine-speed reference.

    OMP_NUM_THREADS=2 .venv/bin/python bench/precision_memory.py
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OVERRIDES = [
    "run.iterations=1",
    "run.warm_start=false",
    "policy.hidden_size=512",
    "policy.n_layers=8",
    "policy.n_heads=8",
    "policy.intermediate_size=1408",
    "reward_models.use_orm=false",
    "reward_models.use_prm=false",
    "grpo.rewards.orm=0",
    "grpo.rewards.verifier=1",
    "grpo.steps=2",
    "grpo.prompts_per_step=8",
    "grpo.group_size=4",
    "grpo.max_new_tokens=32",
    "grpo.algo.micro_batch_size=32",
]


def _config(store: Path, dtype: str) -> object:
    from flows.config_files import load_config

    return load_config(
        "micro", [*OVERRIDES, f"policy.dtype={dtype}", f"store.root={store}", "run.run_id=mem"]
    )


def prepare(store: Path, dtype: str) -> None:
    """policy_0 of the run, in `dtype` (the warm-start stage, without its SFT)."""
    from flows.context import RunContext
    from flows.names import WARM_START
    from flows.stages import STAGES
    from storage.store import RunStore

    cfg = _config(store, dtype)
    run_store = RunStore(store)
    with run_store.open_run("mem", cfg.model_dump(mode="json")) as run:  # type: ignore[attr-defined]
        ctx = RunContext(cfg, run_store, run)  # type: ignore[arg-type]
        STAGES[WARM_START].fn(ctx, 0, lambda fraction, text: None)
        ctx.close()


def grpo_stage_alone(store: Path, dtype: str) -> dict[str, float]:
    """Run the GRPO stage of iteration 0 in this (fresh) process; its figures."""
    from flows.context import RunContext
    from flows.names import GRPO
    from flows.stages import STAGES
    from storage.store import RunStore

    cfg = _config(store, dtype)
    run_store = RunStore(store)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with run_store.open_run("mem", cfg.model_dump(mode="json")) as run:  # type: ignore[attr-defined]
        ctx = RunContext(cfg, run_store, run)  # type: ignore[arg-type]
        model, _ = ctx.policy(0)
        params = sum(p.numel() * p.element_size() for p in model.parameters())
        del model
        start = time.perf_counter()
        STAGES[GRPO].fn(ctx, 0, lambda fraction, text: None)
        seconds = time.perf_counter() - start
        ctx.close()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "param_mb": params / 2**20,
        "peak_rss_mb": peak / 1024,
        "rss_before_mb": before / 1024,
        "seconds": seconds,
    }


def matmul_gflops() -> float:
    """The machine-speed reference: float32 GFLOP/s of a fixed 1024^3 matmul, best of 5."""
    import torch

    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * 1024**3 / best / 1e9


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--child", nargs=2, metavar=("STORE", "DTYPE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(grpo_stage_alone(Path(args.child[0]), args.child[1])))
        return 0
    threads = os.environ.get("OMP_NUM_THREADS", "unset")
    print(f"OMP_NUM_THREADS={threads}, load {os.getloadavg()[0]:.1f}, ref {matmul_gflops():.1f}")
    rows = []
    for dtype in ("float32", "bfloat16"):
        with tempfile.TemporaryDirectory(prefix="precision-bench-") as tmp:
            store = Path(tmp)
            prepare(store, dtype)
            out = subprocess.run(
                [sys.executable, __file__, "--child", str(store), dtype],
                cwd=REPO,
                capture_output=True,
                text=True,
                check=True,
            )
            rows.append((dtype, json.loads(out.stdout.strip().splitlines()[-1])))
    print(f"{'policy.dtype':>12} | params MB | peak RSS MB | GRPO stage s")
    for dtype, r in rows:
        print(
            f"{dtype:>12} | {r['param_mb']:9.1f} | {r['peak_rss_mb']:11.0f} | {r['seconds']:12.1f}"
        )
    print(f"machine-speed reference: {matmul_gflops():.1f} GFLOP/s (float32 1024^3 matmul)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
