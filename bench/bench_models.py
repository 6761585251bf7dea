"""The seeded Llama of a bench config (grpo_bench_common.CONFIGS) with the char tokenizer:
what grpo_step.py, ppo_vs_grpo.py and sampler.py build, in itergrpo's environment (TRL's side
loads the saved copy instead)."""

from __future__ import annotations

from pathlib import Path

import grpo_bench_common as common
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from grpo_core.model.config import PolicyConfig
from grpo_core.model.policy import build_char_tokenizer, create_tiny_policy


def bench_policy(cfg: common.BenchConfig) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The Llama of `cfg`'s shape drawn from seed 0, and the char tokenizer."""
    tokenizer = build_char_tokenizer()
    shape = PolicyConfig(
        n_layers=cfg.n_layers,
        hidden_size=cfg.hidden_size,
        n_heads=cfg.n_heads,
        intermediate_size=cfg.intermediate_size,
        seed=0,
    )
    return create_tiny_policy(shape, tokenizer), tokenizer


def save_bench_policy(cfg: common.BenchConfig, out: Path) -> None:
    """bench_policy(cfg) saved where every side of a comparison loads it."""
    model, tokenizer = bench_policy(cfg)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
