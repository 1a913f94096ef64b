"""Statistics over training seeds for `grail compare`, on scipy.stats (its Student t, `ttest_1samp`, and
`permutation_test` beyond the exact range).

    per arm    mean over seeds ± t_{0.975, S−1} · sd / √S   (Student t-interval over the S per-seed values)
    paired     d_s = arm_s − base_s for each seed s both have; the same t-interval over the d_s
    seeds      half-width(S) = t_{0.975, S−1} · sd_d / √S; the S that brings it under d points, and the S that
               gives 80% power at a true difference d: (t_{0.975, S−1} + t_{0.80, S−1}) · sd_d / √S ≤ d
    t test     the paired t-test's two-sided p (scipy.stats.ttest_1samp of the d_s, the same as ttest_rel of the
               two arms); it can be as small as the data make it at any S ≥ 2, where the sign-flip p cannot go below
               2 / 2^S
    no normal  two checks of the paired differences that do not assume the d_s normal: the sign-flip permutation
               test (under H0 each d_s is as likely −d_s: the two-sided p is the share of the 2^S sign assignments
               whose |mean| reaches the observed one; exact, so with S seeds p ≥ 2 / 2^S: S ≥ 6 to reach 0.05), and
               a percentile bootstrap interval of the mean over seeds (grail.evaluation.bootstrap)
    several    Holm's step-down adjustment of m p-values tested together: sorted p₍₁₎ ≤ … ≤ p₍ₘ₎, adjusted
               p₍ᵢ₎ = max over j ≤ i of min(1, (m − j + 1) · p₍ⱼ₎); rejecting where it is below α keeps the chance of
               any false rejection among the m below α, without assuming them independent

What is computed here rather than by scipy: the exact sign-flip count up to 30 seeds by meeting in the middle
(scipy's exact `permutation_test` enumerates all 2^S assignments: 2^30 at 30 seeds), Holm's adjustment (not in
scipy.stats), the smallest p a test can give (`smallest_p`, `rule_attainable`), and the bootstrap, which is
grail-rl's own so that compare and evaluation draw alike. The t-interval's mean and sd are summed here in Python,
in the order the committed reports were rendered in, so that they render again to the last digit."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats as scipy_stats

from grail.evaluation.bootstrap import bootstrap_intervals

__all__ = ["Interval", "LEVEL", "POWER", "bootstrap_interval", "holm", "paired_interval", "rule_attainable",
           "seeds_needed", "sign_flip_p", "smallest_p", "t_interval", "t_p", "t_quantile"]

LEVEL = 0.95
POWER = 0.80


def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t with df > 0 degrees of freedom (scipy.stats.t.ppf)."""
    if not 0.0 < p < 1.0 or not df > 0:
        raise ValueError(f"t_quantile: need 0 < p < 1 and df > 0; got p={p}, df={df}.")
    return float(scipy_stats.t.ppf(p, df))


@dataclass(frozen=True)
class Interval:
    """Mean over n values with a t-interval; sd, half_width, low and high are None when n < 2."""

    n: int
    mean: float | None
    sd: float | None = None
    half_width: float | None = None
    low: float | None = None
    high: float | None = None
    values: tuple[float, ...] = ()


