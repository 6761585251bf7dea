"""A user error raised inside a deployment run names the deployment's parameters
(`force_config`, the `config` form's fields), not the CLI's flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.deployment_messages import (
    in_deployment_terms,
    resume_hint,
    user_errors_in_deployment_terms,
)
from storage.errors import ConfigMismatchError, StoreError, StorePathError
from storage.store import RunStore
from tests.flow_helpers import commit_a_stage, micro_config

DEPLOYMENT_ENV = "PREFECT__RUNTIME__DEPLOYMENT__ID"  # prefect.runtime's override


def _mismatch(store: Path) -> ConfigMismatchError:
    commit_a_stage(RunStore(store), "r", {"a": 1})
    with pytest.raises(ConfigMismatchError) as caught:
        RunStore(store).check_can_open("r", {"a": 2})
    return caught.value


def test_a_config_clash_names_the_force_config_parameter(tmp_path: Path) -> None:
    message = in_deployment_terms(str(_mismatch(tmp_path)))
    assert "--force-config" not in message and "itergrpo run" not in message
    assert message.endswith(
        "use a new run id, or the deployment parameter `force_config` set to true to replace "
        "it (the old config is kept beside it)"
    )


def test_store_path_errors_name_the_store_root_field(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(StorePathError) as caught:
        RunStore(tmp_path / "file")
    message = in_deployment_terms(str(caught.value))
    assert message == (
        f"store path {tmp_path / 'file'} is a file, not a directory; set the `config` "
        "parameter's `store.root` to another directory"
    )
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("x")
    with pytest.raises(StorePathError) as caught:
        RunStore(tmp_path / "other").check_can_open("r", {})
    assert in_deployment_terms(str(caught.value)).endswith(
        "is not an itergrpo store; set the `config` parameter's `store.root` to a new or "
        "empty directory"
    )


def test_outside_a_deployment_the_cli_flags_stay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(DEPLOYMENT_ENV, raising=False)
    error = _mismatch(tmp_path)
    with pytest.raises(ConfigMismatchError) as caught, user_errors_in_deployment_terms():
        raise error
    assert "`itergrpo run --force-config`" in str(caught.value)


def test_inside_a_deployment_the_same_error_names_the_parameter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DEPLOYMENT_ENV, "6f1c7c1e-0000-4000-8000-000000000001")
    error = _mismatch(tmp_path)
    with pytest.raises(ConfigMismatchError) as caught, user_errors_in_deployment_terms():
        raise error
    assert caught.value is error and caught.value.keys == ["a"]  # the same error, its data kept
    assert "`force_config` set to true" in str(caught.value)
    assert "--force-config" not in str(caught.value)


def test_a_bug_is_not_rewritten(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DEPLOYMENT_ENV, "6f1c7c1e-0000-4000-8000-000000000001")
    text = "pass another --store or set ITERGRPO_STORE"
    with pytest.raises(ValueError) as caught, user_errors_in_deployment_terms():
        raise ValueError(text)
    assert str(caught.value) == text


def test_resume_hint_names_the_run_id_parameter() -> None:
    assert resume_hint("r1") == (
        "run the deployment again with the `config` parameter's `run.run_id` = 'r1'"
    )


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_harness")
def test_a_deployment_flow_run_refused_for_a_config_clash_names_force_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the real flow (as a deployment's flow run calls it): the clash found by the
    pre-flight fails the flow run with the parameter named."""
    from flows.prefect_flow import iterative_rl

    cfg = micro_config(tmp_path, "clash")
    commit_a_stage(RunStore(tmp_path), "clash", {"something": "else"})
    monkeypatch.setenv(DEPLOYMENT_ENV, "6f1c7c1e-0000-4000-8000-000000000001")
    with pytest.raises(StoreError) as caught:
        iterative_rl(cfg)
    assert "the deployment parameter `force_config` set to true" in str(caught.value)
    assert "--force-config" not in str(caught.value)
