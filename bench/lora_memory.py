"""Training state and peak memory of one GRPO update, full weights vs LoRA, same model.

Each arm runs in a fresh process: a seeded Llama made from a config (the tiny policy widened
to 8 layers of 512, ~25M parameters, the shape of precision_memory.py), the reference the
GRPO stage holds beside it (full weights: a second copy of policy_k; LoRA: the same model
with its adapters off), a TorchEngine, and one grpo_update (beta 0.04) on 8 prompts x 4
outputs x 32 tokens. It reports the bytes of what the update keeps (the policy's weights, the
reference's, the trained parameters' gradients, AdamW's moments) and the process's peak RSS.

    OMP_NUM_THREADS=1 .venv/bin/python bench/lora_memory.py
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
SHAPE = {"hidden_size": 512, "n_layers": 8, "n_heads": 8, "intermediate_size": 1408}
PROMPTS, GROUP, PROMPT_TOKENS, COMPLETION_TOKENS = 8, 4, 16, 32


def one_update(arm: str) -> dict[str, float]:
    """Build the arm's policy and reference, run one update; its figures in MB (RSS: peak)."""
    import copy

    import torch

    from grpo_core.algo.config import GRPOConfig
    from grpo_core.algo.update import grpo_update
    from grpo_core.contracts.policy_batch import build_policy_batch
    from grpo_core.contracts.training import OptimizerSettings
    from grpo_core.engines.train import TorchEngine
    from grpo_core.model.config import LoRAConfig, PolicyConfig
    from grpo_core.model.lora import LoRAAdapters
    from grpo_core.model.policy import build_char_tokenizer, create_tiny_policy

    def mb(tensors: list[torch.Tensor]) -> float:
        return sum(t.numel() * t.element_size() for t in tensors) / 2**20

    model = create_tiny_policy(PolicyConfig(**SHAPE), build_char_tokenizer())
    if arm == "lora":
        adapters = LoRAAdapters(model, LoRAConfig(enabled=True), seed=0)
        reference = adapters.reference()
        reference_params: list[torch.Tensor] = []  # the base itself, adapters off
    else:
        reference = copy.deepcopy(model).eval().requires_grad_(False)
        reference_params = list(reference.parameters())
    engine = TorchEngine(model, OptimizerSettings(lr=1e-4))
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    prompts = [torch.randint(4, vocab, (PROMPT_TOKENS,), generator=gen).tolist()] * GROUP
    batch = build_policy_batch(
        [p for _ in range(PROMPTS) for p in prompts],
        [
            torch.randint(4, vocab, (COMPLETION_TOKENS,), generator=gen).tolist()
            for _ in range(PROMPTS * GROUP)
        ],
        pad_id=0,
    )
    advantages = batch.expand_per_sequence(torch.randn(PROMPTS * GROUP, generator=gen))
    start = time.perf_counter()
    grpo_update(engine, reference, batch, advantages, GRPOConfig(beta=0.04))
    seconds = time.perf_counter() - start
    moments = [t for state in engine.optimizer.state.values() for t in state.values()]
    return {
        "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
        "trained_m": sum(p.numel() for p in engine.params) / 1e6,
        "weights_mb": mb(list(model.parameters())),
        "reference_mb": mb(reference_params),
        "grads_mb": mb(list(engine.params)),  # a gradient per trained parameter, same dtype
        "adam_mb": mb([t for t in moments if t.dim() > 0]),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "update_s": seconds,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--child", choices=("full", "lora"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(one_update(args.child)))
        return 0
    threads = os.environ.get("OMP_NUM_THREADS", "unset")
    print(f"OMP_NUM_THREADS={threads}, load {os.getloadavg()[0]:.1f}")
    print(
        "arm  | params M | trained M | weights MB | reference MB | grads MB | AdamW MB "
        "| state MB | peak RSS MB | update s"
    )
    for arm in ("full", "lora"):
        out = subprocess.run(
            [sys.executable, __file__, "--child", arm],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        )
        r = json.loads(out.stdout.strip().splitlines()[-1])
        state = r["weights_mb"] + r["reference_mb"] + r["grads_mb"] + r["adam_mb"]
        print(
            f"{arm:4} | {r['params_m']:8.2f} | {r['trained_m']:9.3f} | {r['weights_mb']:10.1f} "
            f"| {r['reference_mb']:12.1f} | {r['grads_mb']:8.1f} | {r['adam_mb']:8.1f} "
            f"| {state:8.1f} | {r['peak_rss_mb']:11.0f} | {r['update_s']:8.1f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
