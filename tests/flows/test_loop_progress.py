"""The loop's bookkeeping: the progress line's time left, and the status a stop records."""

from pathlib import Path

import pytest

from flows.context import RunContext
from flows.loop import Executor, StageFn, execute_run, seconds_left
from flows.stages import StageResult
from storage.store import RunStore
from tests.flow_helpers import micro_config


def test_time_left_is_known_once_every_remaining_stage_has_run() -> None:
    last = {"rollout": 10.0, "label": 5.0, "grpo": 30.0}
    assert seconds_left(["label", "grpo", "rollout"], last) == 45.0
    assert seconds_left([], last) == 0.0
    assert seconds_left(["grpo", "evaluate"], last) is None  # evaluate has not run yet


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
    assert RunStore(tmp_path).run_status("stopped")["status"] == status
