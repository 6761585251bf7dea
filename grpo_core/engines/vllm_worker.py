"""vLLM rollout worker: samples completions with vLLM inside `.venv-vllm` (`make vllm-env`).

Runs by path with the vLLM environment's python and imports only the standard library, vLLM
and (for Parquet) pyarrow, never our packages, whose dependencies that environment lacks:

    .venv-vllm/bin/python -P grpo_core/engines/vllm_worker.py --model CKPT_DIR            # serve
    .venv-vllm/bin/python -P grpo_core/engines/vllm_worker.py --model CKPT_DIR --request r.json

Serve mode reads one JSON request per line on stdin and answers one JSON line on stdout
(vLLM's own logging is moved to stderr); the first line is {"op": "ready", ...}. Requests:
- {"op": "generate", "output": PATH, "n", "temperature", "top_p", "max_tokens", "seed",
  "stop_token_ids", optionally "prompt_offset" (the index of the first prompt in the caller's
  whole batch, when engines share one: seeds follow it), and the prompts: "prompt_token_ids"
  (lists of ids), or "prompts" (strings), or "input": a .parquet/.json file with one of
  those columns}: writes one row per sample to PATH (.parquet or .json) with prompt_index,
  sample_index, prompt_token_ids, token_ids, text, finish_reason (stop/length) and logprobs
  (the sampling log-prob of each token).
- {"op": "reload", "model": DIR}: loads new weights of the same architecture in place and
  drops the prefix cache (its KV entries belong to the old weights).
- {"op": "init_sync", "host", "port", "backend" (gloo/nccl), "timeout_s", optionally "rank"
  and "world_size" (default 1 of 2)}: every model worker (each tensor-parallel rank t) joins
  the trainer's process group as rank + t, for in-memory weight updates
  (grpo_core/engines/weight_sync.py); engines sharing one broadcast take consecutive ranks.
- {"op": "update", "manifest": [[name, dtype, shape], ...]}: receives those tensors, broadcast
  by the trainer in that order, loads them into the model in place and drops the prefix cache.
- {"op": "sleep"} / {"op": "wake"}: vLLM sleep mode level 1 (needs enable_sleep_mode, GPU
  only): the weights wait in CPU memory and the KV cache is freed until "wake".
- {"op": "shutdown"}.

Log-probs follow grpo_core.contracts.rollout.RolloutBatch: log softmax(logits / T) of each
sampled
token, before top-p truncation (T = 1 for greedy). vLLM's returned log-probs are either the raw
T = 1 ones or taken after top-p renormalisation, so the worker scales the model's logits by 1/T
itself (the LogitsProcessor `scale`, which vLLM applies before anything else) and asks vLLM to
sample at temperature 1 with top-p: same distribution, and the raw log-probs are the contract's.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
import traceback
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

# Set before vLLM is imported: no hub access, and the engine core in this process (with
# tensor_parallel_size 1 the model worker too; with more, one process per rank: on_models).
WORKER_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}


def read_prompts(request: dict[str, Any]) -> list[dict[str, Any]]:
    """vLLM prompt dicts from inline token ids/strings or an input .parquet/.json file."""
    if "input" in request:
        path = Path(request["input"])
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            data: dict[str, Any] = pq.read_table(path).to_pydict()
        else:
            data = json.loads(path.read_text())
    else:
        data = request
    if "prompt_token_ids" in data:
        return [{"prompt_token_ids": [int(t) for t in ids]} for ids in data["prompt_token_ids"]]
    if "prompts" in data:
        return [{"prompt": str(p)} for p in data["prompts"]]
    raise ValueError("request needs 'prompt_token_ids', 'prompts' or an 'input' file with one")


def write_rows(rows: list[dict[str, Any]], path: Path) -> None:
    """Rows to .parquet (pyarrow) or .json, atomically: temp file in the same folder, rename."""
    tmp = path.with_name(f".{path.name}.tmp")
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), tmp)
    else:
        tmp.write_text(json.dumps({"rows": rows}))
    os.replace(tmp, path)


def on_models(llm: Any, fn: Any) -> list[Any]:
    """fn(model) in every model worker (each tensor-parallel rank: its own process when
    tensor_parallel_size > 1), results in rank order. vLLM sends a callable by value
    (cloudpickle) but its arguments by reference (pickle), which rejects this script's local
    functions: so fn travels inside the callable, never as an argument (`apply_model`)."""
    return list(llm.collective_rpc(lambda worker: fn(worker.get_model())))


def set_logit_scale(llm: Any, scale: float) -> None:
    """Multiply the model's output logits by `scale` (on top of the model's own logit_scale)."""

    def apply(model: Any) -> int:
        from vllm.model_executor.layers.logits_processor import LogitsProcessor

        found = 0
        for module in model.modules():
            if isinstance(module, LogitsProcessor):
                if not hasattr(module, "itergrpo_base_scale"):
                    module.itergrpo_base_scale = module.scale
                module.scale = module.itergrpo_base_scale * scale
                found += 1
        return found

    if not all(on_models(llm, apply)):
        raise RuntimeError("model has no vLLM LogitsProcessor: cannot apply the temperature")


def generate(llm: Any, request: dict[str, Any], show_progress: bool) -> int:
    """Sample request["n"] completions per prompt and write them to request["output"]."""
    from vllm import SamplingParams

    prompts = read_prompts(request)
    n, temperature = int(request["n"]), float(request["temperature"])
    greedy = temperature == 0
    set_logit_scale(llm, 1.0 if greedy else 1.0 / temperature)
    # vLLM seeds sample j of a request with seed + j, and torch's CPU generator keeps only the
    # low 32 bits of a seed: row r = p * n + j of this call gets (base + r) mod 2**32, with
    # base a hash of the call's seed, so a row's draw never depends on the rest of the batch;
    # p counts from prompt_offset, so engines sharing a batch draw what one engine would.
    base = int.from_bytes(
        hashlib.blake2b(str(int(request["seed"])).encode(), digest_size=4).digest()
    )
    first = int(request.get("prompt_offset", 0))
    params = [
        SamplingParams(
            n=n,
            temperature=0.0 if greedy else 1.0,  # the 1/T is already in the logits
            top_p=1.0 if greedy else float(request.get("top_p", 1.0)),
            max_tokens=int(request["max_tokens"]),
            seed=(base + (first + p) * n) % 2**32,
            logprobs=0,  # the sampled token's log-prob only
            stop_token_ids=[int(t) for t in request.get("stop_token_ids", [])],
            skip_special_tokens=True,
        )
        for p in range(len(prompts))
    ]
    outputs = llm.generate(prompts, params, use_tqdm=show_progress)
    rows = []
    for p, out in enumerate(outputs):
        for j, comp in enumerate(sorted(out.outputs, key=lambda c: c.index)):
            if comp.finish_reason not in ("stop", "length"):
                raise RuntimeError(f"prompt {p} sample {j}: finish reason {comp.finish_reason!r}")
            ids = [int(t) for t in comp.token_ids]
            rows.append(
                {
                    "prompt_index": p,
                    "sample_index": j,
                    "prompt_token_ids": [int(t) for t in out.prompt_token_ids],
                    "token_ids": ids,
                    "text": comp.text,
                    "finish_reason": comp.finish_reason,
                    "logprobs": [
                        float(step[t].logprob) for step, t in zip(comp.logprobs, ids, strict=True)
                    ],
                }
            )
    write_rows(rows, Path(request["output"]))
    return len(rows)


def refresh_tied_lm_head(model: Any) -> int:
    """Re-run the post-load processing of an lm_head tied to the input embeddings.

    vLLM's in-place reload skips a tied lm_head (its weight is the embedding's, loaded with
    it) and puts the layer's old processed tensors back: on CPU the lm_head's pre-packed GEMM
    then keeps computing logits with the previous weights. Returns 1 if it refreshed one.
    """
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    method = getattr(head, "quant_method", None)
    if head is None or embed is None or method is None:
        return 0
    if getattr(head, "weight", None) is not getattr(embed, "weight", None):
        return 0
    method.process_weights_after_loading(head)
    return 1


def reload(llm: Any, model_dir: str) -> None:
    """New weights (same architecture) in place, then forget the KV prefix cache."""
    llm.collective_rpc("reload_weights", kwargs={"weights_path": model_dir})
    on_models(llm, refresh_tied_lm_head)
    llm.reset_prefix_cache()


class SyncGroup:
    """One model worker's side of the trainer's weight-sync group (mirrors make_group in
    grpo_core/engines/weight_sync.py, which this environment cannot import). Every
    tensor-parallel rank of the engine is a member: rank = the engine's first rank + its own
    (1.. for one engine; engines sharing a broadcast take consecutive ranges)."""

    def __init__(self, request: dict[str, Any], tp_rank: int) -> None:
        import torch
        import torch.distributed as dist

        self.backend = str(request["backend"])
        self.group: Any
        timeout = timedelta(seconds=float(request["timeout_s"]))
        rank = int(request.get("rank", 1)) + tp_rank
        world = int(request.get("world_size", 2))
        store = dist.TCPStore(
            str(request["host"]), int(request["port"]), world, is_master=False, timeout=timeout
        )
        if self.backend == "gloo":
            self.group = dist.ProcessGroupGloo(store, rank, world, timeout)
            self.device = torch.device("cpu")
        elif self.backend == "nccl":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            self.group = dist.ProcessGroupNCCL(store, rank, world, options)
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            raise ValueError(f"backend must be gloo or nccl (got {self.backend!r})")

    def receive(self, manifest: list[list[Any]]) -> Iterator[tuple[str, Any]]:
        """(name, tensor) pairs as the trainer broadcasts them, one at a time."""
        import torch

        for name, dtype, shape in manifest:
            tensor = torch.empty(shape, dtype=getattr(torch, dtype), device=self.device)
            self.group.broadcast(tensor, 0).wait()
            yield str(name), tensor


SYNC_ATTR = "itergrpo_sync"  # the model worker's attribute holding its SyncGroup


def init_sync(llm: Any, request: dict[str, Any]) -> None:
    """Every model worker joins the trainer's group (its SyncGroup kept on the worker object:
    functions reach a tensor-parallel worker's process by value, their globals copied)."""

    def join(worker: Any) -> None:
        setattr(worker, SYNC_ATTR, SyncGroup(request, int(worker.rank)))

    llm.collective_rpc(join)


