"""Algorithm 1 as a loop over the run's plan of registered stages (flows/plan.py); who
executes a stage (plain call or Prefect task) is injected, so the same loop runs in tests,
from the CLI and in the Prefect flow."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any

from flows.config import ItergrpoConfig
from flows.config_files import stored_config_for_rerun
from flows.config_readers import stages_reading
from flows.context import RunContext
from flows.data_identity import check_data, data_now, record_data
from flows.engines.availability import check_attention, check_engines
from flows.interrupts import INTERRUPT, graceful_sigint, stopped_by_a_signal, with_fault_hook
from flows.plan import ends_an_iteration, planned_stages
from flows.progress import ProgressFn, iteration_label, no_progress
from flows.report import write_report
from flows.runtime import apply_threads, name_deepspeed_accelerator
from flows.stages import STAGES, StageFn, StageResult
from flows.tracking.run_tracking import RunTracking, TrackedRun, check_trackers
from storage.store import RunStore

log = logging.getLogger("itergrpo")

# A stored failure message is the exception's first line, cut to this many characters.
FAILURE_MESSAGE_CHARS = 300
# execute(stage_name, iteration, fn) -> result. The default calls fn directly.
Executor = Callable[[str, int, StageFn], StageResult]


def seconds_left(remaining: list[str], last_seconds: dict[str, float]) -> float | None:
    """Time the `remaining` stages should take, each as long as its last run; None while a
    stage has not run yet (the first iteration)."""
    if any(name not in last_seconds for name in remaining):
        return None
    return sum(last_seconds[name] for name in remaining)


def _minutes(seconds: float) -> str:
    return f"{int(seconds) // 60}m{int(seconds) % 60:02d}s"


def call_directly(ctx: RunContext, progress: ProgressFn = no_progress) -> Executor:
    """Stages called in this process, their progress reports passing the fault hook."""

    def execute(name: str, iteration: int, fn: StageFn) -> StageResult:
        return fn(ctx, iteration, with_fault_hook(progress, name, iteration))

    return execute


def run_loop(
    ctx: RunContext,
    execute: Executor,
    on_stage_done: Callable[[StageResult], None] | None = None,
    on_stage_start: Callable[[str, int], None] | None = None,
) -> list[StageResult]:
    """Run every planned stage not yet committed; committed ones are skipped (resume)."""
    cfg, run = ctx.cfg, ctx.run
    results: list[StageResult] = []
    plan = planned_stages(cfg)
    n, began = cfg.run.iterations, time.perf_counter()
    last_seconds: dict[str, float] = {}
    for position, (name, iteration) in enumerate(plan):
        INTERRUPT.check()
        spec = STAGES[name]
        if run.is_committed(iteration, name):
            result = StageResult(name, iteration, skipped=True)
        else:
            where = "policy_0" if spec.once else iteration_label(iteration, n)
            log.info("%s: %s", where, name)
            if on_stage_start is not None:
                on_stage_start(name, iteration)
            start = time.perf_counter()
            result = execute(name, iteration, spec.fn)
            result.seconds = last_seconds[name] = time.perf_counter() - start
            left = seconds_left([s for s, _ in plan[position + 1 :]], last_seconds)
            eta = f", about {_minutes(left)} left" if left else ""
            log.info(
                "%s: %s done in %.1f s (run: %s elapsed%s)",
                where,
                name,
                result.seconds,
                _minutes(time.perf_counter() - began),
                eta,
            )
        results.append(result)
        if ends_an_iteration(cfg, name):
            run.set_status("running", iterations_done=iteration + 1)
        if on_stage_done is not None:
            on_stage_done(result)
    return results


def tracked_run(cfg: ItergrpoConfig) -> TrackedRun:
    """What the run's trackers are told besides its stored rows (flows/tracking/)."""
    assert cfg.run.run_id is not None
    return TrackedRun(cfg.run.run_id, cfg.run.seed, cfg.grpo.steps, cfg.model_dump(mode="json"))


def failure_record(exc: BaseException, stage: tuple[str, int] | None) -> dict[str, Any]:
    """What status.json keeps of the exception that ended a run: its type, its message (first
    line, shortened) and the stage it was raised in (None: before or between stages)."""
    lines = str(exc).strip().splitlines()
    message = lines[0] if lines else ""
    if len(message) > FAILURE_MESSAGE_CHARS:
        message = message[: FAILURE_MESSAGE_CHARS - 3] + "..."
    return {
        "type": type(exc).__name__,
        "message": message,
        "stage": stage[0] if stage else None,
        "iteration": stage[1] if stage else None,
    }


