"""Peak memory and seconds of one GRPO update with the memory settings off and on
(grpo.algo.gradient_checkpointing, grpo.algo.logits_chunk_tokens, policy.dtype bf16-mixed;
docs/memory.md).

Each arm runs in a fresh process: a Qwen2-shaped model with random weights from a config
(hidden 512, 8 layers, GQA 8/2, vocab 32k, ~42M parameters), a TorchEngine, and one
grpo_update (mu 1, beta 0) on one prompt x 2 outputs of `--tokens` completion tokens. Peak
memory is the process's peak RSS minus its RSS before the update (ru_maxrss, in MB). The
machine-speed reference (bench/machine_speed.py) is measured in the same run.

    OMP_NUM_THREADS=1 .venv/bin/python bench/memory_update.py --tokens 256 1024
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
ARMS = {
    "plain": {},
    "checkpointing": {"gradient_checkpointing": True},
    "chunk 256": {"logits_chunk_tokens": 256},
    "both": {"gradient_checkpointing": True, "logits_chunk_tokens": 256},
    "bf16-mixed": {},  # the plain update at policy.dtype bf16-mixed (PRECISIONS)
}
PRECISIONS = {"bf16-mixed": "bf16-mixed"}  # arm -> policy.dtype; the others float32
GROUP, PROMPT_TOKENS, VOCAB = 2, 16, 32000


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def one_update(arm: str, tokens: int) -> dict[str, float]:
    """One grpo_update of the arm's settings; peak RSS above the start (MB) and seconds."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from grpo_core.algo.config import GRPOConfig
    from grpo_core.algo.update import grpo_update
    from grpo_core.contracts.policy_batch import build_policy_batch
    from grpo_core.contracts.training import OptimizerSettings
    from grpo_core.engines.train import TorchEngine, with_policy_precision

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=512,
        intermediate_size=1408,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=tokens + PROMPT_TOKENS + 1,
        tie_word_embeddings=True,
    )
    model = Qwen2ForCausalLM(config)
    optim = with_policy_precision(OptimizerSettings(lr=1e-6), PRECISIONS.get(arm, "float32"))
    engine = TorchEngine(model, optim)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(4, VOCAB, (PROMPT_TOKENS,), generator=gen).tolist()
    batch = build_policy_batch(
        [prompt] * GROUP,
        [torch.randint(4, VOCAB, (tokens,), generator=gen).tolist() for _ in range(GROUP)],
        pad_id=0,
    )
    advantages = batch.expand_per_sequence(torch.tensor([1.0, -1.0]))
    cfg = GRPOConfig(beta=0.0, micro_batch_size=GROUP).model_copy(update=ARMS[arm])
    start_rss = rss_mb()
    start = time.perf_counter()
    grpo_update(engine, None, batch, advantages, cfg)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"peak_mb": peak - start_rss, "update_s": seconds}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--child", choices=tuple(ARMS), help=argparse.SUPPRESS)
    parser.add_argument("--tokens", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--arms", nargs="+", choices=tuple(ARMS), default=list(ARMS))
    args = parser.parse_args()
    if args.child:
        print(json.dumps(one_update(args.child, args.tokens[0])))
        return 0
    threads = os.environ.get("OMP_NUM_THREADS", "unset")
    print(f"OMP_NUM_THREADS={threads}, load {os.getloadavg()[0]:.1f}")
    print("tokens | arm           | peak MB above start | update s")
    for tokens in args.tokens:
        for arm in args.arms:
            out = subprocess.run(
                [sys.executable, __file__, "--child", arm, "--tokens", str(tokens)],
                cwd=REPO,
                capture_output=True,
                text=True,
                check=True,
            )
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"{tokens:6} | {arm:13} | {r['peak_mb']:19.0f} | {r['update_s']:8.1f}")
    from machine_speed import reference_line  # bench/ is the script's own directory

    print(reference_line())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