def update(llm: Any, manifest: list[list[Any]]) -> None:
    """Weights received over the sync group into every model worker in place (each takes the
    whole tensors and loads its shard, as `reload` does from disk: vLLM's load path, a tied
    lm_head re-processed), then forget the KV prefix cache."""

    def receive(worker: Any) -> None:
        group = getattr(worker, SYNC_ATTR, None)
        if group is None:
            raise RuntimeError("update before init_sync: no weight-sync group")
        received = group.receive(manifest)
        try:
            worker.reload_weights(weights_iterator=received)
        finally:
            for _ in received:  # a failed load still takes every tensor: the trainer never hangs
                pass
        refresh_tied_lm_head(worker.get_model())

    llm.collective_rpc(receive)
    llm.reset_prefix_cache()


def handle(llm: Any, request: dict[str, Any], show_progress: bool) -> dict[str, Any]:
    start = time.perf_counter()
    op = request.get("op")
    reply: dict[str, Any] = {"ok": True, "op": op}
    if op == "generate":
        reply["rows"] = generate(llm, request, show_progress)
    elif op == "reload":
        reload(llm, request["model"])
    elif op == "init_sync":
        init_sync(llm, request)
    elif op == "update":
        update(llm, request["manifest"])
    elif op == "sleep":
        llm.sleep(level=1)  # weights to CPU memory, KV cache dropped
    elif op == "wake":
        llm.wake_up()
    elif op != "shutdown":
        raise ValueError(
            f"unknown op {op!r}: expected generate, reload, init_sync, update, sleep, wake or "
            "shutdown"
        )
    reply["seconds"] = round(time.perf_counter() - start, 3)
    return reply


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="HF save_pretrained directory")
    parser.add_argument("--llm-kwargs", default="{}", help="JSON of extra vllm.LLM arguments")
    parser.add_argument("--request", help="run this one request file (JSON) and exit")
    parser.add_argument("--progress", action="store_true", help="vLLM progress bar on stderr")
    args = parser.parse_args(argv)
    for key, value in WORKER_ENV.items():
        os.environ.setdefault(key, value)
    # Replies own the real stdout; anything vLLM or its libraries print goes to stderr.
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())

    def send(reply: dict[str, Any]) -> None:
        replies.write(json.dumps(reply) + "\n")

    start = time.perf_counter()
    import vllm

    kwargs = {"enable_prefix_caching": True, **json.loads(args.llm_kwargs)}
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        # When a prompt's prefill is split over engine steps (chunked prefill), vLLM drops
        # that step's sample and rewinds the request's seeded generator, which a CPU
        # generator cannot do ("CPU Generator does not use offset"): prefill whole prompts.
        kwargs.setdefault("enable_chunked_prefill", False)
    llm = vllm.LLM(model=args.model, **kwargs)
    ready = {"ok": True, "op": "ready", "vllm": vllm.__version__}
    ready["seconds"] = round(time.perf_counter() - start, 3)
    if args.request:
        request = {"op": "generate", **json.loads(Path(args.request).read_text())}
        send(handle(llm, request, args.progress))
        return 0
    send(ready)
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            send(handle(llm, request, args.progress))
        except Exception as err:  # reported to the caller, who raises it; the worker lives on
            send(
                {
                    "ok": False,
                    "error": f"{type(err).__name__}: {err}",
                    "trace": traceback.format_exc(),
                }
            )
            continue
        if request.get("op") == "shutdown":
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
