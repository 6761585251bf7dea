"""Answer formats by name: how an output states its final answer, and when it equals the gold
answer. A task declares its format (`task.answer_format`); the verifier, majority voting,
the format reward and the rollout rows' `extracted_answer` all go through it.

- `gsm8k`: the text after the last `####`, compared as numbers (`1,000` = `1000.0`).
- `boxed`: the content of the last `\\boxed{...}`, compared by math-verify (`\\frac12` = `0.5`,
  `2\\sqrt3` = `\\sqrt{12}`, `(1,-2)`, intervals, sets, matrices, letters, expressions). An
  output without a `\\boxed{}` gives no answer: the format asks for one, and taking the last
  number instead would pay an output the format reward calls malformed.
- `python_tests`: the last ```python block, right when the gold answer's tests (assert
  statements) pass against it in the Python tool's sandbox (code tasks).

Torch-free and sympy-free at import (the config lists the names); math-verify runs in a
worker process of its own (grpo_core/data/math_equivalence.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from grpo_core.contracts.registry import Registry
from grpo_core.data.answers import extract_answer, format_reward, normalize_number
from grpo_core.data.code_answers import (
    canonical_program,
    check_tests,
    ends_with_program,
    last_python_block,
    passes_tests,
)
from grpo_core.data.math_equivalence import MathVerifier


@dataclass(frozen=True)
class AnswerFormat:
    """extract: an output's final answer, None when it states none. equal(gold, answer):
    the same answer. canonical: a key equal answers share (majority votes). check_gold: None
    when a gold answer can be compared, else what is wrong. ends_with_answer: 1.0 when the
    output ends stating one answer in this format (the format reward), else 0.0.
    instruction: how a prompt asks for the answer."""

    name: str
    description: str
    instruction: str
    extract: Callable[[str], str | None]
    equal: Callable[[str, str], bool]
    canonical: Callable[[str], str]
    check_gold: Callable[[str], str | None]
    ends_with_answer: Callable[[str], float]

    def is_correct(self, gold: str, completion: str) -> bool:
        """Whether the output's final answer equals `gold` (no answer: not correct)."""
        answer = self.extract(completion)
        return answer is not None and self.equal(gold, answer)


ANSWER_FORMATS: Registry[AnswerFormat] = Registry("answer format")


# ---- gsm8k -----------------------------------------------------------------------------------


def _numbers_equal(gold: str, answer: str) -> bool:
    return normalize_number(answer) == normalize_number(gold)


def _check_number(gold: str) -> str | None:
    number = normalize_number(gold)
    canonical = number.lstrip("-").replace(".", "", 1)
    return None if canonical.isdigit() else "it must be a number"


ANSWER_FORMATS.add(
    "gsm8k",
    AnswerFormat(
        name="gsm8k",
        description="a last line '#### <answer>', compared as numbers",
        instruction="end with a final line '#### <answer>' giving only the number",
        extract=extract_answer,
        equal=_numbers_equal,
        canonical=normalize_number,
        check_gold=_check_number,
        ends_with_answer=format_reward,
    ),
)


# ---- boxed -----------------------------------------------------------------------------------

_BOX_COMMANDS = ("\\boxed{", "\\fbox{")


def _last_box(text: str) -> tuple[int, int] | None:
    """(start of the content, index of the closing brace) of the last `\\boxed{...}` (or
    `\\fbox{...}`) of `text`, braces balanced; None when there is none or it never closes."""
    start = max(text.rfind(command) for command in _BOX_COMMANDS)
    if start < 0:
        return None
    begin = text.index("{", start) + 1
    depth = 1
    for at in range(begin, len(text)):
        depth += {"{": 1, "}": -1}.get(text[at], 0)
        if depth == 0:
            return begin, at
    return None


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` of `text`; None when there is none, it never
    closes, or it is empty."""
    box = _last_box(text)
    return (text[box[0] : box[1]].strip() or None) if box else None


def _ends_boxed(completion: str) -> float:
    """1.0 when the output has a closed, non-empty `\\boxed{}` and nothing but punctuation,
    `$` or a closing `\\]` after the last one."""
    box = _last_box(completion)
    if box is None or not completion[box[0] : box[1]].strip():
        return 0.0
    tail = completion[box[1] + 1 :].replace("\\]", "").replace("$", "")
    return 1.0 if all(not c.isalnum() for c in tail) else 0.0


MATH_VERIFIER = MathVerifier()  # one worker per process, started when a boxed answer is compared

ANSWER_FORMATS.add(
    "boxed",
    AnswerFormat(
        name="boxed",
        description="the last \\boxed{...}, compared by math-verify (LaTeX equivalence)",
        instruction="put the final answer in \\boxed{}",
        extract=last_boxed,
        equal=MATH_VERIFIER.equal,
        canonical=MATH_VERIFIER.canonical,
        check_gold=MATH_VERIFIER.check_gold,
        ends_with_answer=_ends_boxed,
    ),
)

ANSWER_FORMATS.add(
    "python_tests",
    AnswerFormat(
        name="python_tests",
        description="the last ```python block, right when the gold tests pass against it "
        "(run in the Python tool's sandbox)",
        instruction="end with the complete program in one ```python block",
        extract=last_python_block,
        equal=passes_tests,
        canonical=canonical_program,
        check_gold=check_tests,
        ends_with_answer=ends_with_program,
    ),
)
