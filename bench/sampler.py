"""Completion tokens per second of our in-process sampler (HFRolloutEngine: own decode loop,
preallocated KV cache, each prompt prefilled once for its G samples, finished rows dropped,
the lean Llama decode step) against the same loop through the model's HF forward and against
transformers' `model.generate`, on the same prompts, model and settings.

    OMP_NUM_THREADS=2 .venv/bin/python bench/sampler.py                 # tiny, small, smollm2
    OMP_NUM_THREADS=2 .venv/bin/python bench/sampler.py --models tiny --shapes 32x8

Shapes are prompts x samples per prompt, as the stages draw them: 8x8 is bench/grpo_step.py's
step, 32x8 the demo's GRPO step (grpo.prompts_per_step x group_size) and 64x4 the drift
measurement's batch; the demo's rollout and evaluation stages sample 512x8 and 300x8 in
1024-row passes (rollout.batch_size). Temperature 1, top-p 1, no top-k on both sides. Each
figure is the median of `--repeats` timed calls (after one untimed warm-up), the two
samplers alternating. Before any timing, greedy decoding (temperature 0) of the same prompts
is compared token for token. The machine-speed reference (bench/machine_speed.py) is
measured before and after.

Two floors per shape, as tokens per second if every decode step cost only that (all rows
still decoding, so upper bounds): one forward pass of the model at batch size B = rows over
one token each (no cache), and the model's weight matmuls alone at M = B; the last column is
ours as a share of the matmul floor.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import grpo_bench_common as common
import torch
from bench_models import bench_policy
from machine_speed import load, reference_line
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from grpo_core.contracts.rollout import SamplingParams
from grpo_core.engines.hf_rollout import HFRolloutEngine, left_padded, stop_token_ids
from grpo_core.model.policy import (
    encode_prompt,
    ensure_pad_token,
)

MODELS = ("tiny", "small", "smollm2")
DEFAULT_SHAPES = ("8x8", "32x8", "64x4")
# (prompts, samples per prompt, params) -> (completion tokens, completion ids per row)
Sampler = Callable[[list[str], int, SamplingParams], tuple[int, list]]


def build(name: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, int, list[str]]:
    """The model, its tokenizer, max new tokens and the bench's prompts for `name`."""
    if name == "smollm2":
        from grpo_core.model.policy import load_policy
        from grpo_core.model.smollm2 import smollm2_path

        model, tokenizer = load_policy(str(smollm2_path()))
        questions = common.make_prompts(common.CONFIGS["small"], seed=0)
        return model, tokenizer, 48, questions
    cfg = common.CONFIGS[name]
    model, tokenizer = bench_policy(cfg)
    return model, tokenizer, cfg.max_new_tokens, common.make_prompts(cfg, seed=0)


def prompts_for(questions: list[str], n_prompts: int) -> list[str]:
    """`n_prompts` prompts, cycling the bench's questions."""
    return [questions[i % len(questions)] for i in range(n_prompts)]


def _until_stop(row: list[int], stop_ids: list[int]) -> list[int]:
    """A generated row up to and including its first stop token."""
    for t, token in enumerate(row):
        if token in stop_ids:
            return row[: t + 1]
    return row


class HFGenerate:
    """transformers' sampling: left-padded prompts, num_return_sequences = samples."""

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.stop_ids = stop_token_ids(tokenizer, getattr(model, "generation_config", None))

    def __call__(self, prompts: list[str], n: int, params: SamplingParams) -> tuple[int, list]:
        pad = self.tokenizer.pad_token_id
        ids, mask = left_padded([encode_prompt(self.tokenizer, p) for p in prompts], pad)
        width = ids.shape[1]
        sampling = (
            {"do_sample": True, "temperature": params.temperature, "top_k": 0, "top_p": 1.0}
            if params.temperature > 0
            else {"do_sample": False}
        )
        with torch.inference_mode():
            out = self.model.generate(  # type: ignore[operator]
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=params.max_new_tokens,
                num_return_sequences=n,
                pad_token_id=pad,
                eos_token_id=self.stop_ids,
                **sampling,
            )
        rows = [_until_stop(row, self.stop_ids) for row in out[:, width:].tolist()]
        return sum(len(r) for r in rows), rows


def ours(engine: HFRolloutEngine) -> Sampler:
    def sample(prompts: list[str], n: int, params: SamplingParams) -> tuple[int, list]:
        batch = engine.generate(prompts, n, params, seed=0)
        return sum(len(c) for c in batch.completion_ids), batch.completion_ids

    return sample


def timed(sample: Sampler, prompts: list[str], n: int, params: SamplingParams) -> tuple[float, int]:
    start = time.perf_counter()
    tokens, _ = sample(prompts, n, params)
    return time.perf_counter() - start, tokens


