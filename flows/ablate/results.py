"""What an ablation found, from its `ablation` rows: the results table (mean and 95% t-interval
over seeds) and the verdicts of the paper's orderings (DeepSeekMath section 5.2, Figs. 5-7).

The claims name arms by their conventional names; a suite without an arm a claim needs shows
that claim as not run. Arms are compared on paired per-seed differences (flows/ablate_stats).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from flows.ablate.stats import Interval, Relation, Verdict, combine, mean_ci, paired_verdict

POLICY_0 = "policy_0"  # the results table's row for the shared starting policy
GREEDY = "greedy_accuracy"
MAJ, PASS = "maj@k", "pass@k"
# Fig. 5: GRPO PS >= GRPO OS > Online RFT > RFT after one iteration (policy_1), where every
# arm has drawn the same number of outputs and taken the same update steps.
FIG5_POLICY = 1
FIG5_LINKS: tuple[tuple[str, Relation, str], ...] = (
    ("grpo_ps", ">=", "grpo_os"),
    ("grpo_os", ">", "online_rft"),
    ("online_rft", ">", "rft"),
)
# Fig. 6: iterative GRPO with the RM retrained every iteration >= with the RM trained once,
# at the last iteration.
FIG6_LINKS: tuple[tuple[str, Relation, str], ...] = (("grpo_os", ">=", "grpo_os_rm_once"),)
FIG7_ARM = "grpo_os"  # Fig. 7: policy_0 vs this arm's final policy, Maj@K and Pass@K


@dataclass(frozen=True)
class Values:
    """An ablation's evaluations: (arm, policy_iteration, metric, k) -> {seed: value}."""

    by_key: Mapping[tuple[str, int, str, int], Mapping[int, float]]

    @classmethod
    def from_rows(cls, rows: Iterable[Mapping[str, Any]]) -> Values:
        out: dict[tuple[str, int, str, int], dict[int, float]] = defaultdict(dict)
        for r in rows:
            key = (str(r["arm"]), int(r["policy_iteration"]), str(r["metric"]), int(r["k"] or 1))
            out[key][int(r["seed"])] = float(r["value"])
        return cls(dict(out))

    def arms(self) -> list[str]:
        return list(dict.fromkeys(arm for arm, *_ in self.by_key))

    def final_iteration(self, arm: str) -> int:
        return max(p for a, p, *_ in self.by_key if a == arm)

    def iterations(self, arm: str) -> list[int]:
        return sorted({p for a, p, *_ in self.by_key if a == arm})

    def ks(self, metric: str) -> list[int]:
        return sorted({k for _, _, m, k in self.by_key if m == metric})

    def top_k(self) -> int | None:
        ks = self.ks(MAJ)
        return ks[-1] if ks else None

    def seeds(self, arm: str, policy_iteration: int, metric: str, k: int = 1) -> dict[int, float]:
        return dict(self.by_key.get((arm, policy_iteration, metric, k), {}))

    def interval(self, arm: str, policy_iteration: int, metric: str, k: int = 1) -> Interval | None:
        found = self.seeds(arm, policy_iteration, metric, k)
        return mean_ci([found[s] for s in sorted(found)]) if found else None


def results_table(values: Values) -> list[dict[str, Any]]:
    """One row per arm and policy it trained (policy_1, policy_2, ...) after a policy_0 row
    (the first arm's, at each seed: every arm evaluates the same policy_0 on the same
    problems at a given seed)."""
    arms = values.arms()
    if not arms:
        return []
    k = values.top_k()
    rows = []
    trained = [(a, a, p) for a in arms for p in values.iterations(a) if p > 0]
    for label, arm, policy in [(POLICY_0, arms[0], 0), *trained]:
        cells: dict[str, Any] = {"arm": label, "policy": policy}
        for name, metric, at in (("greedy", GREEDY, 1), ("maj", MAJ, k), ("pass", PASS, k)):
            cells[name] = values.interval(arm, policy, metric, at) if at is not None else None
        cells["seeds"] = max((c.n for c in cells.values() if isinstance(c, Interval)), default=0)
        rows.append(cells)
    return rows


def text_table(heads: list[str], cells: list[list[str]]) -> str:
    """Columns padded to their widest cell, the first left-aligned, the rest right-aligned,
    under a header and a rule."""
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(heads)]

    def line(parts: list[str]) -> str:
        pairs = zip(parts, widths, strict=True)
        return "  ".join(p.ljust(w) if i == 0 else p.rjust(w) for i, (p, w) in enumerate(pairs))

    return "\n".join([line(heads), line(["-" * w for w in widths]), *(line(c) for c in cells)])


