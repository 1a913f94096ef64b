"""grail.methods.bilevel: OAR's bi-level reshaping, by hand and against the loop reference."""

import math

import pytest
import torch

from grail.methods.bilevel import bilevel_weights, oar_weights_from_importance
from references import random_batch, ref_bilevel

# ---------------------------------------------------------------------------------------------------------------
# OAR bi-level reshaping (METHODS.md 3)
# ---------------------------------------------------------------------------------------------------------------

def _from_logs(ibar):
    """Importances whose log(1 + I) are `ibar`."""
    return [math.expm1(v) for v in ibar]


def test_bilevel_weights_hand_case():
    # Scored t0..t3 with Ī = [0, 1, 2, 4] → Î = [0, .25, .5, 1]; q = 0.5: pos = 0.5·3 = 1.5,
    # τ = .25 + .5·(.5 − .25) = .375. ω: 0 < τ → max(0, .1) = .1; .25 < τ → .25/.375 = 2/3;
    # .5 → 1 + (.5 − .375)/.625 = 1.2; 1 → 1 + .625/.625 = 2. Σ = 119/30, rescale by 4/(119/30) = 120/119:
    # ω = [12, 80, 144, 240]/119. t4 real but not scored → 1; t5 padding → 0.
    imp = torch.tensor([_from_logs([0.0, 1.0, 2.0, 4.0]) + [9.0, math.nan]])
    mask = torch.tensor([[True] * 5 + [False]])
    scored = torch.tensor([[True] * 4 + [False, True]])  # t5 scored but padding → ignored
    w = bilevel_weights(imp, scored, mask, quantile=0.5, beta=1.0, floor=0.1)
    torch.testing.assert_close(w, torch.tensor([[12 / 119, 80 / 119, 144 / 119, 240 / 119, 1.0, 0.0]]),
                               atol=1e-6, rtol=0)


def test_bilevel_weights_tau_zero_tau_one_constant_and_empty_rows():
    imp = torch.tensor([_from_logs([0.0, 1.0, 2.0]),  # Î = [0, .5, 1]
                        _from_logs([0.0, 1.0, 2.0]),
                        [0.3, 0.3, 0.3],  # constant → max = min
                        [0.0, 0.0, 0.0],  # zeros → constant
                        [5.0, 1.0, 2.0],  # nothing scored
                        [4.0, 7.0, 2.0]])  # one scored token → constant
    mask = torch.ones(6, 3, dtype=torch.bool)
    scored = mask.clone()
    scored[4] = False
    scored[5, 1:] = False
    # q = 0 → τ = 0: lower branch never fires, ω = 1 + Î = [1, 1.5, 2], Σ 4.5 → ×3/4.5 = [2/3, 1, 4/3].
    w0 = bilevel_weights(imp, scored, mask, quantile=0.0, beta=1.0, floor=0.1)
    torch.testing.assert_close(w0[0], torch.tensor([2 / 3, 1.0, 4 / 3]), atol=1e-6, rtol=0)
    # q = 1 → τ = 1: ω = [max(0, .1), .5, 1 (upper branch, no 0/0)], Σ 1.6 → ×3/1.6 = [.1875, .9375, 1.875].
    w1 = bilevel_weights(imp, scored, mask, quantile=1.0, beta=1.0, floor=0.1)
    torch.testing.assert_close(w1[1], torch.tensor([0.1875, 0.9375, 1.875]), atol=1e-6, rtol=0)
    for w in (w0, w1):
        assert torch.isfinite(w).all()
        assert w[2:].tolist() == [[1.0] * 3] * 4


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("quantile, beta", [(0.25, 1.0), (0.4, 2.0), (0.0, 1.0), (1.0, 0.5)])
def test_bilevel_weights_match_the_loop_reference(seed, quantile, beta):
    importance, mask, g = random_batch(seed)
    importance = torch.where(mask, importance, 0.0)
    scored = mask & (torch.rand(mask.shape, generator=g) < 0.8)
    importance[2] = torch.where(mask[2], 0.7, 0.0)  # a constant row
    got = bilevel_weights(importance, scored, mask, quantile=quantile, beta=beta, floor=0.1)
    ref = ref_bilevel(importance, scored, mask, quantile, beta, 0.1)
    torch.testing.assert_close(got.double(), ref, atol=1e-6, rtol=1e-6)


