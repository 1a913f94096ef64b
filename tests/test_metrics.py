"""Tests for grail.evaluation.scores: pass@k vs brute force, bootstrap CI behaviour, scores and averages by hand."""

import itertools
import json
import math
import random

import pytest
import torch

from grail.evaluation.scores import (
    Average,
    BenchmarkScore,
    Estimate,
    average_scores,
    bootstrap_ci,
    format_markdown,
    paired_difference,
    pass_at_k,
    score_benchmark,
    to_json,
)

T, F = True, False


# ---------------------------------------------------------------- pass@k


def _pass_at_k_brute(n: int, c: int, k: int) -> float:
    """Fraction of all k-subsets of n samples (c of them correct) that contain a correct sample."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(samples, k))
    return sum(any(s) for s in subsets) / len(subsets)


def test_pass_at_k_matches_brute_force_enumeration():
    checked = 0
    for n in range(1, 7):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(_pass_at_k_brute(n, c, k), abs=1e-12), (n, c, k)
                checked += 1
    assert checked == sum((n + 1) * n for n in range(1, 7))


def test_pass_at_k_edge_cases():
    for n in range(1, 9):
        for c in range(n + 1):
            assert pass_at_k(n, c, 1) == pytest.approx(c / n, abs=1e-15)  # pass@1 = c/n
            assert pass_at_k(n, c, n) == (1.0 if c > 0 else 0.0)  # pass@n = any correct
        for k in range(1, n + 1):
            assert pass_at_k(n, 0, k) == 0.0
            assert pass_at_k(n, n, k) == 1.0
    # Large n, where C(n, k) has ~300 digits: C(999, 500)/C(1000, 500) = (1000 − 500)/1000, so pass@500 = 0.5.
    assert pass_at_k(1000, 1, 500) == pytest.approx(0.5, abs=1e-12)


@pytest.mark.parametrize("n, c, k", [(3, 4, 1), (3, -1, 1), (3, 1, 0), (3, 1, 4), (0, 0, 1), (3, 1.0, 1)])
def test_pass_at_k_validation_names_the_values(n, c, k):
    with pytest.raises(ValueError, match=f"n={n}") as info:
        pass_at_k(n, c, k)
    assert "pass_at_k" in str(info.value)


# ---------------------------------------------------------------- bootstrap


def _bernoulli(p: float, size: int, seed: int) -> list[float]:
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(size, generator=g, dtype=torch.float64) < p).double().tolist()


def test_bootstrap_deterministic_for_a_seed_and_contains_the_mean():
    values = _bernoulli(0.4, 150, seed=1)
    a = bootstrap_ci(values, seed=7)
    b = bootstrap_ci(values, seed=7)
    c = bootstrap_ci(values, seed=8)
    assert a == b
    assert (c.low, c.high) != (a.low, a.high)
    assert a.value == pytest.approx(sum(values) / len(values), abs=1e-12)
    assert a.low < a.value < a.high
    assert 0.0 <= a.low and a.high <= 1.0


def test_bootstrap_constant_vector_has_zero_width():
    for const in (0.0, 1.0, 1 / 3):
        e = bootstrap_ci([const] * 37, seed=3)
        assert e.value == pytest.approx(const, abs=1e-15)
        assert e.high - e.low == pytest.approx(0.0, abs=1e-15)
        assert e.low == pytest.approx(e.value, abs=1e-15)


def test_bootstrap_width_shrinks_like_one_over_sqrt_p():
    # Exactly 30% correct at both sizes, so only P changes. The standard error of a mean is sqrt(p(1 − p)/P):
    # quadrupling P should halve the width (ratio ≈ 2). A bug returning the data range (min, max) gives ratio 1.
    small = bootstrap_ci([1.0] * 30 + [0.0] * 70, seed=0)
    large = bootstrap_ci([1.0] * 120 + [0.0] * 280, seed=0)
    ratio = (small.high - small.low) / (large.high - large.low)
    assert 1.7 < ratio < 2.3, ratio
    # And the width is about 2 · 1.96 · sqrt(0.3 · 0.7 / 400) ≈ 0.0898.
    assert 0.08 < large.high - large.low < 0.10


@pytest.fixture
def one_thread():
    """200 small bootstraps: torch's intra-op thread pool only adds latency here (a lot on a busy 2-core box)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_bootstrap_coverage_is_about_95_percent(one_thread):
    # Percentile bootstrap of a Bernoulli(0.3) mean over 200 problems: nominal 95%; 200 trials give a binomial
    # standard error of ~1.5 points, so 88–99% is a loose band that a too-narrow or too-wide CI still fails.
    trials, size, p = 200, 200, 0.3
    g = torch.Generator().manual_seed(2024)
    data_SP = (torch.rand(trials, size, generator=g, dtype=torch.float64) < p).double()
    covered = 0
    for s in range(trials):
        e = bootstrap_ci(data_SP[s].tolist(), resamples=1000, seed=s)
        covered += e.low <= p <= e.high
    assert 0.88 * trials <= covered <= 0.99 * trials, covered


