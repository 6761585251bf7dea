"""Runs whose ORM and PRM start from pretrained checkpoints in their own formats and BPE
tokenizer (tests/rm_checkpoints.py), unlike the character policy's: they train with the
replay, reward GRPO, resume after kills to the same rows, or stay frozen (micro scale)."""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from flows.loop import execute_run
from storage.sql import run_query
from storage.store import RunStore
from tests import rm_checkpoints
from tests.flow_helpers import cli, micro_config, snapshot

pytestmark = pytest.mark.slow


def rows(root: Path, query: str) -> list[dict]:  # type: ignore[type-arg]
    return run_query(RunStore(root), query).to_pylist()


def weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(path / "model.safetensors")


def same_weights(a: Path, b: Path) -> bool:
    wa, wb = weights(a), weights(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def pretrained_overrides(models: Path) -> list[str]:
    """ORM: a one-logit sequence classifier (a); PRM: a step-tag causal LM (b); both reward."""
    orm = rm_checkpoints.classifier(models / "orm-classifier")
    prm = rm_checkpoints.step_tag_lm(models / "prm-step-tag")
    return [
        *(f"reward_models.orm.source={orm}", "reward_models.orm.format=classifier"),
        *(f"reward_models.prm.source={prm}", "reward_models.prm.format=step_tag"),
        "grpo.rewards.prm=0.5",
    ]


def committed(store: Path, run_id: str) -> set[tuple[str, int]]:
    return {(s["stage"], s["iteration"]) for s in RunStore(store).committed_stages(run_id)}


def test_pretrained_rms_train_reward_grpo_and_a_killed_run_resumes_to_the_same_rows(
    tmp_path: Path,
) -> None:
    overrides = pretrained_overrides(tmp_path / "models")
    reference = tmp_path / "reference"
    execute_run(micro_config(reference, "pre", *overrides))

    # Both RMs trained at both iterations, on their labels plus the replay at iteration 1.
    trained = rows(
        reference,
        "SELECT rm_kind, iteration, count(*) FILTER (WHERE source = 'replay') > 0 AS replayed "
        "FROM rm_train WHERE run_id = 'pre' GROUP BY ALL ORDER BY ALL",
    )
    assert trained == [
        {"rm_kind": kind, "iteration": k, "replayed": k == 1}
        for kind in ("orm", "prm")
        for k in (0, 1)
    ]
    parts = rows(
        reference,
        "SELECT count(*) AS n, min(reward_parts['orm']) AS orm, min(reward_parts['prm']) AS prm "
        "FROM policy_samples WHERE run_id = 'pre'",
    )[0]
    assert parts["n"] == 2 * 3 * 4 * 4 and parts["orm"] is not None and parts["prm"] is not None
    checkpoints = reference / "checkpoints" / "pre"
    for kind, fmt, source in (
        ("orm", "classifier", "orm-classifier"),
        ("prm", "step_tag", "prm-step-tag"),
    ):
        saved = checkpoints / kind / "iter-1"
        meta = json.loads((saved / "reward_model.json").read_text())
        assert (meta["kind"], meta["format"]) == (kind, fmt)
        config = json.loads((saved / "config.json").read_text())
        assert config["vocab_size"] == len(rm_checkpoints.rm_tokenizer())  # its own, not chars
        assert not same_weights(saved, tmp_path / "models" / source)  # trained

    # Killed after the ORM of iteration 1 was trained and saved but not the PRM, then
    # in the GRPO stage after a step checkpoint: the resumed run has the same rows.
    store = tmp_path / "killed"
    args = [a for o in overrides for a in ("--set", o)]
    first = cli(
        store, "run", "--config", "micro", "--run-id", "pre", *args, fault="SIGKILL@train_rm:1:2"
    )
    assert first.returncode == -signal.SIGKILL, first.stderr[-2000:]
    assert ("train_rm", 1) not in committed(store, "pre")
    # RM_0 of both kinds is in the store: the sources are never read again, not even checked.
    shutil.rmtree(tmp_path / "models")
    second = cli(store, "resume", "pre", fault="SIGKILL@grpo:1:2")
    assert second.returncode == -signal.SIGKILL, second.stderr[-2000:]
    final = cli(store, "resume", "pre")
    assert final.returncode == 0, final.stderr[-2000:]
    assert "GRPO: resuming at step 1" in final.stderr
    assert snapshot(RunStore(store), "pre") == snapshot(RunStore(reference), "pre")


def test_a_two_class_prm_rewards_steps_while_a_frozen_orm_stays_its_source(
    tmp_path: Path,
) -> None:
    orm = rm_checkpoints.classifier(tmp_path / "models" / "orm")
    prm = rm_checkpoints.two_class(tmp_path / "models" / "prm")
    store = tmp_path / "store"
    cfg = micro_config(
        store,
        "qwen-style",
        *(f"reward_models.orm.source={orm}", "reward_models.orm.format=classifier"),
        "reward_models.orm.train=false",
        *(f"reward_models.prm.source={prm}", "reward_models.prm.format=two_class"),
        "grpo.algo.adv_estimator=grpo_process",  # the PRM's step scores are the reward
    )
    execute_run(cfg)
    checkpoints = store / "checkpoints" / "qwen-style"
    for k in (0, 1):
        assert same_weights(checkpoints / "orm" / f"iter-{k}", orm)  # bit for bit
    assert not same_weights(checkpoints / "prm" / "iter-1", prm)
    trained = rows(store, "SELECT DISTINCT rm_kind FROM rm_train WHERE run_id = 'qwen-style'")
    assert trained == [{"rm_kind": "prm"}]
    samples = rows(
        store,
        "SELECT reward_rm, advantage, reward_parts['orm'] AS orm FROM policy_samples "
        "WHERE run_id = 'qwen-style'",
    )
    assert len(samples) == 2 * 3 * 4 * 4
    assert all(0.0 <= s["reward_rm"] <= 1.0 and s["orm"] is not None for s in samples)
    assert any(abs(s["advantage"]) > 1e-3 for s in samples)  # step rewards moved the policy
    # The frozen ORM's drift rows compare it with itself: RM_1 is RM_0.
    drift = {
        r["metric"]: r["value"]
        for r in RunStore(store)
        .read("eval", run_id="qwen-style", where="policy_iteration = 1 AND split = 'train'")
        .to_pylist()
    }
    assert drift["orm_auroc"] == drift["orm_auroc_stale"]
