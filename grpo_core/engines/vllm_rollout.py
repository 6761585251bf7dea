"""vLLM rollout engine: `RolloutEngine` over a long-lived vLLM worker in its own environment.

vLLM's pins clash with Prefect's, so vLLM lives in `.venv-vllm` (`make vllm-env`) and this
engine drives `grpo_core/engines/vllm_worker.py` there as a subprocess speaking JSON lines.
Prompts are
tokenized and completions decoded here, with the policy's tokenizer and the HF engine's rules,
so both engines return the same `RolloutBatch` for the same tokens.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any, Literal

from torch import Tensor
from transformers import AutoConfig, AutoTokenizer, GenerationConfig

from grpo_core.contracts.rollout import FinishReason, RolloutBatch, SamplingParams
from grpo_core.engines.hf_rollout import completion_texts, stop_token_ids
from grpo_core.engines.sharded_rollout import BroadcastGroup, WeightSource
from grpo_core.engines.vllm_env import find_vllm_python
from grpo_core.engines.weight_sync import (
    WeightSender,
    unique_tensors,
)
from grpo_core.model.policy import encode_prompt, ensure_pad_token

WeightSync = Literal["memory", "disk"]
WORKER_SCRIPT = Path(__file__).with_name("vllm_worker.py")
# The weight files of a checkpoint: what a disk sync replaces (config and tokenizer are kept).
_WEIGHT_FILES = ("*.safetensors", "*.safetensors.index.json", "*.bin", "*.bin.index.json")

log = logging.getLogger(__name__)


def _dir_identity(path: Path) -> tuple[str, int, int]:
    """Checkpoints are renamed into place: a rewrite changes the directory's inode/mtime."""
    stat = os.stat(path)
    return (str(path), stat.st_ino, stat.st_mtime_ns)


def _generation_config(checkpoint_dir: Path) -> GenerationConfig:
    try:
        return GenerationConfig.from_pretrained(checkpoint_dir, local_files_only=True)
    except OSError:  # no generation_config.json: HF derives it from config.json the same way
        config = AutoConfig.from_pretrained(checkpoint_dir, local_files_only=True)
        return GenerationConfig.from_model_config(config)


