"""Time one GRPO step (online sampling -> reward -> update) on CPU, optionally against TRL.

    OMP_NUM_THREADS=2 python bench/grpo_step.py --config tiny
    OMP_NUM_THREADS=2 python bench/grpo_step.py --config small --vs-trl --pairs 3  # make bench-env
    OMP_NUM_THREADS=2 python bench/grpo_step.py --config tiny --vs-trl --check-only
    OMP_NUM_THREADS=2 python bench/grpo_step.py --config tiny --profile            # where time goes

Each side runs in its own process (so peak RSS is its own) on the same saved model: 1 warm-up
+ 10 timed steps of 8 prompts x G = 8, temperature 1, beta 0.04, eps 0.2, mu 1, lr 1e-5
constant. With --vs-trl each pair runs both sides, ours first in pairs 1, 3, ... and TRL first
in pairs 2, 4, ..., and gives the ratio of median step times ours / TRL. Both workers get the
same OMP_NUM_THREADS and TOKENIZERS_PARALLELISM; each reads back and reports its effective
settings (optimizer, checkpointing, algorithm, dtype, threads, versions), and the run stops
if a setting that must match differs. --check-only prints those settings and times nothing.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpo_bench_common as common
import torch
from bench_models import save_bench_policy
from torch import Tensor, nn

from grpo_core.algo.config import GRPOConfig
from grpo_core.algo.estimators import VERIFIER
from grpo_core.algo.rewards import StepRewards
from grpo_core.algo.step import grpo_step, step_parts
from grpo_core.algo.update import grpo_update
from grpo_core.contracts.policy_batch import PolicyBatch
from grpo_core.contracts.rollout import RolloutBatch, Sampler, SamplingParams
from grpo_core.engines.hf_rollout import HFRolloutEngine
from grpo_core.engines.train import TorchEngine
from grpo_core.model.policy import load_policy

HERE = Path(__file__).resolve().parent
MARK = "BENCH_JSON "
OUR_PHASES = ("generation", "reference", "policy_fwd_bwd", "optimizer", "other")
# TRL's side times generation, reference and policy_fwd (forward + loss; backward not hooked)
PHASES = (*OUR_PHASES[:3], "policy_fwd", *OUR_PHASES[3:])


class TimedEngine(TorchEngine):
    """TorchEngine that adds its forward+backward and optimizer seconds to `times`."""

    times: dict[str, float]

    def forward_logprobs(
        self,
        batch: PolicyBatch,
        temperature: float,
        with_entropy: bool = False,
        logits_chunk_tokens: int | None = None,
        packed: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        start = time.perf_counter()
        out = super().forward_logprobs(
            batch, temperature, with_entropy, logits_chunk_tokens, packed
        )
        self.times["policy_fwd_bwd"] += time.perf_counter() - start
        return out

    def backward(self, loss: Tensor) -> None:
        start = time.perf_counter()
        super().backward(loss)
        self.times["policy_fwd_bwd"] += time.perf_counter() - start

    def step(self) -> float:
        start = time.perf_counter()
        norm = super().step()
        self.times["optimizer"] += time.perf_counter() - start
        return norm


def time_forward(model: nn.Module, times: dict[str, float], key: str) -> None:
    """Add the seconds of every model(...) call to times[key] (hooks, no code change)."""
    started: list[float] = []
    model.register_forward_pre_hook(lambda *_: started.append(time.perf_counter()))

    def done(*_: Any) -> None:
        times[key] += time.perf_counter() - started.pop()

    model.register_forward_hook(done)


@contextmanager
def maybe_profile(enabled: bool) -> Iterator[None]:
    if not enabled:
        yield
        return
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        yield
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
    print(table, file=sys.stderr)


@dataclass
class OurSetup:
    """Everything our step loop runs on, built the way flows/stages/grpo.py builds it."""

    model: nn.Module
    reference: nn.Module
    tokenizer: Any
    algo: GRPOConfig
    engine: TimedEngine
    times: dict[str, float]


def build_ours(cfg: common.BenchConfig, model_dir: Path, compile_models: bool) -> OurSetup:
    """Policy, frozen reference, GRPO settings and engine for `cfg`.

    compile_models: torch.compile (dynamic shapes) the policy and reference first, a what-if
    for how much of the step is kernel-launch overhead; the warm-up step absorbs compiling.
    """
    model, tokenizer = load_policy(model_dir)
    reference, _ = load_policy(model_dir)
    reference.eval().requires_grad_(False)
    if compile_models:
        model.compile(dynamic=True)
        reference.compile(dynamic=True)
    algo = GRPOConfig(
        beta=common.BETA,
        eps_low=common.EPS,
        eps_high=common.EPS,
        loss_agg="seq-mean-token-mean",
        mu=1,
        lr=common.LR,
        lr_schedule="constant",
        max_grad_norm=1.0,
        micro_batch_size=common.PROMPTS_PER_STEP * common.GROUP_SIZE,
        temperature=common.TEMPERATURE,
    )
    engine = TimedEngine(model, algo.optimizer_settings())
    times: dict[str, float] = defaultdict(float)
    engine.times = times
    time_forward(reference, times, "reference")
    return OurSetup(model, reference, tokenizer, algo, engine, times)


def our_settings(setup: OurSetup, cfg: common.BenchConfig) -> dict[str, Any]:
    """Our effective settings, read back from the built objects, in trl_side.py's groups."""
    algo = setup.algo
    checkpointing = {
        **common.checkpointing_facts(setup.model, "model"),
        **common.checkpointing_facts(setup.reference, "reference"),
    }
    return {
        "optimizer": common.optimizer_facts(setup.engine.optimizer),
        "checkpointing": checkpointing,
        "algorithm": {
            "lr": algo.lr,
            "lr_schedule": algo.lr_schedule,
            "max_grad_norm": setup.engine.max_grad_norm,
            "beta": algo.beta,
            "clip_eps": [algo.eps_low, algo.eps_high],
            "mu": algo.mu,
            "num_generations": common.GROUP_SIZE,
            "prompts_per_step": common.PROMPTS_PER_STEP,
            "max_new_tokens": cfg.max_new_tokens,
            "temperature": algo.temperature,
        },
        "dtype": str(next(setup.model.parameters()).dtype),
        "threads": common.thread_settings(torch.get_num_threads(), torch.get_num_interop_threads()),
        "versions": common.versions(),
        "ours": {"loss_agg": algo.loss_agg, "adv_estimator": algo.adv_estimator},
    }


