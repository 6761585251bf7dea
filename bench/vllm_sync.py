"""Policy weights into the vLLM worker, disk vs in memory, side by side in one run.

For each model (the demo's tiny policy, the 25M `small` bench model, SmolLM2-135M when its
package is installed) one worker starts on the model; then, alternately, `disk` (the GRPO
stage's fallback: save_pretrained to a scratch checkpoint + the worker's reload) and `memory`
(the tensors broadcast over the gloo process group into vLLM's weight loader) each sync a
perturbed copy of the weights. Prints seconds per sync (median of --reps), bytes moved, the
bandwidth reached and, by arithmetic, what it implies for 1.5B and 7B parameters in bf16.
After the last memory sync, greedy tokens must equal those after a disk reload of the same
weights. Needs `make vllm-env`.

    .venv/bin/python bench/vllm_sync.py [--reps 5] [--models tiny,small,smollm2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from grpo_bench_common import CONFIGS
from transformers import PreTrainedModel

from flows.model_io import save_model
from grpo_core.contracts.rollout import SamplingParams
from grpo_core.engines.vllm_rollout import VLLMRolloutEngine
from grpo_core.engines.weight_sync import WeightSender, manifest, unique_tensors
from grpo_core.model.config import PolicyConfig
from grpo_core.model.policy import build_char_tokenizer, create_tiny_policy, load_policy

WORKER_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
LLM_KWARGS = {"enforce_eager": True, "max_model_len": 256}
EXTRAPOLATE = {"1.5B": 1.5e9, "7B": 7e9}  # parameters; bf16: 2 bytes each


def make_model(name: str, root: Path) -> Path | None:
    """A checkpoint directory for `name`, or None (with a message) when it is unavailable."""
    tok = build_char_tokenizer()
    if name == "tiny":  # the demo's policy, 2 heads (vLLM on CPU needs head_dim 64)
        model = create_tiny_policy(PolicyConfig(n_heads=2), tok)
    elif name == "small":
        c = CONFIGS["small"]
        shape = PolicyConfig(
            n_layers=c.n_layers,
            hidden_size=c.hidden_size,
            n_heads=c.n_heads,
            intermediate_size=c.intermediate_size,
        )
        model = create_tiny_policy(shape, tok)
    else:
        try:
            from grpo_core.model.smollm2 import smollm2_path

            return smollm2_path()
        except (ImportError, FileNotFoundError) as err:
            print(f"smollm2: skipped, not available locally ({err})")
            return None
    model.save_pretrained(root / name)
    tok.save_pretrained(root / name)
    return root / name


def perturbed(model: PreTrainedModel, rep: int) -> dict[str, torch.Tensor]:
    """The model's weights plus a small seeded change (a new policy for every sync)."""
    gen = torch.Generator().manual_seed(rep)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 1e-3)
    return dict(model.state_dict())


# Rank 1 that receives the manifest's tensors and drops them: the transfer alone, no vLLM.
RECEIVER = """
import json, sys, torch, torch.distributed as dist
from datetime import timedelta
from grpo_core.engines.weight_sync import make_group
port, reps, items = int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.stdin.read())
t = timedelta(seconds=120)
group = make_group(dist.TCPStore("127.0.0.1", port, 2, is_master=False, timeout=t), 1, "gloo", t)
for _ in range(reps):
    for name, dtype, shape in items:
        group.broadcast(torch.empty(shape, dtype=getattr(torch, dtype)), 0).wait()
"""


def transfer_only(weights: dict[str, torch.Tensor], reps: int) -> float:
    """Median seconds to broadcast `weights` to a bare receiver process over gloo."""
    sender = WeightSender(timeout_s=120)
    cmd = [sys.executable, "-c", RECEIVER, str(sender.port), str(reps)]
    receiver = subprocess.Popen(cmd, stdin=subprocess.PIPE, text=True)
    assert receiver.stdin is not None
    receiver.stdin.write(json.dumps(manifest(weights)))
    receiver.stdin.close()
    sender.connect("gloo")
    secs = []
    for _ in range(reps):
        start = time.perf_counter()
        sender.send(weights)
        secs.append(time.perf_counter() - start)
    receiver.wait(timeout=120)
    return statistics.median(secs)


