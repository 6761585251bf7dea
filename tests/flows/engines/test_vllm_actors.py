"""engines.vllm.placement = ray: two vLLM engines, each started and owned by a Ray actor on a
local Ray (127.0.0.1), sample what one engine samples, take an updated policy by one shared
broadcast, and stop with their Ray. Needs `make vllm-env` and ray; skipped otherwise."""

from __future__ import annotations

import os
from importlib.util import find_spec
from pathlib import Path

import pytest

from grpo_core.contracts.rollout import SamplingParams
from grpo_core.engines.config import VLLMSettings
from grpo_core.engines.registry import VLLM_PLACEMENTS
from grpo_core.engines.sharded_rollout import ShardedRolloutEngine
from grpo_core.engines.vllm_env import find_vllm_python
from grpo_core.engines.vllm_rollout import VLLMRolloutEngine
from grpo_core.model.policy import load_policy
from tests.grpo_core.engines.test_vllm_rollout import (
    LLM_KWARGS,
    WORKER_ENV,
    _vllm_missing,
    assert_greedy_identical,
    assert_same_rows,
    prompts,
    save_policy,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(_vllm_missing()), reason=_vllm_missing() or "vLLM env present"),
    pytest.mark.skipif(find_spec("ray") is None, reason="ray is not installed"),
]


def test_two_engines_on_ray_actors_sample_what_one_samples(tmp_path: Path) -> None:
    import ray

    import flows.engines.vllm_actors  # noqa: F401  (registers the placement)

    policy_a, policy_b = save_policy(tmp_path / "a", seed=2), save_policy(tmp_path / "b", seed=3)
    options = {
        "checkpoint_dir": policy_a,
        "dtype": "float32",
        "llm_kwargs": LLM_KWARGS,
        "env": WORKER_ENV,
        "python": find_vllm_python(),
    }
    settings = VLLMSettings(engines=2, placement="ray", num_cpus_per_engine=0.5)
    members, after_close = VLLM_PLACEMENTS["ray"]([options, options], settings)
    group = ShardedRolloutEngine(members, after_close, broadcast_timeout_s=60)
    try:
        actors = [m.actor for m in members]
        pids = ray.get([actor.pid.remote() for actor in actors])
        assert len(set(pids)) == 2 and os.getpid() not in pids  # an engine per actor process
        with VLLMRolloutEngine(**options) as one:
            tok = one.tokenizer
            params = SamplingParams(16, 1.0, top_p=0.9)
            want = one.generate(prompts(tok), 3, params, seed=5)
        assert_same_rows(group.generate(prompts(tok), 3, params, seed=5), want)
        # one broadcast from this process to both actors' workers (not through Ray's store)
        group.receive_weights(dict(load_policy(policy_b)[0].state_dict()))
        assert_greedy_identical(group, policy_b)
    finally:
        group.close()
    assert not ray.is_initialized()  # the local Ray the placement started is stopped