class TimedSampler:
    """A rollout engine that adds its generate seconds to times["generation"]."""

    def __init__(self, engine: Sampler, times: dict[str, float]) -> None:
        self.engine, self.times = engine, times

    def generate(
        self, prompts: list[str], n: int, params: SamplingParams, seed: int
    ) -> RolloutBatch:
        start = time.perf_counter()
        batch = self.engine.generate(prompts, n, params, seed=seed)
        self.times["generation"] += time.perf_counter() - start
        return batch


@dataclass
class BenchUpdate:
    """grpo_update on the timed engine, seeded as the stage's in-process updater seeds it."""

    engine: TimedEngine
    reference: nn.Module
    algo: GRPOConfig

    def update(
        self, batch: PolicyBatch, advantages: Tensor, old_logprobs: Tensor | None, seed: int
    ) -> dict[str, float]:
        generator = torch.Generator().manual_seed(seed)
        return grpo_update(
            self.engine, self.reference, batch, advantages, self.algo, old_logprobs, generator
        )


def arith_rewards(prompts: list[str], batch: RolloutBatch) -> StepRewards:
    """The verifier's 1/0 for each output: the reward both sides use."""
    owners = [prompts[i] for i in batch.prompt_index]
    correct = torch.tensor(
        [common.arith_reward(q, t) for q, t in zip(owners, batch.texts, strict=True)]
    )
    return StepRewards(total=correct, parts={VERIFIER: correct}, rm=None)


