"""Preference pairs from a local JSONL file (grpo.pairs_file), the data of offline DPO: one
object per line with the question `prompt`, the preferred completion `chosen`, the
dispreferred `rejected`, and optionally the gold `answer` the verifier judges both by
(docs/algorithm.md section 12)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from grpo_core.data.tasks.base import Problem, TaskDataError

FIELDS = ("prompt", "chosen", "rejected")


@dataclass(frozen=True)
class PreferencePair:
    """One line of a pairs file: `prompt` is the raw question (the run's prompt style
    formats it), `chosen` and `rejected` are completions of it."""

    prompt: str
    chosen: str
    rejected: str
    answer: str = ""
    line: int = 0


def read_pairs(path: Path) -> list[PreferencePair]:
    """Every pair of the file, checked: a JSON object per non-empty line whose `prompt`,
    `chosen` and `rejected` are non-empty strings (and `answer`, when there, a string); a bad
    line is an error naming FILE:LINE. An empty file is an error too."""
    if not path.is_file():
        raise TaskDataError(
            f"grpo.pairs_file {path} is not a file: give a JSONL of prompt/chosen/rejected"
        )
    pairs: list[PreferencePair] = []
    for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not text.strip():
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TaskDataError(f"{path}:{number}: not JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise TaskDataError(
                f"{path}:{number}: a pair is a JSON object, not a {type(row).__name__}"
            )
        bad = [f for f in FIELDS if not isinstance(row.get(f), str) or not row[f].strip()]
        if bad or not isinstance(row.get("answer", ""), str):
            wrong = ", ".join(bad) or "answer"
            raise TaskDataError(
                f"{path}:{number}: {wrong} must be a non-empty string (a pair has "
                f"{' / '.join(FIELDS)}, and optionally the gold answer)"
            )
        answer = row.get("answer", "")
        pairs.append(PreferencePair(row["prompt"], row["chosen"], row["rejected"], answer, number))
    if not pairs:
        raise TaskDataError(f"{path} holds no pair: one JSON object per line")
    return pairs


def pair_problems(pairs: list[PreferencePair]) -> list[Problem]:
    """One problem per distinct prompt, in the order first seen (its answer: the first one a
    pair of it gives): the pool the GRPO stage draws a step's prompts from."""
    seen: dict[str, Problem] = {}
    for pair in pairs:
        if pair.prompt not in seen:
            seen[pair.prompt] = Problem(f"pairs-{pair.line}", pair.prompt, pair.answer)
    return list(seen.values())
