"""Fixtures of the engine tests: one reference run on two Ray training ranks, shared."""

from __future__ import annotations

from pathlib import Path

import pytest
from filelock import FileLock

from tests.conftest import shared_dir

# The micro preset, one iteration, its GRPO updates on two long-lived Ray ranks: DeepSpeed
# (ZeRO-2) where installed, as issue 32 asks; else the torch engine under DDP.
RAY_RUN_ID = "rr"
RM_ON_RANKS = "engines.workers.reward_models=true"


def ray_sets() -> tuple[str, ...]:
    from importlib.util import find_spec

    train = "deepspeed" if find_spec("deepspeed") else "torch"
    return ("engines.train_workers=ray", f"engines.train={train}", "engines.workers.ranks=2")


def _reference_run(factory: pytest.TempPathFactory, name: str, *sets: str) -> Path:
    """The store of one complete run `rr` (micro, `run.iterations=1`, two Ray ranks, `sets`),
    run once per test session whichever xdist worker asks first."""
    from flows.loop import execute_run
    from tests.flow_helpers import micro_config

    root = shared_dir(factory, name)
    with FileLock(str(root) + ".lock"):
        if not (root / "complete").exists():
            run_sets = ("run.iterations=1", *ray_sets(), *sets)
            execute_run(micro_config(root / "store", RAY_RUN_ID, *run_sets))
            (root / "complete").touch()
    return root / "store"


@pytest.fixture(scope="session")
def ray_ranks_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference run on two Ray ranks: the kill/resume test resumes to it, the two-node
    test matches it. Both take its run id (rollout rows name their checkpoint by run id)."""
    return _reference_run(tmp_path_factory, "ray-ranks-reference")


@pytest.fixture(scope="session")
def rm_ranks_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference run with its reward models also trained on the two ranks
    (engines.workers.reward_models): the comparison with the stage-process reward models and
    the kill/resume test both read it."""
    return _reference_run(tmp_path_factory, "rm-ranks-reference", RM_ON_RANKS)