def run_ours(
    cfg: common.BenchConfig,
    model_dir: Path,
    profile: bool,
    compile_models: bool = False,
    check_only: bool = False,
) -> dict[str, Any]:
    """Our GRPO step loop, as flows/stages/grpo.py runs it, with per-phase timings and the
    effective settings (only those under check_only)."""
    setup = build_ours(cfg, model_dir, compile_models)
    settings = our_settings(setup, cfg)
    common.check_settings("ours", settings)
    if check_only:
        return {"side": "ours", "settings": settings, "steps": []}
    algo, times = setup.algo, setup.times
    sampler = TimedSampler(
        HFRolloutEngine(setup.model, setup.tokenizer, show_progress=False), times
    )
    policy = BenchUpdate(setup.engine, setup.reference, algo)
    parts = step_parts(
        sampler,
        policy,
        algo,
        group_size=common.GROUP_SIZE,
        max_new_tokens=cfg.max_new_tokens,
        pad_token_id=setup.tokenizer.pad_token_id,
    )
    prompts = common.make_prompts(cfg)
    steps: list[dict[str, Any]] = []
    for step in range(common.WARMUP_STEPS + common.TIMED_STEPS):
        times.clear()
        with maybe_profile(profile and step == common.WARMUP_STEPS):
            start, cpu_start = time.perf_counter(), time.process_time()
            step_prompts = prompts[step * common.PROMPTS_PER_STEP :][: common.PROMPTS_PER_STEP]
            reward = functools.partial(arith_rewards, step_prompts)
            out = grpo_step(parts, step_prompts, reward, seed=step)
            total = time.perf_counter() - start
            cpu_total = time.process_time() - cpu_start
        times["other"] = total - sum(times[k] for k in OUR_PHASES if k != "other")
        steps.append(
            {
                "seconds": total,
                "cpu_seconds": cpu_total,
                **{k: times[k] for k in OUR_PHASES},
                "completion_tokens": sum(len(ids) for ids in out.batch.completion_ids),
                "reward_mean": out.stats["reward_mean"],
                "kl": out.stats["kl"],
            }
        )
    return {
        "side": "ours",
        "settings": settings,
        "steps": steps,
        "peak_rss_mib": common.peak_rss_mib(),
    }


def worker_env() -> dict[str, str]:
    """The environment both workers get: same thread count and tokenizer parallelism, so
    neither side has cores the other lacks."""
    return {
        **os.environ,
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2"),
        "TOKENIZERS_PARALLELISM": os.environ.get(
            "TOKENIZERS_PARALLELISM", common.TOKENIZERS_PARALLELISM
        ),
    }


def run_worker(
    side: str,
    cfg: common.BenchConfig,
    model_dir: Path,
    trl_python: str,
    compile_ours: bool = False,
    check_only: bool = False,
) -> dict:
    """One side in a fresh process; its JSON report (settings, and steps unless check_only)."""
    if side == "ours":
        cmd = [sys.executable, __file__, "--worker", "--config", cfg.name]
        cmd += ["--compile"] if compile_ours else []
    else:
        cmd = [trl_python, str(HERE / "trl_side.py"), "--config", cfg.name]
    cmd += ["--check-only"] if check_only else []
    proc = subprocess.run(
        [*cmd, "--model-dir", str(model_dir)], capture_output=True, text=True, env=worker_env()
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith(MARK)]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise SystemExit(f"{side} worker failed (exit {proc.returncode}): {' '.join(cmd)}")
    report: dict = json.loads(lines[-1][len(MARK) :])
    return report


def show_settings(ours: dict, trl: dict) -> None:
    """Print both sides' effective settings; exit if a setting that must match differs."""
    print(common.format_settings("ours", ours))
    print(common.format_settings("trl", trl))
    mismatches = common.settings_mismatches(ours, trl)
    if mismatches:
        raise SystemExit("sides differ: " + "; ".join(mismatches))
    print(f"settings match on both sides: {', '.join(common.MUST_MATCH)}; checkpointing off")


def versions_line(ours: dict, trl: dict) -> str:
    """Package versions of both environments, `name a / b` where they differ."""
    a, b = ours["versions"], trl["versions"]
    parts = [f"{k} {a[k]}" if a[k] == b[k] else f"{k} {a[k]} / {b[k]}" for k in a]
    return "VERSIONS ours / TRL: " + ", ".join(parts)


def summarize(report: dict) -> dict[str, float]:
    """Medians over the timed steps (the warm-up step is dropped)."""
    timed = report["steps"][common.WARMUP_STEPS :]
    out = {
        "step_s": statistics.median(s["seconds"] for s in timed),
        "cpu_s": statistics.median(s["cpu_seconds"] for s in timed),
        "reward_mean": statistics.fmean(s["reward_mean"] for s in timed),
    }
    for key in PHASES:
        if all(key in s for s in timed):
            out[key] = statistics.median(s[key] for s in timed)
    out["tokens_per_s"] = sum(s["completion_tokens"] for s in timed) / sum(
        s["seconds"] for s in timed
    )
    out["peak_rss_mib"] = report["peak_rss_mib"]
    return out


