"""Throughput of the GRPO policy update on one CUDA GPU: tokens/s, TFLOP/s and MFU.

    python bench/gpu_update.py                  # fp32 torch engine vs DeepSpeed ZeRO-2 bf16
    python bench/gpu_update.py --peak-tflops 989  # MFU against another peak
    python bench/gpu_update.py --zero-stages 0 2 --profile  # where one update's time goes

The model is a Llama made on the GPU from a config (no download) with Qwen2.5-0.5B's shape:
24 layers, hidden 896, MLP 4864, 14 query and 2 key/value heads, vocabulary 151936, tied
embeddings (494M parameters). One update = the reference
forward pass plus mu = 1 epoch of forward + backward + AdamW over 64 sequences of a 64-token
prompt and a 192-token completion (at mu = 1 with one mini-batch pi_old is the detached
current policy: no pass of its own). FLOPs are counted as 2 N per token for each forward-only
pass and 6 N per token for the training pass (N = parameters; real_size_common.update_flops),
the usual estimate that leaves attention's quadratic term out. MFU = achieved / peak, where
peak is the dense bf16 figure of the GPU (H100 SXM 989, H200 989, A100 312 TFLOP/s) for both
rows: the fp32 row's low MFU is what training in fp32 leaves on the table. Without CUDA it
says so and exits 0.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from importlib.util import find_spec

import torch
from real_size_common import peak_tflops, update_flops, update_passes
from transformers import LlamaConfig, LlamaForCausalLM

from grpo_core.algo.config import GRPOConfig
from grpo_core.algo.update import grpo_update
from grpo_core.contracts.policy_batch import PolicyBatch, build_policy_batch
from grpo_core.contracts.training import OptimizerSettings, TrainEngine
from grpo_core.engines.config import DeepSpeedConfig
from grpo_core.engines.train import TorchEngine

ROWS, PROMPT, COMPLETION = 64, 64, 192
VOCAB = 151936


def build_model(device: str = "cuda", seed: int = 0) -> LlamaForCausalLM:
    """The 0.5B Llama, initialised where it will run (a CPU init of 494M weights takes
    longer than the timed updates)."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    )
    with torch.device(device):
        return LlamaForCausalLM(cfg)


def make_batch() -> tuple[PolicyBatch, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, VOCAB, (PROMPT,), generator=gen).tolist() for _ in range(ROWS)]
    completions = [
        torch.randint(1, VOCAB, (COMPLETION,), generator=gen).tolist() for _ in range(ROWS)
    ]
    batch = build_policy_batch(prompts, completions, pad_id=0, padding_side="left")
    advantages = batch.expand_per_sequence(torch.randn(ROWS, generator=gen))
    return batch, advantages


def update_inputs(micro_batch: int) -> tuple[GRPOConfig, PolicyBatch, torch.Tensor]:
    cfg = GRPOConfig(lr=1e-6, beta=0.04, micro_batch_size=micro_batch, mini_batches_per_epoch=1)
    batch, advantages = make_batch()
    device = torch.device("cuda")
    return cfg, batch.to(device), advantages.to(device)


def time_updates(
    engine: TrainEngine, ref: torch.nn.Module, repeats: int, micro_batch: int
) -> list[float]:
    cfg, batch, advantages = update_inputs(micro_batch)
    times = []
    for i in range(repeats + 1):  # the first update warms up kernels and the allocator
        torch.cuda.synchronize()
        start = time.perf_counter()
        grpo_update(engine, ref, batch, advantages, cfg)
        torch.cuda.synchronize()
        if i:
            times.append(time.perf_counter() - start)
    return times


def profile_update(
    engine: TrainEngine, ref: torch.nn.Module, micro_batch: int, top: int = 12
) -> None:
    """One more update under torch.profiler: its top ops by self CUDA time, and how much of
    the update's wall the GPU was busy (the rest is the host: Python, launches, syncs)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cfg, batch, advantages = update_inputs(micro_batch)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        grpo_update(engine, ref, batch, advantages, cfg)
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    events = prof.key_averages()
    # kernels only, as the table's "Self CUDA %" totals them: an op's row repeats its kernels'
    busy = sum(e.self_device_time_total for e in events if e.device_type == DeviceType.CUDA) / 1e6
    print(f"  profiled update: wall {wall:.3f} s, GPU busy {busy:.3f} s ({100 * busy / wall:.0f}%)")
    print(events.table(sort_by="self_cuda_time_total", row_limit=top, max_name_column_width=48))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed updates per row")
    parser.add_argument("--peak-tflops", type=float, default=None, help="dense bf16 peak")
    parser.add_argument(
        "--micro-batch", type=int, nargs="+", default=[8, 32], help="rows per forward pass"
    )
    parser.add_argument(
        "--zero-stages", type=int, nargs="+", default=[2], help="ZeRO stages of the bf16 rows"
    )
    parser.add_argument("--profile", action="store_true", help="profile one update per row")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(f"gpu_update: no CUDA device visible (torch {torch.__version__}); nothing to time")
        return 0
    peak = peak_tflops(torch.device("cuda"), args.peak_tflops)
    n_params = sum(p.numel() for p in build_model("meta").parameters())
    tokens = ROWS * (PROMPT + COMPLETION)
    algo = GRPOConfig(beta=0.04, mini_batches_per_epoch=1)  # update_inputs' passes
    flops = update_flops(n_params, tokens, *update_passes(algo.beta, algo.mu, 1))
    tf32 = torch.backends.cuda.matmul.allow_tf32
    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}, peak {peak} TFLOP/s")
    print(f"fp32 matmuls in TF32: {tf32} (torch's default; the fp32 row is plain fp32 if False)")
    print(f"model: Llama {n_params / 1e6:.1f}M parameters; update: {ROWS} x {tokens // ROWS} tok")
    rows = []
    kinds: list[tuple[str, int | None]] = [("torch fp32", None)]  # (name, ZeRO stage)
    if find_spec("deepspeed") is not None:
        kinds += [(f"DeepSpeed ZeRO-{z} bf16", z) for z in args.zero_stages]
    engines = [(f"{kind}, micro {m}", zero, m) for kind, zero in kinds for m in args.micro_batch]
    for name, zero, micro_batch in engines:
        model = build_model()
        ref = build_model().eval()
        engine: TrainEngine
        if zero is not None:
            from grpo_core.engines.deepspeed_engine import DeepSpeedEngine

            config = DeepSpeedConfig(zero_stage=zero, bf16=True)
            engine = DeepSpeedEngine(model, OptimizerSettings(lr=1e-6), config=config)
            ref = ref.to(torch.bfloat16)
        else:
            engine = TorchEngine(model, OptimizerSettings(lr=1e-6))
        torch.cuda.reset_peak_memory_stats()
        median = statistics.median(time_updates(engine, ref, args.repeats, micro_batch))
        tflops = flops / median / 1e12
        mfu = f"{100 * tflops / peak:.1f}%" if peak else "-"
        memory = torch.cuda.max_memory_allocated() / 2**30
        rows.append((name, median, tokens / median, tflops, mfu, memory))
        if args.profile:
            print(name)
            profile_update(engine, ref, micro_batch)
        del engine, model, ref
        torch.cuda.empty_cache()
    print(f"{'engine':<34} {'s/update':>9} {'tokens/s':>10} {'TFLOP/s':>8} {'MFU':>6} {'GiB':>6}")
    for name, median, tps, tflops, mfu, memory in rows:
        print(f"{name:<34} {median:>9.3f} {tps:>10.0f} {tflops:>8.1f} {mfu:>6} {memory:>6.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