def test_bilevel_weights_preserve_mass_are_non_negative_and_monotone():
    for seed in range(5):
        importance, mask, g = random_batch(seed, B=9, T=17)
        scored = mask & (torch.rand(mask.shape, generator=g) < 0.7)
        w = bilevel_weights(importance, scored, mask, quantile=0.4, beta=2.0, floor=0.1)
        assert torch.isfinite(w).all() and (w >= 0).all() and (w[~mask] == 0).all()
        assert (w[mask & ~scored] == 1).all()
        torch.testing.assert_close((w * scored).sum(1), scored.sum(1).float(), atol=1e-5, rtol=0)
        for i in range(w.shape[0]):  # ω non-decreasing in I within a row
            order = torch.argsort(importance[i][scored[i]])
            assert (w[i][scored[i]][order].diff() >= -1e-6).all()


def test_bilevel_weights_clamp_negative_importance_to_zero():
    # KL can round below 0. Clamped: I = [−1e-7, 0, e − 1] ≡ [0, 0, e − 1] → Î = [0, 0, 1]; q = .5 → τ = 0 →
    # ω = 1 + Î = [1, 1, 2], rescaled by 3/4.
    imp = torch.tensor([[-1e-7, 0.0, math.e - 1]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    w = bilevel_weights(imp, mask, mask, quantile=0.5, beta=1.0, floor=0.1)
    torch.testing.assert_close(w, torch.tensor([[0.75, 0.75, 1.5]]), atol=1e-6, rtol=0)


def test_oar_weights_fall_back_to_uniform_on_unusable_rows():
    nan, inf = math.nan, math.inf
    imp = torch.tensor([_from_logs([0.0, 1.0, 2.0, 4.0]),  # normal row (the hand case with q = .5)
                        [0.0, 0.0, 0.0, 3.0],  # scored all zero (t3 not scored) → fallback
                        [1.0, nan, 2.0, 3.0],  # NaN on a scored token → fallback
                        [1.0, inf, 2.0, 3.0],  # inf on a scored token → fallback
                        [1.0, 2.0, 3.0, nan],  # NaN only on a non-scored token → ignored
                        [nan, 2.0, 3.0, 4.0],  # no scored token → uniform, NOT a fallback
                        [0.5, 0.5, 0.5, nan]])  # constant non-zero → ω = 1, not a fallback (t3 padding)
    mask = torch.ones(7, 4, dtype=torch.bool)
    mask[6, 3] = False
    scored = mask.clone()
    scored[1, 3] = scored[4, 3] = False
    scored[5] = False
    out = oar_weights_from_importance(imp, mask, scored, quantile=0.5, beta=1.0, floor=0.1)
    assert out.fallback_B.tolist() == [False, True, True, True, False, False, False]
    assert torch.isfinite(out.weights_BT).all()
    torch.testing.assert_close(out.weights_BT[0], torch.tensor([12, 80, 144, 240]) / 119, atol=1e-6, rtol=0)
    assert out.weights_BT[1:4].tolist() == [[1.0] * 4] * 3
    # Row 4: Ī = log(1 + [1, 2, 3]) = [log 2, log 3, log 4]; min-max normalised below.
    ibar = [math.log(2), math.log(3), math.log(4)]
    ihat = [(v - ibar[0]) / (ibar[2] - ibar[0]) for v in ibar]  # [0, log 1.5 / log 2 = .584963, 1]
    tau = ihat[1]  # the median of three values
    raw = [0.1, 1.0, 1.0 + (1 - tau) / (1 - tau)]  # Î0 < τ → max(0, .1); Î1 = τ → upper branch 1; Î2 → 2
    expected = [v * 3 / sum(raw) for v in raw] + [1.0]
    torch.testing.assert_close(out.weights_BT[4], torch.tensor(expected), atol=1e-6, rtol=0)
    assert out.weights_BT[5:].tolist() == [[1.0] * 4, [1.0, 1.0, 1.0, 0.0]]