def describe(report: dict) -> str:
    s = summarize(report)
    split = " / ".join(f"{k} {s[k]:.3f}" for k in PHASES if k in s)
    trend = " ".join(f"{step['reward_mean']:.3f}" for step in report["steps"])
    return (
        f"{report['side']:>4}: median step {s['step_s']:.3f} s wall, {s['cpu_s']:.3f} s CPU "
        f"({split}), {s['tokens_per_s']:.0f} completion tok/s, "
        f"peak RSS {s['peak_rss_mib']:.0f} MiB\n"
        f"      reward per step (warm-up first): {trend} (timed mean {s['reward_mean']:.3f})"
    )


def load() -> str:
    """1-minute load average and core count: other processes inflate wall times."""
    return f"load {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores"


def ratio_without_generation(ours: dict[str, float], trl: dict[str, float]) -> float:
    """(our step - our generation) / TRL's step: the ratio a free sampler would give, i.e. the
    floor that the reference, policy update and optimizer alone put under the ratio."""
    return (ours["step_s"] - ours["generation"]) / trl["step_s"]


def result_line(name: str, pairs: list[tuple[dict[str, float], dict[str, float]]]) -> str:
    """One pasteable line: median ratios over the pairs and the median of each side's figures."""
    med = statistics.median

    def side(i: int, key: str) -> float:
        return med(p[i][key] for p in pairs)

    wall = [a["step_s"] / b["step_s"] for a, b in pairs]
    cpu = [a["cpu_s"] / b["cpu_s"] for a, b in pairs]
    floor = [ratio_without_generation(a, b) for a, b in pairs]
    return (
        f"RESULT {name}: median ratio ours/TRL {med(wall):.2f} wall "
        f"(pairs {' '.join(f'{r:.2f}' for r in wall)}), {med(cpu):.2f} CPU "
        f"(pairs {' '.join(f'{r:.2f}' for r in cpu)}); "
        f"without our generation {med(floor):.2f}; "
        f"step ours {side(0, 'step_s'):.3f} s / "
        f"TRL {side(1, 'step_s'):.3f} s; tok/s ours {side(0, 'tokens_per_s'):.0f} / "
        f"TRL {side(1, 'tokens_per_s'):.0f}; peak RSS ours {side(0, 'peak_rss_mib'):.0f} / "
        f"TRL {side(1, 'peak_rss_mib'):.0f} MiB; timed reward mean ours "
        f"{side(0, 'reward_mean'):.3f} / TRL {side(1, 'reward_mean'):.3f}; "
        f"{time.strftime('%Y-%m-%d %H:%M')}, {load()}"
    )


def run_pair(
    pair: int, cfg: common.BenchConfig, model_dir: Path, args: argparse.Namespace
) -> tuple[dict, dict, list[str]]:
    """Both sides once, ours first on even pairs and TRL first on odd ones, so neither side
    always runs on a cooler or warmer machine (page cache, CPU clocks); reports and order."""
    order = ["ours", "trl"] if pair % 2 == 0 else ["trl", "ours"]
    reports = {
        side: run_worker(side, cfg, model_dir, args.trl_python, args.compile and side == "ours")
        for side in order
    }
    return reports["ours"], reports["trl"], order


