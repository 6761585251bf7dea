"""Math-Shepherd labelling cost per labelled step, HF engine and (when present) vLLM.

    OMP_NUM_THREADS=2 .venv/bin/python bench/labeling.py                # demo settings
    OMP_NUM_THREADS=2 .venv/bin/python bench/labeling.py --outputs 32 --warm-steps 100

Settings come from the `demo` preset (built-in arithmetic task, tiny policy, N = 4 completions
per step prefix, 48 new tokens, engine batch 64). The tiny policy is first warm-started
(`--warm-steps` SFT steps, not timed) so its outputs have steps and its completions stop;
then `--outputs` outputs (prompts x G = 4) are sampled and labelled exactly as the `label`
stage does it (`prm_labels_monte_carlo`: one `generate` call over every non-final step
prefix). Printed per engine: labelled steps (the final step of each output is labelled by the
verifier, so it generates nothing), completions generated, completion tokens, seconds, and
seconds per labelled step. vLLM (`make vllm-env`) runs with prefix caching on, once cold (its
first call also pays vLLM's lazy warm-up) and once more on the same prefixes; its worker start
is reported apart, and its CPU time is in the worker, not in this process.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from flows.config_files import load_config
from grpo_core.contracts.rollout import RolloutBatch, Sampler, SamplingParams
from grpo_core.data.reasoning_steps import split_steps
from grpo_core.data.tasks.registry import make_task
from grpo_core.engines.hf_rollout import HFRolloutEngine
from grpo_core.model.policy import build_policy
from grpo_core.model.prompts import Prompter
from grpo_core.model.warm_start import warm_start
from reward_models.config import LabellingConfig
from reward_models.labelling import LabelledSample, PrmLabel, prm_labels_monte_carlo

GROUP = 4  # outputs per prompt, as the demo's rollout stage samples them


@dataclass
class CountingEngine:
    """A sampler that counts what the wrapped engine generated."""

    inner: Any
    completions: int = 0
    tokens: int = 0
    calls: list[float] = field(default_factory=list)

    def generate(
        self, prompts: list[str], n: int, params: SamplingParams, seed: int
    ) -> RolloutBatch:
        start = time.perf_counter()
        batch: RolloutBatch = self.inner.generate(prompts, n, params, seed)
        self.calls.append(time.perf_counter() - start)
        self.completions += len(batch)
        self.tokens += sum(len(ids) for ids in batch.completion_ids)
        return batch


def load() -> str:
    return f"load {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores"


def sample_outputs(
    engine: Sampler, tokenizer: Any, task: Any, n_prompts: int, max_new_tokens: int
) -> list[LabelledSample]:
    """G outputs per test prompt from the policy, as the rollout stage would store them."""
    problems = task.problems("test", n_prompts, 1)
    texts = [Prompter(tokenizer)(p.question) for p in problems]
    batch = engine.generate(texts, GROUP, SamplingParams(max_new_tokens=max_new_tokens), seed=0)
    return [
        LabelledSample(
            problem=problems[i],
            prompt_text=texts[i],
            completion=text,
            completion_ids=list(tokenizer(text, add_special_tokens=False)["input_ids"]),
            sample_index=r % GROUP,
        )
        for r, (i, text) in enumerate(zip(batch.prompt_index, batch.texts, strict=True))
    ]


def label(
    name: str,
    engine: Any,
    tokenizer: Any,
    task: Any,
    samples: list[LabelledSample],
    cfg: LabellingConfig,
) -> list[PrmLabel]:
    counting = CountingEngine(engine)
    start, cpu = time.perf_counter(), time.process_time()
    rows = prm_labels_monte_carlo(counting, tokenizer, task, samples, cfg, seed=0)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    mc = sum(r.n_completions > 0 for r in rows)
    print(
        f"RESULT labeling {name}: {len(samples)} outputs, {len(rows)} labelled steps "
        f"({mc} by Monte Carlo), {counting.completions} completions "
        f"({counting.completions / max(len(rows), 1):.2f} per labelled step), "
        f"{counting.tokens} completion tokens, {seconds:.2f} s wall ({cpu:.2f} s CPU of this "
        f"process) = {seconds / max(len(rows), 1) * 1000:.1f} ms per labelled step, "
        f"{counting.tokens / seconds:.0f} tok/s; {time.strftime('%Y-%m-%d %H:%M')}, {load()}"
    )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="demo", help="preset or YAML for task/policy/labelling")
    parser.add_argument("--outputs", type=int, default=64, help="outputs to label (x4 per prompt)")
    parser.add_argument("--warm-steps", type=int, default=100, help="SFT steps first (untimed)")
    parser.add_argument("--vllm-python", help="python of a vLLM env (default: .venv-vllm)")
    args = parser.parse_args(argv)
    threads = int(os.environ.get("OMP_NUM_THREADS", "2"))
    torch.set_num_threads(threads)
    cfg = load_config(args.config)
    lab = cfg.labelling
    print(
        f"torch {torch.__version__}, {threads} threads, {load()}; labelling: N = "
        f"{lab.n_completions}, max_new_tokens {lab.max_new_tokens}, batch {lab.batch_size}"
    )
    task = make_task(cfg.task)
    model, tokenizer = build_policy(cfg.policy)
    warm_cfg = cfg.warm_start.model_copy(update={"steps": args.warm_steps, "eval_prompts": 0})
    warm = warm_start(model, tokenizer, task, warm_cfg, progress=False)
    print(f"warm start: {warm['steps']} steps in {warm['seconds']:.1f} s (not counted)")
    model.eval()
    hf = HFRolloutEngine(model, tokenizer, batch_size=lab.batch_size, show_progress=False)
    samples = sample_outputs(
        hf, tokenizer, task, -(-args.outputs // GROUP), cfg.grpo.max_new_tokens
    )
    steps = [len(split_steps(s.completion)) for s in samples]
    print(f"{len(samples)} outputs sampled, {sum(steps) / len(steps):.1f} steps each")
    hf_rows = label("hf", hf, tokenizer, task, samples, lab)

    from grpo_core.contracts.errors import SettingError
    from grpo_core.engines.vllm_env import find_vllm_python
    from grpo_core.engines.vllm_rollout import VLLMRolloutEngine

    try:
        python = find_vllm_python(args.vllm_python)
    except SettingError as missing:
        print(f"SKIP labeling vllm: {missing}")
        return 0
    with tempfile.TemporaryDirectory(prefix="labeling-bench-") as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        start = time.perf_counter()
        with VLLMRolloutEngine(
            Path(tmp),
            dtype="float32",
            llm_kwargs={"enable_prefix_caching": True, "enforce_eager": True},
            python=python,
            env={"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"},
            log_path=Path(tmp) / "vllm-worker.log",
        ) as vllm:
            print(
                f"vllm {vllm.vllm_version}: worker start {time.perf_counter() - start:.1f} s "
                f"(not counted)"
            )
            rows = label("vllm (prefix caching, cold)", vllm, tokenizer, task, samples, lab)
            label("vllm (prefix caching, same prefixes again)", vllm, tokenizer, task, samples, lab)
    agree = sum(a.hard_label == b.hard_label for a, b in zip(hf_rows, rows, strict=True))
    print(f"hard labels equal between HF and vLLM: {agree}/{len(rows)} (sampling differs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
