"""The ablation under Prefect: one flow run, the shared warm start a task in it, each
arm-seed run an `iterative_rl` subflow named by its run id, the report a markdown artifact."""

from __future__ import annotations

from pathlib import Path

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterKey,
    TaskRunFilter,
    TaskRunFilterFlowRunId,
)

from flows.ablate.flow import ablate
from flows.ablate.suites import Suite
from flows.prefect_flow import artifact_key
from storage.store import RunStore
from tests.prefect_harness import flow_run_ids, new_flow_runs

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]


def test_each_arm_seed_run_is_a_subflow_of_one_ablation_flow_run(tmp_path: Path) -> None:
    suite = Suite(
        config="micro",
        seeds=1,
        overrides=["run.iterations=1", "grpo.steps=2"],
        arms={"grpo_os": [], "online_rft": ["grpo.algo.adv_estimator=online_rft"]},
    )
    before = flow_run_ids()  # the server is shared: only this test's flow runs count
    out = ablate("abl", "tiny", suite.model_dump(mode="json"), 1, str(tmp_path))
    runs = new_flow_runs(before)
    parents = {r.parent_task_run_id for r in runs if r.parent_task_run_id}
    with get_client(sync_client=True) as client:
        mine = TaskRunFilterFlowRunId(any_=[r.id for r in runs])
        tasks = {
            t.id: t for t in client.read_task_runs(task_run_filter=TaskRunFilter(flow_run_id=mine))
        }
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(
                key=ArtifactFilterKey(any_=[artifact_key("abl", "ablation")])
            )
        )
    rows = RunStore(tmp_path).read("ablation", run_id="abl").to_pylist()
    assert out == {"ablation_id": "abl", "rows": len(rows)}
    (top,) = [r for r in runs if r.parent_task_run_id is None]
    subflows = sorted(r.name for r in runs if r.parent_task_run_id)
    assert subflows == ["abl-grpo_os-s0", "abl-online_rft-s0"]
    assert {tasks[p].flow_run_id for p in parents} == {top.id}  # children of the ablation run
    assert any(t.name == "warm_start-iter0" and t.flow_run_id == top.id for t in tasks.values())
    assert artifacts and artifacts[0].type == "markdown"
    page = str(artifacts[0].data)
    assert "grpo_os > online_rft" in page
    assert page.count("](data:image/png;base64,iVBORw0KGgo") == 3  # Figs. 5-7 inlined