def greedy(engine: VLLMRolloutEngine) -> list[list[int]]:
    prompts = ["Q: 3+4-2=?\nA:", "Q: 12-7=?\nA:"]
    return engine.generate(prompts, 1, SamplingParams(16, 0.0), seed=0).completion_ids


def bench_model(name: str, ckpt: Path, scratch: Path, reps: int) -> dict[str, float]:
    model, tok = load_policy(ckpt)
    weights = unique_tensors(dict(model.state_dict()))
    payload = sum(t.numel() * t.element_size() for t in weights.values())
    params = sum(t.numel() for t in weights.values())
    secs: dict[str, list[float]] = {"disk": [], "memory": []}
    disk_bytes = 0
    with VLLMRolloutEngine(ckpt, dtype="float32", llm_kwargs=LLM_KWARGS, env=WORKER_ENV) as engine:
        engine.update_weights(weights)  # sets the group up (not timed: once per run)
        for rep in range(reps):
            state = perturbed(model, rep)
            for path in ("disk", "memory") if rep % 2 == 0 else ("memory", "disk"):
                start = time.perf_counter()
                if path == "disk":
                    save_model(scratch / name, model, tok, state)
                    engine.reload(scratch / name)
                else:
                    engine.update_weights(state)
                secs[path].append(time.perf_counter() - start)
            disk_bytes = sum(f.stat().st_size for f in (scratch / name).glob("*.safetensors"))
        engine.update_weights(state)
        after_memory = greedy(engine)
        engine.reload(scratch / name)
        if greedy(engine) != after_memory:
            raise AssertionError(f"{name}: greedy tokens after a memory sync differ from disk")
    disk_s, mem_s = statistics.median(secs["disk"]), statistics.median(secs["memory"])
    gloo_s = transfer_only(weights, reps)
    print(
        f"{name:8s} {params / 1e6:8.2f}M  disk {disk_s:7.3f} s ({2 * disk_bytes / 1e6:8.1f} MB "
        f"written+read, {payload / disk_s / 1e6:7.1f} MB/s)  memory {mem_s:7.3f} s "
        f"({payload / 1e6:8.1f} MB sent, {payload / mem_s / 1e6:7.1f} MB/s)  "
        f"speed-up {disk_s / mem_s:5.1f}x  [min/max disk {min(secs['disk']):.3f}/"
        f"{max(secs['disk']):.3f}, memory {min(secs['memory']):.3f}/{max(secs['memory']):.3f}]"
    )
    print(
        f"{'':8s} gloo transfer alone (no vLLM load, median of {reps}): {gloo_s:.3f} s, "
        f"{payload / gloo_s / 1e6:.1f} MB/s"
    )
    return {"disk_bw": payload / disk_s, "memory_bw": payload / mem_s, "gloo_bw": payload / gloo_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5, help="syncs per path and model")
    parser.add_argument("--models", default="tiny,small,smollm2")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(max(1, (os.cpu_count() or 1)))
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}; "
        f"worker fp32 on CPU (vllm-cpu), gloo group on 127.0.0.1; median of {args.reps}"
    )
    results = {}
    with tempfile.TemporaryDirectory(prefix="vllm-sync-bench-") as tmp:
        root = Path(tmp)
        for name in args.models.split(","):
            ckpt = make_model(name, root)
            if ckpt is not None:
                results[name] = bench_model(name, ckpt, root / "scratch", args.reps)
    if not results:
        return
    largest = list(results.values())[-1]
    print("extrapolation (arithmetic: bf16 bytes / bandwidth of the largest model measured):")
    for label, n in EXTRAPOLATE.items():
        size = 2 * n
        print(
            f"  {label}: {size / 1e9:.1f} GB per sync -> disk ~{size / largest['disk_bw']:.1f} s, "
            f"memory ~{size / largest['memory_bw']:.1f} s (gloo transfer alone "
            f"~{size / largest['gloo_bw']:.1f} s) on this CPU"
        )


if __name__ == "__main__":
    main()
