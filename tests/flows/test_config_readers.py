"""The rerun rule: a field no committed stage read may be corrected without --force-config."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.config_readers import first_iteration_reading, stages_reading
from storage.errors import ConfigMismatchError
from storage.store import RunStore


def test_stages_reading_the_keys() -> None:
    assert stages_reading("guards.rm_labels") == frozenset()
    assert stages_reading("evaluation.n_prompts") == {"warm_start", "evaluate"}  # policy_0 too
    assert stages_reading("reward_models.orm.source") == {"train_rm"}
    assert stages_reading("reward_models.lr") == {"train_rm"}
    assert stages_reading("reward_models.prm_continual_epochs") == {"train_rm"}
    iterations = {"rollout", "label", "train_rm", "grpo", "evaluate"}
    assert stages_reading("reward_models.dtype") == iterations  # the GRPO stage loads RMs in it
    assert stages_reading("grpo.steps") == iterations  # all but the warm start
    assert stages_reading("rollout.prompts") == iterations
    assert stages_reading("rollout.batch_size") == {"warm_start", *iterations}  # its sampler
    assert stages_reading("engines.rollout") is None  # not listed: every stage
    assert stages_reading("run.warm_start") is None  # not warm_start.*
    # train_rm of iteration 0 trains RM_0 whatever `retrain` says (what a fork may share)
    assert first_iteration_reading("reward_models.retrain") == 1
    assert first_iteration_reading("reward_models.lr") == 0


def _commit(store: RunStore, config: dict[str, object], stage: str) -> None:
    with (
        store.open_run("r", config, stage_readers=stages_reading) as run,
        run.stage(0, stage) as attempt,
    ):
        attempt.write("metrics", [{"stage": stage, "name": "x", "value": 1.0}])


def test_a_field_only_uncommitted_stages_read_may_change(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    first = {"grpo": {"steps": 2}, "evaluation": {"n_prompts": 8}, "guards": {"rm_labels": "stop"}}
    _commit(store, first, "label")
    corrected = {**first, "evaluation": {"n_prompts": 16}, "guards": {"rm_labels": "warn"}}
    store.check_can_open("r", corrected, stage_readers=stages_reading)  # no committed reader
    with store.open_run("r", corrected, stage_readers=stages_reading):
        pass
    assert store.run_config("r") == corrected  # the rerun took it; the old one kept beside
    assert len(list(store.run_dir("r").glob("config.*.yaml"))) == 1

    with pytest.raises(ConfigMismatchError, match=r"grpo\.steps") as refused:
        store.check_can_open("r", {**corrected, "grpo": {"steps": 3}}, stage_readers=stages_reading)
    assert refused.value.keys == ["grpo.steps"]  # the evaluation key is not blamed


def test_once_its_reader_committed_the_field_is_fixed(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    config = {"evaluation": {"n_prompts": 8}}
    _commit(store, config, "evaluate")
    with pytest.raises(ConfigMismatchError, match=r"evaluation\.n_prompts"):
        store.check_can_open("r", {"evaluation": {"n_prompts": 16}}, stage_readers=stages_reading)
    # without the readers (a caller that does not know them) any difference is refused
    with pytest.raises(ConfigMismatchError):
        store.check_can_open("r", {"evaluation": {"n_prompts": 8}, "guards": {}})
