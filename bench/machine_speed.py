"""The machine-speed reference: the `demo` preset's warm start run for 150 SFT steps of 64
solutions (the preset's own steps changed on 2026-11-28; the reference keeps the work every
figure in bench/README.md and docs/results/ was read against), a fixed amount of work whose
seconds say how fast this machine is now.

    OMP_NUM_THREADS=2 .venv/bin/python bench/machine_speed.py

On the 2-core VM of the README it takes 23-27 s in usual hours and 33-41 s in slow ones; a
bench prints it beside its own figures (measured in the same process, same threads) so that
figures from different hours compare per second of reference.
"""

from __future__ import annotations

import os
import time

import torch

from flows.config_files import load_config
from grpo_core.data.tasks.registry import make_task
from grpo_core.model.policy import build_policy
from grpo_core.model.warm_start import warm_start


def load() -> str:
    return f"load {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores"


# SFT steps and solutions per step of the reference: fixed, whatever the demo preset takes.
REFERENCE_STEPS = 150
REFERENCE_BATCH = 64


def demo_warm_start_seconds() -> float:
    """Wall seconds of the demo's warm start at REFERENCE_STEPS (no evaluation), in this
    process."""
    cfg = load_config("demo")
    model, tokenizer = build_policy(cfg.policy)
    settings = cfg.warm_start.model_copy(
        update={"eval_prompts": 0, "steps": REFERENCE_STEPS, "batch_size": REFERENCE_BATCH}
    )
    start = time.perf_counter()
    warm_start(model, tokenizer, make_task(cfg.task), settings, progress=False)
    return time.perf_counter() - start


def reference_line() -> str:
    """One printable line: the reference's seconds, the threads, the load and the time."""
    before = load()
    seconds = demo_warm_start_seconds()
    return (
        f"RESULT machine speed: demo warm start ({REFERENCE_STEPS} steps) {seconds:.1f} s, "
        f"{torch.get_num_threads()} torch threads; {before} before, {load()} after; "
        f"{time.strftime('%Y-%m-%d %H:%M')}"
    )


if __name__ == "__main__":
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    print(reference_line())
