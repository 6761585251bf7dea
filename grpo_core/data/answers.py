"""Final-answer extraction and checking for GSM8K-style completions (`#### <answer>` lines)."""

from __future__ import annotations

import re

_MARKER = "####"
_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)$")


def extract_answer(completion: str) -> str | None:
    """Text after the last `####` in the completion, up to the end of its line; None if absent."""
    pos = completion.rfind(_MARKER)
    if pos < 0:
        return None
    answer = completion[pos + len(_MARKER) :].split("\n", 1)[0].strip()
    return answer or None


def normalize_number(text: str) -> str:
    """Canonical form of an answer: `+5`->`5`, `1,000`->`1000`, `2.50`->`2.5`, `-0`->`0`.

    Text that is not a number after removing commas, spaces and a trailing period is
    returned stripped and lower-cased with single spaces, so non-numeric answers still compare.
    """
    compact = text.strip().replace(",", "").replace(" ", "").rstrip(".")
    if compact.startswith("$"):
        compact = compact[1:]
    if not _NUMBER.match(compact):
        return " ".join(text.strip().lower().split())
    sign = "-" if compact.startswith("-") else ""
    digits = compact.lstrip("+-")
    if "." in digits:
        whole, frac = digits.split(".", 1)
        frac = frac.rstrip("0")
    else:
        whole, frac = digits, ""
    whole = whole.lstrip("0") or "0"
    body = f"{whole}.{frac}" if frac else whole
    return "0" if body == "0" else sign + body


def answers_match(pred: str | None, gold: str) -> bool:
    """True when the predicted answer equals the gold answer after `normalize_number`."""
    return pred is not None and normalize_number(pred) == normalize_number(gold)


def format_reward(completion: str) -> float:
    """1.0 when the last non-empty line is `#### <answer>` (one marker, an answer), else 0.0."""
    lines = [line.strip() for line in completion.splitlines() if line.strip()]
    if not lines or not lines[-1].startswith(_MARKER):
        return 0.0
    answer = lines[-1][len(_MARKER) :].strip()
    return 1.0 if answer and _MARKER not in answer else 0.0
