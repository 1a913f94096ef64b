"""grail.evaluation.bootstrap: the quantile rule on cases small enough to read off by hand, the draw shared by the
rows, and the callers (evaluation's CI over problems, compare's interval over seeds) going through it."""

import random

import pytest

from grail.evaluation.bootstrap import bootstrap_intervals, percentile_interval, resampled_means


def test_the_rule_takes_the_sorted_means_just_outside_each_tail():
    # 31 means 0..30 (given shuffled): R − 1 = 30. Level 0.9: tail 0.05, ⌊0.05 · 30⌋ = ⌊1.5⌋ = 1 and
    # ⌈0.95 · 30⌉ = ⌈28.5⌉ = 29, where a linear interpolation would give 1.5 and 28.5.
    means = [float(v) for v in range(31)]
    random.Random(1).shuffle(means)
    assert percentile_interval(means, 0.9) == (1.0, 29.0)
    # 21 means, level 0.95: ⌊0.025 · 20⌋ = ⌊0.5⌋ = 0 and ⌈0.975 · 20⌉ = ⌈19.5⌉ = 20
    assert percentile_interval([float(v) for v in range(21)], 0.95) == (0.0, 20.0)
    # R = 4, level 0.5: tail 0.25, ⌊0.75⌋ = 0 and ⌈2.25⌉ = 3 of the sorted [1, 2, 5, 9]
    assert percentile_interval([5.0, 1.0, 9.0, 2.0], 0.5) == (1.0, 9.0)


def test_the_draw_is_randrange_resample_after_resample_and_rows_share_it():
    # Two units, two resamples, seed 0: the indices are the first four randrange(2) of random.Random(0).
    rng = random.Random(0)
    first, second = [rng.randrange(2) for _ in range(2)], [rng.randrange(2) for _ in range(2)]
    values = [[0.0, 1.0], [10.0, 20.0]]
    means = resampled_means(values, 2, random.Random(0))
    assert means[0] == [sum(values[0][i] for i in first) / 2, sum(values[0][i] for i in second) / 2]
    assert means[1] == [sum(values[1][i] for i in first) / 2, sum(values[1][i] for i in second) / 2]


def test_a_constant_row_has_no_width_and_bad_arguments_are_named():
    assert bootstrap_intervals([[0.25] * 7], resamples=50, level=0.95, seed=3) == [(0.25, 0.25)]
    with pytest.raises(ValueError, match="resamples must be >= 1"):
        bootstrap_intervals([[1.0]], resamples=0, level=0.95, seed=0)
    with pytest.raises(ValueError, match="level must be in"):
        bootstrap_intervals([[1.0]], resamples=10, level=95, seed=0)
    with pytest.raises(ValueError, match="same length"):
        resampled_means([[1.0, 2.0], [1.0]], 10, random.Random(0))


def test_evaluation_and_compare_use_the_same_bootstrap():
    from grail.analysis.compare.stats import bootstrap_interval
    from grail.evaluation.scores import bootstrap_ci

    values = [0.1, 0.4, 0.35, 0.9, 0.2, 0.6]
    estimate = bootstrap_ci(values, resamples=300, level=0.9, seed=5)
    assert (estimate.low, estimate.high) == bootstrap_interval(values, level=0.9, resamples=300, seed=5)


def test_the_auroc_cluster_bootstrap_takes_the_same_rule_after_dropping_resamples_without_pairs():
    import math

    import torch

    from grail.analysis.saliency import token_labels

    draws = torch.tensor([0.9, math.nan, 0.1, 0.5, 0.3, 0.7], dtype=torch.float64)
    # 5 finite draws, level 0.5: tail 0.25, ranks floor(0.25·4) = 1 and ceil(0.75·4) = 3 of 0.1 0.3 0.5 0.7 0.9
    assert token_labels.percentile_interval(draws, 0.5) == (0.3, 0.7, "1 of 6 resamples had no pair to compare "
                                                                       "and were dropped")
    assert token_labels.percentile_interval(torch.tensor([math.nan]), 0.95)[2].startswith("1 of 1")
