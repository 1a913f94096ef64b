"""grail compare's statistics over seeds (grail.analysis.compare.stats, pure Python): the Student t quantile against
its closed forms, the t-interval and the seeds-needed count by hand, the sign-flip permutation p by hand and against
the whole enumeration, the bootstrap interval's bounds. The report's use of them is in tests/test_compare.py."""

import math
import statistics

import pytest

from grail.analysis.compare.stats import (
    bootstrap_interval,
    holm,
    rule_attainable,
    seeds_needed,
    sign_flip_p,
    smallest_p,
    t_cdf,
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
    assert t_cdf(t_quantile(p, 4.5), 4.5) == pytest.approx(p, abs=1e-12)
    assert t_quantile(0.975, 4) == pytest.approx(2.776, abs=5e-4)  # the textbook table's 4 degrees of freedom


def test_t_interval_by_hand_and_without_a_spread():
    # values 1, 2, 3: mean 2, sd 1, half-width t_{0.975,2} / sqrt(3); t_{0.975,2} = 0.95 / sqrt(2·0.975·0.025)
    got = t_interval([1.0, 2.0, 3.0])
    assert got.mean == 2.0 and got.sd == pytest.approx(1.0)
    assert got.half_width == pytest.approx(0.95 / math.sqrt(2 * 0.975 * 0.025) / math.sqrt(3))
    one = t_interval([0.7])
    assert one.mean == 0.7 and one.sd is None and one.half_width is None and one.low is None


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
    # beyond the exact range, the random assignments agree with the exact count
    d = [0.3, -0.1, 0.5, 0.2, 0.4, -0.2, 0.1, 0.6]
    assert sign_flip_p(d, exact_up_to=4, draws=40_000) == pytest.approx(sign_flip_p(d), abs=0.01)


def test_sign_flip_p_meets_in_the_middle_as_the_whole_enumeration_counts():
    import itertools
    import random

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
