"""The ablation's difference paired by problem and seed (flows/ablate/problem_stats.py): hand
vectors, and its coverage on simulated ablations with a known difference — at least the
nominal 95% whatever the between-seed variance (with 2 or 3 seeds that often tie too), where
pooling all problems as one sample is not."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flows.ablate.problem_stats import (
    RandomEffects,
    SeedDifference,
    hartung_knapp,
    paired_by_problem,
    random_effects,
    seed_difference,
)
from flows.ablate.results import Link, Values, claims
from flows.ablate.stats import Interval, mean_ci, normal_quantile, t_quantile


def test_seed_difference_of_paired_problems() -> None:
    # differences 1, 0, -1, 0: mean 0, sample variance 2/3, se sqrt(2/3 / 4)
    d = seed_difference(7, [1, 1, 0, 0], [0, 1, 1, 0])
    assert (d.seed, d.mean, d.n) == (7, 0.0, 4)
    assert d.se == pytest.approx(math.sqrt(1 / 6))


def test_identical_arms_get_the_one_problem_floor_not_zero_variance() -> None:
    assert seed_difference(0, [1, 0, 1, 0], [1, 0, 1, 0]).se == pytest.approx(1 / 4)


def test_unpaired_problem_lists_are_refused() -> None:
    with pytest.raises(ValueError, match="seed 3: paired problems need the same problems"):
        seed_difference(3, [1, 0], [1])
    with pytest.raises(ValueError, match="at least one seed on both sides"):
        paired_by_problem({0: [1.0]}, {1: [1.0]})


def test_two_seeds_with_heterogeneity() -> None:
    # w = 100, 100; fixed 0.2; Q = 2; tau^2 = (2 - 1) / (200 - 100) = 0.01; I^2 = 1/2;
    # w* = 50, 50; q = 1; half = t_1 * sqrt(1 / 100) = 1.2706
    pooled = random_effects([SeedDifference(0, 0.1, 0.1, 32), SeedDifference(1, 0.3, 0.1, 32)])
    assert pooled.tau2 == pytest.approx(0.01)
    assert pooled.i2 == pytest.approx(0.5)
    assert pooled.interval.mean == pytest.approx(0.2)
    assert pooled.interval.half == pytest.approx(1.2706, abs=1e-4)


def test_three_seeds_weighted_by_their_evaluation_noise() -> None:
    # v = .01, .04, .01 -> w = 100, 25, 100 (sum 225); fixed = 15/225; Q = 1.0 < S - 1, so
    # tau^2 = 0, I^2 = 0; mean 1/15; q = Q / 2; half = 4.303 * sqrt(0.5 / 225) = 0.2028.
    # The t-interval of the seed means: 0.100 ± 0.248 (the noisy seed counts as much).
    seeds = [SeedDifference(0, 0.0, 0.1, 32), SeedDifference(1, 0.2, 0.2, 32)]
    pooled = random_effects([*seeds, SeedDifference(2, 0.1, 0.1, 32)])
    assert (pooled.tau2, pooled.i2) == (0.0, 0.0)
    assert pooled.interval.mean == pytest.approx(1 / 15)
    assert pooled.interval.half == pytest.approx(0.2028, abs=1e-4)
    assert pooled.interval.n == 3


def test_hartung_knapp_by_hand() -> None:
    # Two seeds that tie at 0, each with se 0.5 (v = 0.25): w* = 4, 4; q = 0, so the plain
    # Hartung-Knapp width t_1 * sqrt(0 / 8) is 0; the classic random-effects one is
    # z * sqrt(1 / 8) = 1.959964 * 0.353553 = 0.692952.
    tied = hartung_knapp([0.0, 0.0], [0.25, 0.25], tau2=0.0)
    assert (tied.mean, tied.n) == (0.0, 2)
    assert tied.half == pytest.approx(0.692952, abs=1e-6)
    # Seeds 0.1 and 0.3 (v = 0.01 each) with tau^2 0.01: w* = 50, 50, q = 1; the spread wins,
    # 12.706 * sqrt(1 / 100) = 1.2706 > 1.96 * 0.1.
    spread = hartung_knapp([0.1, 0.3], [0.01, 0.01], tau2=0.01)
    assert spread.mean == pytest.approx(0.2) and spread.half == pytest.approx(1.2706, abs=1e-4)
    # Three seeds 0.10, 0.11, 0.12 (v = 0.01, 0.04, 0.01): w = 100, 25, 100, mean 0.11; q =
    # (100 * 1e-4 + 0 + 100 * 1e-4) / 2 = 0.01; HK 4.303 * sqrt(0.01 / 225) = 0.0287 < z *
    # sqrt(1 / 225) = 0.1307: nearly agreeing seeds get the width of their own noise.
    near = hartung_knapp([0.10, 0.11, 0.12], [0.01, 0.04, 0.01], tau2=0.0)
    assert near.mean == pytest.approx(0.11)
    assert near.half == pytest.approx(1.959964 / 15, abs=1e-6)
    with pytest.raises(ValueError, match="S >= 2 differences and as many variances"):
        hartung_knapp([0.1], [0.01], tau2=0.0)
    with pytest.raises(ValueError, match="variance plus tau"):
        hartung_knapp([0.1, 0.2], [0.0, 0.01], tau2=0.0)


_DIFFERENCES = st.lists(st.floats(-1.0, 1.0), min_size=2, max_size=8)


@given(
    _DIFFERENCES,
    st.lists(st.floats(1e-4, 1.0), min_size=8, max_size=8),
    st.floats(0.0, 0.5),
    st.floats(-0.5, 0.5),
)
def test_hartung_knapp_is_never_narrower_than_the_seeds_own_noise(
    d: list[float], v8: list[float], tau2: float, shift: float
) -> None:
    v = v8[: len(d)]
    got = hartung_knapp(d, v, tau2)
    total = math.fsum(1.0 / (x + tau2) for x in v)
    assert got.half is not None and got.half > 0.0
    # at least the classic random-effects interval, so at least the fixed-effect one of the
    # per-seed standard errors (tau^2 = 0), and at least the plain Hartung-Knapp one
    assert got.half >= normal_quantile() * math.sqrt(1.0 / total) * (1 - 1e-12)
    fixed = normal_quantile() * math.sqrt(1.0 / math.fsum(1.0 / x for x in v))
    assert got.half >= fixed * (1 - 1e-12)
    q = math.fsum((di - got.mean) ** 2 / (x + tau2) for di, x in zip(d, v, strict=True))
    plain = t_quantile(len(d) - 1) * math.sqrt(q / (len(d) - 1) / total)
    assert got.half >= plain * (1 - 1e-12)
    # the seeds' order does not matter; moving every difference moves the mean alone
    turned = hartung_knapp(d[::-1], v[::-1], tau2)
    assert turned.mean == pytest.approx(got.mean, abs=1e-12)
    assert turned.half == pytest.approx(got.half, rel=1e-9)
    moved = hartung_knapp([x + shift for x in d], v, tau2)
    assert moved.mean == pytest.approx(got.mean + shift, abs=1e-9)
    assert moved.half == pytest.approx(got.half, rel=1e-6, abs=1e-12)


def test_a_tied_two_seed_ablation_is_not_decided_by_a_zero_width_interval() -> None:
    # Issue 55, Why 5: grpo_os and online_rft answer the same 2 questions alike at both seeds,
    # so each seed's difference is 0 with se 0.5 (the one-question floor). Today both
    # intervals were "+0.000 ± 0.000" and "grpo_os > online_rft" did not hold.
    same = {0: [1.0, 0.0], 1: [0.0, 1.0]}
    rows = [*_seed_means("grpo_os", 1, same), *_seed_means("online_rft", 1, same)]
    problems = [*_problem_rows("grpo_os", 1, same), *_problem_rows("online_rft", 1, same)]
    fig5 = claims(Values.from_rows(rows, problems))[0]
    link = fig5.links[1]
    assert link.text == "grpo_os > online_rft"
    pooled = link.by_problem
    assert pooled is not None and [d.se for d in pooled.seeds] == [0.5, 0.5]
    assert pooled.interval.half == pytest.approx(1.959964 * math.sqrt(1 / 8), abs=1e-6)
    assert (link.seed_verdict, link.problem_verdict) == ("not judged", "inconclusive")
    assert link.verdict == "inconclusive" and fig5.verdict == "inconclusive"
    text = fig5.text()
    assert "difference +0.000 ± 0.000 (n=2) -> not judged (the 2 seeds' differences" in text
    assert "paired by problem and seed: +0.000 ± 0.693 (n=2) -> inconclusive" in text


def test_one_seed_has_no_interval() -> None:
    pooled = paired_by_problem({0: [1.0, 0.0]}, {0: [0.0, 0.0]})
    assert pooled.interval.half is None and pooled.interval.mean == 0.5


def _simulated_ablation(
    rng: random.Random,
    seeds: int,
    problems: int,
    delta: float,
    tau: float,
    disagree: float = 0.5,
) -> tuple[dict[int, list[float]], dict[int, list[float]]]:
    """Per seed a training-chance difference D_s ~ N(delta, tau^2); per problem the arms
    disagree with probability `disagree` (A right and B wrong with disagree / 2 + D_s / 2, the
    reverse with disagree / 2 - D_s / 2), so E[A - B] = delta exactly."""
    a: dict[int, list[float]] = {}
    b: dict[int, list[float]] = {}
    for s in range(seeds):
        d = min(disagree - 0.001, max(0.001 - disagree, rng.gauss(delta, tau)))
        a[s], b[s] = [], []
        for _ in range(problems):
            u = rng.random()
            if u < disagree / 2 + d / 2:
                a[s].append(1.0), b[s].append(0.0)
            elif u < disagree:
                a[s].append(0.0), b[s].append(1.0)
            else:
                same = float(rng.random() < 0.5)
                a[s].append(same), b[s].append(same)
    return a, b


def _pooled_as_one_sample(
    a: dict[int, list[float]], b: dict[int, list[float]]
) -> tuple[float, float]:
    """The interval that ignores seeds: every problem of every seed one paired sample, z 1.96."""
    d = [x - y for s in a for x, y in zip(a[s], b[s], strict=True)]
    mean = math.fsum(d) / len(d)
    se = math.sqrt(math.fsum((x - mean) ** 2 for x in d) / (len(d) - 1) / len(d))
    return mean - 1.96 * se, mean + 1.96 * se


@pytest.mark.parametrize(("seeds", "tau"), [(3, 0.0), (3, 0.15), (5, 0.05)])
def test_coverage_is_near_nominal_whatever_the_between_seed_variance(
    seeds: int, tau: float
) -> None:
    rng, delta, reps = random.Random(seeds * 1000 + int(tau * 100)), 0.05, 1500
    covered = covered_t = covered_pooled = 0
    for _ in range(reps):
        a, b = _simulated_ablation(rng, seeds, 32, delta, tau)
        ci = paired_by_problem(a, b).interval
        assert ci.low is not None and ci.high is not None
        covered += ci.low <= delta <= ci.high
        t = mean_ci([math.fsum(a[s]) / 32 - math.fsum(b[s]) / 32 for s in a])
        assert t.low is not None and t.high is not None
        covered_t += t.low <= delta <= t.high
        low, high = _pooled_as_one_sample(a, b)
        covered_pooled += low <= delta <= high
    rate = covered / reps
    print(
        f"S={seeds} tau={tau}: {rate:.3f} (seed-mean t {covered_t / reps:.3f}, "
        f"pooled {covered_pooled / reps:.3f})"
    )
    # at least nominal: the small-sample correction keeps the interval as wide as the seeds'
    # own noise, which covers a little more than 95% where seeds agree (98.5% at tau 0)
    assert 0.925 <= rate <= 0.99
    assert 0.925 <= covered_t / reps <= 0.975  # the t-interval of seed means
    if tau >= 0.15:  # training chance the pooled interval cannot see: it calls noise a finding
        assert covered_pooled / reps < 0.85


# Measured (1500 ablations each): at 2 seeds 1.5% miss the truth, 9% of the tied ones; the
# plain Hartung-Knapp interval missed 18% (every tie), the t-interval of seed means too.
TIES_AT_LEAST = {2: 150, 3: 20}


@pytest.mark.parametrize("seeds", [2, 3])
def test_coverage_with_two_or_three_seeds_that_often_tie(seeds: int) -> None:
    # Arms that disagree on 1 problem in 10 of 24 (a difference of 1/24 per disagreement) tie
    # often: at 2 seeds the plain Hartung-Knapp interval then has width 0 and misses the true
    # 0.02, whatever each seed's own noise. The corrected one keeps at least that noise.
    rng, delta, reps = random.Random(55 + seeds), 0.02, 1500
    covered = ties = covered_on_ties = 0
    for _ in range(reps):
        a, b = _simulated_ablation(rng, seeds, 24, delta, 0.0, disagree=0.1)
        pooled = paired_by_problem(a, b)
        ci = pooled.interval
        assert ci.low is not None and ci.high is not None and ci.low < ci.high
        hit = ci.low <= delta <= ci.high
        covered += hit
        if len({d.mean for d in pooled.seeds}) == 1:
            ties += 1
            covered_on_ties += hit
    print(f"S={seeds}: coverage {covered / reps:.3f}; {ties} ties, covered {covered_on_ties}")
    assert ties >= TIES_AT_LEAST[seeds]
    assert 0.95 <= covered / reps <= 0.997
    assert covered_on_ties / ties >= 0.85


def _problem_rows(
    arm: str, policy: int, by_seed: dict[int, list[float]], ids: str = "abcd"
) -> list[dict]:
    return [
        {"arm": arm, "seed": s, "policy_iteration": policy, "metric": "greedy_accuracy"}
        | {"k": 1, "problem_index": i, "problem_id": ids[i], "value": v}
        for s, values in by_seed.items()
        for i, v in enumerate(values)
    ]


def _seed_means(arm: str, policy: int, by_seed: dict[int, list[float]]) -> list[dict]:
    return [
        {"arm": arm, "seed": s, "policy_iteration": policy, "metric": "greedy_accuracy"}
        | {"k": 1, "value": sum(v) / len(v)}
        for s, v in by_seed.items()
    ]


def test_a_claim_reports_both_intervals_and_decides_only_where_they_agree() -> None:
    # grpo_os vs grpo_os_rm_once at their final policy_1, 3 seeds x 4 problems.
    # Per-problem differences: s0 (1,1,0,0) mean .5 se .2887; s1 (1,0,1,0) same; s2 (1,1,1,0)
    # mean .75 se .25. Seed means: .5, .5, .75 -> t interval .583 ± .359 -> holds.
    retrained = {0: [1.0, 1.0, 0.0, 1.0], 1: [1.0, 1.0, 1.0, 0.0], 2: [1.0, 1.0, 1.0, 0.0]}
    once = {0: [0.0, 0.0, 0.0, 1.0], 1: [0.0, 1.0, 0.0, 0.0], 2: [0.0, 0.0, 0.0, 0.0]}
    rows = [*_seed_means("grpo_os", 1, retrained), *_seed_means("grpo_os_rm_once", 1, once)]
    problems = [*_problem_rows("grpo_os", 1, retrained), *_problem_rows("grpo_os_rm_once", 1, once)]
    fig6 = claims(Values.from_rows(rows, problems))[1]
    link = fig6.links[0]
    assert link.seed_verdict == "holds" and link.difference is not None
    assert link.difference.mean == pytest.approx(7 / 12)
    pooled = link.by_problem
    assert pooled is not None and [d.mean for d in pooled.seeds] == [0.5, 0.5, 0.75]
    # w = 12, 12, 16; Q = 0.0833 + 0.0833 + 0.1111 < 2: tau^2 = 0; mean = (6+6+12)/40 = 0.6;
    # q = Q' / 2 with Q' = 12*.01 + 12*.01 + 16*.0225 = 0.6; half = 4.303 * sqrt(0.3 / 40).
    assert pooled.tau2 == 0.0
    assert pooled.interval.mean == pytest.approx(0.6)
    assert pooled.interval.half == pytest.approx(4.3027 * math.sqrt(0.3 / 40), abs=1e-3)
    assert link.problem_verdict == "holds" and fig6.verdict == "holds"
    text = fig6.text()
    assert "paired by problem and seed: +0.600 ± 0.373 (n=3) -> holds" in text
    assert "s2 +0.750 (se 0.250)" in text


def test_where_the_methods_differ_the_comparison_is_inconclusive() -> None:
    seeds = (SeedDifference(0, 0.1, 0.05, 32), SeedDifference(1, 0.2, 0.05, 32))
    straddling = RandomEffects(Interval(0.1, 0.2, 2), 0.0, 0.0, seeds)
    above = RandomEffects(Interval(0.3, 0.2, 2), 0.0, 0.0, seeds)
    seed_holds = ("a >= b", ">=", "holds", Interval(0.15, 0.1, 2))
    assert Link(*seed_holds, straddling).verdict == "inconclusive"  # type: ignore[arg-type]
    assert Link(*seed_holds, above).verdict == "holds"  # type: ignore[arg-type]
    assert Link(*seed_holds).verdict == "holds"  # type: ignore[arg-type]


def test_arms_that_saw_other_problems_are_not_paired() -> None:
    a, b = {0: [1.0, 0.0], 1: [1.0, 1.0]}, {0: [0.0, 0.0], 1: [0.0, 1.0]}
    rows = [*_seed_means("grpo_os", 1, a), *_seed_means("grpo_os_rm_once", 1, b)]
    problems = [*_problem_rows("grpo_os", 1, a), *_problem_rows("grpo_os_rm_once", 1, b, "xy")]
    link = claims(Values.from_rows(rows, problems))[1].links[0]
    assert link.by_problem is None and link.verdict == link.seed_verdict
    assert "the arms saw other problems at seed(s) [0, 1]" in "\n".join(link.lines())
    # Without per-problem rows (an ablation stored before them) the seed verdict alone.
    assert claims(Values.from_rows(rows))[1].links[0].by_problem is None


def test_seed_difference_over_questions_by_hand() -> None:
    # Problems of questions q, q, r, s; differences 1, 1, 0, -1 (mean 1/4). Residuals summed
    # per question: q 3/2, r -1/4, s -5/4; se^2 = 3/2 * (9/4 + 1/16 + 25/16) / 16 = 93/256.
    d = seed_difference(0, [1, 1, 0, 0], [0, 0, 0, 1], questions=["q", "q", "r", "s"])
    assert d.mean == pytest.approx(0.25) and d.se == pytest.approx(math.sqrt(93 / 256))
    # Each problem its own question: the usual s_d / sqrt(n).
    named = seed_difference(7, [1, 1, 0, 0], [0, 1, 1, 0], questions="abcd")
    assert named.se == pytest.approx(seed_difference(7, [1, 1, 0, 0], [0, 1, 1, 0]).se)
    # Identical arms: the floor is one question differing by 1, 1 / C with C = 2 questions.
    assert seed_difference(0, [1, 0, 1, 0], [1, 0, 1, 0], questions="xxyy").se == 0.5
    with pytest.raises(ValueError, match="seed 2: 3 questions for 4 problems"):
        seed_difference(2, [1, 0, 1, 0], [1, 0, 1, 1], questions="xyz")


@pytest.mark.parametrize("copies", [2, 5])
def test_a_question_evaluated_k_times_counts_once_in_the_pairing(copies: int) -> None:
    # The same per-problem values with every question drawn `copies` times (an evaluation
    # with repeats): named questions give the interval of one draw each; unnamed, the draws
    # pass for more problems and the interval narrows.
    rng = random.Random(copies)
    a = {s: [float(rng.random() < 0.6) for _ in range(12)] for s in range(3)}
    b = {s: [float(rng.random() < 0.4) for _ in range(12)] for s in range(3)}
    once = paired_by_problem(a, b, questions={s: list(range(12)) for s in a})
    repeated_a = {s: v * copies for s, v in a.items()}
    repeated_b = {s: v * copies for s, v in b.items()}
    names = {s: list(range(12)) * copies for s in a}
    named = paired_by_problem(repeated_a, repeated_b, questions=names)
    unnamed = paired_by_problem(repeated_a, repeated_b)
    assert [d.se for d in named.seeds] == pytest.approx([d.se for d in once.seeds])
    assert all(u.se < n.se for u, n in zip(unnamed.seeds, named.seeds, strict=True))


def test_stored_questions_reach_the_pairing_and_old_rows_pair_by_problem() -> None:
    a, b = {0: [1.0, 1.0, 0.0, 1.0], 1: [1.0, 0.0, 0.0, 1.0]}, {0: [0.0] * 4, 1: [0.0] * 4}
    rows = [*_seed_means("grpo_os", 1, a), *_seed_means("grpo_os_rm_once", 1, b)]
    plain = [*_problem_rows("grpo_os", 1, a), *_problem_rows("grpo_os_rm_once", 1, b)]
    asked = [r | {"question": "xxyy"[r["problem_index"]]} for r in plain]
    by_problem = claims(Values.from_rows(rows, plain))[1].links[0].by_problem
    by_question = claims(Values.from_rows(rows, asked))[1].links[0].by_problem
    assert by_problem is not None and by_question is not None
    want = [seed_difference(s, a[s], b[s], questions="xxyy").se for s in (0, 1)]
    assert [d.se for d in by_question.seeds] == pytest.approx(want)
    assert [d.se for d in by_problem.seeds] == [seed_difference(s, a[s], b[s]).se for s in (0, 1)]
