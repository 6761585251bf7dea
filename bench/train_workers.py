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
process` is engines.train: torch in the stage. set-up: per GRPO stage, getting the ranks
(the Ray start, the actors and their process group: once per run for `ray`) and building
the updater; nothing for the other paths, whose jobs start at each step. step: the whole
GRPO step (sampling, rewards, update), update: the update alone, both medians over all
stages' steps.

    OMP_NUM_THREADS=1 .venv/bin/python bench/train_workers.py --configs micro --iterations 2 \
        --paths ray "ray per stage"
"""

from __future__ import annotations

import argparse
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
from flows.loop import execute_run
from flows.stages import grpo as grpo_stage_module

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


def time_stages(config: str, path: str, root: Path, iterations: int) -> dict[str, Any]:
    """One run; each GRPO stage's set-up, and the step and update seconds."""
    setup: list[float] = []
    steps: list[float] = []
    updates: list[float] = []
    build, step = grpo_stage_module.build_policy_updater, grpo_stage_module.grpo_step
    get_ranks = RunContext.training_ranks
    getting = [0.0]  # this stage's seconds in ctx.training_ranks (the run's ranks start there)

    def timed_ranks(self: RunContext) -> Any:
        start = time.perf_counter()
        try:
            return get_ranks(self)
        finally:
            getting[0] = time.perf_counter() - start

    def timed_build(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        updater = build(*args, **kwargs)
        setup.append(getting[0] + time.perf_counter() - start)
        getting[0] = 0.0
        update = updater.update

        def timed_update(*a: Any, **k: Any) -> Any:
            begin = time.perf_counter()
            try:
                return update(*a, **k)
            finally:
                updates.append(time.perf_counter() - begin)

        updater.update = timed_update
        return updater

    def timed_step(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return step(*args, **kwargs)
        finally:
            steps.append(time.perf_counter() - start)

    grpo_stage_module.build_policy_updater = timed_build  # type: ignore[assignment]
    grpo_stage_module.grpo_step = timed_step  # type: ignore[assignment]
    RunContext.training_ranks = timed_ranks  # type: ignore[method-assign]
    try:
        run_id = f"bench-{config}-{path.replace(' ', '-')}"
        sets = [*CONFIG_SETS[config], *path_sets(path), f"store.root={root}"]
        sets.append(f"run.iterations={iterations}")
        execute_run(load_config("micro", [*sets, f"run.run_id={run_id}"]))
    finally:
        grpo_stage_module.build_policy_updater = build  # type: ignore[assignment]
        grpo_stage_module.grpo_step = step  # type: ignore[assignment]
        RunContext.training_ranks = get_ranks  # type: ignore[method-assign]
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
