"""Seconds and peak memory of one GRPO update on reasoning-length outputs, by how its
micro-batches hold the rows: fixed rows, a token budget (each pass padded to its own longest
row), and the budget with grpo.algo.padding_free (each pass one packed row; docs/memory.md).

Each arm runs in a fresh process: a Qwen2-shaped model with random weights from a config
(hidden 256, 4 layers, GQA 4/2, vocab 8k, ~6M parameters) under sdpa, a TorchEngine, and one
grpo_update (mu 1, beta 0) on P = 2 prompts of 64 tokens x G = 4 outputs whose lengths are
log-uniform over 50 to `--longest` tokens (seeded). Peak memory is the process's peak RSS
minus its RSS before the update (MB). The machine-speed reference (bench/machine_speed.py)
is measured in the same run.

    OMP_NUM_THREADS=1 .venv/bin/python bench/padding_free_update.py --longest 1000 --budget 2048
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROMPTS, GROUP, PROMPT_TOKENS, VOCAB = 2, 4, 64, 8192


def arms(budget: int) -> dict[str, dict[str, object]]:
    return {
        "8 rows": {"micro_batch_size": 8},
        f"budget {budget}": {"max_tokens_per_micro_batch": budget},
        f"budget {budget} packed": {"max_tokens_per_micro_batch": budget, "padding_free": True},
    }


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def one_update(settings: dict[str, object], longest: int) -> dict[str, float]:
    """One grpo_update with `settings`; peak RSS above the start (MB), seconds, and the
    update's padding_share."""
    import math

    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from grpo_core.algo.config import GRPOConfig
    from grpo_core.algo.update import grpo_update
    from grpo_core.contracts.policy_batch import build_policy_batch
    from grpo_core.contracts.training import OptimizerSettings
    from grpo_core.engines.train import TorchEngine

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=256,
        intermediate_size=704,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=longest + PROMPT_TOKENS + 1,
        tie_word_embeddings=True,
    )
    model = Qwen2ForCausalLM(config)
    model.set_attn_implementation("sdpa")
    engine = TorchEngine(model, OptimizerSettings(lr=1e-6))
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(4, VOCAB, (PROMPT_TOKENS,), generator=gen).tolist()] * GROUP
    prompts += [torch.randint(4, VOCAB, (PROMPT_TOKENS,), generator=gen).tolist()] * GROUP
    rows = PROMPTS * GROUP
    lengths = torch.empty(rows).uniform_(math.log(50), math.log(longest), generator=gen).exp()
    completions = [torch.randint(4, VOCAB, (int(n),), generator=gen).tolist() for n in lengths]
    batch = build_policy_batch(prompts, completions, pad_id=0)
    advantages = batch.expand_per_sequence(torch.randn(rows, generator=gen))
    cfg = GRPOConfig(beta=0.0).model_copy(update=settings)
    start_rss = rss_mb()
    start = time.perf_counter()
    metrics = grpo_update(engine, None, batch, advantages, cfg)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"peak_mb": peak - start_rss, "update_s": seconds, "padding": metrics["padding_share"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--longest", type=int, default=1000)
    parser.add_argument("--budget", type=int, default=2048)
    args = parser.parse_args()
    table = arms(args.budget)
    if args.child:
        print(json.dumps(one_update(table[args.child], args.longest)))
        return 0
    threads = os.environ.get("OMP_NUM_THREADS", "unset")
    print(f"OMP_NUM_THREADS={threads}, load {os.getloadavg()[0]:.1f}, outputs 50-{args.longest}")
    print("arm                  | padding | peak MB above start | update s")
    for arm in table:
        sizes = ["--longest", str(args.longest), "--budget", str(args.budget)]
        out = subprocess.run(
            [sys.executable, __file__, "--child", arm, *sizes],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        )
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{arm:20} | {r['padding']:7.1%} | {r['peak_mb']:19.0f} | {r['update_s']:8.1f}")
    from machine_speed import reference_line  # bench/ is the script's own directory

    print(reference_line())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
