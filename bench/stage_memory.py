"""What the GRPO stage process holds when Ray ranks train the policy and vLLM samples it: the
meta-device skeleton of policy_k it holds (the ranks hold the weights), read from the stage's
stored `peak_memory_mib` (on CPU: the highest resident set size above the stage's start)
with the machine-speed reference.

    OMP_NUM_THREADS=1 .venv/bin/python bench/stage_memory.py     # needs ray and make vllm-env

`skeleton, disk sync` is the skeleton with engines.vllm.weight_sync = disk (rank 0 writes each
update for the engine to reload).

One fresh run per variant of the micro preset with bench/train_workers.py's `small` shape
(8 layers x 512), one iteration, two torch ranks, one vLLM worker process on the CPU.

`--timeline` also samples this process's resident set every 20 ms with the last log line
seen, and prints where the GRPO stage's rise happened: each rise (and fall) summed under the
log line that preceded it, digits folded, so that a stage's steps add up under one line.
The GRPO stage then runs as set-up and steps (flows/stages/grpo.py) with its sampler,
rewarder and updater wrapped to log a line before and after each call; a step's progress
save comes after the step's own log line (`GRPO iter # step #: ...`), so its rise sums there.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import logging
import os
import re
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from machine_speed import reference_line
from train_workers import CONFIG_SETS

from flows.config_files import load_config
from flows.context import RunContext
from flows.loop import Executor, call_directly, execute_run
from flows.names import GRPO, POLICY
from flows.progress import ProgressFn
from flows.stages import StageResult
from flows.stages.grpo import commit_grpo, setup_grpo, train_grpo
from grpo_core.engines.cost import MIB, PeakMemory, resident_bytes
from storage.checkpoints import checkpoint_path
from storage.store import RunStore

VARIANTS = ["skeleton", "skeleton, disk sync"]
# engines.vllm.weight_sync = disk: rank 0 writes each update for the engines to reload
DISK_SYNC = ["engines.vllm.weight_sync=disk"]
VLLM_ON_CPU = [
    "engines.rollout=vllm",
    "engines.vllm.dtype=float32",
    "engines.vllm.enforce_eager=true",
    "engines.vllm.max_model_len=256",
    "engines.vllm.env={VLLM_CPU_OMP_THREADS_BIND: nobind}",
]
RANKS = ["engines.train_workers=ray", "engines.train=torch", "engines.workers.ranks=2"]


class RssTimeline(logging.Handler):
    """This process's resident bytes every `interval_s`, and the log lines, both timed."""

    def __init__(self, interval_s: float = 0.02) -> None:
        super().__init__(logging.INFO)
        self.interval_s, self._start = interval_s, time.perf_counter()
        self.samples: list[tuple[float, int]] = []
        self.events: list[tuple[float, str]] = [(0.0, "(start)")]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def emit(self, record: logging.LogRecord) -> None:
        line = record.getMessage().splitlines()[0][:100]
        self.events.append((time.perf_counter() - self._start, line))

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.samples.append((time.perf_counter() - self._start, resident_bytes()))

    def __enter__(self) -> RssTimeline:
        root = logging.getLogger()
        self._level = root.level
        root.setLevel(logging.INFO)  # the stages' INFO lines reach this handler (only)
        root.addHandler(self)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        logging.getLogger().removeHandler(self)
        logging.getLogger().setLevel(self._level)

    def _line_at(self, t: float) -> str:
        return next(line for at, line in reversed(self.events) if at <= t)

    def stage_report(self, stage: str = "grpo", top: int = 12) -> list[str]:
        """The rises and falls inside `stage` (its start and `done` log lines), by log line."""
        t0 = next(at for at, line in self.events if line.endswith(f"): {stage}"))
        t1 = next(at for at, line in self.events if f"): {stage} done" in line)
        window = [(t, rss) for t, rss in self.samples if t0 <= t <= t1]
        base = window[0][1]
        moves: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        for (_, before), (t, after) in itertools.pairwise(window):
            line = re.sub(r"\d[\d.]*", "#", self._line_at(t))
            moves[line][after < before] += (after - before) / MIB
        peak_t, peak = max(window, key=lambda s: s[1])
        lines = [
            f"stage start RSS {base / MIB:.0f} MiB; peak {(peak - base) / MIB:.0f} MiB above "
            f"it, {peak_t - t0:.1f} s into the stage, after: {self._line_at(peak_t)!r}",
            "| after the log line | rise | fall |",
            "|---|---|---|",
        ]
        ranked = sorted(moves.items(), key=lambda kv: -kv[1][0])[:top]
        lines += [f"| {line} | {up:+.0f} MiB | {down:+.0f} MiB |" for line, (up, down) in ranked]
        return lines


