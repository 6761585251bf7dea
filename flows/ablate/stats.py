"""Statistics of an ablation over seeds: mean and Student-t 95% interval, and the verdict of
an ordering claim ("A > B", "A >= B") from the interval of the per-seed differences.

Pure functions of lists of floats; no store, no torch. Seeds pair the arms (the same seed
gives every arm the same evaluation problems and sampling seeds), so a claim is judged on
the paired differences A_s - B_s, whose interval is narrower than the two arms' own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Literal

# Values equal up to float rounding tie (0.80 - 0.75 and 0.90 - 0.85 differ by 1e-16): a
# spread of 0, not one that float noise makes look like the tightest interval of all.
TIE_TOLERANCE = 1e-9

Relation = Literal[">", ">="]
# "not judged": the interval cannot say anything (one seed, or seeds that all tie exactly)
Verdict = Literal["holds", "does not hold", "inconclusive", "not judged"]
NOT_JUDGED: Verdict = "not judged"


def two_sided_t_probability(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with `df` degrees of freedom (Abramowitz & Stegun
    26.7.3-4: a finite sum in cos^2 of theta = atan(t / sqrt(df)), exact for integer df)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1 (got {df})")
    theta = math.atan(abs(t) / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    if df % 2 == 1:
        term, total = 1.0, 1.0
        for j in range(1, (df - 1) // 2):  # 1 + 2/3 c2 + 2*4/(3*5) c2^2 + ...
            term *= c2 * (2 * j) / (2 * j + 1)
            total += term
        tail = math.sin(theta) * math.cos(theta) * total if df > 1 else 0.0
        return 2.0 / math.pi * (theta + tail)
    term, total = 1.0, 1.0
    for j in range(1, df // 2):  # 1 + 1/2 c2 + 1*3/(2*4) c2^2 + ...
        term *= c2 * (2 * j - 1) / (2 * j)
        total += term
    return math.sin(theta) * total


def t_quantile(df: int, confidence: float = 0.95) -> float:
    """The t with P(|T| <= t) = `confidence` (12.706 for df 1, 4.303 for df 2 at 95%)."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie strictly between 0 and 1 (got {confidence})")
    low, high = 0.0, 1.0
    while two_sided_t_probability(high, df) < confidence:
        high *= 2.0
    for _ in range(200):  # bisection to float precision
        mid = (low + high) / 2.0
        if two_sided_t_probability(mid, df) < confidence:
            low = mid
        else:
            high = mid
    return (low + high) / 2.0


def normal_quantile(confidence: float = 0.95) -> float:
    """The z with P(|Z| <= z) = `confidence` (1.960 at 95%)."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie strictly between 0 and 1 (got {confidence})")
    return NormalDist().inv_cdf((1.0 + confidence) / 2.0)


@dataclass(frozen=True)
class Interval:
    """Mean of n values and its two-sided t interval; `half` is None below two values."""

    mean: float
    half: float | None
    n: int

    @property
    def low(self) -> float | None:
        return None if self.half is None else self.mean - self.half

    @property
    def high(self) -> float | None:
        return None if self.half is None else self.mean + self.half

    def text(self) -> str:
        """`0.812 ± 0.034` (or `0.812` alone for a single value)."""
        return f"{self.mean:.3f}" if self.half is None else f"{self.mean:.3f} ± {self.half:.3f}"


def mean_ci(values: Sequence[float], confidence: float = 0.95) -> Interval:
    """Mean and t interval mean ± t_{df=n-1} * s / sqrt(n), s the sample standard deviation
    (0 for values that tie to TIE_TOLERANCE)."""
    n = len(values)
    if n == 0:
        raise ValueError("mean_ci needs at least one value")
    mean = math.fsum(values) / n
    if n == 1:
        return Interval(mean, None, 1)
    if max(values) - min(values) <= TIE_TOLERANCE:
        return Interval(mean, 0.0, n)
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    return Interval(mean, t_quantile(n - 1, confidence) * sd / math.sqrt(n), n)


def seeds_to_decide(difference: Interval, confidence: float = 0.95, most: int = 1000) -> int | None:
    """A planning figure for an undecided comparison: the fewest seeds S whose interval
    t_{S-1} * sd / sqrt(S) would be narrower than |mean|, were the mean and the seeds' sd
    (sd = half * sqrt(n) / t_{n-1}) what this interval measured. None without an interval,
    at a mean of 0, or beyond `most` seeds. Estimated from few seeds, it can be far off."""
    if not difference.half or difference.mean == 0.0:  # no spread measured: nothing to scale
        return None
    n = difference.n
    sd = difference.half * math.sqrt(n) / t_quantile(n - 1, confidence)

    def decides(seeds: int) -> bool:
        return t_quantile(seeds - 1, confidence) * sd / math.sqrt(seeds) < abs(difference.mean)

    if not decides(most):
        return None
    low, high = 1, most  # the half-width shrinks as seeds grow: bisect for the first that decides
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if decides(mid) else (mid, high)
    return high


def why_not_judged(difference: Interval) -> str | None:
    """Why an interval of paired differences cannot judge a claim, None if it can: one value
    (no interval), or values that all tie exactly (a spread, and a width, of 0: it measured
    nothing of the chance that separates seeds)."""
    if difference.half is None:
        return "one seed: no interval"
    if difference.half == 0.0:
        return (
            f"the {difference.n} seeds' differences are all {difference.mean:+.3f}: their "
            "spread, and so the interval's width, is 0, which measures no chance at all"
        )
    return None


def verdict(difference: Interval, relation: Relation) -> Verdict:
    """Whether `A relation B` holds given the interval of the paired differences A - B.

    '>': holds if the whole interval is above 0, does not hold if it lies at or below 0.
    '>=': holds if it lies at or above 0 (equal arms on every seed satisfy it), does not hold
    if it is wholly below 0. Anything straddling 0 is inconclusive; an interval that cannot
    judge (why_not_judged: one seed, or a width of 0) is not judged.
    """
    low, high = difference.low, difference.high
    if low is None or high is None or why_not_judged(difference) is not None:
        return NOT_JUDGED
    if relation == ">":
        return "holds" if low > 0 else "does not hold" if high <= 0 else "inconclusive"
    return "holds" if low >= 0 else "does not hold" if high < 0 else "inconclusive"


def paired_verdict(
    a: Sequence[float], b: Sequence[float], relation: Relation, confidence: float = 0.95
) -> tuple[Verdict, Interval]:
    """`verdict` of A relation B from per-seed values (same seed order), with the interval."""
    if len(a) != len(b) or not a:
        raise ValueError(
            f"paired values need the same seeds on both sides (got {len(a)} and {len(b)} values)"
        )
    difference = mean_ci([x - y for x, y in zip(a, b, strict=True)], confidence)
    return verdict(difference, relation), difference


def agreed(verdicts: Sequence[Verdict]) -> Verdict:
    """Several methods' verdicts of one claim: the one every method that could judge reaches,
    inconclusive where they differ, not judged where none could."""
    judged = [v for v in verdicts if v != NOT_JUDGED]
    if not judged:
        return NOT_JUDGED
    return judged[0] if all(v == judged[0] for v in judged) else "inconclusive"


def combine(verdicts: Sequence[Verdict]) -> Verdict:
    """A chain of claims: holds if every link holds, does not hold if any link does not, not
    judged if no link could be judged."""
    if any(v == "does not hold" for v in verdicts):
        return "does not hold"
    if verdicts and all(v == "holds" for v in verdicts):
        return "holds"
    if verdicts and all(v == NOT_JUDGED for v in verdicts):
        return NOT_JUDGED
    return "inconclusive"