def _stop_worker(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.kill()
        process.wait()


class VLLMRolloutEngine:
    """`RolloutEngine` backed by vLLM (prefix caching on) in a worker process.

    Costs: the worker starts once per engine (about 20-60 s on 2 CPU cores: importing vLLM,
    loading, warming up) and then serves every `generate` call; `reload` (from a checkpoint)
    and `update_weights` (tensors over a process group, no disk) swap in new weights without
    a restart: per GRPO step, one in-place load of the policy, never an engine start.

    checkpoint_dir: HF `save_pretrained` directory of the policy (weights and tokenizer).
    dtype: vLLM's dtype; "float32" matches the HF engine on CPU, "auto" lets vLLM choose
    (it runs float32 checkpoints in 16-bit on GPU). llm_kwargs go to `vllm.LLM` as they are
    (e.g. gpu_memory_utilization, max_model_len, enforce_eager). env adds to the worker's
    environment (e.g. VLLM_CPU_KVCACHE_SPACE=1 for 1 GiB of KV cache on CPU). The worker's
    log (vLLM start-up, warnings) goes to `log_path` when given, else to this stderr.
    """

    def __init__(
        self,
        checkpoint_dir: str | Path,
        *,
        dtype: str = "auto",
        seed: int = 0,
        llm_kwargs: dict[str, Any] | None = None,
        python: str | Path | None = None,
        env: dict[str, str] | None = None,
        log_path: str | Path | None = None,
        show_progress: bool = False,
        weight_sync: WeightSync = "memory",
        sync_backend: str = "gloo",
        sync_timeout_s: float = 120.0,
        scratch_dir: str | Path | None = None,
    ) -> None:
        self.checkpoint_dir = Path(checkpoint_dir)
        self.weight_sync = weight_sync
        # ranks of a weight-sync group this engine's model workers take (one per TP rank)
        self.sync_ranks = int((llm_kwargs or {}).get("tensor_parallel_size", 1))
        self._loaded: tuple[str, int, int] | None = _dir_identity(self.checkpoint_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(self.checkpoint_dir, local_files_only=True)
        ensure_pad_token(self.tokenizer)
        self.stop_ids = stop_token_ids(self.tokenizer, _generation_config(self.checkpoint_dir))
        self._tmp = tempfile.TemporaryDirectory(prefix="itergrpo-vllm-")
        # A disk sync writes the trained weights here for the worker to reload.
        self._scratch = Path(scratch_dir) if scratch_dir else Path(self._tmp.name) / "sync"
        self._log: IO[str] | None = open(log_path, "a") if log_path else None  # noqa: SIM115
        kwargs = {"dtype": dtype, "seed": seed, **(llm_kwargs or {})}
        cmd = [
            str(find_vllm_python(python)),
            "-P",
            str(WORKER_SCRIPT),
            "--model",
            str(checkpoint_dir),
        ]
        cmd += ["--llm-kwargs", json.dumps(kwargs)] + (["--progress"] if show_progress else [])
        self._process = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})},
        )
        self._finalizer = weakref.finalize(self, _stop_worker, self._process)
        try:
            ready = self._reply()
        except BaseException:
            self.close()
            raise
        self._group = BroadcastGroup([self], sync_timeout_s, sync_backend)  # in-memory syncs
        self._asleep = False  # sleep(): every later request wakes the worker first
        self.start_seconds: float = ready["seconds"]
        self.vllm_version: str = ready["vllm"]
        log.info("vLLM %s worker ready in %.1f s", self.vllm_version, self.start_seconds)

    def generate(
        self, prompts: list[str], n: int, params: SamplingParams, seed: int, prompt_offset: int = 0
    ) -> RolloutBatch:
        """n samples per prompt, rows prompt-major; same inputs and seed give the same batch.
        prompt_offset: where `prompts` start in a batch that several engines share (their rows
        are seeded by their place in it; prompt_index stays local to this call)."""
        if n < 1:
            raise ValueError(f"n (samples per prompt) must be >= 1 (got {n})")
        encoded = [encode_prompt(self.tokenizer, p) for p in prompts]
        output = Path(self._tmp.name) / "rollouts.json"
        self._call(
            op="generate",
            prompt_token_ids=encoded,
            n=n,
            temperature=params.temperature,
            top_p=params.top_p,
            max_tokens=params.max_new_tokens,
            seed=seed,
            prompt_offset=prompt_offset,
            stop_token_ids=self.stop_ids,
            output=str(output),
        )
        rows = sorted(
            json.loads(output.read_text())["rows"],
            key=lambda r: (r["prompt_index"], r["sample_index"]),
        )
        output.unlink()
        completion_ids = [r["token_ids"] for r in rows]
        reasons: list[FinishReason] = [r["finish_reason"] for r in rows]
        return RolloutBatch(
            prompt_index=[r["prompt_index"] for r in rows],
            prompt_ids=[list(encoded[r["prompt_index"]]) for r in rows],
            completion_ids=completion_ids,
            texts=completion_texts(self.tokenizer, completion_ids, reasons, self.stop_ids),
            finish_reasons=reasons,
            logprobs=[r["logprobs"] for r in rows],
        )

    def sleep(self) -> None:
        """Free the worker's GPU memory until its next request (vLLM sleep mode, level 1: the
        weights wait in CPU memory, the KV cache is dropped); needs enable_sleep_mode."""
        if not self._asleep:
            self._call(op="sleep")
            self._asleep = True

    def load(self, checkpoint_dir: Path) -> None:
        """Sample the policy at `checkpoint_dir` from now on: reloaded into the running worker
        unless that directory, as written, is what the worker holds already."""
        if self._loaded != _dir_identity(Path(checkpoint_dir)):
            self.reload(checkpoint_dir)

    def receive_weights(self, weights: Mapping[str, Tensor]) -> None:
        """Sample these weights from now on: broadcast in memory (weight_sync = memory), or
        saved to the scratch directory for the worker to reload (disk)."""
        start = time.perf_counter()
        if self.weight_sync == "memory":
            sent = self.update_weights(dict(weights))
            log.info(
                "vLLM weight sync in memory: %.3f s, %.1f MB",
                time.perf_counter() - start,
                sent / 1e6,
            )
            return
        self._write_scratch(weights)
        saved = time.perf_counter()
        self.reload(self._scratch)
        log.info(
            "vLLM weight sync: save %.3f s + reload %.3f s",
            saved - start,
            time.perf_counter() - saved,
        )

    def _write_scratch(self, weights: Mapping[str, Tensor]) -> None:
        """An HF checkpoint of `weights` with the loaded one's config and tokenizer files."""
        from safetensors.torch import save_file

        source, scratch = self.checkpoint_dir, self._scratch
        if source != scratch:  # first sync: the config and tokenizer files of the policy
            shutil.rmtree(scratch, ignore_errors=True)
            skip = shutil.ignore_patterns(*_WEIGHT_FILES)
            shutil.copytree(source, scratch, ignore=skip)
        tensors = {
            n: t.detach().cpu().contiguous() for n, t in unique_tensors(dict(weights)).items()
        }
        save_file(tensors, str(scratch / "model.safetensors"), metadata={"format": "pt"})

    def reload(self, checkpoint_dir: str | Path) -> float:
        """Load new policy weights (same architecture and tokenizer); returns seconds taken.

        vLLM re-reads the safetensors files and copies them into the model in place (0.1 s for
        the tiny demo policy; for a real model about the time to read its checkpoint from
        disk), then the prefix cache is cleared, since its KV entries came from the old weights.
        """
        reply = self._call(op="reload", model=str(checkpoint_dir))
        self.checkpoint_dir = Path(checkpoint_dir)
        self._loaded = _dir_identity(self.checkpoint_dir)
        seconds = float(reply["seconds"])
        log.info("vLLM worker reloaded %s in %.3f s", checkpoint_dir, seconds)
        return seconds

    def update_weights(self, weights: dict[str, Tensor], timeout_s: float | None = None) -> int:
        """Push new policy weights (HF state_dict names) into the worker over a process group,
        no disk: the first call sets the group up (sync_backend: gloo unless told nccl), each call
        broadcasts the tensors into vLLM's weight loader. Returns the bytes sent. timeout_s:
        the wait for the group and each broadcast (default: sync_timeout_s)."""
        if timeout_s is not None:
            self._group.timeout_s = timeout_s
        return self._group.send(weights)

    def receive_broadcast(self, source: WeightSource) -> bool:
        """The weights `source` (a training rank) holds, broadcast by it straight to the worker;
        False (nothing done) with weight_sync = disk."""
        if self.weight_sync != "memory":
            return False
        start = time.perf_counter()
        sent = self._group.push(source)
        log.info(
            "vLLM weight sync broadcast by the training rank: %.3f s, %.1f MB",
            time.perf_counter() - start,
            sent / 1e6,
        )
        return True

    @property
    def _sender(self) -> WeightSender | None:
        """This process's sync group with the worker, when the worker is in it."""
        return self._group.sender

    # The steps of a broadcast that several engines share (PromptShardedEngines): each engine
    # is told to join or to receive, the trainer broadcasts once, then each engine's reply is
    # read (finish_sync).

    def start_join(
        self, host: str, port: int, backend: str, timeout_s: float, rank: int = 1, world: int = 2
    ) -> None:
        """Tell the worker to join the trainer's sync group as ranks rank .. rank +
        sync_ranks - 1 of `world`."""
        self._send(
            op="init_sync",
            host=host,
            port=port,
            backend=backend,
            timeout_s=timeout_s,
            rank=rank,
            world_size=world,
        )

    def start_update(self, tensors: list[list[object]]) -> None:
        """Tell the worker to receive the tensors of a manifest over the sync group."""
        self._send(op="update", manifest=tensors)
        self._loaded = None  # no checkpoint holds these weights: the next load() reloads

    def finish_sync(self) -> None:
        """The worker's reply to start_join or start_update (its error, if it had one)."""
        self._reply()

    def close(self) -> None:
        """Stop the worker (politely, then by force after 60 s)."""
        if self._process.poll() is None:
            try:
                self._call(op="shutdown")
                self._process.wait(timeout=60)
            except (RuntimeError, OSError, subprocess.TimeoutExpired):
                pass
        self._finalizer()
        log.info("vLLM worker stopped")
        if self._log:
            self._log.close()
        shutil.rmtree(self._scratch, ignore_errors=True)
        self._tmp.cleanup()

    def __enter__(self) -> VLLMRolloutEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, **request: Any) -> dict[str, Any]:
        self._send(**request)
        return self._reply()

    def _send(self, **request: Any) -> None:
        if self._asleep and request["op"] != "shutdown":
            self._asleep = False
            self._call(op="wake")
        stdin = self._process.stdin
        if stdin is None or self._process.poll() is not None:
            raise RuntimeError(f"vLLM worker is not running (exit code {self._process.poll()})")
        stdin.write(json.dumps(request) + "\n")
        stdin.flush()

    def _reply(self) -> dict[str, Any]:
        assert self._process.stdout is not None
        line = self._process.stdout.readline()
        if not line:
            code = self._process.wait()
            where = self._log.name if self._log else "stderr"
            raise RuntimeError(f"vLLM worker exited with code {code}; its log is on {where}")
        reply: dict[str, Any] = json.loads(line)
        if not reply.get("ok"):
            raise RuntimeError(f"vLLM worker failed: {reply.get('error')}\n{reply.get('trace')}")
        return reply