def traced(name: str, call: Any) -> Any:
    """`call` with a log line before and after it."""
    say = logging.getLogger("bench.stage_memory").info

    def run(*a: Any, **k: Any) -> Any:
        say(f"phase: {name}")
        out = call(*a, **k)
        say(f"phase: after {name}")
        return out

    return run


class TracedSampler:
    def __init__(self, inner: Any) -> None:
        self.generate = traced("sampling (vLLM)", inner.generate)


class TracedUpdater:
    """The stage's updater with log lines around its update and its hand-on of the weights."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.update = traced("update (on the ranks)", inner.update)
        self.hand_on = traced("hand on the weights (sync)", inner.hand_on)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def traced_grpo_stage(ctx: RunContext, k: int, progress: ProgressFn) -> StageResult:
    """The GRPO stage, log lines around each part of its steps: sampling, rewards, update,
    the weights' hand-on."""
    with PeakMemory(ctx.device) as peak:
        parts = setup_grpo(ctx, k)
        parts = dataclasses.replace(
            parts,
            sampler=TracedSampler(parts.sampler),
            rewarder=traced("rewards (reward models in the stage)", parts.rewarder),
            updater=TracedUpdater(parts.updater),
        )
        samples, metrics = train_grpo(parts, progress)
    return commit_grpo(ctx, k, samples, metrics, peak.mib, parts.draw)


def traced_stages(ctx: RunContext) -> Executor:
    """Stages called directly, the GRPO stage as traced_grpo_stage."""
    direct = call_directly(ctx)
    return lambda name, k, fn: direct(name, k, traced_grpo_stage if name == GRPO else fn)


def stage_memory(variant: str, root: Path, timeline: bool) -> dict[str, Any]:
    """One run; the GRPO stage's stored peak memory, its weights' size, and its wall."""
    run_id = "mem-" + re.sub(r"[^a-z]+", "-", variant)
    sets = [*CONFIG_SETS["small"], *VLLM_ON_CPU, *RANKS, f"store.root={root}"]
    if "disk sync" in variant:
        sets += DISK_SYNC
    started = time.perf_counter()
    cfg = load_config("micro", [*sets, f"run.run_id={run_id}"])
    execute_run(cfg, make_executor=traced_stages if timeline else None)
    seconds = time.perf_counter() - started
    rows = RunStore(root).read("metrics", run_id=run_id).to_pylist()
    peak = [r["value"] for r in rows if r["stage"] == "grpo" and r["name"] == "peak_memory_mib"]
    policy = checkpoint_path(root, run_id, POLICY, 1) / "model.safetensors"
    return {"peak": peak[0], "weights": policy.stat().st_size / 2**20, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--variants", nargs="+", default=VARIANTS, choices=VARIANTS)
    parser.add_argument("--timeline", action="store_true", help="where the GRPO stage's rise is")
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    print(reference_line(), flush=True)
    rows = []
    for variant in args.variants:
        with tempfile.TemporaryDirectory() as tmp, RssTimeline() as timeline:
            got = stage_memory(variant, Path(tmp), args.timeline)
        if args.timeline:
            print(f"\n{variant}:", *timeline.stage_report(), sep="\n", flush=True)
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
