"""grail.methods.diagnostics: the weight statistics, one batch by hand and against loop references, and their
pooling."""


import pytest
import torch

from grail.methods.core import saliency_weights, token_advantages, uniform_weights
from grail.methods.diagnostics import finish, release_diagnostics, weight_diagnostics, weight_sums
from references import random_batch, ref_diagnostics

RELEASE = {"weight_mean": 1.0, "weight_std": 0.5, "weight_min": 0.5, "weight_max": 5.0}  # METHODS.md 2.5


def _mask():
    return torch.tensor([[True, True, True, False], [True, False, False, False]])




def _stats(w, adv, mask, **kw):
    return weight_diagnostics(w, adv, mask, mask, torch.zeros_like(mask), weight_min=0.5, weight_max=5.0, **kw)


def test_uniform_weights_give_scale_ratio_one_and_weighted_ones_the_ratio_of_means():
    mask, adv_B = _mask(), torch.tensor([1.0, -3.0])
    assert _stats(uniform_weights(mask), adv_B, mask)["adv_scale_ratio"].item() == pytest.approx(1.0)
    weights = torch.tensor([[2.0, 2.0, 2.0, 9.0], [1.0, 9.0, 9.0, 9.0]])
    # sum|Â| over real tokens = 3*2*1 + 1*1*3 = 9; sum|A| over the same tokens = 3*1 + 1*3 = 6.
    assert _stats(weights, adv_B, mask)["adv_scale_ratio"].item() == pytest.approx(9 / 6)


def test_scale_ratio_is_one_and_mean_zero_without_signal():
    mask = _mask()
    d = _stats(uniform_weights(mask), torch.zeros(2), mask)
    assert d["adv_scale_ratio"].item() == 1.0 and d["mean"].item() == 0.0


# ---------------------------------------------------------------------------------------------------------------
# Weight diagnostics (METHODS.md 5)
# ---------------------------------------------------------------------------------------------------------------

def _diag_batch():
    """row 0: A = 1, 4 real tokens w = [.5, .5, 1, 5], all normalised, reasoning t0..t2.
    row 1: A = −2, 2 real tokens w = [1, 5], normalised t0 only (t1 is an answer token at w_max: not clipped),
           reasoning t0.
    row 2: A = 0 (no policy gradient), w = 9 everywhere: excluded from every statistic."""
    w = torch.tensor([[0.5, 0.5, 1.0, 5.0], [1.0, 5.0, 0.0, 0.0], [9.0] * 4])
    adv = torch.tensor([1.0, -2.0, 0.0])
    mask = torch.tensor([[True] * 4, [True, True, False, False], [True] * 4])
    reasoning = torch.tensor([[True, True, True, False], [True, False, False, False], [True] * 4])
    normalised = torch.tensor([[True] * 4, [True, False, False, False], [True] * 4])
    return w, adv, mask, reasoning, normalised


def test_weight_diagnostics_hand_case():
    w, adv, mask, reasoning, normalised = _diag_batch()
    d = weight_diagnostics(w, adv, mask, reasoning, normalised, weight_min=0.5, weight_max=5.0, num_bins=4)
    # mean (.5 + .5 + 1 + 5 + 1 + 5)/6 = 13/6; max 5 (row 2's 9 excluded).
    # clip: 5 normalised tokens; ≤ .5: two; ≥ 5: one (row 1's answer token at 5 is not normalised).
    # scale ratio: Σ|Â| = 1·7 + 2·6 = 19, Σ|A| = 1·4 + 2·2 = 8.
    # ess: row 0 7²/(4 · 26.5) = 49/106; row 1 6²/(2 · 26) = 9/13.
    # top10: row 0 k = .4 → .4 · 5 / 7 = 2/7; row 1 |Â| = [2, 10], k = .2 → .2 · 10 / 12 = 1/6.
    # profile (4 bins): row 0 R = 3: j = 0, 1, 2 → bins 0, floor(4/3) = 1, floor(8/3) = 2; row 1 R = 1: bin 0.
    # bin 0: (.5 + 1)/2 = .75; bin 1: .5; bin 2: 1; bin 3: empty → 0.
    # reasoning std: w = .5, .5, 1, 1 → mean .75, E[w²] = 2.5/4 = .625, var = .625 − .5625 = .0625 → .25.
    expected = {"mean": 13 / 6, "max": 5.0, "clip_low_frac": 0.4, "clip_high_frac": 0.2, "adv_scale_ratio": 19 / 8,
                "ess_ratio": (49 / 106 + 9 / 13) / 2, "top10_mass": (2 / 7 + 1 / 6) / 2, "reasoning_std": 0.25}
    assert set(d) == set(expected) | {"position_profile", "position_count"}
    for key, value in expected.items():
        assert d[key].shape == () and d[key].dtype == torch.float32, key
        assert d[key].item() == pytest.approx(value, abs=1e-6), key
    torch.testing.assert_close(d["position_profile"], torch.tensor([0.75, 0.5, 1.0, 0.0]))
    torch.testing.assert_close(d["position_count"], torch.tensor([2.0, 1.0, 1.0, 0.0]))