def test_bootstrap_validation():
    with pytest.raises(ValueError, match="empty"):
        bootstrap_ci([])
    with pytest.raises(ValueError, match="level"):
        bootstrap_ci([1.0], level=1.0)
    with pytest.raises(ValueError, match="resamples"):
        bootstrap_ci([1.0], resamples=0)


# ---------------------------------------------------------------- score_benchmark

# Three problems, n = 3:
#   p0: T F T  -> c = 2; acc 2/3; pass@2 = 1 − C(1,2)/C(3,2) = 1;        pass@3 = 1
#   p1: F T F  -> c = 1; acc 1/3; pass@2 = 1 − C(2,2)/C(3,2) = 1 − 1/3;  pass@3 = 1
#   p2: F F F  -> c = 0; acc 0;   pass@2 = 0;                            pass@3 = 0
# acc@3 = pass@1 = (2/3 + 1/3 + 0)/3 = 1/3; pass@2 = (1 + 2/3 + 0)/3 = 5/9; pass@3 = 2/3.
# Tokens: (10+20+30) + (5+5+5) + (1+2+3) = 81 over 9 samples -> 9.
CORRECT_3 = [[T, F, T], [F, T, F], [F, F, F]]
TOKENS_3 = [[10, 20, 30], [5, 5, 5], [1, 2, 3]]


def test_score_benchmark_hand_computed():
    s = score_benchmark("toy", CORRECT_3, TOKENS_3, seed=0)
    assert (s.name, s.num_problems, s.n) == ("toy", 3, 3)
    assert s.acc_at_n.value == pytest.approx(1 / 3)
    assert sorted(s.pass_at_k) == [1, 2, 3]
    assert s.pass_at_k[1].value == pytest.approx(1 / 3)
    assert s.pass_at_k[2].value == pytest.approx(5 / 9)
    assert s.pass_at_k[3].value == pytest.approx(2 / 3)
    assert s.mean_completion_tokens == pytest.approx(9.0)
    assert s.per_problem_acc == pytest.approx((2 / 3, 1 / 3, 0.0))
    assert s.per_problem_pass[2] == pytest.approx((1.0, 2 / 3, 0.0))
    for e in (s.acc_at_n, *s.pass_at_k.values()):
        assert 0.0 <= e.low <= e.value <= e.high <= 1.0
    # Shared resample indices: pass@1 is acc@n problem by problem, so their CIs coincide.
    assert (s.pass_at_k[1].low, s.pass_at_k[1].high) == pytest.approx((s.acc_at_n.low, s.acc_at_n.high))
    # The benchmark CI is exactly bootstrap_ci on the per-problem values with the same seed.
    assert s.acc_at_n == bootstrap_ci(s.per_problem_acc, seed=0)
    assert score_benchmark("toy", CORRECT_3, TOKENS_3, seed=0) == s
    assert "per_problem" not in repr(s)


def test_score_benchmark_ragged_and_mismatched_raise():
    with pytest.raises(ValueError, match="problem 2"):
        score_benchmark("x", [[T, F], [T, T], [T]], [[1, 1], [1, 1], [1]])
    with pytest.raises(ValueError, match="problem 1"):
        score_benchmark("x", [[T, F], [T, T]], [[1, 1], [1]])
    with pytest.raises(ValueError, match="no problems"):
        score_benchmark("x", [], [])
    with pytest.raises(ValueError, match="n >= 1"):
        score_benchmark("x", [[]], [[]])


