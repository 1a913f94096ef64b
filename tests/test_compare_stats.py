"""grail compare's statistics over seeds (grail.analysis.compare.stats, on scipy.stats): the Student t quantile
against its closed forms, the t-interval and the t-test's p by hand and against scipy's paired t-test, the
seeds-needed count by its definition, the sign-flip permutation p by hand, against the whole enumeration and against
scipy's exact permutation test, the bootstrap interval's bounds. The report's use of them: tests/test_compare.py."""

import math
import random
import statistics

import numpy as np
import pytest
from scipy import stats as scipy_stats

from grail.analysis.compare.stats import (
    bootstrap_interval,
    holm,
    rule_attainable,
    seeds_needed,
    sign_flip_p,
    smallest_p,
    t_interval,
    t_p,
    t_quantile,
)


@pytest.mark.parametrize("p", [0.6, 0.8, 0.9, 0.975, 0.995])
def test_t_quantile_matches_the_closed_forms(p):
    assert t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-9)  # Cauchy
    assert t_quantile(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-9)
    normal = statistics.NormalDist().inv_cdf(p)
    assert t_quantile(p, 1e7) == pytest.approx(normal, rel=1e-5)  # t → normal as df → ∞
    assert t_quantile(1 - p, 7) == pytest.approx(-t_quantile(p, 7))
    assert t_quantile(0.975, 4) == pytest.approx(2.776, abs=5e-4)  # the textbook table's 4 degrees of freedom
    with pytest.raises(ValueError, match="0 < p < 1 and df > 0"):
        t_quantile(1.0, 4)


def test_t_interval_by_hand_and_without_a_spread():
    # values 1, 2, 3: mean 2, sd 1, half-width t_{0.975,2} / sqrt(3); t_{0.975,2} = 0.95 / sqrt(2·0.975·0.025)
    got = t_interval([1.0, 2.0, 3.0])
    assert got.mean == 2.0 and got.sd == pytest.approx(1.0)
    assert got.half_width == pytest.approx(0.95 / math.sqrt(2 * 0.975 * 0.025) / math.sqrt(3))
    one = t_interval([0.7])
    assert one.mean == 0.7 and one.sd is None and one.half_width is None and one.low is None


def test_the_t_interval_and_t_test_are_scipy_s_paired_t_test():
    rng = random.Random(5)
    for n in (2, 3, 6, 13, 30):
        base = [rng.uniform(0.2, 0.6) for _ in range(n)]
        other = [b + rng.gauss(0.02, 0.05) for b in base]
        d = [o - b for o, b in zip(other, base, strict=True)]
        scipy_test = scipy_stats.ttest_rel(other, base)
        assert t_p(d) == pytest.approx(scipy_test.pvalue, rel=1e-12)
        got, ci = t_interval(d, level=0.9), scipy_test.confidence_interval(0.9)
        assert (got.low, got.high) == pytest.approx((ci.low, ci.high), rel=1e-12, abs=1e-15)
        assert got.sd == pytest.approx(np.std(d, ddof=1), rel=1e-12)


@pytest.mark.parametrize("sd, d, power", [(4.0, 1.0, None), (4.0, 2.0, None), (4.0, 2.0, 0.8), (0.5, 5.0, 0.8)])
def test_seeds_needed_is_the_first_count_that_is_enough(sd, d, power):
    def enough(s):
        factor = t_quantile(0.975, s - 1) + (t_quantile(power, s - 1) if power else 0.0)
        return factor * sd / math.sqrt(s) <= d

    s = seeds_needed(sd, d, power=power)
    assert enough(s) and (s == 2 or not enough(s - 1))


def test_sign_flip_p_counts_the_sign_assignments_by_hand():
    # 5 positive differences: only all-plus and all-minus reach |mean|, so p = 2 / 32, the smallest 5 seeds allow
    assert sign_flip_p([1.0, 2.0, 3.0, 4.0, 5.0]) == pytest.approx(2 / 32)
    # 1, 1, -1: the 8 assignments' sums are ±3 (2 of them) and ±1 (6): all reach |1|
    assert sign_flip_p([1.0, 1.0, -1.0]) == 1.0
    # 3, 1, 1: sums 5, 3, 3, 1 and their negatives; |sum| >= 5 for 2 of 8
    assert sign_flip_p([3.0, 1.0, 1.0]) == pytest.approx(2 / 8)
    assert sign_flip_p([]) is None


def test_sign_flip_p_meets_in_the_middle_as_the_whole_enumeration_counts():
    import itertools

    def brute(d):
        observed = abs(sum(d)) - 1e-12 * (1.0 + sum(abs(v) for v in d))
        return sum(abs(sum(s * v for s, v in zip(signs, d, strict=True))) >= observed
                   for signs in itertools.product((1.0, -1.0), repeat=len(d))) / 2 ** len(d)

    rng = random.Random(3)
    for n in range(1, 12):
        # accuracy-like differences (multiples of 100/256 points, many ties) and continuous ones
        ties = [100 * rng.randint(-6, 9) / 256 for _ in range(n)]
        smooth = [rng.gauss(0.5, 2.0) for _ in range(n)]
        for d in (ties, smooth, [0.0] * n):
            assert sign_flip_p(d) == pytest.approx(brute(d), abs=1e-12), d
    assert 0.0 < sign_flip_p([rng.gauss(1.0, 1.0) for _ in range(30)]) < 0.05  # 2^30 assignments, counted exactly


