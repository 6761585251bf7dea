"""Tiny pretrained reward models of every format, saved locally with a tokenizer unlike the
built-in policy's characters: a byte-level BPE trained here on arithmetic solutions (its merges
span line ends and operators), with Math-Shepherd's step tag 'ки' and Qwen's '<extra_0>'
separator added as tokens. Weights are drawn from a seed; nothing comes from a hub."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    LlamaForSequenceClassification,
    LlamaForTokenClassification,
    PreTrainedModel,
    PreTrainedTokenizerFast,
)

# Questions and solutions in the built-in task's format (configs/micro.yaml: sums of 1 and 2).
CORPUS = [
    "Q: 1+2\nA:\n1+2=3\n#### 3",
    "Q: 2+2+1\nA:\n2+2=4\n4+1=5\n#### 5",
    "Q: 1+1\nA:\n1+1=2\n#### 2",
    "Q: 2+1+2\nA:\n2+1=3\n3+2=5\n#### 5",
]
SEPARATOR = "<extra_0>"
TAG = "ки"


@cache
def rm_tokenizer() -> PreTrainedTokenizerFast:
    """The reward models' own tokenizer, built once (tests must not change it)."""
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<pad>", "<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    core.train_from_iterator(CORPUS * 50, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        eos_token="<eos>",
        additional_special_tokens=[SEPARATOR],
    )
    tokenizer.add_tokens([TAG])
    return tokenizer


def _llama(num_labels: int | None = None) -> LlamaConfig:
    config = LlamaConfig(
        vocab_size=len(rm_tokenizer()),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=512,
        pad_token_id=rm_tokenizer().pad_token_id,
    )
    if num_labels is not None:
        config.num_labels = num_labels
    return config


def save(net: PreTrainedModel, path: Path) -> Path:
    """`net` and the RM tokenizer in a save_pretrained directory."""
    net.save_pretrained(path)
    rm_tokenizer().save_pretrained(path)
    return path


def classifier(path: Path, *, num_labels: int = 1, token: bool = False, seed: int = 0) -> Path:
    """Format (a) (two_class with num_labels 2): a Llama sequence classifier (a token one
    with `token`)."""
    torch.manual_seed(seed)
    cls = LlamaForTokenClassification if token else LlamaForSequenceClassification
    return save(cls(_llama(num_labels)), path)


def step_tag_lm(path: Path, *, seed: int = 0) -> Path:
    """Format (b): a Llama causal LM, read at the tag for the '+' / '-' next-token logits."""
    torch.manual_seed(seed)
    return save(LlamaForCausalLM(_llama()), path)


def two_class(path: Path, *, seed: int = 0) -> Path:
    """Format (c): a Llama token classifier with a two-class head, read at the separator.
    (Not a Qwen2 model: transformers 5 loads any tokenizer beside a qwen2 config as its own
    Qwen2Tokenizer, which re-splits this BPE's text.)"""
    return classifier(path, num_labels=2, token=True, seed=seed)
