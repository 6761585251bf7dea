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


@pytest.fixture(scope="session")
def ray_ranks_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The store of one complete run `rr` (micro, `run.iterations=1`, two Ray ranks), run
    once per test session: the kill/resume test resumes to it, the two-node test matches it.
    Both take its run id (rollout rows name their checkpoint by run id)."""
    from flows.loop import execute_run
    from tests.flow_helpers import micro_config

    root = shared_dir(tmp_path_factory, "ray-ranks-reference")
    with FileLock(str(root) + ".lock"):
        if not (root / "complete").exists():
            execute_run(micro_config(root / "store", RAY_RUN_ID, "run.iterations=1", *ray_sets()))
            (root / "complete").touch()
    return root / "store"


@pytest.fixture(scope="session")
def rm_ranks_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The store of run `rr` as ray_ranks_reference, with its reward models also trained on
    the two ranks (engines.workers.reward_models), run once per session: the comparison with
    the stage-process reward models and the kill/resume test both read it."""
    from flows.loop import execute_run
    from tests.flow_helpers import micro_config

    root = shared_dir(tmp_path_factory, "rm-ranks-reference")
    with FileLock(str(root) + ".lock"):
        if not (root / "complete").exists():
            sets = ("run.iterations=1", *ray_sets(), RM_ON_RANKS)
            execute_run(micro_config(root / "store", RAY_RUN_ID, *sets))
            (root / "complete").touch()
    return root / "store"