def _scipy_sign_flip(d):
    """scipy's exact sign-flip test: one sample, `samples` permutations flip each value's sign, all 2^n of them."""
    return scipy_stats.permutation_test((np.array(d),), lambda x, axis: np.mean(x, axis=axis), vectorized=True,
                                        permutation_type="samples", n_resamples=np.inf).pvalue


def test_sign_flip_p_is_scipy_s_exact_permutation_test():
    rng = random.Random(7)
    for n in range(2, 13):  # scipy takes two or more
        ties = [100 * rng.randint(-6, 9) / 256 for _ in range(n)]  # accuracy-like: multiples of 100/256 points
        smooth = [rng.gauss(0.3, 1.0) for _ in range(n)]
        for d in (ties, smooth, [0.0] * n, [1.0] * n):
            assert sign_flip_p(d) == pytest.approx(_scipy_sign_flip(d), abs=1e-12), d
    # beyond the exact range: scipy's random assignments, which agree with the exact count
    d = [rng.gauss(0.3, 1.0) for _ in range(14)]
    assert sign_flip_p(d, exact_up_to=10, draws=40_000) == pytest.approx(sign_flip_p(d), abs=0.01)


@pytest.mark.parametrize("seeds", [2, 5, 6, 9])
def test_the_smallest_p_is_what_scipy_gives_the_most_extreme_data(seeds):
    # every difference positive: the sign-flip floor 2 / 2^S; a tiny spread about a mean: a t-test p below any floor
    assert smallest_p("sign_flip", seeds) == pytest.approx(_scipy_sign_flip(list(range(1, seeds + 1))), rel=1e-12)
    extreme = [1.0 + 1e-6 * k for k in range(seeds)]
    assert scipy_stats.ttest_1samp(extreme, 0.0).pvalue < 1e-6 and smallest_p("t", seeds) == 0.0


def test_bootstrap_interval_brackets_the_mean_and_is_reproducible():
    values = [2.0, -1.0, 4.0, 0.5, 3.0, 1.5]
    low, high = bootstrap_interval(values)
    assert low < statistics.fmean(values) < high and min(values) <= low and high <= max(values)
    assert bootstrap_interval(values) == (low, high)  # a fixed seed
    assert bootstrap_interval([1.0, 1.0, 1.0]) == (1.0, 1.0) and bootstrap_interval([1.0]) is None


def test_holm_multiplies_the_sorted_p_values_by_the_tests_left_and_keeps_them_in_order():
    # sorted: 0.01·4 = 0.04, 0.03·3 = 0.09, 0.04·2 = 0.08 → 0.09 (never below an earlier one), 0.20·1 = 0.20
    assert holm([0.01, 0.04, 0.03, 0.20]) == pytest.approx([0.04, 0.09, 0.09, 0.20])
    assert holm([0.5, 0.6]) == [1.0, 1.0]  # capped at 1
    assert holm([0.02]) == [0.02] and holm([]) == []  # one test: nothing to adjust
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        holm([0.1, 1.5])


def test_t_p_is_the_two_sided_tail_of_the_t_statistic():
    # 1, 2, 3: mean 2, sd 1, t = 2·√3 with 2 degrees of freedom, where P(|T| > t) = 1 − t/√(2 + t²) in closed form
    t = 2 * math.sqrt(3)
    assert t_p([1.0, 2.0, 3.0]) == pytest.approx(1 - t / math.sqrt(2 + t * t), rel=1e-9)
    assert t_p([-1.0, -2.0, -3.0]) == t_p([1.0, 2.0, 3.0])  # two-sided
    assert t_p([1.0, -1.0]) == 1.0 and t_p([0.5, 0.5]) == 0.0 and t_p([0.5]) is None
    # at the 95% t-interval's edge the p is 0.05: a difference whose interval just touches zero
    values = [1.0, 2.0, 3.0, 4.0]
    shift = t_interval(values).half_width - statistics.fmean(values)
    assert t_p([v + shift for v in values]) == pytest.approx(0.05, abs=1e-9)


def test_a_rule_on_the_sign_flip_p_over_six_seeds_and_four_methods_cannot_say_pays():
    """The trap a plan fell into: 2 / 2^6 · 4 = 0.125 ≥ 0.05 whatever the data; the paired t-test has no such floor."""
    assert smallest_p("sign_flip", 6) == 2 / 64
    assert not rule_attainable("sign_flip", seeds=6, comparisons=4)
    assert not rule_attainable("sign_flip", seeds=7, comparisons=4)  # 4 · 2/128 = 0.0625
    assert rule_attainable("sign_flip", seeds=7, comparisons=2) and rule_attainable("sign_flip", seeds=8,
                                                                                     comparisons=4)
    assert rule_attainable("t", seeds=6, comparisons=3) and not rule_attainable("t", seeds=1, comparisons=1)
    with pytest.raises(ValueError, match="'t' or 'sign_flip'"):
        smallest_p("wilcoxon", 6)