def median_rates(
    samplers: dict[str, Sampler],
    prompts: list[str],
    n: int,
    params: SamplingParams,
    repeats: int,
) -> dict[str, float]:
    """Each sampler's median tokens/s over `repeats` calls, in alternating order (forward,
    then reversed) so drift in machine speed falls on every sampler alike."""
    rates: dict[str, list[float]] = {k: [] for k in samplers}
    for repeat in range(repeats):
        order = list(samplers) if repeat % 2 == 0 else list(reversed(samplers))
        for key in order:
            wall, tokens = timed(samplers[key], prompts, n, params)
            rates[key].append(tokens / wall)
    return {k: statistics.median(v) for k, v in rates.items()}


def _median_seconds(call: Callable[[], object], repeats: int) -> float:
    call()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def decode_floors(model: PreTrainedModel, rows: int, repeats: int = 20) -> tuple[float, float]:
    """Seconds of two floors under one decode step of `rows` rows: the model's own forward
    pass at batch size `rows` over one token each (no cache: what a decode step at least
    computes, with HF's per-call cost), and its weight matrices' matmuls alone at M = `rows`
    (the compute no decode loop can skip)."""
    ids = torch.ones(rows, 1, dtype=torch.long)
    weights = [
        p for n, p in model.named_parameters() if p.dim() == 2 and "embed" not in n
    ]  # every Linear's weight (the LM head included; a tied head shares the embedding's)
    if model.get_output_embeddings() is not None and not any(
        w is model.get_output_embeddings().weight for w in weights
    ):
        weights.append(model.get_output_embeddings().weight)
    inputs = {w.shape[1]: torch.randn(rows, w.shape[1]) for w in weights}

    def forward() -> object:
        with torch.inference_mode():
            return model(input_ids=ids, use_cache=False)

    def matmuls() -> object:
        with torch.inference_mode():
            return [torch.nn.functional.linear(inputs[w.shape[1]], w) for w in weights]

    return _median_seconds(forward, repeats), _median_seconds(matmuls, repeats)


def bench_model(name: str, shapes: list[tuple[int, int]], repeats: int) -> None:
    model, tokenizer, max_new, questions = build(name)
    ensure_pad_token(tokenizer)
    model.eval()
    n_params = sum(p.numel() for p in model.parameters()) / 1e6
    engines = {
        lean: HFRolloutEngine(model, tokenizer, 256, show_progress=False, lean_decode=lean)
        for lean in (True, False)
    }
    samplers: dict[str, Sampler] = {
        "ours": ours(engines[True]),
        "ours, HF forward": ours(engines[False]),
        "generate": HFGenerate(model, tokenizer),
    }
    greedy = SamplingParams(max_new_tokens=max_new, temperature=0.0)
    probe = prompts_for(questions, 8)
    reference = samplers["generate"](probe, 1, greedy)[1]
    same = all(samplers[k](probe, 1, greedy)[1] == reference for k in ("ours", "ours, HF forward"))
    lean = (
        "lean decode step" if engines[True].uses_lean_decode() else "HF forward (not a plain Llama)"
    )
    print(
        f"\n## {name}: {n_params:.1f}M parameters, <= {max_new} new tokens, ours decodes with the "
        f"{lean}; greedy tokens of both our loops identical to generate's on 8 prompts: "
        f"{'yes' if same else 'NO'}"
    )
    print(
        "| shape | rows | ours tok/s | ours, HF forward tok/s | generate tok/s | "
        "ours / generate | ours / ours with HF forward | floor: a forward at B tok/s | "
        "floor: its matmuls tok/s | ours / matmul floor |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    params = SamplingParams(max_new_tokens=max_new, temperature=1.0)
    for n_prompts, n in shapes:
        prompts = prompts_for(questions, n_prompts)
        for sample in samplers.values():  # untimed warm-up
            sample(prompts[: min(4, n_prompts)], n, params)
        rate = median_rates(samplers, prompts, n, params, repeats)
        rows = n_prompts * n
        # every step at full batch: the floors' tokens per second are upper bounds
        forward_s, matmuls_s = decode_floors(model, rows)
        print(
            f"| {n_prompts}x{n} | {rows} | {rate['ours']:,.0f} | "
            f"{rate['ours, HF forward']:,.0f} | {rate['generate']:,.0f} | "
            f"{rate['ours'] / rate['generate']:.2f}x | "
            f"{rate['ours'] / rate['ours, HF forward']:.2f}x | {rows / forward_s:,.0f} | "
            f"{rows / matmuls_s:,.0f} | {rate['ours'] * matmuls_s / rows:.2f} |",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--shapes", nargs="+", default=list(DEFAULT_SHAPES))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    shapes = [(int(s.split("x")[0]), int(s.split("x")[1])) for s in args.shapes]
    print(f"{load()}; torch threads {torch.get_num_threads()}")
    print(reference_line(), flush=True)
    for name in args.models:
        bench_model(name, shapes, args.repeats)
    print()
    print(reference_line())


if __name__ == "__main__":
    main()
