"""Statistics of `itergrpo ablate` on hand-computed vectors: t quantiles, mean and 95% interval,
verdicts of ordering claims, and the claims read from `ablation` rows."""

from __future__ import annotations

import math

import pytest

from flows.ablate.results import Values, claims, format_results_table, results_table
from flows.ablate.stats import (
    Interval,
    agreed,
    combine,
    mean_ci,
    paired_verdict,
    seeds_to_decide,
    t_quantile,
    two_sided_t_probability,
    verdict,
    why_not_judged,
)


@pytest.mark.parametrize(
    ("df", "t"), [(1, 12.706), (2, 4.303), (3, 3.182), (4, 2.776), (9, 2.262), (30, 2.042)]
)
def test_t_quantiles_match_the_printed_table(df: int, t: float) -> None:
    assert t_quantile(df) == pytest.approx(t, abs=1e-3)


def test_t_probability_closed_forms() -> None:
    # df 1 is Cauchy: P(|T| <= 1) = 2 atan(1) / pi; df 2: t / sqrt(t^2 + 2).
    assert two_sided_t_probability(1.0, 1) == pytest.approx(0.5)
    assert two_sided_t_probability(2.0, 2) == pytest.approx(2 / math.sqrt(6))
    assert t_quantile(5, confidence=0.90) == pytest.approx(2.015, abs=1e-3)


def test_mean_ci_of_three_seeds() -> None:
    # mean 0.8, sample sd 0.1, half-width 4.303 * 0.1 / sqrt(3) = 0.2484
    ci = mean_ci([0.70, 0.80, 0.90])
    assert ci.mean == pytest.approx(0.8)
    assert ci.half == pytest.approx(0.2484, abs=1e-4)
    assert (ci.low, ci.high) == (pytest.approx(0.5516, abs=1e-4), pytest.approx(1.0484, abs=1e-4))
    assert ci.text() == "0.800 ± 0.248"


def test_one_seed_has_no_interval_and_is_not_judged() -> None:
    ci = mean_ci([0.6])
    assert (ci.mean, ci.half, ci.text()) == (0.6, None, "0.600")
    assert verdict(ci, ">") == "not judged"
    assert why_not_judged(ci) == "one seed: no interval"
    with pytest.raises(ValueError, match="at least one value"):
        mean_ci([])


@pytest.mark.parametrize(
    ("interval", "relation", "expected"),
    [
        (Interval(0.10, 0.05, 3), ">", "holds"),
        (Interval(0.02, 0.05, 3), ">", "inconclusive"),
        (Interval(-0.10, 0.05, 3), ">", "does not hold"),
        # seeds that tie exactly: a width of 0 measures no chance, so it cannot judge
        (Interval(0.0, 0.0, 3), ">", "not judged"),
        (Interval(0.0, 0.0, 3), ">=", "not judged"),
        (Interval(0.05, 0.0, 2), ">", "not judged"),
        (Interval(-0.02, 0.05, 3), ">=", "inconclusive"),
        (Interval(-0.10, 0.05, 3), ">=", "does not hold"),
    ],
)
def test_verdict_at_the_interval_level(interval: Interval, relation: str, expected: str) -> None:
    assert verdict(interval, relation) == expected  # type: ignore[arg-type]


def test_pairing_by_seed_separates_arms_whose_own_intervals_overlap() -> None:
    # diffs 0.05, 0.06, 0.04: mean 0.05, sd 0.01, half 4.303 * 0.01 / sqrt(3) = 0.0248
    a, b = [0.80, 0.90, 0.70], [0.75, 0.84, 0.66]
    assert mean_ci(a).low < mean_ci(b).high  # type: ignore[operator]
    outcome, difference = paired_verdict(a, b, ">")
    assert outcome == "holds"
    assert difference.mean == pytest.approx(0.05)
    assert difference.half == pytest.approx(0.0248, abs=1e-4)
    # diffs 0.1, 0.15, 0.05: mean 0.1, sd 0.05, half 4.303 * 0.05 / sqrt(3) = 0.1242
    outcome, difference = paired_verdict([0.8, 0.9, 0.85], [0.7, 0.75, 0.8], ">")
    assert (outcome, round(difference.half or 0, 4)) == ("inconclusive", 0.1242)


def test_seeds_to_decide_by_hand() -> None:
    # mean 0.5, sd 0.5 (half-width 12.706 * 0.5 / sqrt(2) at n = 2): t_{S-1} * 0.5 / sqrt(S)
    # is 4.49, 1.24, 0.80, 0.62, 0.52 for S = 2..6 and 0.46 < 0.5 at S = 7
    assert seeds_to_decide(Interval(0.5, 12.706 * 0.5 / math.sqrt(2), 2)) == 7
    assert seeds_to_decide(Interval(-0.5, 12.706 * 0.5 / math.sqrt(2), 2)) == 7  # either sign
    # the default ablation's Fig. 6 at 3 seeds: +0.031 ± 0.280, sd 0.113
    assert seeds_to_decide(Interval(0.031, 0.280, 3)) == 54
    assert seeds_to_decide(Interval(0.0, 0.1, 3)) is None  # no difference to find
    assert seeds_to_decide(Interval(0.001, 0.5, 3)) is None  # beyond 1000 seeds
    assert seeds_to_decide(Interval(0.3, None, 1)) is None  # one seed: no spread measured