# ---------------------------------------------------------------- averages

# A: n = 2, problems [T T], [T F] -> acc 1, 1/2 -> acc@2 = 3/4; pass@1 = 3/4; pass@2 = (1 + 1)/2 = 1.
#    tokens per problem (10+30)/2 = 20, (20+20)/2 = 20 -> 20.
# B: n = 1, problems [T], [F], [F], [F] -> acc@1 = pass@1 = 1/4; tokens 4.
# Unweighted:    acc = (3/4 + 1/4)/2 = 1/2;          tokens = (20 + 4)/2 = 12.
# Size-weighted: acc = (1 + 1/2 + 1 + 0 + 0 + 0)/6 = 2.5/6 = 5/12;  tokens = (2·20 + 4·4)/6 = 28/3.
# pass@k only for k every benchmark has: {1}.
def _two_benchmarks():
    a = score_benchmark("A", [[T, T], [T, F]], [[10, 30], [20, 20]])
    b = score_benchmark("B", [[T], [F], [F], [F]], [[4], [4], [4], [4]])
    return a, b


def test_average_unweighted_vs_size_weighted_by_hand():
    a, b = _two_benchmarks()
    unweighted, weighted = average_scores([a, b], seed=5)
    assert isinstance(unweighted, Average) and isinstance(weighted, Average)
    assert (unweighted.kind, weighted.kind) == ("unweighted", "size_weighted")
    assert unweighted.benchmarks == weighted.benchmarks == ("A", "B")
    assert unweighted.acc_at_n.value == pytest.approx(1 / 2)
    assert weighted.acc_at_n.value == pytest.approx(5 / 12)
    assert sorted(unweighted.pass_at_k) == sorted(weighted.pass_at_k) == [1]
    assert unweighted.pass_at_k[1].value == pytest.approx(1 / 2)
    assert weighted.pass_at_k[1].value == pytest.approx(5 / 12)
    assert unweighted.mean_completion_tokens == pytest.approx(12.0)
    assert weighted.mean_completion_tokens == pytest.approx(28 / 3)
    for e in (unweighted.acc_at_n, weighted.acc_at_n):
        assert 0.0 <= e.low < e.value < e.high <= 1.0
    assert average_scores([a, b], seed=5) == (unweighted, weighted)


def test_average_of_one_benchmark_is_its_bootstrap():
    # With one stratum the stratified bootstrap is the plain bootstrap: same generator, same (R, P) draw.
    s = score_benchmark("toy", CORRECT_3, TOKENS_3)
    for avg in average_scores([s], seed=4):
        ref = bootstrap_ci(s.per_problem_acc, seed=4)
        assert (avg.acc_at_n.value, avg.acc_at_n.low, avg.acc_at_n.high) == pytest.approx(
            (ref.value, ref.low, ref.high), abs=1e-12)
        assert sorted(avg.pass_at_k) == [1, 2, 3]


def test_average_all_correct_and_all_wrong_exact():
    # 2 problems all correct, 6 all wrong (n = 3): every resample keeps each benchmark's mean at 1 and 0, so
    # unweighted = (1 + 0)/2 = 0.5 and size-weighted = 2/8 = 0.25 exactly, with zero-width CIs, for every k.
    good = score_benchmark("good", [[T, T, T]] * 2, [[1, 1, 1]] * 2)
    bad = score_benchmark("bad", [[F, F, F]] * 6, [[1, 1, 1]] * 6)
    unweighted, weighted = average_scores([good, bad])
    assert unweighted.acc_at_n == Estimate(0.5, 0.5, 0.5)
    assert weighted.acc_at_n == Estimate(0.25, 0.25, 0.25)
    assert sorted(unweighted.pass_at_k) == [1, 2, 3]
    for k in (1, 2, 3):
        assert unweighted.pass_at_k[k] == Estimate(0.5, 0.5, 0.5)
        assert weighted.pass_at_k[k] == Estimate(0.25, 0.25, 0.25)


