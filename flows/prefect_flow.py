"""The Prefect flow: one task per stage (thin wrappers), progress/table/markdown artifacts,
and the deployment entry point used by `itergrpo serve`."""

# No `from __future__ import annotations` here: `serve` runs each flow run in a spawned
# process from a pickled copy of the flow, and the parameter model Prefect builds there from
# the signature must see the ItergrpoConfig class itself, not the string "ItergrpoConfig"
# (it failed with "Iterative_RlModel is not fully defined").
import contextlib
import json
import logging
import os
import re
from collections.abc import Iterator
from typing import Any, cast
from uuid import UUID

import prefect.runtime.flow_run
from prefect import flow, get_run_logger, task
from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import get_client
from prefect.exceptions import TerminationSignal
from prefect.logging.handlers import APILogHandler
from prefect.states import Cancelled, State

from flows.config import ItergrpoConfig
from flows.config_files import parameters_merged
from flows.context import RunContext
from flows.deployment_messages import (
    is_deployment_run,
    resume_hint,
    user_errors_in_deployment_terms,
)
from flows.interrupts import RunInterrupted, with_fault_hook
from flows.loop import Executor, execute_run
from flows.names import default_run_id
from flows.preflight import preflight
from flows.progress import PACKAGE_LOGGERS, log
from flows.report import iteration_table, report_with_inline_plots
from flows.stages import STAGES, StageFn, StageResult
from flows.tracking.record import mlflow_run
from storage.store import RunStore

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")


# Set by `itergrpo serve` for its flow runs: the served config, as JSON.
SERVED_CONFIG_ENV = "ITERGRPO_SERVED_CONFIG"


def raise_for_flow_state(state: State[Any], cancelled: str) -> None:
    """A flow run's end as the caller sees it: RunInterrupted when it was cancelled (it
    stopped at a safe point), the flow's own exception when it failed, else nothing."""
    if state.is_cancelled():
        raise RunInterrupted(state.message or cancelled)
    state.result()


def _resume_line(run_id: str) -> str:
    """How to resume a stopped run: from the Prefect UI for a deployment's run, else the CLI."""
    return resume_hint(run_id) if is_deployment_run() else f"itergrpo resume {run_id}"


def this_flow_run_is_cancelling() -> bool:
    """Whether the API shows this flow run cancelling (or cancelled): a cancel from the UI
    sets that before the runner's SIGTERM, whatever exception the signal became on its way
    up. Asked only while an exception ends the run; False outside a flow run or when the API
    cannot say (the exception's own type then decides)."""
    flow_run_id = prefect.runtime.flow_run.id
    if flow_run_id is None:
        return False
    try:
        with get_client(sync_client=True) as client:
            state = client.read_flow_run(UUID(flow_run_id)).state
    except Exception as exc:  # the run's own error is the one to report
        log.warning("could not read the flow run's state: %s", exc)
        return False
    return state is not None and (state.is_cancelling() or state.is_cancelled())


