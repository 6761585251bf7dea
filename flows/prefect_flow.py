"""The Prefect flow: one task per stage (thin wrappers), progress/table/markdown artifacts,
and the deployment entry point used by `itergrpo serve`."""

# No `from __future__ import annotations` here: `serve` runs each flow run in a spawned
# process from a pickled copy of the flow, and the parameter model Prefect builds there from
# the signature must see the ItergrpoConfig class itself, not the string "ItergrpoConfig"
# (it failed with "Iterative_RlModel is not fully defined").
import os
import re
from typing import Any, cast
from uuid import UUID

from prefect import flow, get_run_logger, task
from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.cache_policies import NO_CACHE

from flows.common import StageResult, with_fault_hook
from flows.config import ItergrpoConfig
from flows.loop import Executor, StageFn, default_run_id, execute_run
from flows.preflight import preflight
from flows.report import iteration_table, summary_markdown
from storage.store import RunStore, RunWriter

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")


def artifact_key(run_id: str, what: str) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes only."""
    return re.sub(r"[^a-z0-9-]+", "-", f"itergrpo-{what}-{run_id}".lower()).strip("-")


def _run_stage_in_task(
    name: str, iteration: int, fn: StageFn, cfg: ItergrpoConfig, run: RunWriter
) -> StageResult:
    # The store decides skip/commit (resume must not depend on Prefect's cache), so the
    # task has no cache policy; the progress artifact mirrors the terminal progress bar.
    artifact_id = cast(
        UUID, create_progress_artifact(0.0, description=f"iteration {iteration}: {name}")
    )

    def progress(fraction: float, message: str) -> None:
        update_progress_artifact(
            artifact_id, 100.0 * min(max(fraction, 0.0), 1.0), description=message
        )

    result = fn(cfg, run, iteration, with_fault_hook(progress, name, iteration))
    update_progress_artifact(artifact_id, 100.0)
    return result


def prefect_executor(cfg: ItergrpoConfig, run: RunWriter) -> Executor:
    def execute(name: str, iteration: int, fn: StageFn) -> StageResult:
        stage_task = task(
            name=name,
            task_run_name=f"{name}-iter{iteration}",
            cache_policy=NO_CACHE,
            retries=0,
        )(_run_stage_in_task)
        return stage_task(name, iteration, fn, cfg, run)

    return execute


def _publish_iteration_table(cfg: ItergrpoConfig, result: StageResult) -> None:
    if result.stage not in ("evaluate", "warm_start", "train_rm"):
        return
    assert cfg.run.run_id is not None
    rows = iteration_table(RunStore(cfg.store.resolved_root()), cfg.run.run_id)
    if rows:
        create_table_artifact(
            rows,
            key=artifact_key(cfg.run.run_id, "metrics"),
            description="Per-iteration evaluation of the policy and reward models",
        )


@flow(name="iterative-rl", log_prints=True)
def iterative_rl(config: ItergrpoConfig, force_config: bool = False) -> dict[str, Any]:
    """DeepSeekMath Algorithm 1: rollout -> label -> train RMs (replay) -> GRPO -> evaluate."""
    logger = get_run_logger()
    if config.run.run_id is None:
        config = config.model_copy(
            update={"run": config.run.model_copy(update={"run_id": default_run_id()})}
        )
    run_id = config.run.run_id
    assert run_id is not None
    logger.info("run %s, store %s", run_id, config.store.resolved_root())
    preflight(config, force_config=force_config)  # UI-triggered runs: refused before any write
    results = execute_run(
        config,
        force_config=force_config,
        make_executor=prefect_executor,
        on_stage_done=lambda r: _publish_iteration_table(config, r),
    )
    store = RunStore(config.store.resolved_root())
    create_markdown_artifact(
        summary_markdown(store, run_id),
        key=artifact_key(run_id, "summary"),
        description=f"itergrpo run {run_id}",
    )
    ran = [r for r in results if not r.skipped]
    return {
        "run_id": run_id,
        "stages_run": len(ran),
        "stages_skipped": len(results) - len(ran),
    }
