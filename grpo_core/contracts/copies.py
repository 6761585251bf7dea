"""Copies among a batch's items: a small policy repeats itself (40-60% of the demo's outputs
are copies of another), so prefill, scoring and the update run each distinct item once."""

from __future__ import annotations

from collections.abc import Hashable, Iterable


def first_copies(keys: Iterable[Hashable]) -> tuple[list[int], list[int]]:
    """Equal keys grouped: the position of each distinct key's first occurrence, in order of
    appearance, and for every key the index (into that list) of its group."""
    group_of: dict[Hashable, int] = {}
    firsts: list[int] = []
    groups: list[int] = []
    for position, key in enumerate(keys):
        if key not in group_of:
            group_of[key] = len(firsts)
            firsts.append(position)
        groups.append(group_of[key])
    return firsts, groups
