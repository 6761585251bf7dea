"""HF vs vLLM rollout engines on a tiny Llama (head_dim 64: vLLM on CPU rejects head_dim 16).

Runs when the vLLM environment exists (`make vllm-env`), skipped otherwise.
"""

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from grpo_core.contracts.errors import SettingError
from grpo_core.contracts.rollout import RolloutBatch, Sampler, SamplingParams
from grpo_core.engines.hf_rollout import HFRolloutEngine
from grpo_core.engines.sharded_rollout import PromptShardedEngines, on_all
from grpo_core.engines.vllm_env import find_vllm_python
from grpo_core.engines.vllm_rollout import WORKER_SCRIPT, VLLMRolloutEngine
from grpo_core.model.config import PolicyConfig
from grpo_core.model.policy import (
    build_char_tokenizer,
    create_tiny_policy,
    load_policy,
)
from grpo_core.model.prompts import Prompter


def _vllm_missing() -> str:
    try:
        find_vllm_python()
    except SettingError as err:
        return str(err)
    return ""


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(_vllm_missing()), reason=_vllm_missing() or "vLLM env present"),
]

QUESTIONS = ["3", "3+4-2", "12*7", "1+2-3+4-5+6-7+8-9+1-2+3-4+5-6", "What is 9-4?"]
# Both engines compute in float32; vLLM's CPU kernels (paged attention, fused RMSNorm and
# SiLU, 1/T multiplied into the logits) round differently from HF's eager ops: about 1e-6 on
# this model. 1e-4 leaves room for other CPUs' vector widths and still catches a real
# mismatch: a missing temperature or a log-prob renormalised over the top-p nucleus (-log of
# a mass in [0.9, 1) here) is off by more than 1e-2, a shifted position by far more.
LOGPROB_ATOL = 1e-4
# On a 2-core machine: 1 GiB of KV cache, and OpenMP threads not pinned to one core.
WORKER_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
LLM_KWARGS = {"enforce_eager": True, "max_model_len": 256}


def save_policy(path: Path, seed: int) -> Path:
    """A tiny Llama whose greedy outputs vary by prompt and sometimes stop on EOS."""
    tok = build_char_tokenizer()
    cfg = PolicyConfig(
        seed=seed, hidden_size=128, n_heads=2, intermediate_size=256, tie_embeddings=False
    )
    model = create_tiny_policy(cfg, tok)
    with torch.no_grad():  # sharper than the 0.02 init: clear argmax margins, some EOS
        model.lm_head.weight.mul_(3)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("vllm-policies")
    return save_policy(root / "a", seed=2), save_policy(root / "b", seed=3)


@pytest.fixture(scope="module")
def engine(checkpoints: tuple[Path, Path]) -> Iterator[VLLMRolloutEngine]:
    with VLLMRolloutEngine(
        checkpoints[0], dtype="float32", llm_kwargs=LLM_KWARGS, env=WORKER_ENV
    ) as vllm_engine:
        yield vllm_engine


def prompts(tok: PreTrainedTokenizerBase) -> list[str]:
    return [Prompter(tok)(q) for q in QUESTIONS]


def full_forward_logprobs(
    model: PreTrainedModel, batch: RolloutBatch, row: int, temperature: float
) -> torch.Tensor:
    prompt, completion = batch.prompt_ids[row], batch.completion_ids[row]
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0].float()
    logp = torch.log_softmax(logits / temperature, -1)[len(prompt) - 1 : -1]
    return logp.gather(1, torch.tensor(completion)[:, None])[:, 0]


def min_argmax_margin(model: PreTrainedModel, batch: RolloutBatch) -> float:
    """Smallest top-1 minus top-2 logit along the greedy paths (ties would make greedy moot)."""
    margins = []
    for r in range(len(batch)):
        with torch.no_grad():
            ids = torch.tensor([batch.prompt_ids[r] + batch.completion_ids[r]])
            logits = model(ids).logits[0, len(batch.prompt_ids[r]) - 1 : -1]
        top2 = logits.topk(2).values
        margins.append(float((top2[:, 0] - top2[:, 1]).min()))
    return min(margins)


def assert_greedy_identical(engine: Sampler, checkpoint: Path) -> None:
    model, tok = load_policy(checkpoint)
    params = SamplingParams(max_new_tokens=24, temperature=0.0)
    hf = HFRolloutEngine(model, tok, show_progress=False).generate(prompts(tok), 1, params, 0)
    # No near-ties: round-off far below LOGPROB_ATOL cannot flip a wider argmax margin.
    assert min_argmax_margin(model, hf) > LOGPROB_ATOL
    vllm = engine.generate(prompts(tok), 1, params, seed=0)
    assert vllm.prompt_index == hf.prompt_index
    assert vllm.prompt_ids == hf.prompt_ids
    assert vllm.completion_ids == hf.completion_ids
    assert vllm.texts == hf.texts
    assert vllm.finish_reasons == hf.finish_reasons
    for got, want in zip(vllm.logprobs, hf.logprobs, strict=True):
        assert torch.allclose(torch.tensor(got), torch.tensor(want), atol=LOGPROB_ATOL)