def compare(cfg: common.BenchConfig, model_dir: Path, args: argparse.Namespace) -> dict:
    """--vs-trl on one config: settings of both sides, then alternating pairs, then RESULT."""
    pairs: list[tuple[dict[str, float], dict[str, float]]] = []
    record: dict[str, Any] = {"config": cfg.as_dict(), "pairs": []}
    for pair in range(args.pairs):
        before = load()
        ours, trl, order = run_pair(pair, cfg, model_dir, args)
        if pair == 0:
            show_settings(ours["settings"], trl["settings"])
            print(versions_line(ours["settings"], trl["settings"]))
            record["settings"] = {"ours": ours["settings"], "trl": trl["settings"]}
        elif common.settings_mismatches(ours["settings"], trl["settings"]):
            show_settings(ours["settings"], trl["settings"])  # exits, naming what changed
        a, b = summarize(ours), summarize(trl)
        pairs.append((a, b))
        record["pairs"].append({"order": order, "ours": a, "trl": b})
        print(
            f"-- pair {pair + 1} ({' then '.join(order)}): ours/TRL step time "
            f"{a['step_s'] / b['step_s']:.2f} wall, {a['cpu_s'] / b['cpu_s']:.2f} CPU, "
            f"without our generation {ratio_without_generation(a, b):.2f}; peak RSS "
            f"{a['peak_rss_mib'] / b['peak_rss_mib']:.2f} ({before} -> {load()})"
        )
        print(describe(ours))
        print(describe(trl))
    record["result"] = result_line(cfg.name, pairs)
    print(record["result"])
    return record


def check_only(cfg: common.BenchConfig, model_dir: Path, args: argparse.Namespace) -> dict:
    """Build both sides, print and compare their effective settings, time nothing."""
    ours = run_worker("ours", cfg, model_dir, args.trl_python, args.compile, check_only=True)
    trl = run_worker("trl", cfg, model_dir, args.trl_python, check_only=True)
    show_settings(ours["settings"], trl["settings"])
    print(versions_line(ours["settings"], trl["settings"]))
    return {"config": cfg.as_dict(), "settings": {"ours": ours["settings"], "trl": trl["settings"]}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", choices=[*common.CONFIGS, "both"], default="both")
    parser.add_argument("--vs-trl", action="store_true", help="alternate with TRL's GRPOTrainer")
    parser.add_argument(
        "--pairs",
        type=int,
        default=5,
        help="ours/TRL pairs with --vs-trl (>= 5: order and drift average out)",
    )
    parser.add_argument("--repeats", type=int, default=1, help="runs of ours without --vs-trl")
    parser.add_argument("--trl-python", default=str(HERE.parent / ".venv-bench/bin/python"))
    parser.add_argument("--profile", action="store_true", help="torch.profiler of one step")
    parser.add_argument(
        "--compile", action="store_true", help="what-if: torch.compile our policy and reference"
    )
    parser.add_argument(
        "--check-only",
        action="store_true",
        help="with --vs-trl: build both sides, print their effective settings, time nothing",
    )
    parser.add_argument("--json", type=Path, help="with --vs-trl: also write the report here")
    parser.add_argument(
        "--no-reference", action="store_true", help="skip the machine-speed reference"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))

    if args.worker:
        cfg = common.CONFIGS[args.config]
        report = run_ours(cfg, args.model_dir, args.profile, args.compile, args.check_only)
        print(MARK + json.dumps(report))
        return 0
    if args.vs_trl and not Path(args.trl_python).exists():
        raise SystemExit(f"no TRL python at {args.trl_python}: run `make bench-env` first")
    names = list(common.CONFIGS) if args.config == "both" else [args.config]
    env = worker_env()
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {load()}; both workers "
        f"get OMP_NUM_THREADS={env['OMP_NUM_THREADS']} "
        f"TOKENIZERS_PARALLELISM={env['TOKENIZERS_PARALLELISM']}"
    )
    if args.vs_trl and not args.check_only:
        print("pairs alternate the order: odd-numbered pairs run ours first, even-numbered TRL")
    timed = not (args.check_only or args.profile or args.no_reference)
    if timed:  # the machine-speed reference, before and after (bench/machine_speed.py)
        from machine_speed import reference_line

        print(reference_line(), flush=True)
    records = []
    for name in names:
        cfg = common.CONFIGS[name]
        print(f"== {name}: {cfg.as_dict()}")
        with tempfile.TemporaryDirectory(prefix="grpo-bench-") as tmp:
            save_bench_policy(cfg, Path(tmp))
            if args.profile:
                print(describe(run_ours(cfg, Path(tmp), True, args.compile)))
            elif args.vs_trl:
                run = check_only if args.check_only else compare
                records.append(run(cfg, Path(tmp), args))
            else:
                for _ in range(args.repeats):
                    print(
                        describe(run_worker("ours", cfg, Path(tmp), args.trl_python, args.compile))
                    )
    if timed:
        print(reference_line(), flush=True)
    if args.json and records:
        args.json.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M"), "runs": records}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