def execute_run(
    cfg: ItergrpoConfig,
    *,
    force_config: bool = False,
    make_executor: Callable[[RunContext], Executor] | None = None,
    on_stage_done: Callable[[StageResult], None] | None = None,
    stop_signals: tuple[type[BaseException], ...] = (),
    stop_requested: Callable[[], bool] | None = None,
) -> list[StageResult]:
    """Open (lock) the run, run the loop, record the final status.

    A RunInterrupted (Ctrl-C), a KeyboardInterrupt (a Ctrl-C outside the run's handler) or one
    of `stop_signals` (the engine's own termination, e.g. Prefect's on a UI cancel) records
    `interrupted`, and so does any exception after a Ctrl-C stopped it (`stopped_by_a_signal`) or
    once `stop_requested()` says the engine asked the run to stop (Prefect: the flow run is
    cancelling): a signal handler's exception raised inside a C extension can reach here as
    another one (DuckDB's RuntimeError "Query interrupted"). Anything else records `failed`.
    Either way status.json keeps the exception's type, message and stage (`failure`), which
    `itergrpo runs` shows; a new start clears it.
    """
    if cfg.run.run_id is None:
        raise ValueError("run.run_id is empty: the caller picks one (see default_run_id)")
    apply_threads(cfg.run.num_threads)
    name_deepspeed_accelerator(cfg.run.device)
    check_engines(cfg.engines)  # a selected engine that is not installed fails before any stage
    check_attention(cfg.policy, cfg.run.device)  # ... and so do flash-attention kernels
    check_trackers(cfg.tracking)  # ... and so does a tracker
    store = RunStore(cfg.store.resolved_root())
    data = data_now(cfg)
    check_data(store, cfg.run.run_id, data, force=force_config)  # before anything is written
    with store.open_run(
        cfg.run.run_id,
        cfg.model_dump(mode="json"),
        force_config=force_config,
        upgrade_config=functools.partial(stored_config_for_rerun, current=cfg),
        stage_readers=stages_reading,
    ) as run:
        record_data(store, cfg.run.run_id, data)
        run.set_status("running", failure=None)
        tracking = RunTracking(cfg.tracking, tracked_run(cfg), store)
        tracking.sync()  # stages committed before a kill, or before tracking was turned on
        seconds: dict[tuple[str, int], float] = {}
        current: list[tuple[str, int]] = []  # the stage being run, for the failure record

        def stage_done(result: StageResult) -> None:
            current.clear()
            if not result.skipped:
                seconds[result.stage, result.iteration] = result.seconds
            tracking.sync(seconds)  # after the commit: what is sent is what is stored
            if on_stage_done is not None:
                on_stage_done(result)

        ctx = RunContext(cfg, store, run)
        executor = make_executor(ctx) if make_executor else call_directly(ctx)

        def stage_started(name: str, iteration: int) -> None:
            current[:] = [(name, iteration)]

        # The handler stays on while the final status is recorded: a Ctrl-C that arrives then
        # cannot cut the record short (graceful_sigint ignores one once the run is stopping).
        with graceful_sigint():
            try:
                results = run_loop(ctx, executor, stage_done, stage_started)
            except BaseException as exc:
                stopped = stopped_by_a_signal(exc, stop_signals) or bool(
                    stop_requested and stop_requested()
                )
                status = "interrupted" if stopped else "failed"
                failure = failure_record(exc, current[0] if current else None)
                try:
                    run.set_status(status, failure=failure)
                except OSError as unrecorded:  # e.g. the disk that stopped the run is still full
                    # the run's own error is the one to report; `runs` shows a run whose holder
                    # died while `running` as interrupted
                    log.warning("could not record the run as %s: %s", status, unrecorded)
                tracking.finish_after_error(status)
                raise
            finally:
                ctx.close()  # a rollout engine's worker kept between stages, if any
        run.set_status("completed", iterations_done=cfg.run.iterations)
        tracking.finish("completed", functools.partial(write_report, store, cfg.run.run_id))
    return results
