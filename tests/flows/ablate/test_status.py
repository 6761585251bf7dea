"""The ablation's own record after a stop: `interrupted` (rerunning resumes it) when an arm
run stopped on the engine's termination (Prefect's TerminationSignal: a SIGTERM, a cancel),
`failed` for anything else, as execute_run records an arm run."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.ablate.run import run_ablation
from flows.ablate.suites import AblationPlan, Suite
from flows.config import ItergrpoConfig
from flows.loop import call_directly
from storage.store import RunStore
from tests.flow_helpers import EngineStop


@pytest.mark.parametrize(
    ("stop_signals", "status"), [((EngineStop,), "interrupted"), ((), "failed")]
)
def test_an_engine_stop_in_an_arm_run_records_the_ablation_interrupted(
    tmp_path: Path, stop_signals: tuple[type[BaseException], ...], status: str
) -> None:
    suite = Suite(
        config="micro",
        seeds=1,
        overrides=["run.iterations=1", "grpo.steps=2"],
        arms={"grpo_os": [], "online_rft": ["grpo.algo.adv_estimator=online_rft"]},
    )
    plan = AblationPlan("abl", "tiny", suite, 1, tmp_path)
    started: list[str | None] = []

    def stopped_arm(cfg: ItergrpoConfig) -> None:
        started.append(cfg.run.run_id)
        raise EngineStop

    with pytest.raises(EngineStop):
        run_ablation(
            plan, make_executor=call_directly, run_arm=stopped_arm, stop_signals=stop_signals
        )
    assert started == ["abl-grpo_os-s0"]  # after the shared policy_0, the first arm run
    stored = RunStore(tmp_path).run_status("abl")
    assert (stored["status"], stored["failure"]["type"]) == (status, "EngineStop")
