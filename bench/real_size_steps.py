"""Sections (c) and (d) of `gpu_real_size.py`: TRL's GRPOTrainer step against ours on the same
model and work in one process, and one whole loop iteration of a 0.5B-shaped policy per stage."""

from __future__ import annotations

import importlib.util
import statistics
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpo_bench_common as common
import torch
from demo_wall import timed_stages
from grpo_step import BenchUpdate
from real_size_common import (
    SHAPES,
    Table,
    build_model,
    peak_gib,
    reset_peak,
    synchronize,
    word_prompts,
    word_tokenizer,
)

from flows.config_files import load_config
from flows.loop import execute_run
from flows.stage_registry import registered
from grpo_core.algo.config import GRPOConfig
from grpo_core.algo.estimators import VERIFIER
from grpo_core.algo.rewards import StepRewards
from grpo_core.algo.step import grpo_step, step_parts
from grpo_core.contracts.rollout import RolloutBatch
from grpo_core.engines.hf_generate import HFGenerateEngine
from grpo_core.engines.train import TorchEngine

if TYPE_CHECKING:
    from gpu_real_size import Bench

STEP_COLUMNS = ["side", "s/step (median)", "completion tokens/step", "tokens/s", "peak GiB"]
LOOP_COLUMNS = ["stage", "iteration", "seconds", "share of the run"]
# What section (c) needs on an offline GPU machine beside itergrpo's own dependencies
TRL_WHEELS = "trl==1.16.0 and datasets==5.2.0 (with dill, multiprocess) as wheels in .whl"


def even_token_share(completions: list[list[int]]) -> list[float]:
    """Reward of each completion: the share of its tokens with an even id (random weights give
    every group a spread of rewards, so no group is skipped for equal rewards)."""
    return [sum(t % 2 == 0 for t in ids) / max(len(ids), 1) for ids in completions]


def trl_section(bench: Bench) -> Table:
    """(c) One GRPO step, ours then TRL's, same model, prompts, G, lengths and settings."""
    sizes = bench.sizes
    table = Table("GRPO step: ours against TRL's GRPOTrainer", STEP_COLUMNS)
    table.notes.append(
        f"{sizes.step_prompts} prompts x G = {sizes.group_size}, {sizes.step_new_tokens} new "
        f"tokens, generation through transformers on both sides; beta {common.BETA}, eps "
        f"{common.EPS}, mu 1, lr {common.LR}, median of {sizes.timed_steps} steps after one"
    )
    shape = SHAPES[sizes.decode_shape]
    prompts = word_prompts(
        sizes.step_prompts * (1 + sizes.timed_steps), sizes.decode_prompt_tokens, shape.vocab
    )
    table.add("ours", *_our_steps(bench, prompts))
    print(table.last_row(), flush=True)
    if importlib.util.find_spec("trl") is None:
        table.add("TRL", "TRL not installed: skipped", "-", "-", "-")
        table.notes.append(f"TRL not installed: skipped (carry {TRL_WHEELS}; bench/README.md)")
        print("TRL not installed: skipped", flush=True)
        return table
    table.add("TRL", *_trl_steps(bench, prompts))
    ours, trl = table.rows[0][1], table.rows[1][1]
    table.notes.append(f"ours / TRL: {float(ours) / float(trl):.2f}x (target <= 0.5x)")  # type: ignore[arg-type]
    return table


def _our_steps(bench: Bench, prompts: list[str]) -> list[object]:
    """grpo_step as the GRPO stage runs it: the hf_generate sampler, grpo_update on a
    TorchEngine; (median seconds, tokens per step, tokens/s, peak GiB)."""
    sizes, dev = bench.sizes, bench.device
    shape = SHAPES[sizes.decode_shape]
    reset_peak(dev)
    model = build_model(shape, dev, bench.dtype)
    reference = build_model(shape, dev, bench.dtype).eval().requires_grad_(False)
    tokenizer = word_tokenizer(shape.vocab)
    rows = sizes.step_prompts * sizes.group_size
    algo = GRPOConfig(
        beta=common.BETA,
        eps_low=common.EPS,
        eps_high=common.EPS,
        lr=common.LR,
        lr_schedule="constant",
        micro_batch_size=rows,
        temperature=common.TEMPERATURE,
    )
    engine = TorchEngine(model, algo.optimizer_settings())
    sampler = HFGenerateEngine(model, tokenizer, rows, show_progress=False)
    parts = step_parts(
        sampler,
        BenchUpdate(engine, reference, algo),  # type: ignore[arg-type]
        algo,
        group_size=sizes.group_size,
        max_new_tokens=sizes.step_new_tokens,
        pad_token_id=tokenizer.pad_token_id,
    )

    def reward(batch: RolloutBatch) -> StepRewards:
        total = torch.tensor(even_token_share(batch.completion_ids))
        return StepRewards(total=total, parts={VERIFIER: total}, rm=None)

    times, tokens = [], []
    for step in range(1 + sizes.timed_steps):
        synchronize(dev)
        start = time.perf_counter()
        out = grpo_step(
            parts, prompts[step * sizes.step_prompts :][: sizes.step_prompts], reward, seed=step
        )
        synchronize(dev)
        if step:
            times.append(time.perf_counter() - start)
            tokens.append(sum(len(ids) for ids in out.batch.completion_ids))
    peak = peak_gib(dev)
    del model, reference, engine, sampler, parts
    reset_peak(dev)
    seconds = statistics.median(times)
    return [seconds, statistics.mean(tokens), statistics.mean(tokens) / seconds, peak]


