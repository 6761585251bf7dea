"""The math-verify worker: a process of its own that answers one JSON request per line on
stdin with one JSON reply per line on stdout, so the caller can kill it when a comparison runs
past its timeout (grpo_core/data/math_equivalence.py). Run as `python -m
grpo_core.data.math_worker`; it imports math-verify and nothing of ours besides this file.

Requests: {"op": "equal", "gold": g, "pred": p}, {"op": "canonical", "answer": a},
{"op": "check_gold", "gold": g}. Replies: {"value": ...} or {"error": "..."}. Before the
first request it imports math-verify, compares one pair (its parser is built lazily) and
writes {"ready": true}, so that start-up never counts against a request's timeout.
"""

from __future__ import annotations

import json
import sys
from functools import lru_cache
from typing import Any

# Timeouts are the caller's (it kills this process): math-verify's own would use SIGALRM.
_NO_TIMEOUT: Any = None


@lru_cache(maxsize=200_000)
def _parsed(answer: str) -> list[Any]:
    """math-verify's parse of an answer, read as the content of a \\boxed{} (parsed once)."""
    from math_verify import parse

    return list(parse("\\boxed{" + answer + "}", parsing_timeout=_NO_TIMEOUT))


def equal(gold: str, pred: str) -> bool:
    """Whether `pred` is the same answer as `gold` (math-verify, gold first)."""
    from math_verify import verify

    target = _parsed(gold)
    got = _parsed(pred)
    return bool(target and got and verify(target, got, timeout_seconds=_NO_TIMEOUT))


def canonical(answer: str) -> str:
    """A key equal answers share for majority voting: a number rounded to 6 digits, else the
    parsed expression's text, else the answer's own text without spaces."""
    parsed = _parsed(answer)
    if not parsed:
        return "".join(answer.split())
    value = parsed[0]
    try:
        return repr(round(float(value), 6))
    except (TypeError, ValueError):
        return str(value)


def check_gold(gold: str) -> str | None:
    """None when math-verify reads `gold` as mathematics, else what is wrong with it (it falls
    back to the raw text, a string, for what it cannot read)."""
    parsed = _parsed(gold)
    return None if parsed and not isinstance(parsed[0], str) else "math-verify cannot parse it"


def answer(request: dict[str, Any]) -> dict[str, Any]:
    op = request.get("op")
    if op == "equal":
        return {"value": equal(request["gold"], request["pred"])}
    if op == "canonical":
        return {"value": canonical(request["answer"])}
    if op == "check_gold":
        return {"value": check_gold(request["gold"])}
    return {"error": f"unknown op {op!r}"}


def main() -> None:
    import logging

    logging.disable(logging.WARNING)  # math-verify warns on every parse without a timeout
    equal("1", "1")  # imports math-verify and warms it before "ready": start-up is no request
    sys.stdout.write(json.dumps({"ready": True}) + "\n")
    sys.stdout.flush()
    for line in sys.stdin:
        try:
            reply = answer(json.loads(line))
        except Exception as exc:  # a reply, not a dead worker: the caller decides
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