def test_greedy_outputs_identical_to_hf_engine(
    engine: VLLMRolloutEngine, checkpoints: tuple[Path, Path]
) -> None:
    assert_greedy_identical(engine, checkpoints[0])
    texts = engine.generate(prompts(engine.tokenizer), 1, SamplingParams(24, 0.0), 0).texts
    assert len(set(texts)) == len(QUESTIONS)  # a real comparison: every prompt differs


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.9)])
def test_sampling_logprobs_match_full_forward(
    engine: VLLMRolloutEngine, checkpoints: tuple[Path, Path], temperature: float, top_p: float
) -> None:
    model, tok = load_policy(checkpoints[0])
    params = SamplingParams(max_new_tokens=24, temperature=temperature, top_p=top_p)
    batch = engine.generate(prompts(tok), 4, params, seed=0)
    assert batch.prompt_index == [p for p in range(len(QUESTIONS)) for _ in range(4)]
    assert {"stop", "length"} <= set(batch.finish_reasons)
    for r in range(len(batch)):
        ids, why = batch.completion_ids[r], batch.finish_reasons[r]
        assert len(batch.logprobs[r]) == len(ids)
        assert (ids[-1] == tok.eos_token_id) if why == "stop" else (len(ids) == 24)
        expected = full_forward_logprobs(model, batch, r, temperature)
        assert torch.allclose(torch.tensor(batch.logprobs[r]), expected, atol=LOGPROB_ATOL)


def test_same_seed_same_batch(engine: VLLMRolloutEngine) -> None:
    tok, params = engine.tokenizer, SamplingParams(max_new_tokens=16, temperature=1.0)
    a = engine.generate(prompts(tok), 3, params, seed=5)
    b = engine.generate(prompts(tok), 3, params, seed=5)
    c = engine.generate(prompts(tok), 3, params, seed=6)
    assert a.completion_ids == b.completion_ids and a.logprobs == b.logprobs
    assert a.completion_ids != c.completion_ids


def test_reload_serves_the_new_weights(
    engine: VLLMRolloutEngine, checkpoints: tuple[Path, Path]
) -> None:
    try:
        engine.reload(checkpoints[1])  # the prefix cache of policy a must not leak into b
        assert_greedy_identical(engine, checkpoints[1])
    finally:
        engine.reload(checkpoints[0])


def test_worker_runs_one_request_file_by_path(
    checkpoints: tuple[Path, Path], tmp_path: Path
) -> None:
    tok = build_char_tokenizer()
    request = {
        "input": str(tmp_path / "prompts.json"),
        "output": str(tmp_path / "rollouts.parquet"),
        "n": 2,
        "temperature": 1.0,
        "max_tokens": 8,
        "seed": 0,
    }
    Path(request["input"]).write_text(json.dumps({"prompts": prompts(tok)}))
    (tmp_path / "request.json").write_text(json.dumps(request))
    cmd = [str(find_vllm_python()), "-P", str(WORKER_SCRIPT), "--model", str(checkpoints[0])]
    cmd += ["--request", str(tmp_path / "request.json"), "--llm-kwargs", json.dumps(LLM_KWARGS)]
    env = {**os.environ, **WORKER_ENV}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1])["rows"] == 2 * len(QUESTIONS)
    rows = pq.read_table(request["output"]).to_pylist()
    assert [(r["prompt_index"], r["sample_index"]) for r in rows[:3]] == [(0, 0), (0, 1), (1, 0)]
    assert all(len(r["logprobs"]) == len(r["token_ids"]) for r in rows)


