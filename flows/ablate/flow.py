"""The ablation as one Prefect flow run: the shared warm start as a task, each arm-seed run as
an `iterative_rl` subflow (named by its run id), the report as a markdown artifact."""

# No `from __future__ import annotations`: Prefect builds the parameter model of the flow
# from its signature (see flows/prefect_flow.py).
import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.artifacts import create_markdown_artifact
from prefect.exceptions import TerminationSignal
from prefect.logging.handlers import APILogHandler
from prefect.states import Cancelled, State

from flows.ablate.report import report_with_inline_plots
from flows.ablate.run import run_ablation, stored_values
from flows.ablate.suites import AblationPlan, Suite
from flows.config import ItergrpoConfig
from flows.interrupts import RunInterrupted
from flows.prefect_flow import (
    artifact_key,
    iterative_rl,
    prefect_executor,
    raise_for_flow_state,
)
from flows.progress import PACKAGE_LOGGERS


class _FlowRunLogs:
    """itergrpo's log lines (progress per arm-seed) in the ablation flow run's logs; detached
    while an `iterative_rl` subflow runs, which attaches its own (else each line twice)."""

    def __init__(self) -> None:
        self.handler = APILogHandler()
        self.loggers = [logging.getLogger(name) for name in PACKAGE_LOGGERS]

    @contextlib.contextmanager
    def attached(self) -> Iterator[None]:
        for lg in self.loggers:
            lg.addHandler(self.handler)
            if lg.level == logging.NOTSET:
                lg.setLevel(logging.INFO)
        try:
            yield
        finally:
            for lg in self.loggers:
                lg.removeHandler(self.handler)
            with contextlib.suppress(Exception):
                self.handler.flush()

    @contextlib.contextmanager
    def detached(self) -> Iterator[None]:
        for lg in self.loggers:
            lg.removeHandler(self.handler)
        try:
            yield
        finally:
            for lg in self.loggers:
                lg.addHandler(self.handler)


@flow(name="itergrpo-ablate", log_prints=True)
def ablate(
    ablation_id: str,
    suite_name: str,
    suite: dict[str, Any],
    seeds: int,
    store_root: str,
    fork: bool = True,
) -> dict[str, Any] | State:
    """Arms x seeds from one shared policy_0 (DeepSeekMath section 5.2 in miniature).

    Args:
        ablation_id: The ablation's run id; its arm-seed runs are `<id>-<arm>-s<seed>`.
        suite_name: The suite's name (configs/ablate/<name>.yaml).
        suite: The suite itself: base config, overrides, arms (flows/ablate/suites.py).
        seeds: Seeds per arm.
        store_root: The run store.
        fork: Start an arm-seed run from the stages another run of the same seed committed
            with the same settings (False: compute every run in full).
    """
    spec = Suite.model_validate(suite)
    plan = AblationPlan(ablation_id, suite_name, spec, seeds, Path(store_root), fork=fork)
    logs = _FlowRunLogs()

    def run_arm(cfg: ItergrpoConfig) -> None:
        with logs.detached():
            state = iterative_rl.with_options(flow_run_name=cfg.run.run_id)(cfg, return_state=True)
        raise_for_flow_state(state, f"run {cfg.run.run_id} was cancelled")

    try:
        with logs.attached():
            rows = run_ablation(
                plan,
                make_executor=prefect_executor,
                run_arm=run_arm,
                stop_signals=(TerminationSignal,),  # the arm run in progress records the same
            )
    except RunInterrupted as exc:  # stopped at a safe point: rerunning resumes it
        return Cancelled(message=str(exc))
    values = stored_values(plan.store_root, ablation_id)
    out_dir = plan.store_root / "reports" / ablation_id
    create_markdown_artifact(
        report_with_inline_plots(values, ablation_id, plan.suite.description, out_dir),
        key=artifact_key(ablation_id, "ablation"),
        description=f"itergrpo ablation {ablation_id}",
    )
    return {"ablation_id": ablation_id, "rows": len(rows)}
