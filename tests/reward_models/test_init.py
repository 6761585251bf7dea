"""Where the iteration-0 PRM starts (reward_models.prm.source) and how long each RM trains."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from flows.config_files import load_config
from flows.errors import ConfigError
from flows.loop import execute_run
from grpo_core.model.policy import build_policy
from reward_models.config import RewardModelSettings
from reward_models.models import RewardModel, load_or_init_reward_model
from storage.sql import run_query
from storage.store import RunStore
from tests.flow_helpers import micro_config


def test_prm_from_an_orm_directory_starts_as_that_orm(tmp_path: Path) -> None:
    cfg = load_config("micro")
    policy, tokenizer = build_policy(cfg.policy)
    orm = RewardModel.from_policy(policy, "orm", tokenizer, seed=1)
    orm.save(tmp_path / "orm")
    settings = RewardModelSettings(source="orm")
    prm = load_or_init_reward_model(None, tmp_path / "orm", "prm", settings, seed=2)
    assert prm.kind == "prm"
    want = orm.state_dict()
    got = prm.state_dict()
    assert want.keys() == got.keys()
    assert all(torch.equal(want[k], got[k]) for k in want)  # head included, not re-seeded


def test_a_prm_from_the_orm_needs_the_orm() -> None:
    with pytest.raises(ConfigError, match=r"prm.source is 'orm' but use_orm is false"):
        load_config("micro", ["reward_models.prm.source=orm", "reward_models.use_orm=false"])


def _head(root: Path, run: str, kind: str) -> torch.Tensor:
    weights = load_file(root / "checkpoints" / run / kind / "iter-0" / "model.safetensors")
    return weights["score.weight"]


@pytest.mark.slow
def test_a_prm_from_the_orm_starts_as_orm_0_and_prm_epochs_sets_its_passes(
    tmp_path: Path,
) -> None:
    # A learning rate so small that training leaves the weights where they started: the
    # PRM's head then shows where it started (ORM_0's head, or a fresh seeded one).
    common = ["run.iterations=1", "grpo.steps=1", "reward_models.lr=1e-12"]
    execute_run(
        micro_config(
            tmp_path,
            "from-orm",
            *common,
            "reward_models.prm.source=orm",
            "reward_models.prm_epochs=3",
        )
    )
    execute_run(micro_config(tmp_path, "from-policy", *common))
    orm_head = _head(tmp_path, "from-orm", "orm")
    assert torch.allclose(_head(tmp_path, "from-orm", "prm"), orm_head, atol=1e-8)
    assert not torch.allclose(_head(tmp_path, "from-policy", "prm"), orm_head, atol=1e-3)
    epochs = run_query(
        RunStore(tmp_path),
        "SELECT rm_kind, max(epoch) + 1 AS passes FROM rm_train WHERE run_id = 'from-orm' "
        "GROUP BY ALL ORDER BY ALL",
    ).to_pylist()
    assert epochs == [{"rm_kind": "orm", "passes": 2}, {"rm_kind": "prm", "passes": 3}]
