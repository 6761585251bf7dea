"""What an ablation found, from its `ablation` rows: the results table (mean and 95% t-interval
over seeds) and the verdicts of the paper's orderings (DeepSeekMath section 5.2, Figs. 5-7).

The claims name arms by their conventional names; a suite without an arm a claim needs shows
that claim as not run. Arms are compared on paired per-seed differences (flows/ablate/stats.py).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from flows.ablate.problem_stats import RandomEffects, paired_by_problem
from flows.ablate.stats import (
    NOT_JUDGED,
    Interval,
    Relation,
    Verdict,
    agreed,
    combine,
    mean_ci,
    paired_verdict,
    seeds_to_decide,
    verdict,
    why_not_judged,
)
from flows.eval_values import GREEDY, MAJ, PASS, ProblemValues, in_problem_order

POLICY_0 = "policy_0"  # the results table's row for the shared starting policy
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


Key = tuple[str, int, str, int]  # (arm, policy_iteration, metric, k)


@dataclass(frozen=True)
class Values:
    """An ablation's evaluations: (arm, policy_iteration, metric, k) -> {seed: value}, and
    where stored (`ablation_problems`) the per-problem values behind them."""

    by_key: Mapping[Key, Mapping[int, float]]
    problems: Mapping[Key, Mapping[int, ProblemValues]] = field(default_factory=dict)

    @classmethod
    def from_rows(
        cls,
        rows: Iterable[Mapping[str, Any]],
        problem_rows: Iterable[Mapping[str, Any]] = (),
    ) -> Values:
        out: dict[Key, dict[int, float]] = defaultdict(dict)
        for r in rows:
            out[_key(r)][int(r["seed"])] = float(r["value"])
        listed: dict[Key, dict[int, list[tuple[int, str, float, str | None]]]] = defaultdict(
            lambda: defaultdict(list)
        )
        for r in problem_rows:
            question = r.get("question")
            entry = (int(r["problem_index"]), str(r["problem_id"]), float(r["value"]), question)
            listed[_key(r)][int(r["seed"])].append(entry)
        problems = {
            key: {seed: in_problem_order(found) for seed, found in by_seed.items()}
            for key, by_seed in listed.items()
        }
        return cls(dict(out), problems)

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

    def per_problem(
        self, arm: str, policy_iteration: int, metric: str, k: int = 1
    ) -> dict[int, ProblemValues]:
        return dict(self.problems.get((arm, policy_iteration, metric, k), {}))

    def interval(self, arm: str, policy_iteration: int, metric: str, k: int = 1) -> Interval | None:
        found = self.seeds(arm, policy_iteration, metric, k)
        return mean_ci([found[s] for s in sorted(found)]) if found else None


def _key(row: Mapping[str, Any]) -> Key:
    return (str(row["arm"]), int(row["policy_iteration"]), str(row["metric"]), int(row["k"] or 1))


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
    """One comparison of a claim, `left relation right`: on paired per-seed values (the t
    interval over seeds) and, where the per-problem values are stored, paired by problem within
    each seed and pooled over seeds (flows/ablate/problem_stats.py). Its verdict is the one both
    methods reach; where they differ, inconclusive."""

    text: str
    relation: Relation
    seed_verdict: Verdict | None  # None: the suite lacks an arm it needs
    difference: Interval | None
    by_problem: RandomEffects | None = None
    why_no_pairing: str = ""

    @property
    def problem_verdict(self) -> Verdict | None:
        return None if self.by_problem is None else verdict(self.by_problem.interval, self.relation)

    @property
    def verdict(self) -> Verdict | None:
        if self.seed_verdict is None or self.problem_verdict is None:
            return self.seed_verdict
        return agreed([self.seed_verdict, self.problem_verdict])

    def lines(self) -> list[str]:
        if self.seed_verdict is None or self.difference is None:
            return [f"  {self.text}: not run"]
        lines = [
            f"  {self.text}: difference {_signed(self.difference)} -> "
            f"{_judged(self.seed_verdict, self.difference)}"
        ]
        if self.verdict == "inconclusive" and (needed := seeds_to_decide(self.difference)):
            lines.append(
                f"    at this mean and spread about {needed} seeds would decide it (a planning "
                f"figure; rerun with --seeds {needed} to add them to this ablation)"
            )
        pooled = self.by_problem
        if pooled is None:
            if self.why_no_pairing:
                lines.append(f"    paired by problem: not computed ({self.why_no_pairing})")
            return lines
        per_seed = ", ".join(f"s{d.seed} {d.mean:+.3f} (se {d.se:.3f})" for d in pooled.seeds)
        lines += [
            f"    paired by problem and seed: {_signed(pooled.interval)} -> "
            f"{_judged(verdict(pooled.interval, self.relation), pooled.interval)}; "
            f"between-seed sd {pooled.tau2**0.5:.3f}, "
            f"I^2 {pooled.i2:.0%}",
            f"    per seed: {per_seed}",
        ]
        return lines


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
            lines += link.lines()
        return "\n".join(lines)


def _judged(found: Verdict, interval: Interval) -> str:
    """A verdict as the report prints it: with the reason when the interval could not judge."""
    why = why_not_judged(interval)
    return f"{found} ({why})" if found == NOT_JUDGED and why else found


def _signed(interval: Interval) -> str:
    half = "" if interval.half is None else f" ± {interval.half:.3f}"
    return f"{interval.mean:+.3f}{half} (n={interval.n})"


def _paired(left: Mapping[int, float], right: Mapping[int, float]) -> tuple[list[float], ...]:
    seeds = sorted(set(left) & set(right))
    return [left[s] for s in seeds], [right[s] for s in seeds]


def _by_problem(
    a: Mapping[int, ProblemValues], b: Mapping[int, ProblemValues]
) -> tuple[RandomEffects | None, str]:
    """The pooled per-problem difference A - B over the seeds both have, or why there is none:
    no per-problem rows (an ablation stored before they existed), or other problems."""
    seeds = sorted(set(a) & set(b))
    if not seeds:
        return None, "no per-problem rows stored"
    unpaired = [s for s in seeds if a[s].problem_ids != b[s].problem_ids]
    if unpaired:
        return None, f"the arms saw other problems at seed(s) {unpaired}"
    named = all(a[s].questions and None not in a[s].questions for s in seeds)
    questions = {s: a[s].questions for s in seeds} if named else None  # same problems: same
    pooled = paired_by_problem(
        {s: a[s].values for s in seeds}, {s: b[s].values for s in seeds}, questions=questions
    )
    return pooled, ""


def _link(
    text: str,
    relation: Relation,
    seed_values: tuple[Mapping[int, float], Mapping[int, float]],
    problem_values: tuple[Mapping[int, ProblemValues], Mapping[int, ProblemValues]],
) -> Link:
    a, b = _paired(*seed_values)
    if not a:
        return Link(text, relation, None, None)
    seed_verdict, difference = paired_verdict(a, b, relation)
    pooled, why = _by_problem(*problem_values)
    return Link(text, relation, seed_verdict, difference, pooled, why)


def _links(
    values: Values, links: Iterable[tuple[str, Relation, str]], policy: int | None
) -> tuple[Link, ...]:
    """Greedy accuracy of policy_`policy` of both arms (None: each arm's final policy)."""
    out = []
    for left, relation, right in links:
        text = f"{left} {relation} {right}"
        if left not in values.arms() or right not in values.arms():
            out.append(Link(text, relation, None, None))
            continue
        at_left = values.final_iteration(left) if policy is None else policy
        at_right = values.final_iteration(right) if policy is None else policy
        seeds = (values.seeds(left, at_left, GREEDY), values.seeds(right, at_right, GREEDY))
        problems = (
            values.per_problem(left, at_left, GREEDY),
            values.per_problem(right, at_right, GREEDY),
        )
        out.append(_link(text, relation, seeds, problems))
    return tuple(out)


def _gain(before: ProblemValues, after: ProblemValues) -> ProblemValues | None:
    if before.problem_ids != after.problem_ids:
        return None
    diff = tuple(y - x for x, y in zip(before.values, after.values, strict=True))
    return ProblemValues(before.problem_ids, diff)


def _problem_gains(
    values: Values, arm: str, final: int, metric: str, k: int
) -> dict[int, ProblemValues]:
    """Per seed, each problem's gain in `metric` from policy_0 to policy_`final`."""
    before = values.per_problem(arm, 0, metric, k)
    after = values.per_problem(arm, final, metric, k)
    gains = {s: _gain(before[s], after[s]) for s in sorted(set(before) & set(after))}
    return {s: g for s, g in gains.items() if g is not None}


def _fig7_link(values: Values) -> Link:
    """Per seed: (Maj@K gain) - (Pass@K gain) from policy_0 to the final policy, K largest."""
    k, arm = values.top_k(), FIG7_ARM
    text = f"{arm}: Maj@{k} gain > Pass@{k} gain"
    if k is None or arm not in values.arms():
        return Link(text, ">", None, None)
    final = values.final_iteration(arm)
    gains: list[dict[int, float]] = []
    for metric in (MAJ, PASS):
        before = values.seeds(arm, 0, metric, k)
        after = values.seeds(arm, final, metric, k)
        gains.append({s: after[s] - before[s] for s in sorted(set(before) & set(after))})
    if not gains[0] or set(gains[0]) != set(gains[1]):
        return Link(text, ">", None, None)
    problems = (
        _problem_gains(values, arm, final, MAJ, k),
        _problem_gains(values, arm, final, PASS, k),
    )
    return _link(text, ">", (gains[0], gains[1]), problems)


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
    "Cells: mean ± half-width of the 95% Student-t interval over seeds. A comparison holds when "
    "the 95% interval of the paired per-seed differences lies above 0 (at or above 0 for '>='), "
    "does not hold when it lies below (at or below 0 for '>'), and is inconclusive when it "
    "straddles 0; an interval that cannot judge (one seed, or seeds whose differences all tie "
    "exactly: a width of 0) gives no verdict ('not judged'). Where per-problem values are "
    "stored, a second interval pairs the arms by problem within each seed and pools the seeds "
    "as a random-effects meta-analysis (Hartung-Knapp, never narrower than the classic "
    "random-effects interval of the seeds' own standard errors); a comparison's verdict is the "
    "one every interval that could judge reaches, else inconclusive. A large I^2 says the "
    "seeds differ by more than their evaluation noise: more seeds, not more problems, would "
    "narrow the interval."
)
