"""Policies: a seeded tiny Llama with a character tokenizer, local HF models, prompt formatting."""

from __future__ import annotations

import contextlib
import json
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from torch import Tensor, nn
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from grpo_core.contracts.errors import MissingPathError, SettingError, UserError
from grpo_core.model.config import DEFAULT_ALPHABET, PolicyConfig
from grpo_core.model.deepspeed_import import import_deepspeed_if_installed

log = logging.getLogger(__name__)
# Before this process's first save_pretrained, which would import deepspeed the slow way.
import_deepspeed_if_installed()

# policy.dtype names and the torch dtypes parameters are held in (bf16-mixed: float32; its
# forward passes autocast, grpo_core/engines/train.py)
DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "bf16-mixed": torch.float32,
}


def build_char_tokenizer(alphabet: str = DEFAULT_ALPHABET) -> PreTrainedTokenizerFast:
    """Character-level tokenizer: one token per character, `<bos>` prepended, `<eos>`, `<pad>`."""
    specials = ["<pad>", "<bos>", "<eos>", "<unk>"]
    chars = list(dict.fromkeys(alphabet))
    vocab = {tok: i for i, tok in enumerate(specials + chars)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("(?m)."), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        clean_up_tokenization_spaces=False,
    )


def ensure_pad_token(tokenizer: PreTrainedTokenizerBase) -> None:
    """Pad-token rule: a tokenizer without a pad token pads with its EOS token (with a warning)."""
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token is None:
            raise SettingError(
                "tokenizer has neither a pad nor an EOS token; set tokenizer.pad_token"
            )
        warnings.warn(
            f"tokenizer has no pad token; padding with its EOS token {tokenizer.eos_token!r}",
            stacklevel=2,
        )
        tokenizer.pad_token = tokenizer.eos_token


def create_tiny_policy(cfg: PolicyConfig, tokenizer: PreTrainedTokenizerBase) -> LlamaForCausalLM:
    """A new Llama sized by `cfg` (its validator checked the shapes), weights drawn from
    `cfg.seed`, vocabulary of `tokenizer`."""
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_kv_heads or cfg.n_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=cfg.tie_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = LlamaForCausalLM(config)
    for param in model.parameters():
        param.data = param.data.to(DTYPES[cfg.dtype])
    if cfg.attn_implementation is not None:
        model.set_attn_implementation(cfg.attn_implementation)
    return model


class CorruptCheckpointError(UserError, ValueError):
    """A checkpoint directory whose files exist but cannot be read."""


@contextlib.contextmanager
def reading_checkpoint(path: Path) -> Iterator[None]:
    """Turn a failure to parse `path`'s files (truncated weights, broken JSON) into one error
    naming the directory and the way out, instead of a library traceback."""
    try:
        yield
    except (OSError, ValueError, RuntimeError, SafetensorError) as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise CorruptCheckpointError(
            f"checkpoint {path} cannot be read ({str(exc).splitlines()[0]}): it was truncated "
            "or overwritten. Restore the directory from a backup, or start a new run id "
            "(a committed stage is not redone)"
        ) from exc


def attention_kwargs(attn_implementation: str | None) -> dict[str, str]:
    """transformers' loading keyword for policy.attn_implementation; none for None (the
    model's default, which a checkpoint does not record: every load passes it again)."""
    return {} if attn_implementation is None else {"attn_implementation": attn_implementation}


def load_policy(
    path: str | Path,
    dtype: str = "float32",
    weights: bool = True,
    attn_implementation: str | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Model and tokenizer from a local HF directory (`save_pretrained` layout); never the hub.
    weights=False: the model as a skeleton, its parameters on the meta device (config, names
    and shapes, no weights in memory), for a process that saves weights held elsewhere through
    `save_pretrained(..., state_dict=...)`. attn_implementation: policy.attn_implementation."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise MissingPathError(f"no HF model directory at {path} (config.json missing)")
    attention = attention_kwargs(attn_implementation)
    with reading_checkpoint(path):
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        if weights:
            model = AutoModelForCausalLM.from_pretrained(
                path, local_files_only=True, dtype=DTYPES[dtype], **attention
            )
        else:
            config = AutoConfig.from_pretrained(path, local_files_only=True)
            with torch.device("meta"):
                model = AutoModelForCausalLM.from_config(config, dtype=DTYPES[dtype], **attention)
    ensure_pad_token(tokenizer)
    return model, tokenizer


def holds_weights(model: nn.Module) -> bool:
    """False for a skeleton (load_policy(weights=False)): parameters on the meta device."""
    return not any(p.is_meta for p in model.parameters())


def without_tied_copies(model: nn.Module, weights: dict[str, Tensor]) -> dict[str, Tensor]:
    """`weights` less each name under which `model` holds a parameter it already holds under
    an earlier name (a head tied to the embedding): saved from a dict, a tied tensor would
    otherwise be written twice, where `save_pretrained` of the model's own writes it once."""
    seen: set[int] = set()
    copies = set()
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) in seen:
            copies.add(name)
        seen.add(id(tensor))
    return {name: value for name, value in weights.items() if name not in copies}


def load_weights_into(model: nn.Module, checkpoint_dir: str | Path) -> None:
    """Copy the weights saved at `checkpoint_dir` (safetensors, one file or sharded) into
    `model` in place; a tied head saved once is tied in the model already."""
    from safetensors.torch import load_file

    path = Path(checkpoint_dir)
    index = path / "model.safetensors.index.json"
    files = (
        sorted({path / f for f in json.loads(index.read_text())["weight_map"].values()})
        if index.is_file()
        else [path / "model.safetensors"]
    )
    with reading_checkpoint(path):
        for file in files:
            model.load_state_dict(load_file(str(file)), strict=False)


def build_policy(cfg: PolicyConfig) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Model and tokenizer for `cfg.kind`."""
    if cfg.kind == "tiny":
        tokenizer = build_char_tokenizer(cfg.alphabet)
        return create_tiny_policy(cfg, tokenizer), tokenizer
    if cfg.kind == "local":
        if cfg.path is None:
            raise SettingError("policy.path is required when policy.kind is 'local'")
        return load_policy(cfg.path, cfg.dtype, attn_implementation=cfg.attn_implementation)
    from grpo_core.model.smollm2 import smollm2_path

    return load_policy(
        smollm2_path(cfg.cache_dir), cfg.dtype, attn_implementation=cfg.attn_implementation
    )


def encode_prompt(tokenizer: PreTrainedTokenizerBase, prompt: str) -> list[int]:
    """Token ids of a formatted prompt, as rollout and warm start both feed it to the model.

    Chat-templated prompts already hold their special tokens; plain prompts get the
    tokenizer's own (the char tokenizer prepends `<bos>`).
    """
    ids = tokenizer(prompt, add_special_tokens=prompt_adds_special_tokens(tokenizer))["input_ids"]
    return list(ids)


def prompt_adds_special_tokens(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether encode_prompt adds the tokenizer's special tokens (chat-templated prompts
    already hold theirs)."""
    return not getattr(tokenizer, "chat_template", None)
