"""What both sides of `grpo_step.py --vs-trl` share: configs, prompts, reward, RSS, and the
read-back of effective settings (optimizer, checkpointing, threads, versions).

Standard library only (torch objects are passed in and read by attribute): TRL's side
imports it from its own venv, which lacks itergrpo.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import random
import re
import resource
import warnings
from dataclasses import asdict, dataclass
from typing import Any

PROMPTS_PER_STEP = 8
GROUP_SIZE = 8
WARMUP_STEPS = 1
TIMED_STEPS = 10
TEMPERATURE = 1.0
BETA = 0.04
EPS = 0.2
LR = 1e-5
_INT = re.compile(r"-?\d+")


@dataclass(frozen=True)
class BenchConfig:
    """A fixed benchmark setting: the Llama shape, prompt length and completion length."""

    name: str
    n_layers: int
    hidden_size: int
    n_heads: int
    intermediate_size: int
    prompt_chars: int  # questions grow to about this many characters (= tokens, char tokenizer)
    max_new_tokens: int

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


CONFIGS = {
    "tiny": BenchConfig("tiny", 4, 128, 4, 256, prompt_chars=14, max_new_tokens=32),
    "small": BenchConfig("small", 8, 512, 8, 1408, prompt_chars=64, max_new_tokens=64),
}


def _question(rng: random.Random, prompt_chars: int) -> str:
    """`12+7-3`-style chain, extended until `Q: ...=?\\nA:` reaches about prompt_chars."""
    text = str(rng.randint(1, 20))
    while len(f"Q: {text}=?\nA:") < prompt_chars - 3:
        text += rng.choice("+-") + str(rng.randint(1, 20))
    return text


def make_prompts(cfg: BenchConfig, seed: int = 0) -> list[str]:
    """Prompts of all warm-up and timed steps, step-major (step s uses rows 8s .. 8s + 7)."""
    rng = random.Random(f"grpo-bench/{cfg.name}/{seed}")
    n = PROMPTS_PER_STEP * (WARMUP_STEPS + TIMED_STEPS)
    return [f"Q: {_question(rng, cfg.prompt_chars)}=?\nA:" for _ in range(n)]


def answer_of(prompt: str) -> int:
    """Value of the `+`/`-` chain between `Q: ` and `=?`."""
    chain = prompt[len("Q: ") : prompt.index("=?")]
    return sum(int(term) for term in re.findall(r"[+-]?\d+", chain))


def arith_reward(prompt: str, completion: str) -> float:
    """Partial credit in [0, 1]: 0.3 x share of digit/minus characters, plus 0.7 / (1 + |first
    integer - answer|), so an untrained model's groups are rarely all-equal."""
    if not completion:
        return 0.0
    digits = sum(ch.isdigit() or ch == "-" for ch in completion) / len(completion)
    match = _INT.search(completion)
    closeness = 0.0 if match is None else 1.0 / (1.0 + abs(int(match.group()) - answer_of(prompt)))
    return 0.3 * digits + 0.7 * closeness


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far, MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# --- Effective settings: each worker reads them back from the objects it built and reports
# them, so the comparison shows (rather than claims) that both sides do the same work.

# Versions printed for each side; importlib.metadata reads them without importing the package.
VERSIONED = ("torch", "transformers", "trl", "accelerate", "datasets", "tokenizers")
# Both workers get TOKENIZERS_PARALLELISM from the driver, "false" unless the caller set it:
# the Rust tokenizer's thread pool would otherwise compete with torch's threads on 2 cores.
TOKENIZERS_PARALLELISM = "false"
# The optimizer both sides must construct: torch's AdamW as our engine builds it. With
# foreach and fused left at None, torch picks its per-parameter loop for CPU tensors on both.
EXPECTED_OPTIMIZER: dict[str, object] = {
    "class": "torch.optim.adamw.AdamW",
    "betas": [0.9, 0.999],
    "eps": 1e-08,
    "weight_decay": 0.0,
    "amsgrad": False,
    "maximize": False,
    "foreach": None,
    "fused": None,
    "capturable": False,
    "differentiable": False,
}
# Settings whose values must be identical on both sides (the driver compares them).
MUST_MATCH = ("optimizer", "algorithm", "dtype", "threads")
# Keys in those groups that may differ: how the same AdamW is wrapped and grouped.
INFORMATIONAL = ("wrapper", "param_groups")


