"""The ablation's difference paired by problem and seed (flows/ablate/problem_stats.py): hand
vectors, and its coverage on simulated ablations with a known difference — near the nominal
95% whatever the between-seed variance, where pooling all problems as one sample is not."""

from __future__ import annotations

import math
import random

import pytest

from flows.ablate.problem_stats import (
    RandomEffects,
    SeedDifference,
    paired_by_problem,
    random_effects,
    seed_difference,
)
from flows.ablate.results import Link, Values, claims
from flows.ablate.stats import Interval, mean_ci


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


def test_one_seed_has_no_interval() -> None:
    pooled = paired_by_problem({0: [1.0, 0.0]}, {0: [0.0, 0.0]})
    assert pooled.interval.half is None and pooled.interval.mean == 0.5


def _simulated_ablation(
    rng: random.Random, seeds: int, problems: int, delta: float, tau: float
) -> tuple[dict[int, list[float]], dict[int, list[float]]]:
    """Per seed a training-chance difference D_s ~ N(delta, tau^2); per problem the arms
    disagree with probability 0.5 (A right and B wrong with 0.25 + D_s / 2, the reverse with
    0.25 - D_s / 2), so E[A - B] = delta exactly."""
    a: dict[int, list[float]] = {}
    b: dict[int, list[float]] = {}
    for s in range(seeds):
        d = min(0.499, max(-0.499, rng.gauss(delta, tau)))
        a[s], b[s] = [], []
        for _ in range(problems):
            u = rng.random()
            if u < 0.25 + d / 2:
                a[s].append(1.0), b[s].append(0.0)
            elif u < 0.5:
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
    assert 0.925 <= rate <= 0.975
    assert 0.925 <= covered_t / reps <= 0.975  # today's interval too
    if tau >= 0.15:  # training chance the pooled interval cannot see: it calls noise a finding
        assert covered_pooled / reps < 0.85


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
