"""Hash-based train/test assignment: a question lands in one split forever, whatever the seed."""

from __future__ import annotations

import hashlib

from grpo_core.data.tasks.base import Split


def split_of(question: str, test_fraction: float) -> Split:
    """`test` for a stable `test_fraction` of all possible questions (by SHA-256), else `train`."""
    digest = hashlib.sha256(question.encode("utf-8")).digest()
    bucket = int.from_bytes(digest[:8], "big") / 2**64
    return "test" if bucket < test_fraction else "train"
