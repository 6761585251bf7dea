"""The loop's bookkeeping: the progress line's time left, and the status a stop records."""

from pathlib import Path

import pytest

from flows.context import RunContext
from flows.loop import Executor, StageFn, execute_run, seconds_left
from flows.progress import iteration_label
from flows.stages import StageResult
from storage.store import RunStore
from tests.flow_helpers import micro_config


def test_time_left_is_known_once_every_remaining_stage_has_run() -> None:
    last = {"rollout": 10.0, "label": 5.0, "grpo": 30.0}
    assert seconds_left(["label", "grpo", "rollout"], last) == 45.0
    assert seconds_left([], last) == 0.0
    assert seconds_left(["grpo", "evaluate"], last) is None  # evaluate has not run yet


def test_iteration_label_leads_with_the_stores_number() -> None:
    assert iteration_label(0, 3) == "iteration 0 (1 of 3)"
    assert iteration_label(2, 3) == "iteration 2 (3 of 3)"


class EngineStop(BaseException):
    """Stands for an engine's termination signal (Prefect's TerminationSignal on a UI cancel)."""


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
