"""The GRPO stage's seams: `setup_grpo` builds the parts iteration k starts from, a part
swapped with dataclasses.replace is the one the steps use, and `train_grpo` on the parts
gives the rows the stage committed (the micro run's iteration 1, rerun on a copy)."""

from __future__ import annotations

import dataclasses
import functools
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from flows.config_files import stored_config_as_current
from flows.context import RunContext
from flows.names import GRPO_PROGRESS, POLICY
from flows.progress import no_progress
from flows.stages.grpo import setup_grpo, train_grpo
from grpo_core.engines.cost import STEP_SECONDS, TRAINING_STATE_MIB
from storage.checkpoints import checkpoint_path
from storage.store import RunStore
from tests.flow_helpers import micro_config

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]


class CountingSampler:
    def __init__(self, inner: Any) -> None:
        self.inner, self.prompts = inner, 0

    def generate(self, prompts: list[str], *args: Any, **kwargs: Any) -> Any:
        self.prompts += len(prompts)
        return self.inner.generate(prompts, *args, **kwargs)


def test_setup_then_train_is_the_stage(micro_run: tuple[RunStore, str], tmp_path: Path) -> None:
    store, run_id = micro_run
    copy = tmp_path / "store"
    shutil.copytree(store.root, copy)
    # removed at the stage's commit (store.progress_checkpoints): a rerun starts at step 0
    assert not checkpoint_path(copy, run_id, GRPO_PROGRESS, 1).exists()
    cfg = micro_config(copy, run_id)
    upgrade = functools.partial(stored_config_as_current, current=cfg)
    run = RunStore(copy).open_run(run_id, cfg.model_dump(mode="json"), upgrade_config=upgrade)
    with run:
        parts = setup_grpo(RunContext(cfg, RunStore(copy), run), 1)
        assert (parts.iteration, parts.resume.resumed, parts.resume.next_step) == (1, False, 0)
        assert parts.outputs.policy == checkpoint_path(copy, run_id, POLICY, 2)
        policy_1 = load_file(str(checkpoint_path(copy, run_id, POLICY, 1) / "model.safetensors"))
        assert parts.reference is not None
        reference = parts.reference.state_dict()
        assert all(torch.equal(reference[name], t) for name, t in policy_1.items())
        counting = CountingSampler(parts.sampler)
        samples, metrics = train_grpo(dataclasses.replace(parts, sampler=counting), no_progress)
    g = cfg.grpo
    assert counting.prompts == g.steps * g.prompts_per_step  # the swapped sampler sampled
    committed = store.read("policy_samples", run_id=run_id, iterations=[1])
    rows = committed.drop(["run_id", "iteration"]).to_pylist()
    assert samples == [{**r, "reward_parts": dict(r["reward_parts"])} for r in rows]  # MAP: pairs
    timings = (STEP_SECONDS, TRAINING_STATE_MIB)
    stored = store.read("metrics", run_id=run_id, stage="grpo", iterations=[1]).to_pylist()
    per_step = [(r["step"], r["name"], r["value"]) for r in stored if r["step"] is not None]
    got = [(r["step"], r["name"], r["value"]) for r in metrics if r["step"] is not None]
    assert [m for m in got if m[1] not in timings] == [m for m in per_step if m[1] not in timings]