def artifact_key(run_id: str, what: str) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes only."""
    return re.sub(r"[^a-z0-9-]+", "-", f"itergrpo-{what}-{run_id}".lower()).strip("-")


def _run_stage_in_task(name: str, iteration: int, fn: StageFn, ctx: RunContext) -> StageResult:
    # The store decides skip/commit (resume must not depend on Prefect's cache), so the
    # task has no cache policy; the progress artifact mirrors the terminal progress bar.
    artifact_id = cast(
        UUID, create_progress_artifact(0.0, description=f"iteration {iteration}: {name}")
    )

    def progress(fraction: float, message: str) -> None:
        update_progress_artifact(
            artifact_id, 100.0 * min(max(fraction, 0.0), 1.0), description=message
        )

    result = fn(ctx, iteration, with_fault_hook(progress, name, iteration))
    update_progress_artifact(artifact_id, 100.0)
    return result


def prefect_executor(ctx: RunContext) -> Executor:
    """Each stage as a Prefect task of the flow run, named and described by its registration
    (thin: the stage function does the work)."""

    def execute(name: str, iteration: int, fn: StageFn) -> StageResult:
        stage_task = task(
            name=name,
            description=STAGES[name].summary,
            task_run_name=f"{name}-iter{iteration}",
            cache_policy=NO_CACHE,
            retries=0,
        )(_run_stage_in_task)
        return stage_task(name, iteration, fn, ctx)

    return execute


def _publish_stage(cfg: ItergrpoConfig, result: StageResult) -> None:
    """After a commit: what the guards warned of (flows/guards.py) as a markdown artifact, and
    the per-iteration table once the stage changed it."""
    assert cfg.run.run_id is not None
    if result.warnings:
        lines = "\n".join(f"- {w}" for w in result.warnings)
        create_markdown_artifact(
            f"## Guards: iteration {result.iteration}, {result.stage}\n\n{lines}\n",
            key=artifact_key(cfg.run.run_id, "guards"),
            description=f"what the guards found in {result.stage} of iteration {result.iteration}",
        )
    if not STAGES[result.stage].changes_iteration_table:
        return
    rows = iteration_table(RunStore(cfg.store.resolved_root()), cfg.run.run_id)
    if rows:
        create_table_artifact(
            rows,
            key=artifact_key(cfg.run.run_id, "metrics"),
            description="Per-iteration evaluation of the policy and reward models",
        )


def served_config(given: ItergrpoConfig, served: str | None) -> ItergrpoConfig:
    """The fields the run's parameters set, on top of the config `itergrpo serve` was started
    with (`served`, JSON; None outside a served deployment). Prefect replaces a parameter
    whole, so without this `--params '{"config": {"run": {"iterations": 1}}}'` ran the class
    defaults (another store, another task size) instead of the served preset with one
    iteration. What a form submission sets: flows/config_files.py parameters_merged."""
    if not served:
        return given
    return parameters_merged(json.loads(served), given)


@contextlib.contextmanager
def itergrpo_lines_in_the_flow_run_logs() -> Iterator[None]:
    """Send itergrpo's own log lines (stages, GRPO steps, tables) to the flow run's logs, so
    a run started from the UI or a deployment shows them; INFO where no level was set (a
    served run's process never ran the CLI that sets it)."""
    handler = APILogHandler()
    loggers = [logging.getLogger(name) for name in PACKAGE_LOGGERS]
    for lg in loggers:
        lg.addHandler(handler)
        if lg.level == logging.NOTSET:
            lg.setLevel(logging.INFO)
    try:
        yield
    finally:
        for lg in loggers:
            lg.removeHandler(handler)
        with contextlib.suppress(Exception):  # delivered before the run reports its end
            handler.flush()


@flow(name="iterative-rl", log_prints=True)
def iterative_rl(config: ItergrpoConfig, force_config: bool = False) -> dict[str, Any] | State:
    """DeepSeekMath Algorithm 1: rollout -> label -> train RMs (replay) -> GRPO -> evaluate.

    Args:
        config: The run's configuration; fields left out keep the served preset's values.
        force_config: Reuse run.run_id although its stored config differs from this one
            (a run with committed stages is otherwise refused): its config.yaml is replaced
            and the old one kept beside it.
    """
    logger = get_run_logger()
    config = served_config(config, os.environ.get(SERVED_CONFIG_ENV))
    if config.run.run_id is None:
        config = config.model_copy(
            update={"run": config.run.model_copy(update={"run_id": default_run_id()})}
        )
    run_id = config.run.run_id
    assert run_id is not None
    logger.info("run %s, store %s", run_id, config.store.resolved_root())
    try:
        with itergrpo_lines_in_the_flow_run_logs(), user_errors_in_deployment_terms():
            preflight(config, force_config=force_config)  # UI runs: refused before any write
            results = execute_run(
                config,
                force_config=force_config,
                make_executor=prefect_executor,
                on_stage_done=lambda r: _publish_stage(config, r),
                stop_signals=(TerminationSignal,),  # a cancel from the UI: resumable
                stop_requested=this_flow_run_is_cancelling,
            )
    except RunInterrupted as exc:  # stopped at a safe point: resumable, not a failure
        logger.warning("%s: %s", exc, _resume_line(run_id))
        return Cancelled(message=str(exc))
    except Exception as exc:
        # A cancel's SIGTERM that lands inside a C extension comes up as that extension's own
        # error (DuckDB: RuntimeError "Query interrupted"), and execute_run has recorded the
        # run interrupted: the flow run ends Cancelled like any cancel, not Failed.
        if not this_flow_run_is_cancelling():
            raise
        logger.warning("cancelled (%s: %s): %s", type(exc).__name__, exc, _resume_line(run_id))
        return Cancelled(message=f"cancelled while the run was stopping ({exc})")
    store = RunStore(config.store.resolved_root())
    tracked = mlflow_run(store.run_dir(run_id))
    mlflow_line = "" if tracked is None else f"MLflow run `{tracked[0]}`: {tracked[1]}\n\n"
    create_markdown_artifact(  # the report page, plots included, in the flow run's Artifacts
        mlflow_line + report_with_inline_plots(store, run_id, store.root / "reports" / run_id),
        key=artifact_key(run_id, "summary"),
        description=f"itergrpo run {run_id}",
    )
    ran = [r for r in results if not r.skipped]
    return {
        "run_id": run_id,
        "stages_run": len(ran),
        "stages_skipped": len(results) - len(ran),
    }
