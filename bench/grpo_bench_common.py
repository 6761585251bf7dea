"""What both sides of `grpo_step.py --vs-trl` share: the two configs, prompts, reward, RSS.

Standard library only: TRL's side imports it from its own venv, which lacks itergrpo.
"""

from __future__ import annotations

import random
import re
import resource
from dataclasses import asdict, dataclass

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