def test_average_validation():
    a, _ = _two_benchmarks()
    with pytest.raises(ValueError, match="no benchmarks"):
        average_scores([])
    with pytest.raises(ValueError, match="unique"):
        average_scores([a, a])
    bare = BenchmarkScore("bare", 2, 1, Estimate(0.5, 0, 1), {1: Estimate(0.5, 0, 1)}, 3.0)
    with pytest.raises(ValueError, match="'bare'.*score_benchmark"):
        average_scores([a, bare])


# ---------------------------------------------------------------- paired_difference


def _score_of(name: str, correct_P: list[int], n: int) -> BenchmarkScore:
    """A score whose problem p has correct_P[p] correct samples out of n (tokens irrelevant here)."""
    return score_benchmark(name, [[j < c for j in range(n)] for c in correct_P], [[1] * n for _ in correct_P])


def test_paired_difference_of_identical_results_is_exactly_zero():
    s = _score_of("toy", [0, 1, 2, 3, 4, 2, 1], n=4)
    assert paired_difference(s, s) == Estimate(0.0, 0.0, 0.0)
    # a second evaluation with the same per-problem counts: the same
    assert paired_difference(s, _score_of("toy", [0, 1, 2, 3, 4, 2, 1], n=4), seed=9) == Estimate(0.0, 0.0, 0.0)


def test_paired_difference_of_a_constant_shift_is_that_shift():
    # b solves exactly one more of the 4 samples on every problem: d_p = 1/4 for every p, so every resample's
    # mean is 1/4 too (exact in binary floating point), and the CI has zero width.
    a = _score_of("toy", [0, 1, 2, 3, 0, 2], n=4)
    b = _score_of("toy", [1, 2, 3, 4, 1, 3], n=4)
    assert paired_difference(a, b) == Estimate(0.25, 0.25, 0.25)
    assert paired_difference(b, a) == Estimate(-0.25, -0.25, -0.25)


def test_paired_difference_matches_a_loop_reference():
    # Loop reference: the same draw as bootstrap_ci (R resamples of P indices from random.Random(seed), resample
    # after resample), each resample's mean of b_p − a_p summed problem by problem, then grail.evaluation.bootstrap's
    # rule by hand: the sorted means' entries at ⌊0.05 · (R − 1)⌋ and ⌈0.95 · (R − 1)⌉ for level 0.9.
    g = torch.Generator().manual_seed(11)
    P, n, R, seed, level = 9, 3, 500, 4, 0.9
    a = _score_of("toy", torch.randint(n + 1, (P,), generator=g).tolist(), n)
    b = _score_of("toy", torch.randint(n + 1, (P,), generator=g).tolist(), n)
    rng = random.Random(seed)
    index_RP = [[rng.randrange(P) for _ in range(P)] for _ in range(R)]
    means = sorted(sum(b.per_problem_acc[i] - a.per_problem_acc[i] for i in row) / P for row in index_RP)
    got = paired_difference(a, b, resamples=R, level=level, seed=seed)
    assert got.value == pytest.approx(b.acc_at_n.value - a.acc_at_n.value, abs=1e-12)
    assert got.low == pytest.approx(means[24], abs=1e-12)  # ⌊0.05 · 499⌋ = ⌊24.95⌋ = 24
    assert got.high == pytest.approx(means[475], abs=1e-12)  # ⌈0.95 · 499⌉ = ⌈474.05⌉ = 475
    assert got.low < got.value < got.high


def test_paired_difference_against_zero_is_the_bootstrap_of_the_other():
    # d_p = b_p − 0 = b_p and the draw is bootstrap_ci's, so the two agree exactly for the same seed.
    b = _score_of("toy", [0, 1, 1, 2, 2, 2, 1, 0], n=2)
    zero = _score_of("toy", [0] * 8, n=2)
    assert paired_difference(zero, b, seed=3) == bootstrap_ci(b.per_problem_acc, seed=3)


