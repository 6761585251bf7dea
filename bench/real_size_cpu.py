"""Issue 53 on CPU: peak memory and seconds of one GRPO update of SmolLM2-135M's and
Qwen2.5-0.5B's shapes at 256, 1k and 4k output tokens, before and after the memory settings.

Each (shape, tokens, arm) runs in a fresh process: random weights from a config (no hub; the
cost of a pass does not depend on the weights' values), a TorchEngine, a frozen reference copy
(beta 0.04, so the reference pass runs as in a default run), and one `grpo_update` (mu 1) on
one prompt of 128 tokens x G = 2 outputs of T and T/2 tokens: the spread of lengths that
reasoning outputs have, so padding shows. The arms:

- before: today's defaults (8 rows per micro-batch: both rows in one pass padded to T);
- item 1: + gradient checkpointing and logits through the output layer in 512-token chunks;
- items 1+2: + micro-batches by token budget (prompt + T tokens per pass), each padded only to
  its own longest row;
- packed (not run by default): + grpo.algo.padding_free, each pass's rows as one packed row;
- bf16 (not run by default): items 1+2 with the model, its gradients and AdamW's moments in
  bfloat16 (policy.dtype: bfloat16), the policy's state at half the bytes.

Peak memory is the process's peak RSS (whole process, and above its RSS before the update:
gradients, AdamW's moments, activations). The parent stops a child whose RSS passes `--cap-gib`
and prints the row as over the cap. The machine-speed reference (bench/machine_speed.py) is
measured in the same run.

    OMP_NUM_THREADS=2 .venv/bin/python bench/real_size_cpu.py
    .venv/bin/python bench/real_size_cpu.py --shapes smollm2-135m --tokens 256 1024 --arms before
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from real_size_common import SHAPES, Shape, build_model

REPO = Path(__file__).resolve().parents[1]
CPU_SHAPES = {
    # HuggingFaceTB/SmolLM2-135M's config: a Llama, tied embeddings
    "smollm2-135m": (
        Shape(layers=30, hidden=576, mlp=1536, heads=9, kv_heads=3, vocab=49152),
        "llama",
    ),
    "qwen2.5-0.5b": (SHAPES["0.5B"], "qwen2"),
    "tiny": (SHAPES["tiny"], "qwen2"),
}
PROMPT_TOKENS, CHUNK_TOKENS = 128, 512
ARMS = ("before", "item 1", "items 1+2", "packed", "bf16")
DEFAULT_ARMS = ARMS[:3]


def arm_settings(arm: str, tokens: int) -> dict[str, object]:
    """The GRPOConfig fields an arm turns on (packing looked up by the names it may land as)."""
    settings: dict[str, object] = {}
    if arm in ("item 1", "items 1+2", "packed", "bf16"):
        settings |= {"gradient_checkpointing": True, "logits_chunk_tokens": CHUNK_TOKENS}
    if arm in ("items 1+2", "packed", "bf16"):
        settings["max_tokens_per_micro_batch"] = PROMPT_TOKENS + tokens
    if arm == "packed":
        settings["padding_free"] = True
    return settings


def rss_gib(pid: int | str = "self") -> float:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30


def one_update(shape_name: str, tokens: int, arm: str) -> dict[str, object]:
    """One grpo_update of the arm's settings: peak RSS (GiB), above the start, and seconds."""
    import torch

    from grpo_core.algo.config import GRPOConfig
    from grpo_core.algo.update import grpo_update
    from grpo_core.contracts.policy_batch import build_policy_batch
    from grpo_core.contracts.training import OptimizerSettings
    from grpo_core.engines.train import TorchEngine

    shape, arch = CPU_SHAPES[shape_name]
    dtype = torch.bfloat16 if arm == "bf16" else torch.float32
    model = build_model(shape, torch.device("cpu"), dtype, arch=arch)
    reference = copy.deepcopy(model).eval().requires_grad_(False)
    engine = TorchEngine(model, OptimizerSettings(lr=1e-6))
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(2, shape.vocab, (PROMPT_TOKENS,), generator=gen).tolist()
    completions = [
        torch.randint(2, shape.vocab, (length,), generator=gen).tolist()
        for length in (tokens, tokens // 2)
    ]
    batch = build_policy_batch([prompt] * 2, completions, pad_id=0)
    advantages = batch.expand_per_sequence(torch.tensor([1.0, -1.0]))
    settings = arm_settings(arm, tokens)
    cfg = GRPOConfig(beta=0.04).model_copy(update=settings)
    start_rss = rss_gib()
    start = time.perf_counter()
    metrics = grpo_update(engine, reference, batch, advantages, cfg)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return {
        "peak_gib": peak,
        "above_start_gib": peak - start_rss,
        "update_s": seconds,
        "padding_share": metrics.get("padding_share"),
        "settings": sorted(settings),
    }


def run_child(shape: str, tokens: int, arm: str, cap_gib: float) -> dict[str, Any]:
    """The row in a fresh process, stopped if its RSS passes the cap."""
    child = subprocess.Popen(
        [sys.executable, __file__, "--child", shape, str(tokens), arm],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    highest = 0.0
    while child.poll() is None:
        try:
            highest = max(highest, rss_gib(child.pid))
        except (FileNotFoundError, ProcessLookupError):
            break
        if highest > cap_gib:
            child.kill()
            child.wait()
            return {"over_cap": True, "peak_gib": highest}
        time.sleep(0.2)
    out, _ = child.communicate()
    if child.returncode != 0:
        raise SystemExit(f"{shape} {tokens} {arm}: child failed with {child.returncode}")
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def row(shape: str, tokens: int, arm: str, r: dict[str, Any], cap: float) -> str:
    if r.get("over_cap"):
        return f"| {shape} | {tokens} | {arm} | > {cap:.0f} (stopped) | - | - | - |"
    share = r["padding_share"]
    padding = "-" if share is None else f"{share:.1%}"
    return (
        f"| {shape} | {tokens} | {arm} | {r['peak_gib']:.2f} | {r['above_start_gib']:.2f} "
        f"| {r['update_s']:.1f} | {padding} |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--shapes", nargs="+", default=["smollm2-135m", "qwen2.5-0.5b"])
    parser.add_argument("--tokens", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--arms", nargs="+", default=list(DEFAULT_ARMS), choices=ARMS)
    parser.add_argument("--cap-gib", type=float, default=20.0)
    parser.add_argument("--out", type=Path, help="write the rows as JSON lines here too")
    args = parser.parse_args()
    if args.child:
        shape, tokens, arm = args.child
        print(json.dumps(one_update(shape, int(tokens), arm)))
        return 0
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    threads = os.environ.get("OMP_NUM_THREADS", "unset")
    print(f"{stamp}, commit {commit}, OMP_NUM_THREADS={threads}, load {os.getloadavg()[0]:.1f}")
    print(f"prompt {PROMPT_TOKENS} tokens x 2 outputs of T and T/2 tokens, beta 0.04")
    print("| shape | T | arm | peak GiB | above start GiB | update s | padding |")
    print("|---|---:|---|---:|---:|---:|---:|", flush=True)
    for shape in args.shapes:
        for tokens in args.tokens:
            for arm in args.arms:
                result = run_child(shape, tokens, arm, args.cap_gib)
                print(row(shape, tokens, arm, result, args.cap_gib), flush=True)
                if args.out:
                    with args.out.open("a") as f:
                        f.write(json.dumps({"shape": shape, "tokens": tokens, "arm": arm})[:-1])
                        f.write(", " + json.dumps(result)[1:] + "\n")
    from machine_speed import reference_line  # bench/ is the script's own directory

    print(reference_line(), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
