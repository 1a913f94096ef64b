"""grail.analysis.gradient_noise on synthetic gradients of known signal and noise."""

import numpy as np
import pytest

from grail.analysis.gradient_noise import batch_cosines, expected_cosine, noise_scale, signal_and_noise


def _gram(n, dim, signal_norm, noise_sd, seed=0):
    rng = np.random.default_rng(seed)
    true = np.zeros(dim)
    true[0] = signal_norm
    g = true + rng.normal(0, noise_sd, (n, dim))
    return g @ g.T, signal_norm**2, noise_sd**2 * dim  # gram, |G|², tr(Σ)


def test_known_signal_and_noise_are_recovered():
    gram, signal, noise = _gram(n=400, dim=2000, signal_norm=3.0, noise_sd=0.1)  # B_simple = 20 / 9
    got_signal, got_noise = signal_and_noise(gram)
    assert got_signal == pytest.approx(signal, rel=0.1) and got_noise == pytest.approx(noise, rel=0.05)
    result = noise_scale(gram, resamples=300)
    assert result["interval"][0] < noise / signal < result["interval"][1]


def test_measured_batch_cosines_follow_the_noise_scale():
    gram, signal, noise = _gram(n=400, dim=2000, signal_norm=1.0, noise_sd=0.1)  # B_simple = 20
    for m in (4, 16, 64):
        assert batch_cosines(gram, m, draws=300)["mean"] == pytest.approx(expected_cosine(noise / signal, m), abs=0.05)


def test_pure_noise_has_no_signal_and_an_unbounded_scale():
    gram, _, _ = _gram(n=200, dim=500, signal_norm=0.0, noise_sd=1.0)
    result = noise_scale(gram, resamples=200)
    assert abs(result["signal"]) < 5 * (2 * 500) ** 0.5 / 200  # five standard errors of the pair mean around 0
    assert result["interval"][1] == np.inf or result["interval"][1] > 1000


def test_a_group_drawn_twice_is_not_its_own_partner():
    gram = np.array([[4.0, 1.0], [1.0, 4.0]])
    assert signal_and_noise(gram, np.array([0, 0, 1])) == pytest.approx(((1 + 1 + 1 + 1) / 4, 4.0 - 1.0))
    with pytest.raises(ValueError, match="same group"):
        signal_and_noise(gram, np.array([1, 1]))
    with pytest.raises(ValueError, match="disjoint batches"):
        batch_cosines(gram, 2)
