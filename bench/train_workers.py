"""Seconds per GRPO step with the update on two long-lived Ray training ranks against one
deepspeed launcher job per step (and against the single-process torch engine), side by side
in one invocation, with the machine-speed reference.

    OMP_NUM_THREADS=1 .venv/bin/python bench/train_workers.py                  # micro and small
    OMP_NUM_THREADS=1 .venv/bin/python bench/train_workers.py --configs micro --paths ray launcher

Each row is the GRPO stages of one fresh run of the `micro` preset (`--iterations`, default
1; `small` is micro with bench/grpo_bench_common.py's `small` Llama shape, 8 layers x 512, a
20-step warm start, 2 GRPO steps, reward-model guards that warn). The multi-rank paths run
DeepSpeed ZeRO-2 on 2 gloo ranks: `ray` kept for the run (engines.workers.lifetime: run),
`ray per stage` started by each GRPO stage, `launcher` a deepspeed job per step; `one
process` is engines.train: torch in the stage. set-up: per GRPO stage, `setup_grpo` (policy_k
and RM_k loaded, the sampler, getting the ranks: the Ray start, the actors and their process
group, once per run for `ray`; and building the updater). step: the stage's stored
step_seconds (the weights handed to the sampler, sampling, rewards, update), update: the
update alone, both medians over all stages' steps. The GRPO stage runs as set-up and steps
(flows/stages/grpo.py) with its updater wrapped to time each update.

    OMP_NUM_THREADS=1 .venv/bin/python bench/train_workers.py --configs micro --iterations 2 \
        --paths ray "ray per stage"
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from grpo_bench_common import CONFIGS
from machine_speed import load, reference_line

from flows.config_files import load_config
from flows.context import RunContext
from flows.loop import Executor, call_directly, execute_run
from flows.names import GRPO
from flows.progress import ProgressFn
from flows.stages import StageResult
from flows.stages.grpo import commit_grpo, setup_grpo, train_grpo
from grpo_core.engines.cost import STEP_SECONDS, PeakMemory

PATHS = ["one process", "ray", "ray per stage", "launcher"]

SMALL = CONFIGS["small"]
CONFIG_SETS = {
    "micro": ["run.iterations=1"],
    "small": [
        "run.iterations=1",
        f"policy.n_layers={SMALL.n_layers}",
        f"policy.hidden_size={SMALL.hidden_size}",
        f"policy.n_heads={SMALL.n_heads}",
        f"policy.intermediate_size={SMALL.intermediate_size}",
        "warm_start.steps=20",
        "grpo.steps=2",
        # 20 warm-start steps leave this policy wrong on every rollout: the reward-model
        # guards would stop the run before its GRPO stage, which is all this bench times
        "guards.rm_labels=warn",
        "guards.rm_auroc=warn",
    ],
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def path_sets(path: str) -> list[str]:
    if path == "one process":
        return ["engines.train=torch"]
    ds = ["engines.train=deepspeed", "engines.deepspeed.zero_stage=2"]
    if path == "launcher":
        return [
            *ds,
            "engines.deepspeed.processes_per_node=2",
            f"engines.deepspeed.master_port={free_port()}",
        ]
    lifetime = "stage" if path == "ray per stage" else "run"
    ranks = ["engines.train_workers=ray", "engines.workers.ranks=2"]
    return [*ds, *ranks, f"engines.workers.lifetime={lifetime}"]


class TimedUpdater:
    """A GRPO stage's policy updater whose update seconds are appended to `seconds`."""

    def __init__(self, inner: Any, seconds: list[float]) -> None:
        self.inner, self.seconds = inner, seconds

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def update(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return self.inner.update(*args, **kwargs)
        finally:
            self.seconds.append(time.perf_counter() - start)


def time_stages(config: str, path: str, root: Path, iterations: int) -> dict[str, Any]:
    """One run; each GRPO stage's set-up, and the step and update seconds."""
    setup: list[float] = []
    steps: list[float] = []
    updates: list[float] = []

    def timed_grpo(ctx: RunContext, k: int, progress: ProgressFn) -> StageResult:
        with PeakMemory(ctx.device) as peak:
            start = time.perf_counter()
            parts = setup_grpo(ctx, k)
            setup.append(time.perf_counter() - start)
            parts = dataclasses.replace(parts, updater=TimedUpdater(parts.updater, updates))
            samples, metrics = train_grpo(parts, progress)
        steps.extend(row["value"] for row in metrics if row["name"] == STEP_SECONDS)
        return commit_grpo(ctx, k, samples, metrics, peak.mib, parts.draw)

    def executor(ctx: RunContext) -> Executor:
        direct = call_directly(ctx)
        return lambda name, k, fn: direct(name, k, timed_grpo if name == GRPO else fn)

    run_id = f"bench-{config}-{path.replace(' ', '-')}"
    sets = [*CONFIG_SETS[config], *path_sets(path), f"store.root={root}"]
    sets.append(f"run.iterations={iterations}")
    execute_run(load_config("micro", [*sets, f"run.run_id={run_id}"]), make_executor=executor)
    return {
        "setup": setup,
        "step": statistics.median(steps),
        "update": statistics.median(updates),
        "steps": steps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--configs", nargs="+", default=["micro", "small"], choices=CONFIG_SETS)
    parser.add_argument("--paths", nargs="+", default=PATHS, choices=PATHS)
    parser.add_argument("--iterations", type=int, default=1, help="iterations (GRPO stages)")
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"uptime before: {uptime}", flush=True)
    print(reference_line(), flush=True)
    rows = []
    for config in args.configs:
        for path in args.paths:
            with tempfile.TemporaryDirectory() as tmp:
                before = load()
                got = time_stages(config, path, Path(tmp), args.iterations)
            each = ", ".join(f"{s:.1f}" for s in got["steps"])
            setups = " + ".join(f"{s:.1f}" for s in got["setup"])
            rows.append(
                f"| {config} | {path} | {setups} s | {got['step']:.1f} s ({each}) "
                f"| {got['update']:.1f} s | {before} |"
            )
            print("RESULT " + rows[-1], flush=True)
    print("\n| config | update path | set-up per stage | s per GRPO step (each) | update | load |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"uptime after: {uptime}")
    print(reference_line(), flush=True)


if __name__ == "__main__":
    main()