def versions() -> dict[str, str | None]:
    """Python and the VERSIONED packages installed in this interpreter's environment."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in VERSIONED:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def thread_settings(torch_threads: int, interop_threads: int) -> dict[str, object]:
    """What decides how many cores each side uses (torch's counts are passed in: stdlib only)."""
    return {
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        "torch_threads": torch_threads,
        "torch_interop_threads": interop_threads,
        "TOKENIZERS_PARALLELISM": os.environ.get("TOKENIZERS_PARALLELISM"),
    }


def optimizer_facts(optimizer: Any) -> dict[str, object]:
    """Class and hyperparameters of `optimizer`, unwrapping accelerate's wrapper. Values come
    from the param groups, not `defaults`: the HF Trainer passes weight_decay per group, so
    its `defaults` keep torch's 0.01 while every group steps with 0.0."""
    inner = getattr(optimizer, "optimizer", optimizer)
    cls = type(inner)
    facts: dict[str, object] = {"class": f"{cls.__module__}.{cls.__qualname__}"}
    for key in [*EXPECTED_OPTIMIZER, "lr"]:
        if key != "class":
            values = [_plain(group.get(key)) for group in inner.param_groups]
            facts[key] = values[0] if all(v == values[0] for v in values) else values
    facts["param_devices"] = sorted(
        {p.device.type for group in inner.param_groups for p in group["params"]}
    )
    facts["param_groups"] = len(inner.param_groups)  # Trainer: decay / no-decay groups
    if inner is not optimizer:
        facts["wrapper"] = f"{type(optimizer).__module__}.{type(optimizer).__qualname__}"
    return facts


def _plain(value: object) -> object:
    """JSON-stable form: tuples (betas) as lists, so read-back and JSON round-trip compare equal."""
    return list(value) if isinstance(value, tuple) else value


def checkpointing_facts(model: Any, name: str) -> dict[str, object]:
    """Every flag that says whether `model` recomputes activations in backward."""
    with warnings.catch_warnings():  # is_gradient_checkpointing is a deprecated alias
        warnings.simplefilter("ignore", FutureWarning)
        return {
            f"{name}.is_activation_checkpointing": getattr(
                model, "is_activation_checkpointing", None
            ),
            f"{name}.is_gradient_checkpointing": getattr(model, "is_gradient_checkpointing", None),
            f"{name} modules with gradient_checkpointing": sum(
                bool(getattr(m, "gradient_checkpointing", False)) for m in model.modules()
            ),
        }


def check_settings(side: str, settings: dict[str, Any]) -> None:
    """Exit loudly unless checkpointing is off and the optimizer is EXPECTED_OPTIMIZER."""
    problems = [f"{k} = {v!r}" for k, v in settings["checkpointing"].items() if v]
    problems += [
        f"optimizer {k} = {settings['optimizer'].get(k)!r}, expected {v!r}"
        for k, v in EXPECTED_OPTIMIZER.items()
        if settings["optimizer"].get(k) != v
    ]
    if problems:
        raise SystemExit(f"{side}: not the benchmarked setup: " + "; ".join(problems))


def format_settings(side: str, settings: dict[str, Any]) -> str:
    """Human-readable block: one `group: key=value, ...` line per group of settings."""
    lines = [f"[{side}] effective settings"]
    for group, values in settings.items():
        if isinstance(values, dict):
            text = ", ".join(f"{k}={v}" for k, v in values.items())
        else:
            text = str(values)
        lines.append(f"  {group}: {text}")
    return "\n".join(lines)


def settings_mismatches(ours: dict[str, Any], trl: dict[str, Any]) -> list[str]:
    """MUST_MATCH groups whose values differ between the sides, as readable strings."""
    out = []
    for group in MUST_MATCH:
        a, b = ours[group], trl[group]
        keys = sorted(set(a) | set(b)) if isinstance(a, dict) else [None]
        for key in keys:
            va = a.get(key) if key is not None else a
            vb = b.get(key) if key is not None else b
            if va != vb and key not in INFORMATIONAL:
                out.append(f"{group}.{key}: ours {va!r} / TRL {vb!r}")
    return out