def _trl_steps(bench: Bench, prompts: list[str]) -> list[object]:
    """TRL's GRPOTrainer on the same model (saved, then loaded by TRL), prompts and work, its
    settings from trl_side.matched_config; steps timed by trl_side.StepClock."""
    from datasets import Dataset
    from trl import GRPOTrainer
    from trl_side import StepClock, matched_config

    sizes, dev = bench.sizes, bench.device
    shape = SHAPES[sizes.decode_shape]
    tokens: list[int] = []

    def reward(
        prompts: list[str], completions: list[str], completion_ids: list[list[int]], **_: Any
    ) -> list[float]:
        tokens.append(sum(len(ids) for ids in completion_ids))
        return even_token_share(completion_ids)

    with tempfile.TemporaryDirectory(prefix="trl-real-size-") as tmp:
        model_dir = Path(tmp) / "model"
        build_model(shape, torch.device("cpu"), bench.dtype).save_pretrained(model_dir)
        tokenizer = word_tokenizer(shape.vocab)
        tokenizer.save_pretrained(model_dir)
        args = matched_config(
            str(Path(tmp) / "out"),
            use_cpu=dev.type == "cpu",
            max_steps=1 + sizes.timed_steps,
            batch=sizes.step_prompts * sizes.group_size,
            group_size=sizes.group_size,
            max_new_tokens=sizes.step_new_tokens,
            bf16=bench.dtype == torch.bfloat16,
        )
        trainer = GRPOTrainer(
            model=str(model_dir),
            reward_funcs=reward,
            args=args,
            train_dataset=Dataset.from_dict({"prompt": prompts}),
            processing_class=tokenizer,
        )
        clock = StepClock()
        trainer.add_callback(clock)
        reset_peak(dev)
        trainer.train()
    seconds = statistics.median(wall for wall, _ in clock.durations()[1:])
    mean_tokens = statistics.mean(tokens[1:])
    return [seconds, mean_tokens, mean_tokens / seconds, peak_gib(dev)]


def loop_overrides(bench: Bench, root: Path) -> tuple[str, list[str]]:
    """The preset and overrides of one loop iteration: on a GPU a tiny-kind policy with
    Qwen2.5-0.5B's transformer shape (character vocabulary) and 512-token outputs; --tiny the
    `micro` preset's policy with the same stage settings at toy counts."""
    new = bench.sizes.loop_new_tokens
    device = bench.device.type
    common_sets = [
        f"store.root={root}",
        "run.run_id=real-size-loop",
        "run.iterations=1",
        f"run.device={device}",
        f"policy.dtype={'bfloat16' if device == 'cuda' else 'float32'}",
        f"policy.max_position_embeddings={new + 256}",
        "warm_start.steps=4",
        "warm_start.eval_prompts=0",
        # a few warm-start steps leave every output wrong: the label guards would stop the run
        *(f"guards.{guard}=warn" for guard in ("rm_labels", "rm_auroc", "over_optimisation")),
        *(
            f"{stage}.max_new_tokens={new}"
            for stage in ("rollout", "labelling", "grpo", "evaluation")
        ),
    ]
    if device == "cpu":
        return "micro", [*common_sets, "grpo.steps=1", "rollout.prompts=4"]
    shape = SHAPES["0.5B"]
    return "demo", [
        *common_sets,
        f"policy.n_layers={shape.layers}",
        f"policy.hidden_size={shape.hidden}",
        f"policy.intermediate_size={shape.mlp}",
        f"policy.n_heads={shape.heads}",
        f"policy.n_kv_heads={shape.kv_heads}",
        "rollout.prompts=64",
        "labelling.prm_outputs=32",
        "reward_models.epochs=1",
        "reward_models.eval_prompts=8",
        "grpo.steps=2",
        "grpo.prompts_per_step=16",
        "grpo.checkpoint_every=2",
        "grpo.algo.micro_batch_size=32",
        "evaluation.n_prompts=64",
        "evaluation.n_samples=4",
    ]


def loop_section(bench: Bench) -> Table:
    """(d) One iteration of the loop through flows.loop.execute_run, wall of each stage."""
    table = Table("One loop iteration: wall per stage", LOOP_COLUMNS)
    times: dict[tuple[str, int], tuple[float, float]] = {}
    with tempfile.TemporaryDirectory(prefix="real-size-loop-") as root:
        preset, overrides = loop_overrides(bench, Path(root))
        cfg = load_config(preset, overrides)
        start = time.perf_counter()
        with registered(*timed_stages(times)):
            execute_run(cfg)
        wall = time.perf_counter() - start
    table.notes.append(f"preset {preset} with {' '.join(overrides[1:])}; whole run {wall:.1f} s")
    for (stage, iteration), (begin, end) in sorted(times.items(), key=lambda kv: kv[1][0]):
        table.add(stage, iteration, end - begin, f"{100 * (end - begin) / wall:.1f}%")
    return table