def format_results_table(values: Values) -> str:
    """The results table as text: each cell `mean ± 95% CI half-width` over seeds."""
    rows = results_table(values)
    if not rows:
        return "(no ablation rows)"
    k = values.top_k()
    heads = ["arm", "policy", "seeds", "greedy acc", f"Maj@{k}", f"Pass@{k}"]
    cells = [
        [
            r["arm"],
            str(r["policy"]),
            str(r["seeds"]),
            *(r[c].text() if r[c] is not None else "-" for c in ("greedy", "maj", "pass")),
        ]
        for r in rows
    ]
    return text_table(heads, cells)


@dataclass(frozen=True)
class Link:
    """One comparison of a claim: `left relation right` on paired per-seed values."""

    text: str
    verdict: Verdict | None  # None: the suite lacks an arm it needs
    difference: Interval | None


@dataclass(frozen=True)
class Claim:
    """One of the paper's orderings with its verdict at the 95% level."""

    figure: str
    statement: str
    measured_on: str
    links: tuple[Link, ...]

    @property
    def verdict(self) -> Verdict | None:
        judged = [link.verdict for link in self.links if link.verdict is not None]
        return combine(judged) if judged else None

    def text(self) -> str:
        verdict = self.verdict or "not run (the suite lacks its arms)"
        lines = [f"{self.figure}: {self.statement} — {verdict}", f"  on {self.measured_on}"]
        for link in self.links:
            if link.verdict is None or link.difference is None:
                lines.append(f"  {link.text}: not run")
            else:
                shown = _signed(link.difference)
                lines.append(f"  {link.text}: difference {shown} -> {link.verdict}")
        return "\n".join(lines)


def _signed(interval: Interval) -> str:
    half = "" if interval.half is None else f" ± {interval.half:.3f}"
    return f"{interval.mean:+.3f}{half} (n={interval.n})"


def _paired(left: Mapping[int, float], right: Mapping[int, float]) -> tuple[list[float], ...]:
    seeds = sorted(set(left) & set(right))
    return [left[s] for s in seeds], [right[s] for s in seeds]


def _links(
    values: Values, links: Iterable[tuple[str, Relation, str]], policy: int | None
) -> tuple[Link, ...]:
    """Greedy accuracy of policy_`policy` of both arms (None: each arm's final policy)."""
    out = []
    for left, relation, right in links:
        text = f"{left} {relation} {right}"
        if left not in values.arms() or right not in values.arms():
            out.append(Link(text, None, None))
            continue
        at_left = values.final_iteration(left) if policy is None else policy
        at_right = values.final_iteration(right) if policy is None else policy
        a, b = _paired(values.seeds(left, at_left, GREEDY), values.seeds(right, at_right, GREEDY))
        verdict, difference = paired_verdict(a, b, relation) if a else (None, None)
        out.append(Link(text, verdict, difference))
    return tuple(out)


def _fig7_link(values: Values) -> Link:
    """Per seed: (Maj@K gain) - (Pass@K gain) from policy_0 to the final policy, K largest."""
    k, arm = values.top_k(), FIG7_ARM
    text = f"{arm}: Maj@{k} gain > Pass@{k} gain"
    if k is None or arm not in values.arms():
        return Link(text, None, None)
    final = values.final_iteration(arm)
    gains = []
    for metric in (MAJ, PASS):
        before, after = _paired(
            values.seeds(arm, 0, metric, k), values.seeds(arm, final, metric, k)
        )
        gains.append([y - x for x, y in zip(before, after, strict=True)])
    if not gains[0] or len(gains[0]) != len(gains[1]):
        return Link(text, None, None)
    verdict, difference = paired_verdict(gains[0], gains[1], ">")
    return Link(text, verdict, difference)


def claims(values: Values) -> list[Claim]:
    """The paper's three orderings, judged on this ablation."""
    k = values.top_k()
    return [
        Claim(
            "Fig. 5",
            "GRPO PS >= GRPO OS > Online RFT > RFT",
            f"greedy accuracy of policy_{FIG5_POLICY} (equal outputs and steps), paired by seed",
            _links(values, FIG5_LINKS, FIG5_POLICY),
        ),
        Claim(
            "Fig. 6",
            "RM retrained every iteration >= RM trained once, at the last iteration",
            "greedy accuracy of the final policy, paired by seed",
            _links(values, FIG6_LINKS, None),
        ),
        Claim(
            "Fig. 7",
            "RL raises Maj@K more than Pass@K",
            f"policy_0 -> final {FIG7_ARM} policy at K={k}, per seed (Maj gain - Pass gain)",
            (_fig7_link(values),),
        ),
    ]


CLAIMS_NOTE = (
    "Cells: mean ± half-width of the 95% Student-t interval over seeds. A claim holds when the "
    "95% interval of the paired per-seed differences lies above 0 (at or above 0 for '>='), "
    "does not hold when it lies below (at or below 0 for '>'), and is inconclusive when it "
    "straddles 0 or there is one seed."
)
