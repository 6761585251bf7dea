"""The Prefect flow on `micro` on the tests' Prefect server (tests/prefect_harness.py): task
per stage, artifacts, resume."""

from __future__ import annotations

from pathlib import Path
from uuid import UUID

import prefect.runtime.flow_run
import pytest
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterKey,
    LogFilter,
    LogFilterFlowRunId,
    LogFilterLevel,
    TaskRunFilter,
    TaskRunFilterFlowRunId,
)
from prefect.client.schemas.objects import Artifact
from prefect.logging.handlers import APILogHandler
from prefect.states import Cancelling

from flows.loop import planned_stages
from flows.prefect_flow import (
    artifact_key,
    iterative_rl,
    served_config,
    this_flow_run_is_cancelling,
)
from flows.tracking.record import mlflow_run
from storage.store import RunStore
from tests.flow_helpers import micro_config
from tests.prefect_harness import flow_run_ids, new_flow_runs

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]


def artifacts(key: str) -> list[Artifact]:
    with get_client(sync_client=True) as client:
        return client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key]))
        )


def test_the_summary_artifact_links_the_runs_mlflow_run(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    # artifacts in tmp_path, not in ./mlruns where a server-less store keeps them by default
    MlflowClient(uri).create_experiment("itergrpo", artifact_location=str(tmp_path / "art"))
    store = tmp_path / "store"
    cfg = micro_config(store, "pf-mlflow", "run.iterations=1", f"tracking.mlflow.uri={uri}")
    iterative_rl(cfg)
    tracked = mlflow_run(RunStore(store).run_dir("pf-mlflow"))
    assert tracked is not None
    summary = artifacts(artifact_key("pf-mlflow", "summary"))
    assert str(summary[0].data).startswith(f"MLflow run `{tracked[0]}`: {tracked[1]}")
    assert MlflowClient(uri).get_run(tracked[0]).info.status == "FINISHED"


def test_flow_runs_each_stage_as_a_task_publishes_artifacts_and_resumes(tmp_path: Path) -> None:
    # a floor micro's tiny RMs cannot reach: the AUROC guard warns, as a flow-run artifact
    cfg = micro_config(tmp_path, "pf-1", "run.iterations=1", "guards.rm_auroc_floor=0.999")
    before = flow_run_ids()
    out = iterative_rl(cfg)
    (run,) = new_flow_runs(before)  # the server is shared: this test's own flow run
    n_stages = len(planned_stages(cfg))
    assert out == {"run_id": "pf-1", "stages_run": n_stages, "stages_skipped": 0}
    assert len(RunStore(tmp_path).committed_stages("pf-1")) == n_stages

    table = artifacts(artifact_key("pf-1", "metrics"))
    assert table and table[0].type == "table"
    assert "greedy_acc" in str(table[0].data)
    summary = artifacts(artifact_key("pf-1", "summary"))
    assert summary and summary[0].type == "markdown" and "pf-1" in str(summary[0].data)
    # one version per stage that warned (train_rm's AUROC, grpo's over-optimisation check
    # that micro's 3 steps cannot judge)
    guards = [
        str(a.data) for a in artifacts(artifact_key("pf-1", "guards")) if a.type == "markdown"
    ]
    assert any("train_rm" in text and "rm_auroc: " in text for text in guards), guards
    # the report page with its plots: PNGs inlined, since the UI cannot read the store
    reports = tmp_path / "reports" / "pf-1"
    pngs = sorted(reports.glob("*.png"))
    assert len(pngs) == 4 and (reports / "summary.md").is_file()
    inlined = str(summary[0].data).count("](data:image/png;base64,iVBORw0KGgo")  # PNG magic
    assert inlined == len(pngs)

    assert run.name
    with get_client(sync_client=True) as client:
        tasks = client.read_task_runs(
            task_run_filter=TaskRunFilter(flow_run_id=TaskRunFilterFlowRunId(any_=[run.id]))
        )
    names = {t.name for t in tasks}
    assert {"warm_start-iter0", "rollout-iter0", "grpo-iter0", "evaluate-iter0"} <= names
    progress = [t for t in tasks if t.name == "grpo-iter0"]
    assert progress and all(t.state and t.state.is_completed() for t in progress)

    # itergrpo's own lines reach the flow run's logs (what the UI's Logs tab shows)
    APILogHandler().flush()
    with get_client(sync_client=True) as client:
        logs = client.read_logs(
            log_filter=LogFilter(
                level=LogFilterLevel(ge_=0), flow_run_id=LogFilterFlowRunId(any_=[run.id])
            ),
            limit=200,
        )
    messages = "\n".join(log.message for log in logs)
    assert "iteration 0 (1 of 1): rollout done in" in messages
    assert "GRPO iter 0 step 0: reward" in messages

    again = iterative_rl(cfg)
    assert again == {"run_id": "pf-1", "stages_run": 0, "stages_skipped": n_stages}


def test_artifact_keys_are_what_prefect_accepts() -> None:
    assert artifact_key("Demo_2026.11", "metrics") == "itergrpo-metrics-demo-2026-11"


def test_partial_parameters_merge_onto_the_served_config(tmp_path: Path) -> None:
    """What `prefect deployment run --params '{"config": {"run": {"iterations": 1}}}'` sends
    is validated by Prefect into a config whose unset fields are remembered: only the named
    field changes; the served preset and store stay."""
    served = micro_config(tmp_path, "served")
    given = iterative_rl.validate_parameters({"config": {"run": {"iterations": 1}}})["config"]
    merged = served_config(given, served.model_dump_json())
    assert merged.run.iterations == 1
    assert merged.store.root == str(tmp_path)  # not ./itergrpo-store
    assert merged.warm_start == served.warm_start  # micro's, not the class defaults
    assert merged.model_copy(update={"run": served.run}) == served
    assert served_config(given, None) is given  # outside `itergrpo serve`


def test_a_cli_run_renders_its_report_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The flow renders the report for its artifact; the CLI prints where, not a second copy."""
    from flows import report
    from flows.cli import main, run_commands

    rendered: list[Path] = []
    write_report = report.write_report

    def counted(store: RunStore, run_id: str, out_dir: Path, *args: object) -> list[Path]:
        rendered.append(out_dir)
        return write_report(store, run_id, out_dir, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(report, "write_report", counted)
    monkeypatch.setattr(run_commands, "write_report", counted)
    argv = ["run", "--config", "micro", "--store", str(tmp_path), "--run-id", "once"]
    assert main([*argv, "--set", "run.iterations=1", "--set", "grpo.steps=1"]) == 0
    reports = tmp_path / "reports" / "once"
    assert rendered == [reports]
    assert (reports / "summary.md").is_file() and len(list(reports.glob("*.png"))) == 4
    assert f"report: {reports.resolve()}" in capsys.readouterr().out


def test_a_flow_run_sees_its_own_cancel_in_the_api() -> None:
    """What execute_run asks when an exception ends a Prefect run (flows/loop.py): a cancel
    from the UI sets the flow run Cancelling before the runner's SIGTERM arrives."""
    seen: list[bool] = []

    @flow
    def cancelled_midway() -> None:
        seen.append(this_flow_run_is_cancelling())
        with get_client(sync_client=True) as client:
            flow_run_id = UUID(prefect.runtime.flow_run.id)
            client.set_flow_run_state(flow_run_id, Cancelling(), force=True)
        seen.append(this_flow_run_is_cancelling())

    cancelled_midway(return_state=True)
    assert seen == [False, True]
    assert not this_flow_run_is_cancelling()  # outside a flow run
