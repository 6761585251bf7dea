"""The per-iteration lines that say whether the reward models can be trusted: the balance
of the labels they learn from, and their AUROC (retrained RM_k and stale RM_{k-1}) on fresh
outputs, rounded to three decimals."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from reward_models.labelling import OrmLabel, PrmLabel

STALE = "_stale"  # metric suffix of RM_{k-1}'s eval rows (train_rm writes them)


def _share(positive: int, total: int, what: str) -> str:
    if total == 0:
        return f"no {what}"
    return f"{positive} of {total} {what} correct ({100 * positive / total:.0f}%)"


def label_balance_line(orm: Sequence[OrmLabel], prm: Sequence[PrmLabel]) -> str:
    """`labels: ORM 5 of 24 outputs correct (21%); PRM 30 of 80 steps correct (38%)`."""
    parts = [f"ORM {_share(sum(r.label for r in orm), len(orm), 'outputs')}"]
    if prm:
        parts.append(f"PRM {_share(sum(r.hard_label for r in prm), len(prm), 'steps')}")
    return "labels: " + "; ".join(parts)


def _rm_name(metric: str) -> str:
    """`orm_auroc` -> `ORM`, `prm_step_auroc` -> `PRM step`."""
    kind, *rest = metric.removesuffix("_auroc").split("_")
    return " ".join([kind.upper(), *rest])


def auroc_line(eval_rows: Iterable[Mapping[str, Any]]) -> str:
    """`AUROC: ORM train 0.712 (stale 0.650), test 0.690; PRM step train 0.550` from the
    train_rm stage's eval rows; an AUROC undefined on one split (its fresh outputs all right
    or all wrong) has no row and is said to be undefined."""
    values: dict[str, dict[str, dict[str, float]]] = {}  # rm -> split -> "" | stale -> value
    for row in eval_rows:
        metric = str(row["metric"])
        if "auroc" not in metric:
            continue
        base = metric.removesuffix(STALE)
        which = "stale" if metric != base else "retrained"
        values.setdefault(base, {}).setdefault(str(row["split"]), {})[which] = float(row["value"])
    if not values:
        return "AUROC: undefined (the fresh outputs are all correct or all wrong)"
    parts = []
    for metric, splits in values.items():
        shown = []
        for split, pair in splits.items():
            retrained = pair.get("retrained")
            text = f"{split} {'undefined' if retrained is None else f'{retrained:.3f}'}"
            if "stale" in pair:
                text += f" (stale {pair['stale']:.3f})"
            shown.append(text)
        parts.append(f"{_rm_name(metric)} " + ", ".join(shown))
    return "AUROC: " + "; ".join(parts)
