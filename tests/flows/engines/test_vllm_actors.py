"""engines.vllm.placement = ray: two vLLM engines, each started and owned by a Ray actor on a
local Ray (127.0.0.1), sample what one engine samples, take an updated policy by one shared
broadcast, and stop with their Ray. Needs `make vllm-env` and ray; skipped otherwise."""

from __future__ import annotations

import os
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest

from grpo_core.contracts.rollout import SamplingParams
from grpo_core.engines.config import VLLMSettings
from grpo_core.engines.registry import VLLM_PLACEMENTS
from grpo_core.engines.sharded_rollout import PromptShardedEngines
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
    placed = VLLM_PLACEMENTS["ray"]([options, options], settings)
    members = placed.members
    assert placed.sync_host == "127.0.0.1"  # a local Ray: the broadcast meets on loopback
    group = PromptShardedEngines(members, placed.after_close, broadcast_timeout_s=60)
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


VLLM_RUN = ("run.iterations=1", "engines.vllm.engines=2")
RANKS = ("engines.train_workers=ray", "engines.train=torch", "engines.workers.ranks=2")


def one_node_rows(store: Path) -> dict[str, Any]:
    """The rows of the micro run (one iteration) on two vLLM worker processes, trained in the
    stage process, whose weights the stage broadcasts."""
    from flows.loop import execute_run
    from storage.store import RunStore
    from tests.flow_helpers import micro_config, snapshot
    from tests.flows.engines.test_engines_flow import VLLM_SETS

    execute_run(micro_config(store, "vr", *VLLM_SETS, *VLLM_RUN))
    return snapshot(RunStore(store), "vr")


def assert_same_sampling(got: dict[str, Any], want: dict[str, Any]) -> None:
    for table in ("rollouts", "policy_samples", "orm_labels"):
        assert got[table] == want[table], table


def test_training_rank_0_broadcasts_each_update_to_two_engines(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The micro run (one iteration) with its updates on two long-lived Ray ranks and two vLLM
    engines: each GRPO step's policy goes from training rank 0 to both workers in one
    broadcast, never through the stage process, and the run stores the rows that the same
    two engines store when the stage broadcasts the weights of an in-process update."""
    from flows.loop import execute_run
    from storage.store import RunStore
    from tests.flow_helpers import micro_config, snapshot
    from tests.flows.engines.test_engines_flow import VLLM_SETS

    cfg = micro_config(tmp_path / "ranks", "vr", *VLLM_SETS, *VLLM_RUN, *RANKS)
    with caplog.at_level("INFO"):
        execute_run(cfg)
    messages = [r.getMessage() for r in caplog.records]
    by_rank = [m for m in messages if "broadcast by the training rank" in m]
    assert len(by_rank) == cfg.grpo.steps - 1  # steps 1.. sample the previous step's policy
    assert not any(m.startswith("weight sync to 2 engines in one broadcast") for m in messages)
    # the stage held no copy of the policy: the ranks trained it, the engines sampled it
    assert "GRPO: policy_0's weights live on the training ranks only" in messages
    got = snapshot(RunStore(tmp_path / "ranks"), "vr")
    assert_same_sampling(got, one_node_rows(tmp_path / "one"))
    print("rank-0 broadcasts:", "; ".join(m.split(": ", 1)[1] for m in by_rank))


def test_ranks_write_each_policy_for_the_engines_to_reload_and_the_stage_never_holds_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """engines.vllm.weight_sync = disk with Ray ranks: rank 0 writes each update once into the
    store and both engines reload it; the stage, which holds no copy of the policy, never
    receives the weights (it used to take rank 0's and write them once per engine). The same
    rows again, and nothing left in the store."""
    from flows.engines.train_workers import RayWorkersUpdater
    from flows.loop import execute_run
    from storage.store import RunStore
    from tests.flow_helpers import micro_config, snapshot
    from tests.flows.engines.test_engines_flow import VLLM_SETS

    def not_to_the_stage(self: RayWorkersUpdater) -> None:
        raise AssertionError("rank 0's weights were sent to the stage")

    monkeypatch.setattr(RayWorkersUpdater, "_rank0_weights", not_to_the_stage)
    on_disk = "engines.vllm.weight_sync=disk"
    cfg = micro_config(tmp_path / "disk", "vr", *VLLM_SETS, *VLLM_RUN, *RANKS, on_disk)
    with caplog.at_level("INFO"):
        execute_run(cfg)
    messages = [r.getMessage() for r in caplog.records]
    assert "GRPO: policy_0's weights live on the training ranks only" in messages
    written = [m for m in messages if m.startswith("vLLM weight sync written by training rank")]
    assert len(written) == cfg.grpo.steps - 1, written  # once for both engines, steps 1..
    reloaded = [m for m in messages if "update-" in m and m.startswith("vLLM worker reloaded")]
    assert len(reloaded) == 2 * len(written), reloaded  # each engine
    assert len({m.split()[3] for m in reloaded}) == len(written)  # a new directory each time
    assert not [m for m in messages if m.startswith("vLLM weight sync: save")]
    got = snapshot(RunStore(tmp_path / "disk"), "vr")
    assert_same_sampling(got, one_node_rows(tmp_path / "one"))
    assert not list((tmp_path / "disk" / "checkpoints" / "vr").glob("grpo-launch*"))


def test_engines_and_ranks_on_two_simulated_nodes_store_the_one_node_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """cluster.ray_address with vLLM: a two-node cluster (1 CPU per node) places one engine on
    each node (an engine reserves 1 CPU, a training rank none); every stage samples with the
    engines, rank 0 broadcasts each update to both, and the rows are the one-node run's."""
    import ray

    import flows.engines.vllm_actors as actors
    from flows.engines import ray_shards
    from flows.loop import execute_run
    from grpo_core.engines.registry import PlacedEngines
    from storage.store import RunStore
    from tests.flow_helpers import micro_config, snapshot
    from tests.flows.engines.test_engines_flow import VLLM_SETS
    from tests.flows.engines.test_train_workers_nodes import two_nodes

    engine_nodes: list[str] = []

    def placed_and_seen(options: list[dict[str, Any]], settings: VLLMSettings) -> PlacedEngines:
        placed = actors._ray_actors(options, settings)
        engine_nodes.extend(ray.get([m.actor.node.remote() for m in placed.members]))
        return placed

    def no_ray_shards(*args: Any) -> None:
        raise AssertionError("a stage sampled with Ray shards, not with the vLLM engines")

    monkeypatch.setitem(VLLM_PLACEMENTS._entries, "ray", placed_and_seen)
    monkeypatch.setattr(ray_shards, "ray_sharded_rollout", no_ray_shards)
    on_ray = ("engines.vllm.placement=ray", "engines.vllm.num_cpus_per_engine=1")
    ranks = (*RANKS, "engines.workers.num_cpus_per_rank=0")
    with two_nodes(monkeypatch) as cluster, caplog.at_level("INFO"):
        nodes = {n.node_id for n in [cluster.head_node, *cluster.worker_nodes]}
        address = f"cluster.ray_address={cluster.address}"
        sets = (*VLLM_SETS, *VLLM_RUN, *on_ray, *ranks, address)
        cfg = micro_config(tmp_path / "two", "vr", *sets)
        execute_run(cfg)
    assert sorted(engine_nodes) == sorted(nodes)  # one engine on each node
    messages = [r.getMessage() for r in caplog.records]
    assert sum("broadcast by the training rank" in m for m in messages) == cfg.grpo.steps - 1
    got = snapshot(RunStore(tmp_path / "two"), "vr")
    assert_same_sampling(got, one_node_rows(tmp_path / "one"))
