"""How noisy is a policy-gradient step? The gradient noise scale of per-group gradients, from their Gram matrix.

Pure (numpy only). Given n per-group gradients g_1..g_n (one prompt's group of completions each, drawn independently
from the training distribution) through their Gram matrix gram_NN[i, j] = g_i · g_j:

    |G|²      the squared norm of the true gradient, unbiased: the mean of g_i · g_j over the pairs i ≠ j;
    tr(Σ)     the per-group gradient variance (trace of its covariance), unbiased: the mean of |g_i|² minus the
              |G|² above;
    B_simple  tr(Σ) / |G|²: the batch (in groups) at which the noise of a batch mean equals the signal (McCandlish et
              al. 2018, "An Empirical Model of Large-Batch Training", the simple noise scale).

A batch mean of m groups has E|ĝ_m|² = |G|² + tr(Σ)/m, so two independent batch means have an expected cosine of
about 1 / (1 + B_simple / m) (`expected_cosine`); `batch_cosines` measures the cosines of disjoint batches directly
from the same Gram matrix. `noise_scale` gives B_simple with a bootstrap interval over groups (each resample keeps
only pairs of distinct original groups, so a group drawn twice never counts as its own independent partner).
"""

from __future__ import annotations

import numpy as np

__all__ = ["batch_cosines", "expected_cosine", "noise_scale", "signal_and_noise"]


def signal_and_noise(gram_NN: np.ndarray, index: np.ndarray | None = None) -> tuple[float, float]:
    """(|G|², tr(Σ)) from the Gram matrix of the groups `index` (default all; repeated indices allowed: a pair of
    draws of one original group is left out of |G|²)."""
    n = gram_NN.shape[0]
    idx = np.arange(n) if index is None else np.asarray(index)
    if len(idx) < 2:
        raise ValueError(f"the noise scale needs at least 2 groups, got {len(idx)}")
    sub = gram_NN[np.ix_(idx, idx)]
    distinct = idx[:, None] != idx[None, :]
    if not distinct.any():
        raise ValueError("every group drawn is the same group: no pair to estimate |G|² from")
    signal = float(sub[distinct].mean())
    mean_sq = float(np.diag(sub).mean())  # E|g_i|² = |G|² + tr(Σ), E g_i · g_j = |G|² (i ≠ j, independent)
    return signal, mean_sq - signal


def noise_scale(gram_NN: np.ndarray, *, resamples: int = 2000, seed: int = 0, level: float = 0.95) -> dict:
    """B_simple = tr(Σ)/|G|² with a percentile bootstrap interval over groups; also |G|² and tr(Σ). A bootstrap
    resample whose |G|² estimate is ≤ 0 (no detectable signal) gives B = inf, so the upper bound can be inf."""
    gram_NN = np.asarray(gram_NN, dtype=np.float64)
    if gram_NN.ndim != 2 or gram_NN.shape[0] != gram_NN.shape[1]:
        raise ValueError(f"gram_NN must be square, got shape {gram_NN.shape}")
    signal, noise = signal_and_noise(gram_NN)
    rng = np.random.default_rng(seed)
    n = gram_NN.shape[0]
    values = []
    for _ in range(resamples):
        s, v = signal_and_noise(gram_NN, rng.integers(0, n, n))
        values.append(v / s if s > 0 else np.inf)
    lo, hi = np.quantile(values, [(1 - level) / 2, (1 + level) / 2], method="inverted_cdf")  # no inf − inf
    return {"groups": n, "signal": signal, "noise": noise, "b_simple": noise / signal if signal > 0 else float("inf"),
            "interval": [float(lo), float(hi)], "level": level, "resamples": resamples}


def expected_cosine(b_simple: float, m: int) -> float:
    """The cosine two independent batch means of m groups have, about, at noise scale b_simple."""
    return 1.0 / (1.0 + b_simple / m)


def batch_cosines(gram_NN: np.ndarray, m: int, *, draws: int = 200, seed: int = 0) -> dict:
    """Cosines between the means of two disjoint batches of m groups, drawn at random `draws` times: mean, and the
    2.5/97.5 percentiles of the draws (their spread, not an interval on the mean)."""
    gram_NN = np.asarray(gram_NN, dtype=np.float64)
    n = gram_NN.shape[0]
    if 2 * m > n:
        raise ValueError(f"two disjoint batches of {m} groups need {2 * m} groups, got {n}")
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(draws):
        perm = rng.permutation(n)
        a, b = perm[:m], perm[m : 2 * m]
        ab, aa, bb = gram_NN[np.ix_(a, b)].sum(), gram_NN[np.ix_(a, a)].sum(), gram_NN[np.ix_(b, b)].sum()
        out.append(ab / np.sqrt(aa * bb) if aa > 0 and bb > 0 else 0.0)
    lo, hi = np.quantile(out, [0.025, 0.975])
    return {"m": m, "mean": float(np.mean(out)), "spread": [float(lo), float(hi)], "draws": draws}