def test_paired_difference_keeps_the_pairing():
    # 200 problems, n = 1: a solves 100; b solves the same 100 and 10 more. Paired: d_p is 1 on 10 problems,
    # so the CI is about 0.05 ± 1.96·sqrt(0.05·0.95/200) = [0.02, 0.08]: above 0. Resampling a and b
    # independently would give a CI about ±1.96·sqrt(2·0.25/200) ≈ ±0.1 wide, straddling 0.
    order = torch.randperm(200, generator=torch.Generator().manual_seed(0)).tolist()
    a_P, b_P = [0] * 200, [0] * 200
    for rank, p in enumerate(order):
        a_P[p] = int(rank < 100)
        b_P[p] = int(rank < 110)
    a, b = _score_of("toy", a_P, n=1), _score_of("toy", b_P, n=1)
    d = paired_difference(a, b)
    assert d.value == pytest.approx(0.05, abs=1e-12)
    assert 0.0 < d.low < d.value < d.high < 0.1
    unpaired_half_width = math.hypot(*((s.acc_at_n.high - s.acc_at_n.low) / 2 for s in (a, b)))
    assert d.high - d.low < unpaired_half_width  # the paired CI is less than half the unpaired one


def test_paired_difference_validation_names_the_mismatch():
    three, four = _score_of("toy", [1, 0, 1], n=2), _score_of("toy", [1, 0, 1, 1], n=2)
    with pytest.raises(ValueError, match="'toy' has 3 problems in the first result and 4 in the second"):
        paired_difference(three, four)
    with pytest.raises(ValueError, match="different benchmarks \\('toy' and 'other'\\)"):
        paired_difference(three, _score_of("other", [1, 0, 1], n=2))
    bare = BenchmarkScore("toy", 3, 2, Estimate(0.5, 0, 1), {1: Estimate(0.5, 0, 1)}, 1.0)
    with pytest.raises(ValueError, match="second result of 'toy' lacks per-problem accuracies.*score_benchmark"):
        paired_difference(three, bare)
    with pytest.raises(ValueError, match="level"):
        paired_difference(three, three, level=95)


# ---------------------------------------------------------------- output


def test_format_markdown_has_labels_and_numbers():
    a, b = _two_benchmarks()
    averages = average_scores([a, b])
    table = format_markdown([a, b], averages)
    lines = table.strip().splitlines()
    assert len(lines) == 2 + 2 + 2  # header, rule, 2 benchmarks, 2 averages
    assert "average (unweighted over benchmarks)" in lines[4]
    assert "average (size-weighted over problems)" in lines[5]
    assert "pass@1" in lines[0] and "pass@2" in lines[0]
    cells_a = [c.strip() for c in lines[2].strip("|").split("|")]
    cells_b = [c.strip() for c in lines[3].strip("|").split("|")]
    assert cells_a[:3] == ["A", "2", "2"]
    assert cells_a[3].startswith("75.0 [")  # acc@2 = 3/4
    assert cells_a[5].startswith("100.0 [")  # pass@2 = 1
    assert cells_a[-1] == "20"
    assert cells_b[5] == "–"  # B has n = 1: no pass@2
    assert lines[4].split("|")[4].strip().startswith("50.0 [")  # unweighted acc = 1/2
    assert lines[5].split("|")[4].strip().startswith("41.7 [")  # size-weighted acc = 5/12
    assert lines[5].split("|")[2].strip() == "6"  # total problems
    e = a.acc_at_n
    assert f"75.0 [{100 * e.low:.1f}, {100 * e.high:.1f}]" in table


def test_to_json_round_trips():
    a, b = _two_benchmarks()
    averages = average_scores([a, b])
    data = to_json([a, b], averages)
    assert json.loads(json.dumps(data, allow_nan=False)) == data
    assert [x["name"] for x in data["benchmarks"]] == ["A", "B"]
    assert data["benchmarks"][0]["pass_at_k"]["2"]["value"] == pytest.approx(1.0)
    assert data["averages"][1]["kind"] == "size_weighted"
    assert data["averages"][1]["acc_at_n"]["value"] == pytest.approx(5 / 12)
    assert "per_problem_acc" not in json.dumps(data)
    assert not any(isinstance(v, float) and math.isnan(v) for v in data["benchmarks"][0].values())
