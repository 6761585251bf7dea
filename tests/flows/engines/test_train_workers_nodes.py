"""A two-node Ray cluster simulated on this machine (ray.cluster_utils.Cluster: a head and a
worker node, each its own raylet with 1 CPU, on 127.0.0.1) runs the micro preset with its two
training ranks (1 CPU each, so one per node) and its sampling as Ray shards: the rows,
metrics and weights equal those of the one-node run (ranks on a local Ray, sampling in
process) exactly, since each rank computes the same rows either way and the shards return
the in-process engine's rows (docs/ray_shards.md)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest
from torch import Tensor

from flows.engines import train_workers
from flows.engines.ray_runtime import LOOPBACK
from flows.loop import execute_run
from flows.names import POLICY
from grpo_core.contracts.policy_batch import PolicyBatch
from storage.checkpoints import checkpoint_path
from storage.store import RunStore
from tests.flow_helpers import micro_config, snapshot
from tests.flows.engines.conftest import RAY_RUN_ID
from tests.flows.engines.test_engines_flow import grpo_metrics, max_weight_gap
from tests.flows.engines.test_train_workers_e2e import RAY_SETS

pytestmark = [
    pytest.mark.skipif(find_spec("ray") is None, reason="ray is not installed"),
    pytest.mark.slow,
]


@contextmanager
def two_nodes(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The simulated cluster, joined by this process; stopped on leaving. Ray turns a
    loopback address into the host's outward one unless told it runs no real cluster (the
    nodes and their workers read the variable, this process the constant)."""
    import ray
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    monkeypatch.setenv(ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR, "0")
    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "node_ip_address": LOOPBACK, "include_dashboard": False},
    )
    try:
        cluster.add_node(num_cpus=1, node_ip_address=LOOPBACK)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address)
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_micro_run_on_two_simulated_nodes_equals_the_one_node_run(
    ray_ranks_reference: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sets = ["run.iterations=1", *RAY_SETS]
    # The one-node run: no cluster, the stage's own local Ray (tests/flows/engines/conftest.py).
    one, two, mn = ray_ranks_reference, tmp_path / "two", RAY_RUN_ID

    placements: list[list[str]] = []  # per GRPO step, the node of each rank
    update = train_workers.RayWorkersUpdater.update

    def spy(
        self: Any, batch: PolicyBatch, adv: Tensor, old: Tensor | None, seed: int
    ) -> dict[str, float]:
        placements.append(list(self.nodes))
        return update(self, batch, adv, old, seed)

    monkeypatch.setattr(train_workers.RayWorkersUpdater, "update", spy)
    with two_nodes(monkeypatch) as cluster:
        nodes = {n.node_id for n in [cluster.head_node, *cluster.worker_nodes]}
        cfg = micro_config(
            two, mn, *sets, f"cluster.ray_address={cluster.address}", "cluster.shards=2"
        )
        execute_run(cfg)
    assert len(nodes) == 2 and len(placements) == cfg.grpo.steps
    assert all(sorted(p) == sorted(nodes) for p in placements)  # one rank on each node
    assert snapshot(RunStore(two), mn) == snapshot(RunStore(one), mn)
    assert grpo_metrics(two, mn) == grpo_metrics(one, mn)
    final = (checkpoint_path(two, mn, POLICY, 1), checkpoint_path(one, mn, POLICY, 1))
    assert max_weight_gap(*final) == 0.0
