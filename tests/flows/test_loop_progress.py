"""The loop's bookkeeping: the progress line's time left, and the status a stop records."""

import os
import signal
import threading
from pathlib import Path
from types import FrameType

import duckdb
import pytest

from flows.context import RunContext
from flows.loop import Executor, StageFn, execute_run, seconds_left
from flows.progress import iteration_label
from flows.stages import StageResult
from storage.store import RunStore
from tests.flow_helpers import EngineStop, micro_config


def test_time_left_is_known_once_every_remaining_stage_has_run() -> None:
    last = {"rollout": 10.0, "label": 5.0, "grpo": 30.0}
    assert seconds_left(["label", "grpo", "rollout"], last) == 45.0
    assert seconds_left([], last) == 0.0
    assert seconds_left(["grpo", "evaluate"], last) is None  # evaluate has not run yet


def test_iteration_label_leads_with_the_stores_number() -> None:
    assert iteration_label(0, 3) == "iteration 0 (1 of 3)"
    assert iteration_label(2, 3) == "iteration 2 (3 of 3)"


@pytest.mark.parametrize(
    ("stop_signals", "status"), [((EngineStop,), "interrupted"), ((), "failed")]
)
def test_an_engine_stop_records_interrupted_anything_else_failed(
    tmp_path: Path, stop_signals: tuple[type[BaseException], ...], status: str
) -> None:
    def stopping_executor(ctx: RunContext) -> Executor:
        def execute(name: str, iteration: int, fn: StageFn) -> StageResult:
            raise EngineStop

        return execute

    cfg = micro_config(tmp_path, "stopped")
    with pytest.raises(EngineStop):
        execute_run(cfg, make_executor=stopping_executor, stop_signals=stop_signals)
    stored = RunStore(tmp_path).run_status("stopped")
    assert stored["status"] == status
    assert stored["failure"] == {
        "type": "EngineStop",
        "message": "",
        "stage": "warm_start",
        "iteration": 0,
    }


def test_a_new_start_clears_the_previous_failure(tmp_path: Path) -> None:
    seen: list[object] = []

    def failing(ctx: RunContext) -> Executor:
        def execute(name: str, iteration: int, fn: StageFn) -> StageResult:
            seen.append(ctx.store.run_status("again").get("failure"))
            raise RuntimeError(f"attempt {len(seen)}")

        return execute

    cfg = micro_config(tmp_path, "again")
    for _ in range(2):
        with pytest.raises(RuntimeError):
            execute_run(cfg, make_executor=failing)
    assert seen == [None, None]  # while running, the last attempt's failure is not shown
    assert RunStore(tmp_path).run_status("again")["failure"]["message"] == "attempt 2"


@pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread(),
    reason="signal handlers are installed from the main thread only",
)
@pytest.mark.parametrize(("ask", "status"), [(True, "interrupted"), (False, "failed")])
def test_a_stop_that_lands_inside_a_duckdb_query_records_interrupted_when_the_engine_asked(
    tmp_path: Path, ask: bool, status: str
) -> None:
    """DuckDB runs a signal handler while a query runs and raises RuntimeError("Query
    interrupted") in place of what the handler raised: a cancel from the UI that landed in a
    stage's query recorded the run `failed` (CI, the served deployment's cancel). The engine's
    `stop_requested` (Prefect: the flow run is cancelling) tells a stop from a bug."""
    asked: list[int] = []

    def engine_stop(signum: int, frame: FrameType | None) -> None:
        asked.append(signum)
        raise EngineStop

    def querying_executor(ctx: RunContext) -> Executor:
        def execute(name: str, iteration: int, fn: StageFn) -> StageResult:
            # the signal lands while the query runs (~0.8 s here, longer on a loaded machine)
            threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)).start()
            duckdb.sql("select sum(hash(range)) from range(200000000)").fetchall()
            raise AssertionError("the query ran to its end: the signal came too late")

        return execute

    previous = signal.signal(signal.SIGTERM, engine_stop)  # as Prefect's flow engine does
    try:
        with pytest.raises(RuntimeError, match="interrupted"):
            execute_run(
                micro_config(tmp_path, "cancelled"),
                make_executor=querying_executor,
                stop_signals=(EngineStop,),
                stop_requested=(lambda: bool(asked)) if ask else None,
            )
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert asked == [signal.SIGTERM]
    stored = RunStore(tmp_path).run_status("cancelled")
    assert stored["status"] == status
    assert stored["failure"]["type"] == "RuntimeError"  # what DuckDB raised instead