def test_a_chain_holds_only_if_every_link_holds() -> None:
    assert combine(["holds", "holds"]) == "holds"
    assert combine(["holds", "inconclusive"]) == "inconclusive"
    assert combine(["inconclusive", "does not hold"]) == "does not hold"
    assert combine(["holds", "not judged"]) == "inconclusive"  # a link nobody could judge
    assert combine(["not judged", "not judged"]) == "not judged"


def test_seeds_that_tie_are_not_judged_whatever_float_rounding_left() -> None:
    # Issue 55, Why 5 (the interval over seeds): 0.05 better at every seed gave
    # "+0.050 ± 0.000 -> holds"; two seeds tied at 0 gave "+0.000 ± 0.000 -> does not hold".
    outcome, difference = paired_verdict([0.80, 0.90, 0.70], [0.75, 0.85, 0.65], ">")
    assert (outcome, difference.half) == ("not judged", 0.0)  # 0.8 - 0.75 != 0.9 - 0.85 in float
    assert why_not_judged(difference) == (
        "the 3 seeds' differences are all +0.050: their spread, and so the interval's width, "
        "is 0, which measures no chance at all"
    )
    assert paired_verdict([0.5, 0.5], [0.5, 0.5], ">")[0] == "not judged"
    assert seeds_to_decide(difference) is None  # no spread to plan from


def test_methods_that_could_not_judge_leave_the_verdict_to_those_that_could() -> None:
    assert agreed(["not judged", "holds"]) == "holds"
    assert agreed(["not judged", "not judged"]) == "not judged"
    assert agreed(["holds", "inconclusive"]) == "inconclusive"


def _rows(arm: str, policy: int, metric: str, k: int, values: list[float]) -> list[dict]:
    return [
        {"arm": arm, "seed": s, "policy_iteration": policy, "metric": metric, "k": k, "value": v}
        for s, v in enumerate(values)
    ]


def test_claims_and_table_from_ablation_rows() -> None:
    rows = [
        *_rows("grpo_os", 0, "greedy_accuracy", 1, [0.50, 0.60, 0.55]),
        *_rows("grpo_os", 1, "greedy_accuracy", 1, [0.80, 0.90, 0.70]),
        *_rows("grpo_os", 2, "greedy_accuracy", 1, [0.85, 0.90, 0.80]),
        *_rows("online_rft", 0, "greedy_accuracy", 1, [0.50, 0.60, 0.55]),
        *_rows("online_rft", 1, "greedy_accuracy", 1, [0.75, 0.84, 0.66]),
        # grpo_os, policy_0 -> policy_2: Maj@8 gains 0.2, 0.3, 0.25; Pass@8 gains 0, 0.05, -0.05
        *_rows("grpo_os", 0, "maj@k", 8, [0.5, 0.5, 0.5]),
        *_rows("grpo_os", 2, "maj@k", 8, [0.7, 0.8, 0.75]),
        *_rows("grpo_os", 0, "pass@k", 8, [0.9, 0.9, 0.9]),
        *_rows("grpo_os", 2, "pass@k", 8, [0.9, 0.95, 0.85]),
    ]
    values = Values.from_rows(rows)
    fig5, fig6, fig7 = claims(values)
    # Fig. 5 compares policy_1 (equal budgets): 0.04 to 0.06 better at every seed
    assert [link.verdict for link in fig5.links] == [None, "holds", None]
    assert fig5.verdict == "holds"
    assert fig6.verdict is None and "not run" in fig6.text()
    assert fig7.verdict == "holds"  # gain differences 0.2, 0.25, 0.3: interval above 0
    assert fig7.links[0].difference.mean == pytest.approx(0.25)  # type: ignore[union-attr]
    table = results_table(values)
    assert [(r["arm"], r["policy"], r["seeds"]) for r in table] == [
        ("policy_0", 0, 3),
        ("grpo_os", 1, 3),
        ("grpo_os", 2, 3),
        ("online_rft", 1, 3),
    ]
    assert table[1]["greedy"].text() == "0.800 ± 0.248"
    assert table[1]["maj"] is None  # Maj@8 of grpo_os's policy_1 was not given
    text = format_results_table(values)
    assert "Maj@8" in text.splitlines()[0]
    # sd 0.05 over 3 seeds: half-width 4.303 * 0.05 / sqrt(3) = 0.124
    assert " ".join(text.splitlines()[4].split()) == (
        "grpo_os 2 3 0.850 ± 0.124 0.750 ± 0.124 0.900 ± 0.124"
    )


def test_an_undecided_comparison_says_how_many_seeds_would_decide_it() -> None:
    # differences 0.05, -0.05, 0.10: mean 0.033, sd 0.076, half-width 0.190 -> inconclusive
    rows = [
        *_rows("grpo_os", 3, "greedy_accuracy", 1, [0.80, 0.70, 0.90]),
        *_rows("grpo_os_rm_once", 3, "greedy_accuracy", 1, [0.75, 0.75, 0.80]),
    ]
    link = claims(Values.from_rows(rows))[1].links[0]
    assert link.verdict == "inconclusive" and link.difference is not None
    needed = seeds_to_decide(link.difference)
    assert needed is not None and needed > 3
    assert f"at this mean and spread about {needed} seeds would decide it" in "\n".join(
        link.lines()
    )
    decided = [*_rows("grpo_os", 3, "greedy_accuracy", 1, [0.9, 0.9, 0.95]), *rows[3:]]
    assert not any(
        "seeds would decide" in line
        for line in claims(Values.from_rows(decided))[1].links[0].lines()
    )
