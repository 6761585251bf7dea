"""Engines chosen by `engines:` in the config run the same pipeline (micro preset, CPU).

DeepSpeed vs torch tolerance: both engines run the same fp32 loss code and the same torch
AdamW (DeepSpeed is handed the optimizer object); in one process DeepSpeed only reorders
float sums (flattened ZeRO buffers, its gradient-norm reduction). Measured on this machine
over the micro run (2 iterations x 3 GRPO steps, lr 1e-4): GRPO metric gaps <= 3e-6 in
absolute value (loss, policy_loss, grad_norm, entropy; kl <= 3e-9) and policy weights
<= 2e-6 apart, while the sampled tokens, rewards and labels came out identical. So the test
allows |ds - torch| <= 1e-5 + 1e-4 |torch| per metric and 1e-5 per weight: a few times the
round-off, far below what a wrong gradient scale, a lost micro-batch or a skipped clip moves
(>= 1e-3 here). Loss values sit near 0 (group-normalised advantages), hence the absolute
part. Two launched processes add a gradient all-reduce (same bound, per the engine tests).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from flows.config import ItergrpoConfig
from flows.engines.availability import check_engines
from flows.engines.policy_updaters import DEEPSPEED_STATE, LAUNCH_JOBS
from flows.engines_config import EnginesSection
from flows.errors import ConfigError
from flows.loop import execute_run
from flows.names import GRPO_PROGRESS, POLICY
from grpo_core.contracts.errors import SettingError
from grpo_core.engines import registry
from grpo_core.engines.cost import MEASURED_METRICS
from storage.checkpoints import EXTRA_FILE, checkpoint_path
from storage.store import RunStore
from tests.flow_helpers import cli, killed_micro_run, micro_config, snapshot
from tests.ports import free_port

ABS_TOL, REL_TOL, WEIGHT_TOL = 1e-5, 1e-4, 1e-5
# Discrete or schedule values: identical whenever the two runs sampled the same tokens.
# (reward_mean and rm_reward_mean hold the ORM's float scores: compared with tolerance.)
EXACT_METRICS = {"verifier_accuracy", "response_length", "optimizer_steps", "lr"}

needs_deepspeed = pytest.mark.skipif(
    find_spec("deepspeed") is None,
    reason="deepspeed is not installed: pip install -e '.[gpu]' (make venv installs it)",
)


def _vllm_missing() -> str:
    try:
        check_engines(ItergrpoConfig.model_validate({"engines": {"rollout": "vllm"}}).engines)
    except SettingError as err:
        return str(err)
    return ""


needs_vllm = pytest.mark.skipif(
    bool(_vllm_missing()), reason=_vllm_missing() or "vLLM environment present"
)


# ---- config ---------------------------------------------------------------------------


def test_defaults_keep_torch_and_hf() -> None:
    assert ItergrpoConfig().engines == EnginesSection()
    cfg = micro_config(Path("/tmp/unused"), "x")
    assert (cfg.engines.train, cfg.engines.rollout) == ("torch", "hf")
    assert not cfg.engines.launched
    check_engines(cfg.engines)  # torch + hf need nothing beyond the base install


def test_engine_names_are_validated_with_the_field_named() -> None:
    with pytest.raises(ConfigError) as err:
        micro_config(Path("/tmp/unused"), "x", "engines.train=jax")
    assert "engines.train" in str(err.value) and "['torch', 'deepspeed']" in str(err.value)
    with pytest.raises(ConfigError, match=r"engines\.deepspeed\.zero_stage"):
        micro_config(Path("/tmp/unused"), "x", "engines.deepspeed.zero_stage=4")
    with pytest.raises(ConfigError, match=r"engines\.vllm\.gpu_memory_utilization"):
        micro_config(Path("/tmp/unused"), "x", "engines.vllm.gpu_memory_utilization=0")
    launched = micro_config(
        Path("/tmp/unused"),
        "x",
        "engines.train=deepspeed",
        "engines.deepspeed.processes_per_node=2",
    )
    assert launched.engines.launched
    # vLLM engines on a cluster (placement ray) sample every stage there, not the Ray shards
    on_cluster = ("engines.rollout=vllm", "engines.vllm.placement=ray", "cluster.ray_address=local")
    assert micro_config(Path("/tmp/unused"), "x", *on_cluster).cluster.ray_address == "local"
    with pytest.raises(ConfigError, match=r"decode with the hf engine's own loop"):
        micro_config(
            Path("/tmp/unused"), "x", "engines.rollout=hf_generate", "cluster.ray_address=local"
        )


def test_missing_deepspeed_names_the_field_and_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = micro_config(Path("/tmp/unused"), "x", "engines.train=deepspeed")
    monkeypatch.setattr(registry, "find_spec", lambda name: None)
    with pytest.raises(SettingError) as err:
        check_engines(cfg.engines)
    message = str(err.value)
    assert "engines.train = deepspeed" in message
    assert "pip install -e '.[gpu]'" in message and "engines.train: torch" in message


def test_missing_vllm_environment_names_the_field_and_the_fix(tmp_path: Path) -> None:
    python = tmp_path / "no-venv" / "bin" / "python"
    cfg = micro_config(tmp_path, "x", "engines.rollout=vllm", f"engines.vllm.python={python}")
    with pytest.raises(SettingError) as err:
        check_engines(cfg.engines)
    message = str(err.value)
    assert "engines.rollout = vllm" in message and str(python) in message
    assert "make vllm-env" in message and "engines.vllm.python" in message
    assert "engines.rollout: hf" in message


def test_a_run_with_a_missing_engine_fails_before_any_stage(tmp_path: Path) -> None:
    store = tmp_path / "store"
    cfg = micro_config(
        store, "x", "engines.rollout=vllm", f"engines.vllm.python={tmp_path / 'nope'}"
    )
    with pytest.raises(SettingError, match="make vllm-env"):
        execute_run(cfg)
    assert not (store / "runs" / "x").exists()  # not even opened


# ---- DeepSpeed --------------------------------------------------------------------------


def grpo_metrics(store: Path, run_id: str) -> dict[tuple[int, int, str], float]:
    rows = RunStore(store).read("metrics", run_id=run_id).to_pylist()
    return {
        (r["iteration"], r["step"], r["name"]): r["value"]
        for r in rows
        if r["stage"] == "grpo" and r["name"] not in MEASURED_METRICS  # time, memory differ
    }


def assert_close_metrics(
    want: dict[tuple[int, int, str], float], got: dict[tuple[int, int, str], float]
) -> float:
    """Every GRPO metric within ABS_TOL + REL_TOL |want|; returns the largest gap seen."""
    assert want.keys() == got.keys()
    worst = 0.0
    for key, value in want.items():
        if key[2] in EXACT_METRICS:
            assert got[key] == value, key
        elif math.isnan(value):
            assert math.isnan(got[key]), key
        else:
            gap = abs(got[key] - value)
            worst = max(worst, gap)
            assert gap <= ABS_TOL + REL_TOL * abs(value), (key, value, got[key])
    return worst


def max_weight_gap(a_dir: Path, b_dir: Path) -> float:
    a, b = load_file(str(a_dir / "model.safetensors")), load_file(str(b_dir / "model.safetensors"))
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.fixture
def count_deepspeed_engines(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Names the model class of every DeepSpeedEngine built in this process."""
    from grpo_core.engines import deepspeed_engine

    built: list[str] = []
    original = deepspeed_engine.DeepSpeedEngine.__init__

    def spy(self: Any, model: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
        built.append(type(model).__name__)
        original(self, model, *args, **kwargs)

    monkeypatch.setattr(deepspeed_engine.DeepSpeedEngine, "__init__", spy)
    yield built


@needs_deepspeed
@pytest.mark.slow
def test_micro_run_with_deepspeed_zero2_matches_torch(
    micro_run: tuple[RunStore, str], tmp_path: Path, count_deepspeed_engines: list[str]
) -> None:
    # The torch-engine reference is the session's micro run (same preset, seed and run id).
    reference, run_id = micro_run
    assert reference.run_config(run_id)["engines"]["train"] == "torch"
    torch_store, ds_store = reference.root, tmp_path / "ds"
    ds_cfg = micro_config(
        ds_store, run_id, "engines.train=deepspeed", "engines.deepspeed.zero_stage=2"
    )
    execute_run(ds_cfg)
    # Per iteration: the GRPO policy and both reward models trained through DeepSpeed.
    assert sorted(count_deepspeed_engines) == sorted(
        ["LlamaForCausalLM", "RewardModel", "RewardModel"] * ds_cfg.run.iterations
    )
    gap = assert_close_metrics(grpo_metrics(torch_store, run_id), grpo_metrics(ds_store, run_id))
    weights = max(
        max_weight_gap(
            checkpoint_path(torch_store, run_id, role, k),
            checkpoint_path(ds_store, run_id, role, k),
        )
        for role, k in [(POLICY, 1), (POLICY, 2), ("orm", 1), ("prm", 1)]
    )
    print(f"DeepSpeed ZeRO-2 vs torch: GRPO metrics max |gap| {gap:.2e}, weights {weights:.2e}")
    assert weights <= WEIGHT_TOL
    # Same labels and reward-model training mix: nothing outside the engines changed.
    want, got = snapshot(reference, run_id), snapshot(RunStore(ds_store), run_id)
    for table in ("prompts", "orm_labels", "rm_train"):
        assert got[table] == want[table], table


@needs_deepspeed
@pytest.mark.slow
@pytest.mark.parametrize("zero_stage", [2, 3])
def test_deepspeed_run_killed_mid_grpo_resumes_exactly(tmp_path: Path, zero_stage: int) -> None:
    """ZeRO-2 resumes from optimizer state_dict(); ZeRO-3 from DeepSpeed's own checkpoint."""
    sets = [
        "run.iterations=1",
        "engines.train=deepspeed",
        f"engines.deepspeed.zero_stage={zero_stage}",
    ]
    reference = tmp_path / "reference"
    execute_run(micro_config(reference, "kr", *sets))
    store = tmp_path / "killed"
    killed_micro_run(store, "kr", sets, fault="SIGKILL@grpo:0:2")  # step 0 saved, step 1 not
    progress = checkpoint_path(store, "kr", GRPO_PROGRESS, 0)
    assert json.loads((progress / EXTRA_FILE).read_text())["next_step"] == 1
    assert (progress / DEEPSPEED_STATE).is_dir() == (zero_stage == 3)
    resumed = cli(store, "resume", "kr")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "GRPO: resuming at step 1" in resumed.stderr
    assert snapshot(RunStore(store), "kr") == snapshot(RunStore(reference), "kr")
    assert (
        max_weight_gap(
            checkpoint_path(store, "kr", POLICY, 1), checkpoint_path(reference, "kr", POLICY, 1)
        )
        == 0.0
    )


@needs_deepspeed
@pytest.mark.slow
def test_grpo_updates_through_the_launcher_match_torch_and_resume(tmp_path: Path) -> None:
    """Two CPU ranks (gloo, ZeRO-2) per GRPO step through the deepspeed launcher; the run is
    killed after step 1's job, before its checkpoint, and resumes from step 0's."""
    sets = ["run.iterations=1", "grpo.steps=2"]
    torch_store, ds_store = tmp_path / "torch", tmp_path / "ds"
    execute_run(micro_config(torch_store, "eng", *sets))
    sets += [
        "engines.train=deepspeed",
        "engines.deepspeed.zero_stage=2",
        "engines.deepspeed.processes_per_node=2",
        f"engines.deepspeed.master_port={free_port()}",
    ]
    killed_micro_run(ds_store, "eng", sets, fault="SIGKILL@grpo:0:2")
    progress = checkpoint_path(ds_store, "eng", GRPO_PROGRESS, 0)
    assert (progress / DEEPSPEED_STATE).is_dir()  # the ranks' optimizer state
    resumed = cli(ds_store, "resume", "eng")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "GRPO: resuming at step 1" in resumed.stderr
    # The launcher's own output, streamed line by line into the stage's log.
    assert "deepspeed: " in resumed.stderr and "exits successfully" in resumed.stderr
    gap = assert_close_metrics(grpo_metrics(torch_store, "eng"), grpo_metrics(ds_store, "eng"))
    weights = max_weight_gap(
        checkpoint_path(torch_store, "eng", POLICY, 1), checkpoint_path(ds_store, "eng", POLICY, 1)
    )
    print(f"launcher, 2 ranks vs torch: GRPO metrics max |gap| {gap:.2e}, weights {weights:.2e}")
    assert weights <= WEIGHT_TOL
    assert not checkpoint_path(ds_store, "eng", LAUNCH_JOBS, 0).exists()  # scratch removed


# ---- vLLM ------------------------------------------------------------------------------

# vLLM on CPU needs head_dim 64 (hidden 128 / 2 heads); a small KV cache and unpinned
# threads on a 2-core machine; float32 to match the HF engine.
VLLM_SETS = (
    "policy.hidden_size=128",
    "policy.n_heads=2",
    "engines.rollout=vllm",
    "engines.vllm.dtype=float32",
    "engines.vllm.enforce_eager=true",
    "engines.vllm.max_model_len=256",
    "engines.vllm.cpu_kv_cache_gib=1",
    "engines.vllm.env={VLLM_CPU_OMP_THREADS_BIND: nobind}",
)


@needs_vllm
@pytest.mark.slow
@pytest.mark.parametrize("weight_sync", ["memory", "disk"])
def test_micro_run_with_vllm_samples_every_stage_from_one_worker(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, weight_sync: str
) -> None:
    cfg = micro_config(tmp_path, "vl", *VLLM_SETS, f"engines.vllm.weight_sync={weight_sync}")
    with caplog.at_level("INFO"):
        execute_run(cfg)
    messages = [r.getMessage() for r in caplog.records]
    # One worker start for the run; every later policy is a reload into it.
    assert sum(m.startswith("starting the vllm rollout engine") for m in messages) == 1
    syncs = [m for m in messages if m.startswith("vLLM weight sync")]
    # GRPO steps 1.. of each iteration sample from the policy updated by the step before.
    assert len(syncs) == cfg.run.iterations * (cfg.grpo.steps - 1)
    # Checkpoint reloads: the evaluation of policy_1 and policy_2 (rollout/label reuse
    # policy_k), plus one per GRPO sync on disk; in memory a sync reloads nothing.
    in_memory = weight_sync == "memory"
    assert all(s.startswith("vLLM weight sync in memory") == in_memory for s in syncs)
    reloads = sum(m.startswith("vLLM worker reloaded") for m in messages)
    assert reloads == cfg.run.iterations + (0 if in_memory else len(syncs))
    print("vLLM GRPO weight syncs:", "; ".join(s.split(": ", 1)[1] for s in syncs))
    assert any(m.startswith("vLLM worker stopped") for m in messages)  # at the run's end
    assert not (tmp_path / "checkpoints" / "vl" / "rollout-engine-sync").exists()
    store = RunStore(tmp_path)
    committed = {(s["stage"], s["iteration"]) for s in store.committed_stages("vl")}
    assert len(committed) == 1 + 5 * cfg.run.iterations
    rollouts = store.read("rollouts", run_id="vl").to_pylist()
    assert len(rollouts) == cfg.run.iterations * cfg.rollout.prompts * cfg.rollout.group_size
    samples = store.read("policy_samples", run_id="vl").to_pylist()
    per_step = cfg.grpo.prompts_per_step * cfg.grpo.group_size
    assert len(samples) == cfg.run.iterations * cfg.grpo.steps * per_step
    assert len({s["completion"] for s in samples}) > 1


@needs_vllm
@pytest.mark.slow
def test_a_tensor_parallel_engine_stores_the_rows_of_one_rank(tmp_path: Path) -> None:
    """engines.vllm.tensor_parallel_size = 2 on vLLM's CPU backend (a process per rank, each
    joining the GRPO stage's weight broadcast): the micro run's rows equal the one-rank run's."""
    stores = {tp: tmp_path / f"tp{tp}" for tp in (1, 2)}
    for tp, store in stores.items():
        sets = (*VLLM_SETS, "run.iterations=1", f"engines.vllm.tensor_parallel_size={tp}")
        execute_run(micro_config(store, "tp", *sets))
    one, two = (snapshot(RunStore(store), "tp") for store in stores.values())
    for table in ("rollouts", "orm_labels", "policy_samples", "eval"):
        assert two[table] == one[table], table


@needs_vllm
@pytest.mark.slow
def test_worker_reloads_tied_policies_and_samples_many_seeded_prompts(tmp_path: Path) -> None:
    """The tiny policy ties lm_head to the embeddings; vLLM's reload skips the tied head, so
    the worker must refresh it (on CPU its pre-packed GEMM would keep the old weights). And a
    labelling-sized call of seeded prompts must not hit vLLM's chunked-prefill rewind."""
    from grpo_core.contracts.rollout import SamplingParams
    from grpo_core.engines.hf_rollout import HFRolloutEngine
    from grpo_core.engines.vllm_rollout import VLLMRolloutEngine
    from grpo_core.model.config import PolicyConfig
    from grpo_core.model.policy import (
        build_char_tokenizer,
        create_tiny_policy,
        load_policy,
    )
    from grpo_core.model.prompts import Prompter

    def save(path: Path, seed: int) -> Path:
        tok = build_char_tokenizer()
        policy = PolicyConfig(
            seed=seed, hidden_size=128, n_heads=2, intermediate_size=256, tie_embeddings=True
        )
        model = create_tiny_policy(policy, tok)
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():  # larger than the 0.02 init: varied outputs, clear argmax margins
            for param in model.parameters():
                if param.ndim == 2:
                    param.normal_(0.0, 0.1, generator=generator)
        model.save_pretrained(path)
        tok.save_pretrained(path)
        return path

    first, second = save(tmp_path / "a", 2), save(tmp_path / "b", 3)
    params = SamplingParams(max_new_tokens=16, temperature=0.0)
    with VLLMRolloutEngine(
        first,
        dtype="float32",
        llm_kwargs={"enforce_eager": True, "max_model_len": 256},
        env={"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"},
    ) as worker:
        for checkpoint in (first, second, first):
            if worker.checkpoint_dir != checkpoint:
                worker.reload(checkpoint)
            model, tok = load_policy(checkpoint)
            prompts = [Prompter(tok)(q) for q in ("3", "3+4-2", "12*7", "What is 9-4?")]
            hf = HFRolloutEngine(model, tok, show_progress=False).generate(prompts, 1, params, 0)
            got = worker.generate(prompts, 1, params, seed=0)
            assert got.completion_ids == hf.completion_ids, checkpoint.name
            for mine, want in zip(got.logprobs, hf.logprobs, strict=True):
                assert torch.allclose(torch.tensor(mine), torch.tensor(want), atol=1e-4)
        assert len(set(hf.texts)) > 1  # a real comparison: the prompts' outputs differ
        # More prompt tokens than one engine step takes (2048): with chunked prefill vLLM
        # rewinds seeded generators, which fails on CPU; the worker prefills whole prompts.
        long = [Prompter(tok)("+".join(str(i + j) for j in range(14))) for i in range(48)]
        assert sum(len(tok(p)["input_ids"]) for p in long) > 2048
        batch = worker.generate(long, 2, SamplingParams(max_new_tokens=4), seed=7)
        assert len(batch) == 96 and batch.prompt_index == [i // 2 for i in range(96)]