def test_in_memory_sync_equals_a_fresh_load(
    engine: VLLMRolloutEngine, checkpoints: tuple[Path, Path]
) -> None:
    model_b, tok = load_policy(checkpoints[1])
    greedy = SamplingParams(24, 0.0)
    runs = [(1, greedy), (3, SamplingParams(24, 1.0))]  # (samples per prompt, params)
    before = engine.generate(prompts(tok), 1, greedy, seed=0)
    try:
        sent = engine.update_weights(dict(model_b.state_dict()), timeout_s=60)
        memory = [engine.generate(prompts(tok), n, p, seed=1) for n, p in runs]
        assert_greedy_identical(engine, checkpoints[1])  # and equal to HF on policy b
        engine.reload(checkpoints[1])  # a fresh load of the same weights, from disk
        disk = [engine.generate(prompts(tok), n, p, seed=1) for n, p in runs]
    finally:
        engine.reload(checkpoints[0])
    assert sent == sum(t.numel() * 4 for t in model_b.state_dict().values())
    assert memory[0].completion_ids != before.completion_ids  # the sync changed the policy
    for got, want in zip(memory, disk, strict=True):
        assert got.completion_ids == want.completion_ids
        assert got.logprobs == want.logprobs  # same weights, same kernels: bit-identical
    engine.update_weights(dict(load_policy(checkpoints[0])[0].state_dict()))  # group reused
    assert engine.generate(prompts(tok), 1, greedy, seed=0).completion_ids == before.completion_ids
    engine.reload(checkpoints[0])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_in_memory_sync_of_cuda_tensors_equals_a_fresh_load(
    checkpoints: tuple[Path, Path],
) -> None:
    """CUDA tensors of a process on the worker's GPU go over gloo: NCCL refuses two ranks on
    one GPU (its own worker: a group's backend is set once)."""
    model_b, tok = load_policy(checkpoints[1])
    weights = {n: t.cuda() for n, t in model_b.state_dict().items()}
    params = SamplingParams(24, 0.0)
    with VLLMRolloutEngine(checkpoints[0], dtype="float32", llm_kwargs=LLM_KWARGS) as gpu_engine:
        gpu_engine.update_weights(weights, timeout_s=120)
        assert gpu_engine._sender is not None and gpu_engine._sender.backend == "gloo"
        memory = gpu_engine.generate(prompts(tok), 1, params, seed=0)
        gpu_engine.reload(checkpoints[1])
        disk = gpu_engine.generate(prompts(tok), 1, params, seed=0)
    assert memory.completion_ids == disk.completion_ids
    assert memory.logprobs == disk.logprobs


@pytest.fixture(scope="module")
def two_engines(checkpoints: tuple[Path, Path]) -> Iterator[PromptShardedEngines]:
    """engines.vllm.engines = 2 with placement = process: two workers, started at once, that
    take each policy by one broadcast over a group of this process and both workers."""
    members = on_all(
        [0, 1],
        lambda _: VLLMRolloutEngine(
            checkpoints[0], dtype="float32", llm_kwargs=LLM_KWARGS, env=WORKER_ENV
        ),
    )
    group = PromptShardedEngines(members, broadcast_timeout_s=60)
    yield group
    group.close()


def assert_same_rows(got: RolloutBatch, want: RolloutBatch) -> None:
    assert got.prompt_index == want.prompt_index and got.prompt_ids == want.prompt_ids
    assert got.completion_ids == want.completion_ids and got.texts == want.texts
    assert got.finish_reasons == want.finish_reasons
    for a, b in zip(got.logprobs, want.logprobs, strict=True):  # other batch shapes: round-off
        assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=LOGPROB_ATOL)


def test_two_engines_sample_what_one_engine_samples(
    engine: VLLMRolloutEngine, two_engines: PromptShardedEngines
) -> None:
    tok = engine.tokenizer
    workers = {member._process.pid for member in two_engines.members}  # type: ignore[attr-defined]
    assert len(workers) == 2
    for n, params in [(1, SamplingParams(16, 0.0)), (3, SamplingParams(16, 1.0, top_p=0.9))]:
        one = engine.generate(prompts(tok), n, params, seed=5)
        assert_same_rows(two_engines.generate(prompts(tok), n, params, seed=5), one)


def test_two_engines_take_each_updated_policy(
    two_engines: PromptShardedEngines, checkpoints: tuple[Path, Path]
) -> None:
    model_b = load_policy(checkpoints[1])[0]
    try:
        two_engines.receive_weights(dict(model_b.state_dict()))  # one broadcast, both workers
        assert_greedy_identical(two_engines, checkpoints[1])
        sender = two_engines._sender
        assert sender is not None and sender.world_size == 3
    finally:
        two_engines.load(checkpoints[0])
    assert_greedy_identical(two_engines, checkpoints[0])


def test_a_tensor_parallel_engine_samples_and_takes_policies_as_one_rank_does(
    engine: VLLMRolloutEngine, checkpoints: tuple[Path, Path]
) -> None:
    """tensor_parallel_size = 2 (vLLM's CPU backend: a process per rank): the rows of the
    one-rank engine; an in-memory update reaches both ranks (each joins the sync group and
    loads its shard), and a reload from disk too."""
    tok = engine.tokenizer
    kwargs = {**LLM_KWARGS, "tensor_parallel_size": 2}
    with VLLMRolloutEngine(
        checkpoints[0], dtype="float32", llm_kwargs=kwargs, env=WORKER_ENV
    ) as sharded:
        params = SamplingParams(16, 1.0, top_p=0.9)
        want = engine.generate(prompts(tok), 3, params, seed=5)
        assert_same_rows(sharded.generate(prompts(tok), 3, params, seed=5), want)
        sharded.update_weights(dict(load_policy(checkpoints[1])[0].state_dict()))
        assert sharded._sender is not None and sharded._sender.world_size == 3  # 1 + 2 ranks
        assert_greedy_identical(sharded, checkpoints[1])
        sharded.load(checkpoints[0])
        assert_greedy_identical(sharded, checkpoints[0])
