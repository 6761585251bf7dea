"""Sharded sampling (flows/engines/ray_shards.py): a split call returns the rows of the whole
call, and a run with `cluster.ray_address=local` commits the same rows as one without Ray."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from flows.config_files import load_config
from flows.engines import ray_shards
from flows.engines.ray_shards import (
    RayShardedRollout,
    ShardJob,
    ShardRunner,
    batch_aligned_shards,
    run_shards_in_process,
)
from flows.errors import ConfigError
from flows.loop import execute_run
from flows.model_io import save_model
from flows.names import POLICY
from grpo_core.contracts.rollout import RolloutBatch, SamplingParams
from grpo_core.engines.hf_rollout import HFRolloutEngine
from grpo_core.model.config import PolicyConfig
from grpo_core.model.policy import (
    build_char_tokenizer,
    create_tiny_policy,
    load_policy,
)
from grpo_core.model.prompts import Prompter
from storage.checkpoints import checkpoint_path
from storage.store import RunStore
from tests.flow_helpers import micro_config, snapshot

QUESTIONS = ["3", "3+4-2", "1+2-3+4-5+6-7+8-9+1-2+3-4+5-6", "7-1", "2+2+2"]
NO_RAY = "ray is not installed (optional extra: pip install -e '.[ray]'; `make venv` installs it)"


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the micro preset's run.num_threads, which shards apply too
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def policy() -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    tok = build_char_tokenizer()
    small = PolicyConfig(seed=3, n_layers=1, hidden_size=32, n_heads=2, intermediate_size=64)
    model = create_tiny_policy(small, tok)
    with torch.no_grad():  # make EOS likely so rows stop at different steps
        model.lm_head.weight[tok.eos_token_id] *= 0
        model.model.norm.weight.mul_(3)
    return model, tok


def test_batch_aligned_shards_are_whole_batches_covering_every_row_once() -> None:
    assert batch_aligned_shards(15, 4, 3) == [(0, 8), (8, 12), (12, 15)]
    assert batch_aligned_shards(24, 8, 2) == [(0, 16), (16, 24)]
    assert batch_aligned_shards(5, 8, 4) == [(0, 5)]  # one batch: one shard
    assert batch_aligned_shards(0, 8, 4) == []
    for total, batch, shards in [(100, 7, 3), (64, 8, 8), (9, 1, 4), (33, 4, 1000)]:
        bounds = batch_aligned_shards(total, batch, shards)
        assert len(bounds) == min(shards, -(-total // batch))
        assert [a for a, _ in bounds[1:]] == [b for _, b in bounds[:-1]]
        assert bounds[0][0] == 0 and bounds[-1][1] == total
        assert all(a % batch == 0 and b > a for a, b in bounds)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_row_slices_at_batch_boundaries_are_the_rows_of_the_whole_call(
    policy: tuple[PreTrainedModel, PreTrainedTokenizerBase], temperature: float
) -> None:
    model, tok = policy
    engine = HFRolloutEngine(model, tok, batch_size=4, show_progress=False)
    prompts = [Prompter(tok)(q) for q in QUESTIONS]
    params = SamplingParams(max_new_tokens=20, temperature=temperature)
    whole = engine.generate(prompts, 3, params, seed=11)
    parts = [
        engine.generate(prompts, 3, params, seed=11, rows=bounds)
        for bounds in batch_aligned_shards(len(whole), 4, 3)
    ]
    assert [len(p) for p in parts] == [8, 4, 3]
    assert ray_shards.merge_batches(parts) == whole  # ids, texts and log-probs, bit for bit
    with pytest.raises(ValueError, match="rows must satisfy"):
        engine.generate(prompts, 3, params, seed=11, rows=(4, 16))


def test_ray_sharded_rollout_in_process_equals_the_hf_engine(
    policy: tuple[PreTrainedModel, PreTrainedTokenizerBase], tmp_path: Path
) -> None:
    model, tok = policy
    cfg = micro_config(tmp_path, "shards", "cluster.ray_address=local", "cluster.shards=3")
    policy_dir = checkpoint_path(tmp_path, "shards", POLICY, 0)
    save_model(policy_dir, model, tok)
    loaded, _ = load_policy(policy_dir)  # memory-mapped weights: CPU floats round differently
    seen: list[list[ShardJob]] = []

    def runner(prompts: list[str], jobs: list[ShardJob]) -> list[RolloutBatch]:
        seen.append(jobs)
        return run_shards_in_process(prompts, jobs)

    prompts = [Prompter(tok)(q) for q in QUESTIONS]
    params = SamplingParams(max_new_tokens=20, temperature=1.0, top_p=0.9)
    for stage_model, copy_weights in [(model, True), (loaded, False)]:
        expected = HFRolloutEngine(stage_model, tok, batch_size=4, show_progress=False).generate(
            prompts, 2, params, seed=5
        )
        sharded = RayShardedRollout(
            cfg.cluster, "cpu", "float32", 1, policy_dir, 4, runner, copy_weights=copy_weights
        )
        assert sharded.generate(prompts, 2, params, seed=5) == expected
    assert [(j.start, j.stop) for j in seen[0]] == [(0, 4), (4, 8), (8, 10)]


def test_each_shard_loads_the_policy_with_its_attention_kernels(
    policy: tuple[PreTrainedModel, PreTrainedTokenizerBase],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model, tok = policy
    cfg = micro_config(tmp_path, "eager", "cluster.ray_address=local", "cluster.shards=2")
    policy_dir = tmp_path / "policy"
    save_model(policy_dir, model, tok)
    kernels: list[str] = []

    def loading(path: Path, dtype: str, **options: Any) -> Any:
        loaded = load_policy(path, dtype, **options)
        kernels.append(loaded[0].config._attn_implementation)
        return loaded

    monkeypatch.setattr(ray_shards, "load_policy", loading)
    sharded = RayShardedRollout(
        *(cfg.cluster, "cpu", "float32", 1, policy_dir, 4, run_shards_in_process),
        attn_implementation="eager",
    )
    prompts = [Prompter(tok)(q) for q in QUESTIONS]
    sharded.generate(prompts, 1, SamplingParams(max_new_tokens=4), seed=0)
    assert kernels == ["eager"]  # loaded once, reused by the second shard


def test_cluster_section_is_validated(
    policy: tuple[PreTrainedModel, PreTrainedTokenizerBase], tmp_path: Path
) -> None:
    cfg = micro_config(tmp_path, "c", "cluster.ray_address=''")
    assert cfg.cluster.ray_address is None  # a cleared Prefect form field means no Ray
    unset = ray_shards.ray_sharded_rollout(
        cfg.cluster, "cpu", "float32", 1, tmp_path, 0, policy[0], 8, "rollout"
    )
    assert unset is None
    for address in ["local", "auto", "10.0.0.5:6379", "ray://head:10001"]:
        assert micro_config(tmp_path, "c", f"cluster.ray_address={address}").cluster.ray_address
    with pytest.raises(ConfigError, match=r"cluster\.ray_address"):
        micro_config(tmp_path, "c", "cluster.ray_address=somewhere")
    with pytest.raises(ConfigError, match=r"cluster\.shards"):
        micro_config(tmp_path, "c", "cluster.shards=0")
    with pytest.raises(ConfigError, match=r"run\.device = cpu"):
        micro_config(tmp_path, "c", "cluster.ray_address=local", "cluster.num_gpus_per_shard=1")
    with pytest.raises(ConfigError, match="num_gpus_per_shard > 0"):
        load_config("micro", ["cluster.ray_address=auto", "run.device=cuda"])


@pytest.fixture
def local_ray() -> Iterator[Any]:
    ray = pytest.importorskip("ray", reason=NO_RAY)
    # address="local": a new cluster even when one a killed run left behind is still up (a
    # bare ray.init() would join it, and refuse num_cpus)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.mark.slow
def test_ray_sharded_run_commits_the_rows_of_an_unsharded_run(
    local_ray: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Small engine batches so every sampling call splits into several shards.
    small = ["rollout.batch_size=4", "labelling.batch_size=4"]
    execute_run(micro_config(tmp_path / "plain", "r", *small))

    calls: list[tuple[str, int]] = []
    ray_runner = ray_shards.ray_runner

    def counting(cluster: Any, name: str) -> ShardRunner:
        run = ray_runner(cluster, name)

        def counted(prompts: list[str], jobs: list[ShardJob]) -> list[RolloutBatch]:
            calls.append((name, len(jobs)))
            return run(prompts, jobs)

        return counted

    monkeypatch.setattr(ray_shards, "ray_runner", counting)
    start = time.perf_counter()
    sharded_cfg = micro_config(
        tmp_path / "ray", "r", *small, "cluster.ray_address=local", "cluster.shards=2"
    )
    execute_run(sharded_cfg)
    print(f"sharded micro run: {time.perf_counter() - start:.1f} s, calls {calls}")

    plain = snapshot(RunStore(tmp_path / "plain"), "r")
    sharded = snapshot(RunStore(tmp_path / "ray"), "r")
    for table in plain:
        assert sharded[table] == plain[table], table
        assert plain[table], f"{table} is empty"
    # Every rollout, labelling and evaluation call ran as 2 Ray tasks: warm start evaluates
    # policy_0, then each of the 2 iterations rolls out, labels and evaluates (greedy +
    # sampled per evaluation).
    kinds = [name.split("-")[0] for name, _ in calls]
    assert {n for _, n in calls} == {2}
    assert (kinds.count("rollout"), kinds.count("label"), kinds.count("evaluate")) == (2, 2, 6)
