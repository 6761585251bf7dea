"""Wall time of the `demo` preset end to end and per stage, and the share spent outside the
stage functions (Prefect engine + store bookkeeping), with and without Prefect.

    .venv/bin/python bench/demo_wall.py                      # direct calls and ephemeral Prefect
    .venv/bin/python bench/demo_wall.py --modes prefect      # only through Prefect
    PREFECT_API_URL=http://127.0.0.1:4200/api .venv/bin/python bench/demo_wall.py --modes prefect

With PREFECT_API_URL set, the Prefect mode talks to that running server; otherwise Prefect
starts a temporary local server (the start-up is counted, as a user would pay it).
Targets: the whole demo under 3 minutes on 2 cores in a usual hour; overhead under 5% of an
iteration. The machine-speed reference (bench/machine_speed.py: 23-27 s in a usual hour) is
measured in the same process before the first mode and after the last, so a figure from a
slow hour reads as one.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")

from machine_speed import reference_line

from flows.config_files import load_config
from flows.loop import execute_run
from flows.report import format_iteration_table, iteration_table
from flows.stage_registry import StageSpec, registered
from flows.stage_table import STAGES
from storage.store import RunStore

# (start, end) in time.perf_counter() seconds
Span = tuple[float, float]
# (stage, iteration) -> span of that stage function
StageTimes = dict[tuple[str, int], Span]


def timed_stages(times: StageTimes) -> list[StageSpec]:
    """Each registered stage with its function wrapped so its own span (inside any Prefect
    task) is recorded; registered in place of the stage for the run."""

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(ctx: Any, iteration: int, progress: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(ctx, iteration, progress)
            finally:
                times[(name, iteration)] = (start, time.perf_counter())

        return timed

    return [dataclasses.replace(spec, impl=wrap(name, spec.fn)) for name, spec in STAGES.items()]


def run_once(mode: str, overrides: list[str], root: Path) -> tuple[Span, StageTimes, str]:
    run_id = f"bench-{mode}"
    cfg = load_config("demo", [*overrides, f"store.root={root}", f"run.run_id={run_id}"])
    times: StageTimes = {}
    start = time.perf_counter()
    with registered(*timed_stages(times)):
        if mode == "prefect":
            from flows.prefect_flow import iterative_rl

            iterative_rl(cfg)
        else:
            execute_run(cfg)
    run_span = (start, time.perf_counter())
    return run_span, times, format_iteration_table(iteration_table(RunStore(root), run_id))


def report(mode: str, run_span: Span, times: StageTimes, iterations: int) -> None:
    run_start, run_end = run_span
    wall = run_end - run_start
    n_iterations = max(iterations, 1)
    per_stage: dict[str, float] = defaultdict(float)
    for (name, _), (begin, end) in times.items():
        per_stage[name] += end - begin
    print(f"\n== {mode}: demo wall {wall:.1f} s (target < 180 s on 2 cores)")
    columns = range(n_iterations)
    print(
        f"  {'stage':<11} {'total':>8}  {'share':>6}  "
        + " ".join(f"{f'iter {k}':>7}" for k in columns)
    )
    for name, seconds in per_stage.items():
        spans = [times.get((name, k)) for k in columns]
        shown = " ".join(f"{s[1] - s[0]:6.1f}s" if s else f"{'-':>7}" for s in spans)
        print(f"  {name:<11} {seconds:7.1f}s  {seconds / wall:6.1%}  {shown}")
    outside = wall - sum(per_stage.values())
    # One-offs: before the first stage (flow start, temporary server, store open) and after
    # the last (flow end, server stop). The rest is paid between stages, every iteration.
    first = min(begin for begin, _ in times.values())
    last = max(end for _, end in times.values())
    one_off = (first - run_start) + (run_end - last)
    between = outside - one_off
    # An iteration's share: the warm start is a one-off before iteration 0.
    iteration_wall = (last - first - per_stage.get("warm_start", 0.0)) / n_iterations
    print(
        f"  outside stage functions: {outside:.1f} s = {outside / wall:.1%} of the run: "
        f"{one_off:.1f} s once (start-up and shutdown), {between:.1f} s between stages = "
        f"{between / n_iterations / iteration_wall:.1%} of an iteration (target < 5%)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", nargs="+", default=["direct", "prefect"])
    parser.add_argument("--set", action="append", default=[], help="config override a.b=v")
    args = parser.parse_args()
    iterations = load_config("demo", args.set).run.iterations
    server = os.environ.get("PREFECT_API_URL", "temporary local server")
    print(f"demo preset, {iterations} iterations; Prefect API: {server}")
    threads = os.environ.get("OMP_NUM_THREADS")
    print(f"machine: {os.cpu_count()} CPUs visible, OMP_NUM_THREADS={threads}")
    print(reference_line(), flush=True)
    for mode in args.modes:
        with tempfile.TemporaryDirectory(prefix=f"demo-wall-{mode}-") as root:
            run_span, times, table = run_once(mode, args.set, Path(root))
        print(table)
        report(mode, run_span, times, iterations)
    print(reference_line())


if __name__ == "__main__":
    main()
