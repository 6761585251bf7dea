"""Completion tokens/s of the `hf` engine's decode loop over its dynamic cache (the default)
against the static-cache loop (engines.hf.cache_implementation: static), eager and compiled
(engines.hf.compile: inductor; CUDA graphs only on a GPU), on the bench policies of sampler.py.

    OMP_NUM_THREADS=2 .venv/bin/python bench/static_decode.py --models tiny small --shapes 32x8

The compiled loop's first call compiles a graph per (rows, capacity) shape; it is timed apart
(`compile s`: the warm-up call at the timed shape), then each figure is the median of
`--repeats` calls. Before timing, greedy tokens of every loop are compared with the dynamic
loop's on the timed prompts. The machine-speed reference is measured before and after.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from machine_speed import load, reference_line
from sampler import Sampler, build, median_rates, ours, prompts_for

from grpo_core.contracts.rollout import SamplingParams
from grpo_core.engines.hf_rollout import HFRolloutEngine
from grpo_core.engines.static_decode import StaticCacheRolloutEngine
from grpo_core.model.policy import ensure_pad_token


def bench_model(name: str, shapes: list[tuple[int, int]], repeats: int) -> None:
    model, tokenizer, max_new, questions = build(name)
    ensure_pad_token(tokenizer)
    model.eval()
    n_params = sum(p.numel() for p in model.parameters()) / 1e6
    samplers: dict[str, Sampler] = {
        "dynamic": ours(HFRolloutEngine(model, tokenizer, 256, show_progress=False)),
        "static": ours(StaticCacheRolloutEngine(model, tokenizer, 256, show_progress=False)),
        "static+compile": ours(
            StaticCacheRolloutEngine(model, tokenizer, 256, show_progress=False, compile=True)
        ),
    }
    print(f"\n## {name}: {n_params:.1f}M parameters, <= {max_new} new tokens, temperature 1")
    print(
        "| shape | greedy tokens as dynamic | compile s | dynamic tok/s | static tok/s | "
        "static+compile tok/s | static+compile / dynamic |"
    )
    print("|---|---|---|---|---|---|---|")
    params = SamplingParams(max_new_tokens=max_new, temperature=1.0)
    greedy = SamplingParams(max_new_tokens=max_new, temperature=0.0)
    for n_prompts, n in shapes:
        prompts = prompts_for(questions, n_prompts)
        reference = samplers["dynamic"](prompts, n, greedy)[1]
        start = time.perf_counter()
        same = [samplers[k](prompts, n, greedy)[1] == reference for k in samplers]
        compile_s = time.perf_counter() - start  # the static shapes' first call compiles
        rate = median_rates(samplers, prompts, n, params, repeats)
        print(
            f"| {n_prompts}x{n} | {'yes' if all(same) else 'NO'} | {compile_s:.1f} | "
            f"{rate['dynamic']:,.0f} | {rate['static']:,.0f} | {rate['static+compile']:,.0f} | "
            f"{rate['static+compile'] / rate['dynamic']:.2f}x |",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "small"])
    parser.add_argument("--shapes", nargs="+", default=["32x8"])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    print(f"{load()}; torch threads {torch.get_num_threads()}")
    print(reference_line(), flush=True)
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes]
    for name in args.models:
        bench_model(name, shapes, args.repeats)  # type: ignore[arg-type]
    print(reference_line())


if __name__ == "__main__":
    main()
