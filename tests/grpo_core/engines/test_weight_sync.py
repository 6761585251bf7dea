"""The weight-sync group of the vLLM worker, both ranks in one process (no vLLM needed)."""

import threading
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from grpo_core.engines.weight_sync import (
    WeightSender,
    make_group,
    manifest,
    sync_backend,
    unique_tensors,
)


def test_broadcast_delivers_every_tensor_in_manifest_order() -> None:
    weights = {"embed": torch.randn(10, 4), "norm": torch.ones(4), "step": torch.tensor([3])}
    sender, got = WeightSender(timeout_s=30), {}

    def worker() -> None:  # what vllm_worker.SyncGroup does, as rank 1
        timeout = timedelta(seconds=30)
        store = dist.TCPStore("127.0.0.1", sender.port, 2, is_master=False, timeout=timeout)
        group = make_group(store, 1, "gloo", timeout)
        for name, dtype, shape in manifest(weights):
            tensor = torch.empty(shape, dtype=getattr(torch, str(dtype)))
            group.broadcast(tensor, 0).wait()
            got[name] = tensor

    thread = threading.Thread(target=worker)
    thread.start()
    sender.connect("gloo")
    sent = sender.send(weights)
    thread.join(timeout=30)
    assert sent == (40 + 4) * 4 + 8
    assert list(got) == list(weights)
    assert all(torch.equal(got[n], weights[n]) for n in weights)


def test_a_worker_that_never_joins_times_out_naming_the_settings() -> None:
    sender = WeightSender(timeout_s=1)
    with pytest.raises(RuntimeError, match=r"sync_timeout_s.*weight_sync: disk"):
        sender.connect("gloo")


def test_a_tied_lm_head_is_sent_once() -> None:
    embed = torch.randn(8, 4)
    weights = {"model.embed_tokens.weight": embed, "lm_head.weight": embed, "b": torch.ones(2)}
    assert list(unique_tensors(weights)) == ["model.embed_tokens.weight", "b"]


def test_nccl_only_where_no_two_ranks_can_share_a_gpu() -> None:
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    # the engines' setting auto (engines on GPUs of their own): NCCL from a sender on its own
    assert sync_backend("auto", cuda, sender_owns_gpu=True) == "nccl"
    assert sync_backend("auto", cuda, sender_owns_gpu=False) == "gloo"  # the stage process
    assert sync_backend("auto", cpu, sender_owns_gpu=True) == "gloo"
    assert sync_backend("nccl", cuda, sender_owns_gpu=False) == "nccl"  # as given
    assert sync_backend("gloo", cuda, sender_owns_gpu=True) == "gloo"
    with pytest.raises(ValueError, match="auto, gloo or nccl"):
        sync_backend("mpi", cpu, sender_owns_gpu=False)


def test_engines_that_may_share_a_gpu_take_gloo_for_auto() -> None:
    from grpo_core.engines.config import VLLMSettings
    from grpo_core.engines.registry import engines_sync_backend

    assert engines_sync_backend(VLLMSettings()) == "gloo"  # worker processes beside the stage
    shared = VLLMSettings(placement="ray", num_gpus_per_engine=0.5)
    assert engines_sync_backend(shared) == "gloo"
    own = VLLMSettings(placement="ray", num_gpus_per_engine=1)
    assert engines_sync_backend(own) == "auto"
    assert engines_sync_backend(VLLMSettings(sync_backend="nccl")) == "nccl"


def test_nccl_sync_is_refused_on_cpu(tmp_path: Path) -> None:
    from flows.errors import ConfigError
    from tests.flow_helpers import micro_config

    with pytest.raises(ConfigError, match=r"sync_backend = nccl needs CUDA tensors"):
        micro_config(tmp_path, "n", "engines.rollout=vllm", "engines.vllm.sync_backend=nccl")