def test_weight_diagnostics_defaults_when_no_row_carries_a_gradient():
    w, _, mask, reasoning, normalised = _diag_batch()
    d = weight_diagnostics(w, torch.zeros(3), mask, reasoning, normalised, weight_min=0.5, weight_max=5.0)
    assert {k: v.tolist() for k, v in d.items()} == {
        "mean": 0.0, "max": 0.0, "clip_low_frac": 0.0, "clip_high_frac": 0.0, "adv_scale_ratio": 1.0,
        "ess_ratio": 1.0, "top10_mass": pytest.approx(0.1), "reasoning_std": 0.0, "position_profile": [0.0] * 10,
        "position_count": [0.0] * 10}


@pytest.mark.parametrize("T", [1, 3, 7, 10, 13, 40])
def test_uniform_weights_give_ess_one_and_top10_mass_one_tenth_for_any_length(T):
    mask = torch.ones(2, T, dtype=torch.bool)
    d = weight_diagnostics(uniform_weights(mask), torch.tensor([0.5, -1.0]), mask, mask, torch.zeros_like(mask),
                           weight_min=0.5, weight_max=5.0)
    assert d["ess_ratio"].item() == pytest.approx(1.0, abs=1e-6)
    assert d["top10_mass"].item() == pytest.approx(0.1, abs=1e-6)
    assert d["adv_scale_ratio"].item() == pytest.approx(1.0, abs=1e-6)
    assert d["clip_low_frac"].item() == 0.0


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_weight_diagnostics_match_the_loop_reference(seed):
    signal, mask, g = random_batch(seed, B=9, T=23)
    w = saliency_weights(signal, mask, **{**RELEASE, "weight_std": 1.5})
    adv = torch.randint(-2, 3, (9,), generator=g).float()  # some rows A = 0
    adv[1] = 1.0  # the single-token row carries a gradient
    reasoning = mask & (torch.arange(23)[None, :] < torch.randint(0, 24, (9, 1), generator=g))
    ess, top, profile, counts = ref_diagnostics(w, adv, mask, reasoning, 10)
    d = weight_diagnostics(w, adv, mask, reasoning, mask, weight_min=0.5, weight_max=5.0)
    assert d["ess_ratio"].item() == pytest.approx(ess, abs=1e-6)
    assert d["top10_mass"].item() == pytest.approx(top, abs=1e-6)
    torch.testing.assert_close(d["position_profile"].double(), torch.tensor(profile, dtype=torch.float64),
                               atol=1e-6, rtol=0)
    assert d["position_count"].tolist() == [float(c) for c in counts]


def test_sums_pool_over_batches_like_one_batch():
    """Two micro-batches (or processes) pooled by adding their sums (max by max) describe the concatenated batch:
    token statistics weighted by tokens and row statistics by rows, not the mean of the two batches' values."""
    signal, mask, g = random_batch(5, B=10, T=17)
    w = saliency_weights(signal, mask, **{**RELEASE, "weight_std": 1.5})
    adv = torch.randint(-2, 3, (10,), generator=g).float()
    reasoning = mask & (torch.arange(17)[None, :] < torch.randint(0, 18, (10, 1), generator=g))
    normalised = mask & (torch.rand(10, 17, generator=g) < 0.7)

    def sums(rows):
        return weight_sums(w[rows], adv[rows], token_advantages(adv[rows], w[rows]), mask[rows], reasoning[rows],
                           normalised[rows], weight_min=0.5, weight_max=5.0)

    first, second = sums(slice(0, 3)), sums(slice(3, 10))  # unequal sizes: a row-weighted mean would differ
    pooled = {k: torch.maximum(first[k], second[k]) if k == "max" else first[k] + second[k] for k in first}
    together = weight_diagnostics(w, adv, mask, reasoning, normalised, weight_min=0.5, weight_max=5.0)
    for key, value in finish(pooled).items():
        torch.testing.assert_close(value, together[key], atol=1e-6, rtol=1e-6)
    halves = [finish(first)["mean"], finish(second)["mean"]]
    assert together["mean"].item() != pytest.approx(sum(halves).item() / 2)  # the test can tell the two apart


def test_release_diagnostics_by_hand():
    # Two rows, 3 real tokens each (row 1: 2 real + padding). Row 0 reweighted, its raw clips: low, none, high.
    weights = torch.tensor([[0.5, 1.0, 5.0], [1.0, 1.0, 0.0]])
    adv = torch.tensor([-1.0, 0.5])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    clip = torch.tensor([[-1, 0, 1], [0, 0, 0]], dtype=torch.int8)
    reweighted = torch.tensor([[True, True, True], [False, False, False]])
    out = release_diagnostics(adv, token_advantages(adv, weights), mask, clip, reweighted)
    assert out["clip_low_frac"].item() == pytest.approx(1 / 3)
    assert out["clip_high_frac"].item() == pytest.approx(1 / 3)
    # Σ|Â| over real tokens = 0.5 + 1 + 5 + 0.5 + 0.5 = 7.5 over 5 tokens = 1.5; mean |A| over rows = 0.75
    assert out["adv_scale_ratio"].item() == pytest.approx(1.5 / (0.75 + 1e-8))
    none = release_diagnostics(adv, token_advantages(adv, weights), mask, clip, torch.zeros_like(reweighted))
    assert torch.isnan(none["clip_low_frac"]) and torch.isnan(none["clip_high_frac"])


def test_diagnostics_do_not_require_grad_even_if_the_weights_do():
    signal, mask, _ = random_batch(1)
    w = signal.clone().requires_grad_(True)
    d = weight_diagnostics(w, torch.ones(signal.shape[0]), mask, mask, mask, weight_min=0.5, weight_max=5.0)
    assert not any(v.requires_grad for v in d.values())
