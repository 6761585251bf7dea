"""What the GRPO stage process holds when Ray ranks train the policy and vLLM samples it: its
own copy of policy_k (as before the skeleton; forced here) against the meta-device skeleton
it holds now, read from the stage's stored `peak_memory_mib` (on CPU: the highest resident
set size above the stage's start) with the machine-speed reference.

    OMP_NUM_THREADS=1 .venv/bin/python bench/stage_memory.py     # needs ray and make vllm-env

`skeleton, disk sync` is the skeleton with engines.vllm.weight_sync = disk (rank 0 writes each
update for the engine to reload); `skeleton, disk sync via the stage` forces the path before
b99a29f, where the stage took rank 0's weights and wrote them itself.

One fresh run per variant of the micro preset with bench/train_workers.py's `small` shape
(8 layers x 512), one iteration, two torch ranks, one vLLM worker process on the CPU.

`--timeline` also samples this process's resident set every 20 ms with the last log line
seen, and prints where the GRPO stage's rise happened: each rise (and fall) summed under the
log line that preceded it, digits folded, so that a stage's steps add up under one line.
"""

from __future__ import annotations

import argparse
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
from flows.engines.train_workers import RayWorkersUpdater
from flows.loop import execute_run
from flows.names import POLICY
from flows.stages import grpo as grpo_stage_module
from grpo_core.engines.cost import MIB, resident_bytes
from storage.checkpoints import checkpoint_path
from storage.store import RunStore

VARIANTS = ["policy copy", "skeleton", "skeleton, disk sync", "skeleton, disk sync via the stage"]
# engines.vllm.weight_sync = disk: rank 0 writes each update for the engines to reload; "via
# the stage" forces the path before b99a29f (the stage takes rank 0's weights and writes them).
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


GRPO_STEP = grpo_stage_module.grpo_step
SAVE_PROGRESS = grpo_stage_module._save_progress
HAND_ON = RayWorkersUpdater.hand_on


def traced(name: str, call: Any) -> Any:
    """`call` with a log line before and after it."""
    say = logging.getLogger("bench.stage_memory").info

    def run(*a: Any, **k: Any) -> Any:
        say(f"phase: {name}")
        out = call(*a, **k)
        say(f"phase: after {name}")
        return out

    return run


def traced_grpo_step(*args: Any, **kwargs: Any) -> Any:
    """grpo_step with log lines around its sampling, rewards and update."""
    prompts, sampler, reward, policy, *rest = args

    class Sampler:
        generate = staticmethod(traced("sampling (vLLM)", sampler.generate))

    class Update:
        update = staticmethod(traced("update (on the ranks)", policy.update))

    rewarded = traced("rewards (reward models in the stage)", reward)
    return GRPO_STEP(prompts, Sampler(), rewarded, Update(), *rest, **kwargs)


def trace_stage(on: bool) -> None:
    """Log lines around each part of a GRPO step (on), or the stage as it is (off)."""
    patches = {
        (grpo_stage_module, "grpo_step"): (traced_grpo_step, GRPO_STEP),
        (grpo_stage_module, "_save_progress"): (
            traced("progress save", SAVE_PROGRESS),
            SAVE_PROGRESS,
        ),
        (RayWorkersUpdater, "hand_on"): (traced("hand on the weights (sync)", HAND_ON), HAND_ON),
    }
    for (owner, name), (new, old) in patches.items():
        setattr(owner, name, new if on else old)


def stage_memory(variant: str, root: Path) -> dict[str, Any]:
    """One run; the GRPO stage's stored peak memory, its weights' size, and its wall."""
    decide = grpo_stage_module.stage_holds_policy_weights
    from_disk = RayWorkersUpdater._engines_reload_from_disk
    if variant == "policy copy":
        grpo_stage_module.stage_holds_policy_weights = lambda *a: True  # type: ignore[assignment]
    if variant.endswith("via the stage"):
        RayWorkersUpdater._engines_reload_from_disk = lambda self: False  # type: ignore[method-assign]
    try:
        run_id = "mem-" + re.sub(r"[^a-z]+", "-", variant)
        sets = [*CONFIG_SETS["small"], *VLLM_ON_CPU, *RANKS, f"store.root={root}"]
        if "disk sync" in variant:
            sets += DISK_SYNC
        started = time.perf_counter()
        execute_run(load_config("micro", [*sets, f"run.run_id={run_id}"]))
        seconds = time.perf_counter() - started
    finally:
        grpo_stage_module.stage_holds_policy_weights = decide  # type: ignore[assignment]
        RayWorkersUpdater._engines_reload_from_disk = from_disk  # type: ignore[method-assign]
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
        trace_stage(args.timeline)
        with tempfile.TemporaryDirectory() as tmp, RssTimeline() as timeline:
            got = stage_memory(variant, Path(tmp))
        trace_stage(False)
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
