"""Peak memory and wall of one long sampling call of the in-process engine, with its KV cache
grown block by block with the live rows (today's) and sized for the whole decode up front
(before 2026-11-28), on the same policy, prompts and seed; the sampled tokens compared.

    OMP_NUM_THREADS=2 .venv/bin/python bench/kv_cache_live.py STORE/checkpoints/RUN/policy/iter-0
    OMP_NUM_THREADS=2 .venv/bin/python bench/kv_cache_live.py POLICY --prompts 64 --samples 8 \
        --new-tokens 1024

POLICY is a saved policy directory, e.g. policy_0 of a `--config math-style-1k` run; the
prompts are that preset's first training questions, written as the preset writes them. Each
setting runs in a fresh process (peak RSS is the process's); `--ignore-stop` decodes every
row to the limit (no row leaves: the growth's worst case). The up-front KV size is
rows x (prompt width + new tokens) x layers x 2 x KV heads x head dim x 4 bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from flows.config_files import load_config
from grpo_core.contracts.rollout import SamplingParams
from grpo_core.data.tasks.registry import make_task
from grpo_core.engines import hf_rollout, live_kv_cache
from grpo_core.engines.hf_rollout import HFRolloutEngine
from grpo_core.model.policy import encode_prompt, load_policy
from grpo_core.model.prompts import Prompter

UP_FRONT = 10**9  # a block longer than any decode: one buffer of width + max_new_tokens


def peak_cache_bytes() -> Callable[[], int]:
    """A reader of the most bytes the KV buffers of one decode batch held at once (on CPU the
    process's RSS holds only the pages written, so an up-front buffer shows in it only as it
    fills; on a GPU it is all allocated at once)."""
    live: dict[int, int] = {}
    peak = [0]
    update = live_kv_cache.PreallocatedLayer.update

    def counted(layer: live_kv_cache.PreallocatedLayer, *args: Any) -> tuple[torch.Tensor, ...]:
        out = update(layer, *args)
        live[id(layer)] = layer.nbytes
        peak[0] = max(peak[0], sum(live.values()))
        return out

    live_kv_cache.PreallocatedLayer.update = counted  # type: ignore[method-assign,assignment]
    return lambda: peak[0]


def sample(args: argparse.Namespace, block: int) -> dict[str, object]:
    """One generate call with KV blocks of `block` positions: wall, peak RSS, output lengths."""
    hf_rollout.KV_BLOCK_TOKENS = block
    model, tokenizer = load_policy(args.policy)
    cfg = load_config("math-style-1k")
    task = make_task(cfg.task)
    prompter = Prompter(tokenizer, cfg.prompt, task.answer_format.instruction)
    prompts = [prompter(p.question) for p in task.problems("train", args.prompts, seed=0)]
    engine = HFRolloutEngine(model, tokenizer, batch_size=args.batch_size, show_progress=False)
    if args.ignore_stop:
        engine.stop_ids = []  # every row runs to --new-tokens: the cache's worst case
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0)
    if len(prompts) * args.samples > args.batch_size:
        raise SystemExit("--batch-size must hold every row: the peak is one decode batch's")
    peak_bytes = peak_cache_bytes()
    start = time.perf_counter()
    batch = engine.generate(prompts, args.samples, params, seed=0)
    wall = time.perf_counter() - start
    lengths = sorted(len(c) for c in batch.completion_ids)
    config = model.config
    heads = config.num_key_value_heads or config.num_attention_heads
    head_dim = config.hidden_size // config.num_attention_heads
    width = max(len(encode_prompt(tokenizer, p)) for p in prompts)
    up_front = len(lengths) * (width + args.new_tokens) * config.num_hidden_layers * 2
    return {
        "wall_s": round(wall, 1),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
        "peak_kv_mb": peak_bytes() // 2**20,
        "up_front_kv_mb": up_front * heads * head_dim * 4 // 2**20,
        "rows": len(lengths),
        "mean_length": round(sum(lengths) / len(lengths), 1),
        "median_length": lengths[len(lengths) // 2],
        "at_limit": sum(n == args.new_tokens for n in lengths),
        "tokens_sha": hashlib.sha256(str(batch.completion_ids).encode()).hexdigest()[:12],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("policy", help="a saved policy directory")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=1024, help="rows per decode batch")
    parser.add_argument(
        "--ignore-stop", action="store_true", help="decode every row to --new-tokens"
    )
    parser.add_argument("--block", type=int, help=argparse.SUPPRESS)  # the child's setting
    args = parser.parse_args()
    if args.block is not None:
        print(json.dumps(sample(args, args.block)))
        return
    for name, block in (("blocks", hf_rollout.KV_BLOCK_TOKENS), ("up front", UP_FRONT)):
        child = [sys.executable, __file__, *sys.argv[1:], "--block", str(block)]
        result = json.loads(subprocess.run(child, check=True, capture_output=True).stdout)
        print(f"{name:>9}: " + ", ".join(f"{k} {v}" for k, v in result.items()), flush=True)


if __name__ == "__main__":
    main()
