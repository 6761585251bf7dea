"""What the sections of `gpu_real_size.py` share: model shapes built from a config (no hub),
a tokenizer for a 152k vocabulary, the update's FLOP count and MFU, the memory settings the
branch has, per-section time budgets and markdown tables."""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}


@dataclass(frozen=True)
class Shape:
    """A decoder's shape: Qwen2.5's published ones, and a toy one for --tiny."""

    layers: int
    hidden: int
    mlp: int
    heads: int
    kv_heads: int
    vocab: int = 151936


SHAPES = {
    "0.5B": Shape(layers=24, hidden=896, mlp=4864, heads=14, kv_heads=2),
    "1.5B": Shape(layers=28, hidden=1536, mlp=8960, heads=12, kv_heads=2),
    "tiny": Shape(layers=2, hidden=64, mlp=128, heads=4, kv_heads=2, vocab=512),
}


def build_model(
    shape: Shape, device: torch.device, dtype: torch.dtype, arch: str = "qwen2", seed: int = 0
) -> torch.nn.Module:
    """Random weights of `shape`, made where they will run (a CPU init of 1.5B weights takes
    longer than the timed work). arch "qwen2": Qwen2.5 itself (q/k/v biases); "llama": the
    same shape as a plain Llama, which our lean decode step drives."""
    kwargs: dict[str, Any] = {
        "vocab_size": shape.vocab,
        "hidden_size": shape.hidden,
        "intermediate_size": shape.mlp,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": True,
        "pad_token_id": 0,
        "eos_token_id": 1,
        "bos_token_id": 1,
    }
    torch.manual_seed(seed)
    with torch.device(device):
        if arch == "qwen2":
            return Qwen2ForCausalLM(Qwen2Config(**kwargs)).to(dtype)
        return LlamaForCausalLM(LlamaConfig(**kwargs)).to(dtype)


def n_params(model: torch.nn.Module) -> int:
    """Distinct parameters (a tied head counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def word_tokenizer(vocab: int) -> PreTrainedTokenizerFast:
    """One token per word `w<id>` for every id of a `vocab`-sized model (0 pad, 1 eos): random
    weights sample any id, and every id must decode."""
    words = {"<pad>": 0, "<eos>": 1, **{f"w{i}": i for i in range(2, vocab)}}
    core = Tokenizer(models.WordLevel(vocab=words, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    return PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token="<eos>", pad_token="<pad>", unk_token="<pad>"
    )


def word_prompts(count: int, length: int, vocab: int, seed: int = 0) -> list[str]:
    """`count` prompts of `length` random words each."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, vocab, (count, length), generator=gen)
    return [" ".join(f"w{i}" for i in row) for row in ids.tolist()]


def update_passes(beta: float, mu: int, mini_batches_per_epoch: int) -> tuple[int, int]:
    """(forward-only passes, training passes) one GRPO update runs over each token, as
    grpo_core/algo/update.py runs them: the reference when beta > 0, pi_old unless it is the
    detached current policy (mu = 1 and one mini-batch), and mu training passes."""
    forward_only = int(beta > 0) + int(not (mu == 1 and mini_batches_per_epoch == 1))
    return forward_only, mu


def update_flops(params: int, tokens: int, forward_only: int, training: int) -> float:
    """FLOPs of an update: 2 N per token for each forward-only pass, 6 N per token for each
    forward + backward (the usual estimate, attention's quadratic term left out)."""
    return float(tokens) * params * (2 * forward_only + 6 * training)


def mfu(flops: float, seconds: float, peak_tflops: float) -> float:
    """Achieved TFLOP/s as a share of the peak."""
    return flops / seconds / 1e12 / peak_tflops


def peak_tflops(device: torch.device, override: float | None = None) -> float | None:
    """Dense bf16 peak of the GPU by name (or `override`); None on CPU or an unknown GPU."""
    if override:
        return override
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)


# Memory settings issue 53 adds to GRPOConfig, by the names they may land under, and the value
# each takes here (micro-batch token budgets are filled in by the caller). A name the branch
# lacks is left out, so the bench runs before and after they merge.
MEMORY_SETTINGS: dict[str, object] = {
    "gradient_checkpointing": True,
    "logits_chunk_tokens": 1024,
    "max_tokens_per_micro_batch": None,  # the row's micro-batch token budget
}


def memory_settings(fields: Any, micro_tokens: int) -> dict[str, object]:
    """The MEMORY_SETTINGS among `fields` (a pydantic model's model_fields), with values."""
    found = {k: v for k, v in MEMORY_SETTINGS.items() if k in fields}
    return {k: micro_tokens if v is None else v for k, v in found.items()}


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_gib(device: torch.device) -> float:
    """Peak GPU memory allocated since reset_peak; on CPU the process's peak RSS."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def is_out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc)


@dataclass
class Budget:
    """A section's wall-clock allowance: rows not started by its end are reported skipped."""

    seconds: float
    start: float = field(default_factory=time.perf_counter)

    def spent(self) -> bool:
        return time.perf_counter() - self.start > self.seconds


@dataclass
class Table:
    """One section's figures: a title, column names, rows of values, and notes under it."""

    title: str
    columns: list[str]
    rows: list[list[object]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, *values: object) -> None:
        self.rows.append(list(values))

    def last_row(self) -> str:
        """The latest row as a markdown line (printed as it is measured)."""
        return "| " + " | ".join(_cell(v) for v in self.rows[-1]) + " |"

    def markdown(self) -> str:
        lines = [f"### {self.title}", "", "| " + " | ".join(self.columns) + " |"]
        lines.append("|" + "---|" * len(self.columns))
        lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in self.rows]
        return "\n".join([*lines, *(["", *self.notes] if self.notes else [])])

    def as_dict(self) -> dict[str, object]:
        return {
            "title": self.title,
            "columns": self.columns,
            "rows": self.rows,
            "notes": self.notes,
        }


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    return str(value)
