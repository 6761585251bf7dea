"""Real sizes on one GPU (issue 53, item 5): the GRPO update at Qwen2.5-0.5B/1.5B shapes with
1k- and 4k-token rows, decode tokens/s of `hf` and `hf_generate` against a forward-pass floor,
TRL's GRPOTrainer step against ours, and one loop iteration of a 0.5B policy per stage.

    python bench/gpu_real_size.py                          # every section, ~9 min on one H200
    python bench/gpu_real_size.py --sections update decode --out real-size.json
    python bench/gpu_real_size.py --dry-run                # every section's code at toy size on CPU

Models are random weights from a transformers config built here (no hub). The update runs
grpo_core.algo.update.grpo_update on a TorchEngine, bf16 weights, with whichever memory
settings GRPOConfig has on this branch (printed). FLOPs are 2 N per token per forward-only
pass and 6 N per training pass (real_size_common.update_flops); MFU is against the GPU's
dense bf16 peak. Each section has a time budget: rows not started within it print as skipped.
Without CUDA (and without --device cpu) it prints one line and exits 0.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from real_size_common import (
    SHAPES,
    Budget,
    Table,
    build_model,
    is_out_of_memory,
    memory_settings,
    mfu,
    n_params,
    peak_gib,
    peak_tflops,
    reset_peak,
    synchronize,
    update_flops,
    update_passes,
    word_prompts,
    word_tokenizer,
)
from transformers import CompileConfig

from grpo_core.algo.config import GRPOConfig
from grpo_core.algo.update import grpo_update
from grpo_core.contracts.policy_batch import build_policy_batch
from grpo_core.contracts.rollout import SamplingParams
from grpo_core.engines.hf_generate import HFGenerateEngine
from grpo_core.engines.hf_rollout import HFRolloutEngine
from grpo_core.engines.static_decode import StaticCacheRolloutEngine
from grpo_core.engines.train import TorchEngine

UPDATE_COLUMNS = [
    "shape",
    "params (M)",
    "row tokens",
    "rows",
    "micro rows",
    "s/update",
    "tokens/s",
    "TFLOP/s",
    "MFU",
    "peak GiB",
]
DECODE_COLUMNS = [
    "engine",
    "batch",
    "completion tokens",
    "tokens/s",
    "floor tokens/s",
    "share of floor",
    "peak GiB",
]


@dataclass(frozen=True)
class Sizes:
    """What each section runs: the real sizes on a GPU, or toys that run every path on CPU."""

    update_shapes: tuple[str, ...] = ("0.5B", "1.5B")
    row_tokens: tuple[int, ...] = (1024, 4096)
    update_tokens: int = 65536  # tokens per update, so every row length does the same work
    prompt_tokens: int = 128
    micro_tokens: int = 16384  # rows per micro-batch = this // row tokens
    repeats: int = 3
    decode_shape: str = "0.5B"
    # 256 first: the target's batch, measured before compiles can spend the section's budget
    decode_batches: tuple[int, ...] = (256, 64, 128, 512)
    decode_new_tokens: int = 256
    decode_prompt_tokens: int = 64
    decode_compile: object = True  # engines.hf.compile: inductor, CUDA graphs on a GPU
    group_size: int = 8
    step_prompts: int = 8  # TRL vs ours: prompts per step (x group_size completions)
    step_new_tokens: int = 256
    timed_steps: int = 3
    loop_new_tokens: int = 512
    budgets: tuple[tuple[str, float], ...] = (
        ("update", 180.0),
        ("decode", 120.0),
        ("trl", 120.0),
        ("loop", 120.0),
    )


TINY = replace(
    Sizes(),
    update_shapes=("tiny",),
    row_tokens=(32, 64),
    update_tokens=256,
    prompt_tokens=8,
    micro_tokens=128,
    repeats=1,
    decode_shape="tiny",
    decode_batches=(4, 8),
    decode_new_tokens=8,
    decode_prompt_tokens=8,
    # dynamo's capture without code generation: the compiled path in seconds on CPU
    decode_compile=CompileConfig(backend="aot_eager", dynamic=False, mode=None),
    group_size=2,
    step_prompts=2,
    step_new_tokens=8,
    timed_steps=1,
    loop_new_tokens=16,
)


@dataclass(frozen=True)
class Bench:
    """Where and how big: the device, its dtype, the sizes and the MFU peak."""

    device: torch.device
    dtype: torch.dtype
    sizes: Sizes
    peak: float | None

    def budget(self, section: str) -> Budget:
        return Budget(dict(self.sizes.budgets)[section])


def update_section(bench: Bench) -> Table:
    """(a) grpo_update's tokens/s, TFLOP/s, MFU and peak memory per shape and row length."""
    sizes, dev = bench.sizes, bench.device
    table = Table("GRPO update: tokens/s, TFLOP/s, MFU, peak memory", UPDATE_COLUMNS)
    on = memory_settings(GRPOConfig.model_fields, sizes.micro_tokens)
    settings = ", ".join(f"{k}={v}" for k, v in on.items()) or "none on this branch"
    table.notes.append(f"memory settings on: {settings}")
    budget = bench.budget("update")
    for shape_name in sizes.update_shapes:
        for row_tokens in sizes.row_tokens:
            rows = max(1, sizes.update_tokens // row_tokens)
            micro = max(1, sizes.micro_tokens // row_tokens)
            label = [shape_name, "-", row_tokens, rows, micro]
            if budget.spent():
                table.add(*label, "skipped: section budget spent", *["-"] * 4)
                continue
            cfg = GRPOConfig(lr=1e-6, beta=0.04, micro_batch_size=micro, **on)
            try:
                params, seconds, peak = _time_update(bench, shape_name, row_tokens, rows, cfg)
            except RuntimeError as exc:
                if not is_out_of_memory(exc):
                    raise
                table.add(*label, "out of memory", *["-"] * 3, f"{peak_gib(dev):.1f}")
                continue
            finally:
                reset_peak(dev)
            tokens = rows * row_tokens
            flops = update_flops(
                params, tokens, *update_passes(cfg.beta, cfg.mu, cfg.mini_batches_per_epoch)
            )
            share = f"{100 * mfu(flops, seconds, bench.peak):.1f}%" if bench.peak else "-"
            label[1] = f"{params / 1e6:.1f}"
            table.add(*label, seconds, tokens / seconds, flops / seconds / 1e12, share, peak)
            print(table.last_row(), flush=True)
    return table


def _time_update(
    bench: Bench, shape_name: str, row_tokens: int, rows: int, cfg: GRPOConfig
) -> tuple[int, float, float]:
    """(parameters, median seconds per update, peak GiB) of grpo_update on `rows` rows."""
    sizes, dev = bench.sizes, bench.device
    shape = SHAPES[shape_name]
    reset_peak(dev)
    model = build_model(shape, dev, bench.dtype)
    reference = build_model(shape, dev, bench.dtype).eval().requires_grad_(False)
    engine = TorchEngine(model, cfg.optimizer_settings())
    gen = torch.Generator().manual_seed(0)
    prompt, completion = sizes.prompt_tokens, row_tokens - sizes.prompt_tokens
    prompts = torch.randint(2, shape.vocab, (rows, prompt), generator=gen).tolist()
    completions = torch.randint(2, shape.vocab, (rows, completion), generator=gen).tolist()
    batch = build_policy_batch(prompts, completions, pad_id=0, padding_side="left").to(dev)
    advantages = batch.expand_per_sequence(torch.randn(rows, generator=gen)).to(dev)
    times = []
    for i in range(sizes.repeats + 1):  # the first warms kernels and the allocator up
        synchronize(dev)
        start = time.perf_counter()
        grpo_update(engine, reference, batch, advantages, cfg)
        synchronize(dev)
        if i:
            times.append(time.perf_counter() - start)
    return n_params(model), statistics.median(times), peak_gib(dev)


def forward_floor_seconds(model: torch.nn.Module, rows: int, device: torch.device) -> float:
    """Seconds of one forward pass at batch `rows` over one token each, no cache: what a decode
    step at least computes (bench/sampler.py's forward floor), median of 5 after a warm-up."""
    ids = torch.ones(rows, 1, dtype=torch.long, device=device)
    times = []
    for i in range(6):
        synchronize(device)
        start = time.perf_counter()
        with torch.inference_mode():
            model(input_ids=ids, use_cache=False)
        synchronize(device)
        if i:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def decode_engines(
    model: Any, tokenizer: Any, compile: Any
) -> dict[str, Callable[[int], HFRolloutEngine]]:
    """Engine name -> a maker of that engine at a batch size: `hf` (our decode loop, lean step),
    `hf_generate` (transformers' generate), and both over a static cache with a compiled step
    (engines.hf.cache_implementation: static, engines.hf.compile; `compile` as given)."""
    return {
        "hf": lambda b: HFRolloutEngine(model, tokenizer, b, show_progress=False),
        "hf_generate": lambda b: HFGenerateEngine(model, tokenizer, b, show_progress=False),
        "hf, static+compile": lambda b: StaticCacheRolloutEngine(
            model, tokenizer, b, show_progress=False, compile=compile
        ),
        "hf_generate, static+compile": lambda b: HFGenerateEngine(
            model,
            tokenizer,
            b,
            show_progress=False,
            cache_implementation="static",
            compile=compile,
        ),
    }


def decode_section(bench: Bench) -> Table:
    """(b) sampled tokens/s of each in-process engine at each batch, against the forward floor."""
    sizes, dev = bench.sizes, bench.device
    shape = SHAPES[sizes.decode_shape]
    table = Table("Decode: in-process engines against one forward pass", DECODE_COLUMNS)
    model = build_model(shape, dev, bench.dtype, arch="llama").eval()
    tokenizer = word_tokenizer(shape.vocab)
    engines = decode_engines(model, tokenizer, sizes.decode_compile)
    table.notes.append(
        f"model: Qwen2.5-{sizes.decode_shape} shape as a plain Llama "
        f"({n_params(model) / 1e6:.1f}M), {sizes.group_size} samples per prompt of "
        f"{sizes.decode_prompt_tokens} tokens, "
        f"temperature 1; floor = batch / seconds of one forward at that batch (no cache); "
        f"hf decodes with the lean step: {HFRolloutEngine(model, tokenizer).uses_lean_decode()}; "
        "static: engines.hf.cache_implementation, compile: engines.hf.compile (warmed up with "
        "the timed call's shapes, so its compile is not timed)"
    )
    params = SamplingParams(max_new_tokens=sizes.decode_new_tokens, temperature=1.0)
    warm = SamplingParams(max_new_tokens=2, temperature=1.0)
    budget = bench.budget("decode")
    for batch in sizes.decode_batches:
        n_prompts = max(1, batch // sizes.group_size)
        prompts = word_prompts(n_prompts, sizes.decode_prompt_tokens, shape.vocab, seed=batch)
        floor = batch / forward_floor_seconds(model, batch, dev)
        for name, make in engines.items():
            if budget.spent():
                table.add(name, batch, "-", "skipped: section budget spent", *["-"] * 3)
                continue
            engine = make(batch)
            # a static cache compiles per shape: its warm-up decodes as many tokens as timed
            static = getattr(engine, "cache_implementation", "dynamic") == "static"
            engine.generate(prompts, sizes.group_size, params if static else warm, seed=1)
            reset_peak(dev)
            synchronize(dev)
            start = time.perf_counter()
            out = engine.generate(prompts, sizes.group_size, params, seed=0)
            synchronize(dev)
            seconds = time.perf_counter() - start
            tokens = sum(len(ids) for ids in out.completion_ids)
            rate = tokens / seconds
            table.add(name, batch, tokens, rate, floor, rate / floor, peak_gib(dev))
            print(table.last_row(), flush=True)
    return table


def sections() -> dict[str, Callable[[Bench], Table]]:
    from real_size_steps import loop_section, trl_section

    return {
        "update": update_section,
        "decode": decode_section,
        "trl": trl_section,
        "loop": loop_section,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sections", nargs="+", default=["update", "decode", "trl", "loop"])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--tiny", action="store_true", help="toy sizes: every code path, fast")
    parser.add_argument("--dry-run", action="store_true", help="= --device cpu --tiny")
    parser.add_argument("--peak-tflops", type=float, default=None, help="dense bf16 peak")
    parser.add_argument("--out", type=Path, default=None, help="also write the tables as JSON")
    args = parser.parse_args(argv)
    if args.dry_run:
        args.device, args.tiny = "cpu", True
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_real_size: no CUDA device: nothing measured")
        return 0
    known = sections()
    unknown = [s for s in args.sections if s not in known]
    if unknown:
        parser.error(f"unknown --sections {unknown}: choose from {list(known)}")
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    bench = Bench(
        device, dtype, TINY if args.tiny else Sizes(), peak_tflops(device, args.peak_tflops)
    )
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(
        f"gpu_real_size on {where}: torch {torch.__version__}, {dtype}, peak {bench.peak} TFLOP/s"
    )
    tables = {}
    for name in args.sections:
        start = time.perf_counter()
        print(f"\n== {name} (budget {dict(bench.sizes.budgets)[name]:.0f} s)", flush=True)
        tables[name] = known[name](bench)
        print(tables[name].markdown(), flush=True)
        print(f"({name}: {time.perf_counter() - start:.1f} s)", flush=True)
    if args.out:
        args.out.write_text(json.dumps({k: t.as_dict() for k, t in tables.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
