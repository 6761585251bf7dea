"""Reasoning steps of a completion and the token index where each step ends.

Step rule: a step is one line of the completion with surrounding whitespace stripped; empty
lines are dropped. The `#### <answer>` line is a step like any other (normally the last one).
"""

from __future__ import annotations

from typing import Any, Protocol


class Decoder(Protocol):
    def decode(self, token_ids: Any, skip_special_tokens: bool = ..., **kwargs: Any) -> Any: ...


def step_spans(completion: str) -> list[tuple[int, int]]:
    """Character span [start, end) of each step of `completion` (stripped, non-empty lines)."""
    spans: list[tuple[int, int]] = []
    pos = 0
    for line in completion.split("\n"):
        stripped = line.strip()
        if stripped:
            start = pos + (len(line) - len(line.lstrip()))
            spans.append((start, start + len(stripped)))
        pos += len(line) + 1
    return spans


def split_steps(completion: str) -> list[str]:
    """The steps of `completion`: stripped non-empty lines, in order."""
    return [completion[a:b] for a, b in step_spans(completion)]


def step_end_token_indices(completion_ids: list[int], tokenizer: Decoder) -> list[int]:
    """For each step of the decoded completion, the index of the token holding its last character.

    The text is `tokenizer.decode(completion_ids, skip_special_tokens=True)`, as the rollout
    engine produces it. Works for BPE tokens that merge a newline with neighbouring characters:
    positions come from decoding prefixes (binary search), not from splitting token strings.
    """
    text = str(tokenizer.decode(completion_ids, skip_special_tokens=True))
    ends: list[int] = []
    cache: dict[int, int] = {}

    def decoded_len(k: int) -> int:  # characters produced by the first k tokens
        if k not in cache:
            cache[k] = len(tokenizer.decode(completion_ids[:k], skip_special_tokens=True))
        return cache[k]

    for _, end in step_spans(text):
        lo, hi = 1, len(completion_ids)  # smallest k with decoded_len(k) >= end
        while lo < hi:
            mid = (lo + hi) // 2
            if decoded_len(mid) >= end:
                hi = mid
            else:
                lo = mid + 1
        ends.append(lo - 1)
    return ends
