"""The Ray that long-lived actors run on (training ranks, vLLM engines): an initialised Ray as
it is, cluster.ray_address joined, or a local Ray on 127.0.0.1 started for the caller."""

from __future__ import annotations

import os
from typing import Any

from flows.progress import log
from grpo_core.engines.weight_sync import LOOPBACK

__all__ = ["LOOPBACK", "start_ray"]


def start_ray(
    ray_address: str | None, cpus_needed: float, who: str = "training ranks"
) -> tuple[Any, bool]:
    """The `ray` module, initialised, and whether this call started it: an initialised Ray is
    used as it is, cluster.ray_address is joined, and without one a local Ray on 127.0.0.1
    (no dashboard) with at least the CPUs the actors reserve is started (the caller stops it).
    who: the actors' name in the log lines."""
    import ray

    if ray.is_initialized():
        return ray, False
    if ray_address is not None:
        log.info("%s: connecting to Ray at %s", who, ray_address)
        ray.init(address=ray_address)
        return ray, False
    cpus = max(float(os.cpu_count() or 1), cpus_needed)
    log.info("%s: starting a local Ray on %s (%g CPUs)", who, LOOPBACK, cpus)
    ray.init(
        address="local",
        _node_ip_address=LOOPBACK,
        include_dashboard=False,
        num_cpus=int(-(-cpus // 1)),
        log_to_driver=True,
    )
    return ray, True