def t_interval(values: Sequence[float], level: float = LEVEL) -> Interval:
    """mean ± t_{(1+level)/2, n−1} · sd / √n over `values` (sd with n − 1); no interval for n < 2."""
    values = tuple(float(v) for v in values)
    n = len(values)
    if n == 0:
        return Interval(0, None)
    mean = sum(values) / n
    if n < 2:
        return Interval(n, mean, values=values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = t_quantile((1.0 + level) / 2.0, n - 1) * sd / math.sqrt(n)
    return Interval(n, mean, sd, half, mean - half, mean + half, values)


def t_p(values: Sequence[float]) -> float | None:
    """Two-sided p of the one-sample t-test of mean 0 over `values` (the paired t-test of the differences;
    scipy.stats.ttest_1samp); None for fewer than 2 values; 1.0 for a zero mean, 0.0 for a non-zero mean with no
    spread (where scipy would divide by a zero or rounding-sized sd)."""
    interval = t_interval(values)
    if interval.n < 2:
        return None
    if interval.mean == 0.0:
        return 1.0
    if not interval.sd:
        return 0.0
    return float(scipy_stats.ttest_1samp(interval.values, 0.0).pvalue)


def smallest_p(test: str, seeds: int) -> float:
    """The smallest two-sided p `test` ("t" or "sign_flip") can give over `seeds` paired seeds, whatever the data:
    0 for the t-test (its statistic is unbounded), 2 / 2^S for the exact sign-flip test."""
    if test == "t":
        return 0.0 if seeds >= 2 else 1.0
    if test == "sign_flip":
        return 2.0 / 2**seeds
    raise ValueError(f"test {test!r}: choose 't' or 'sign_flip'.")


def rule_attainable(test: str, seeds: int, comparisons: int, alpha: float = 0.05) -> bool:
    """Whether a rule "Holm-adjusted p of `test` below `alpha`" over `comparisons` tests at `seeds` seeds can be met
    by any data: Holm multiplies the smallest p by the number of comparisons."""
    return comparisons * smallest_p(test, seeds) < alpha


def paired_interval(base: dict[int, float], other: dict[int, float], level: float = LEVEL) -> Interval:
    """t-interval of other_s − base_s over the seeds s both have (keyed by seed)."""
    seeds = sorted(set(base) & set(other))
    return t_interval([other[s] - base[s] for s in seeds], level)


def seeds_needed(sd: float, difference: float, level: float = LEVEL, power: float | None = None,
                 most: int = 10_000) -> int | None:
    """Smallest S ≥ 2 with t_{(1+level)/2, S−1}·sd/√S ≤ difference (the interval's half-width), or, with `power`,
    (t_{(1+level)/2, S−1} + t_{power, S−1})·sd/√S ≤ difference (a true difference of that size excludes 0 from
    the interval with probability ≈ power). None if more than `most` seeds would be needed."""
    if sd <= 0:
        return 2  # no spread observed: the smallest S with an interval
    def factor(s):
        return t_quantile((1 + level) / 2, s - 1) + (t_quantile(power, s - 1) if power else 0.0)

    low, high = 2, 2
    while factor(high) * sd / math.sqrt(high) > difference:
        if high >= most:
            return None
        low, high = high, min(2 * high, most)
    while low < high:  # the factor·sd/√S decreases in S: bisect for the first S that fits
        mid = (low + high) // 2
        low, high = (mid + 1, high) if factor(mid) * sd / math.sqrt(mid) > difference else (low, mid)
    return low


def _signed_sums(values: Sequence[float]) -> list[float]:
    """The 2^len(values) sums Σ ±v, one per sign assignment."""
    sums = [0.0]
    for v in values:
        sums = [s + v for s in sums] + [s - v for s in sums]
    return sums


def sign_flip_p(differences: Sequence[float], exact_up_to: int = 30, draws: int = 200_000,
                seed: int = 0) -> float | None:
    """Two-sided p of the mean of `differences` under the sign-flip null (module docstring): exact over all 2^n
    assignments for n ≤ exact_up_to, else scipy.stats.permutation_test over `draws` random assignments (rng `seed`;
    the observed one counted). None for no differences. The exact count meets in the middle: the signed sums of each
    half (2^(n/2) each), one half sorted, and for each sum a of the other the b with |a + b| ≥ observed found by
    bisection, so 30 seeds cost about 2^15 · 15 steps, not 2^30."""
    import bisect

    d = [float(v) for v in differences]
    n = len(d)
    if n == 0:
        return None
    observed = abs(sum(d)) - 1e-12 * (1.0 + sum(abs(v) for v in d))  # ties count as reaching it
    if observed <= 0.0:
        return 1.0
    if n <= exact_up_to or n < 2:  # scipy's permutation_test takes two or more
        left, right = _signed_sums(d[: n // 2]), sorted(_signed_sums(d[n // 2:]))
        hits = sum(len(right) - bisect.bisect_left(right, observed - a) + bisect.bisect_right(right, -observed - a)
                   for a in left)
        return hits / 2**n
    result = scipy_stats.permutation_test((d,), _mean, permutation_type="samples", vectorized=True,
                                          n_resamples=draws, batch=10_000, rng=seed)
    return float(result.pvalue)


def _mean(x, axis):
    return x.mean(axis=axis)


def bootstrap_interval(values: Sequence[float], level: float = LEVEL, resamples: int = 20_000,
                       seed: int = 0) -> tuple[float, float] | None:
    """Percentile bootstrap interval of the mean of `values` (grail.evaluation.bootstrap: its draw from
    random.Random(seed) and its quantile rule); None for fewer than 2 values."""
    if len(values) < 2:
        return None
    return bootstrap_intervals([values], resamples=resamples, level=level, seed=seed)[0]


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values (module docstring), in the order given."""
    m = len(p_values)
    if any(not 0.0 <= p <= 1.0 for p in p_values):
        raise ValueError(f"p-values must lie in [0, 1], got {list(p_values)}")
    adjusted, running = [0.0] * m, 0.0
    for rank, i in enumerate(sorted(range(m), key=lambda i: p_values[i])):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted
