"""grail.methods.core: token advantages and their invariants."""

import itertools
import math

import pytest
import torch

from grail.methods.bilevel import bilevel_weights, oar_weights_from_importance
from grail.methods.core import (
    ROLLOUT_SYMMETRIES,
    answer_span_overrides,
    grail_weights_from_saliency,
    log_zscore,
    permuted_weights,
    reweighted_rows,
    saliency_weights,
    token_advantages,
    uniform_weights,
    valid_signal_rows,
)
from references import random_batch, ref_log_zscore

RELEASE = {"weight_mean": 1.0, "weight_std": 0.5, "weight_min": 0.5, "weight_max": 5.0}  # METHODS.md 2.5


def _mask():
    return torch.tensor([[True, True, True, False], [True, False, False, False]])


def test_uniform_weights_are_one_on_real_tokens_and_zero_on_padding():
    w = uniform_weights(_mask())
    assert w.tolist() == [[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]]
    assert w.dtype == torch.float32


def test_token_advantages_broadcast_and_keep_sign():
    adv_B = torch.tensor([0.5, -2.0])
    weights_BT = torch.tensor([[1.0, 2.0, 0.5, 0.0], [3.0, 0.0, 0.0, 0.0]])
    adv_BT = token_advantages(adv_B, weights_BT)
    assert adv_BT.tolist() == [[0.5, 1.0, 0.25, 0.0], [-6.0, 0.0, 0.0, 0.0]]
    positive = weights_BT > 0
    assert torch.equal(torch.sign(adv_BT)[positive], torch.sign(adv_B)[:, None].expand_as(adv_BT)[positive])


def test_weights_are_constants_in_the_loss():
    weights_BT = torch.ones(2, 3, requires_grad=True)
    adv_BT = token_advantages(torch.tensor([1.0, -1.0]), weights_BT * 2)
    assert not adv_BT.requires_grad


def test_token_advantages_reject_wrong_shapes():
    with pytest.raises(ValueError, match=r"\(B,\) and weights \(B, T\)"):
        token_advantages(torch.zeros(3), torch.ones(2, 4))


# ---------------------------------------------------------------------------------------------------------------
# Helpers: random inputs and plain per-row loop references (the slow, obvious version of each formula)
# ---------------------------------------------------------------------------------------------------------------

# ---------------------------------------------------------------------------------------------------------------
# log_zscore, saliency_weights (METHODS.md 2.5)
# ---------------------------------------------------------------------------------------------------------------

def test_log_zscore_hand_case():
    # Row 0: s = [1, e, e²] → x = log(s + 1e-8) ≈ [0, 1, 2]; mean 1; population var (1 + 0 + 1)/3 = 2/3;
    # z = (x − 1)/sqrt(2/3 + 1e-8) = [−1.224745, 0, 1.224745]; padding → 0. Row 1 has no real token → zeros.
    s = torch.tensor([[1.0, math.e, math.e**2, 7.0], [3.0, 3.0, 3.0, 3.0]])
    mask = torch.tensor([[True, True, True, False], [False] * 4])
    z = log_zscore(s, mask)
    c = 1 / math.sqrt(2 / 3)
    torch.testing.assert_close(z, torch.tensor([[-c, 0.0, c, 0.0], [0.0] * 4]), atol=1e-6, rtol=0)
    assert z.dtype == torch.float32


def test_saliency_weights_hand_case_and_clipping():
    # Same row, z = [−1.224745, 0, 1.224745]. Release affine: 1 + 0.5 z = [0.387628, 1, 1.612372]; clip to
    # [0.5, 5] → [0.5, 1, 1.612372]. With w_std 4: 1 + 4 z = [−3.899, 1, 5.899] → [0.5, 1, 5.0]. Padding 0.
    s = torch.tensor([[1.0, math.e, math.e**2, 7.0]])
    mask = torch.tensor([[True, True, True, False]])
    c = 1 / math.sqrt(2 / 3)
    w = saliency_weights(s, mask, **RELEASE)
    torch.testing.assert_close(w, torch.tensor([[0.5, 1.0, 1 + 0.5 * c, 0.0]]), atol=1e-6, rtol=0)
    w4 = saliency_weights(s, mask, **{**RELEASE, "weight_std": 4.0})
    torch.testing.assert_close(w4, torch.tensor([[0.5, 1.0, 5.0, 0.0]]), atol=1e-6, rtol=0)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_log_zscore_and_saliency_weights_match_the_loop_reference(seed):
    signal, mask, _ = random_batch(seed)
    ref = ref_log_zscore(signal, mask)
    torch.testing.assert_close(log_zscore(signal, mask).double(), ref, atol=1e-6, rtol=0)
    ref_w = torch.where(mask, (1.0 + 0.5 * ref).clamp(0.5, 5.0), 0.0)
    torch.testing.assert_close(saliency_weights(signal, mask, **RELEASE).double(), ref_w, atol=1e-6, rtol=0)


def test_log_zscore_is_scale_invariant_and_sums_to_zero_per_row():
    signal, mask, _ = random_batch(5)
    signal = torch.where(mask, signal + 1e-2, signal)  # every value ≫ 1e-8
    z = log_zscore(signal, mask)
    for c in (1e-3, 7.0, 1e4):
        torch.testing.assert_close(log_zscore(signal * c, mask), z, atol=1e-4, rtol=0)
    torch.testing.assert_close(z.sum(dim=1), torch.zeros(signal.shape[0]), atol=1e-5, rtol=0)


def test_constant_signal_gives_exactly_weight_mean_and_empty_rows_zero():
    # Constant rows have z = 0 exactly (not rounding / sqrt(1e-8)), so w = w_mean exactly: GRAIL with constant
    # saliency reduces to GRPO when w_mean = 1.
    mask = torch.tensor([[True] * 7, [True] * 3 + [False] * 4, [False] * 7])
    for value in (0.3, 1e-5, 123.456, 0.0):
        s = torch.full((3, 7), value)
        w = saliency_weights(s, mask, **{**RELEASE, "weight_mean": 1.3})
        assert torch.equal(w, torch.where(mask, 1.3, 0.0))
        assert torch.equal(log_zscore(s, mask), torch.zeros(3, 7))


def test_weights_do_not_require_grad_even_if_the_signal_does():
    signal, mask, _ = random_batch(1)
    signal = torch.nan_to_num(signal, nan=1.0).requires_grad_(True)
    adv = torch.linspace(-1, 1, signal.shape[0])
    spans = torch.zeros_like(mask)
    spans[:, 0] = mask[:, 0]
    outputs = [
        log_zscore(signal, mask),
        saliency_weights(signal, mask, **RELEASE),
        grail_weights_from_saliency(signal, adv, mask, spans, torch.zeros_like(mask), rollout_symmetry="both",
                                    **RELEASE).weights_BT,
        bilevel_weights(signal, mask, mask, quantile=0.4, beta=2.0, floor=0.1),
        oar_weights_from_importance(signal, mask, mask, quantile=0.4, beta=2.0, floor=0.1).weights_BT,
        permuted_weights(signal, mask),
        answer_span_overrides(signal, spans, spans, weight_mean=1.0, weight_max=5.0),
    ]
    assert not any(o.requires_grad for o in outputs)


# ---------------------------------------------------------------------------------------------------------------
# Row selection, validity, answer-span overrides (METHODS.md 2.6–2.7)
# ---------------------------------------------------------------------------------------------------------------

def test_reweighted_rows_for_each_symmetry_and_a_clear_error_otherwise():
    adv = torch.tensor([-1.0, 0.0, 0.5])
    assert reweighted_rows(adv, "wrong").tolist() == [True, True, False]  # A ≤ 0
    assert reweighted_rows(adv, "correct").tolist() == [False, False, True]  # A > 0
    assert reweighted_rows(adv, "both").tolist() == [True, True, True]
    assert ROLLOUT_SYMMETRIES == ("wrong", "correct", "both")
    with pytest.raises(ValueError, match=r"one of \('wrong', 'correct', 'both'\), got 'all'"):
        reweighted_rows(adv, "all")


def test_valid_signal_rows():
    nan, inf = math.nan, math.inf
    s = torch.tensor([[1.0, 2.0, nan],  # NaN only in padding → valid
                      [1.0, 2.0, 3.0],  # no real token → invalid
                      [1.0, nan, 3.0],  # NaN on a real token → invalid
                      [0.0, 0.0, 5.0],  # all real values zero (5 is padding) → invalid
                      [0.0, 4.0, 0.0],  # one non-zero → valid
                      [1.0, inf, 0.0]])  # inf on a real token → invalid
    mask = torch.tensor([[True, True, False], [False] * 3, [True] * 3, [True, True, False], [True] * 3, [True] * 3])
    assert valid_signal_rows(s, mask).tolist() == [True, False, False, False, True, False]


def test_answer_span_overrides_sets_spans_and_leaves_the_input_alone():
    w = torch.tensor([[0.7, 2.0, 3.0, 0.6, 0.0], [0.9, 0.8, 0.7, 0.6, 0.5]])
    before = w.clone()
    answer = torch.tensor([[False, True, True, False, False], [False] * 5])
    after = torch.tensor([[True, False, True, True, False], [False] * 5])  # overlaps answer at t = 2
    out = answer_span_overrides(w, answer, after, weight_mean=1.2, weight_max=5.0)
    # t0 after → 1.2; t1 answer → 5; t2 both → answer wins, 5; t3 after → 1.2; t4 untouched; row 1 untouched.
    torch.testing.assert_close(out, torch.tensor([[1.2, 5.0, 5.0, 1.2, 0.0], [0.9, 0.8, 0.7, 0.6, 0.5]]))
    assert torch.equal(w, before)


# ---------------------------------------------------------------------------------------------------------------
# grail_weights_from_saliency (METHODS.md 2.5–2.8)
# ---------------------------------------------------------------------------------------------------------------

def _grail_batch():
    """Four rows, T = 5, w_mean 1.2 (so the `after` override is distinguishable from the uniform weight 1).

    row 0: A = −1, box; s = [1, e, e², e, e] → x = [0, 1, 2, 1, 1], mean 1, var (1+0+1+0+0)/5 = 0.4,
           z = [−1, 0, 1, 0, 0]/sqrt(0.4) = [−1.581139, 0, 1.581139, 0, 0];
           1.2 + 0.5 z = [0.409431 → clip 0.5, 1.2, 1.990569, 1.2, 1.2]; answer t3 → 5; after t4 → 1.2.
    row 1: A = +1, box, same saliency.
    row 2: A = −1, no box, t4 padding.
    row 3: A = −1, box, saliency all zero → invalid.
    """
    e = math.e
    s_row = [1.0, e, e * e, e, e]
    saliency = torch.tensor([s_row, s_row, [4.0, 1.0, 2.0, 3.0, math.nan], [0.0] * 5])
    adv = torch.tensor([-1.0, 1.0, -1.0, -1.0])
    mask = torch.ones(4, 5, dtype=torch.bool)
    mask[2, 4] = False
    answer = torch.zeros(4, 5, dtype=torch.bool)
    after = torch.zeros(4, 5, dtype=torch.bool)
    for i in (0, 1, 3):
        answer[i, 3], after[i, 4] = True, True
    return saliency, adv, mask, answer, after


_HI = 1.2 + 0.5 / math.sqrt(0.4)  # 1.990569
_SALIENT = [0.5, 1.2, _HI, 5.0, 1.2]  # a reweighted row of _grail_batch, overrides applied
_OVERRIDDEN = [1.0, 1.0, 1.0, 5.0, 1.2]  # a row with a box that was not reweighted
_NORMALISED = [True, True, True, False, False]


@pytest.mark.parametrize("symmetry, rows, normalised, fallback", [
    ("wrong", [_SALIENT, _OVERRIDDEN, [1, 1, 1, 1, 0], [1] * 5],
     [_NORMALISED, [False] * 5, [False] * 5, [False] * 5], [False, False, False, True]),
    ("correct", [_OVERRIDDEN, _SALIENT, [1, 1, 1, 1, 0], _OVERRIDDEN],  # row 3 not selected → not a fallback
     [[False] * 5, _NORMALISED, [False] * 5, [False] * 5], [False, False, False, False]),
    ("both", [_SALIENT, _SALIENT, [1, 1, 1, 1, 0], [1] * 5],
     [_NORMALISED, _NORMALISED, [False] * 5, [False] * 5], [False, False, False, True]),
])
def test_grail_weights_for_each_rollout_symmetry(symmetry, rows, normalised, fallback):
    saliency, adv, mask, answer, after = _grail_batch()
    out = grail_weights_from_saliency(saliency, adv, mask, answer, after, rollout_symmetry=symmetry,
                                      **{**RELEASE, "weight_mean": 1.2})
    torch.testing.assert_close(out.weights_BT, torch.tensor(rows, dtype=torch.float32), atol=1e-6, rtol=0)
    assert out.normalised_BT.tolist() == normalised
    assert out.fallback_B.tolist() == fallback
    assert out.weights_BT.dtype == torch.float32


def test_grail_fallback_rows_are_uniform_for_nan_inf_and_zero_saliency():
    mask = torch.tensor([[True] * 4, [True] * 4, [True] * 4, [True, True, False, False]])
    saliency = torch.tensor([[1.0, math.nan, 2.0, 3.0], [math.inf, 1.0, 1.0, 1.0], [0.0] * 4,
                             [1.0, 2.0, math.nan, math.inf]])  # row 3: non-finite only on padding → valid
    answer = torch.tensor([[False, False, True, False]] * 3 + [[False, True, False, False]])
    after = torch.tensor([[False, False, False, True]] * 3 + [[False, False, True, True]])  # spills onto padding
    out = grail_weights_from_saliency(saliency, -torch.ones(4), mask, answer, after, rollout_symmetry="wrong",
                                      **RELEASE)
    assert out.fallback_B.tolist() == [True, True, True, False]
    assert torch.isfinite(out.weights_BT).all()
    assert out.weights_BT[:3].tolist() == [[1.0] * 4] * 3
    # Row 3: real s = [1, 2]; x = [0, log 2], z = [−1, 1]/sqrt(1 + 4e-8/log²2) ≈ ±1; t0 → 1 − 0.5 = 0.5;
    # t1 is the answer → 5; after/padding stays 0.
    torch.testing.assert_close(out.weights_BT[3], torch.tensor([0.5, 5.0, 0.0, 0.0]), atol=1e-6, rtol=0)
    assert out.normalised_BT[3].tolist() == [True, False, False, False]


def test_grail_rows_without_a_box_are_uniform_and_padding_is_zero():
    signal, mask, g = random_batch(3)
    adv = torch.randn(signal.shape[0], generator=g)
    no_span = torch.zeros_like(mask)
    for symmetry in ROLLOUT_SYMMETRIES:
        out = grail_weights_from_saliency(signal, adv, mask, no_span, no_span, rollout_symmetry=symmetry, **RELEASE)
        assert torch.equal(out.weights_BT, uniform_weights(mask))
        assert not out.normalised_BT.any() and not out.fallback_B.any()


def test_grail_weights_random_batch_invariants():
    for seed in range(4):
        signal, mask, g = random_batch(seed)
        adv = torch.randn(signal.shape[0], generator=g)
        answer = mask & (torch.rand(mask.shape, generator=g) < 0.2)
        after = mask & ~answer & (torch.rand(mask.shape, generator=g) < 0.2)
        out = grail_weights_from_saliency(signal, adv, mask, answer, after, rollout_symmetry="both", **RELEASE)
        w = out.weights_BT
        assert torch.isfinite(w).all() and (w[~mask] == 0).all() and (w[mask] >= 0.5).all()
        assert torch.equal(out.normalised_BT, answer.any(1, keepdim=True) & mask & ~answer & ~after)
        # The normalised tokens are the saliency weights of the whole row (answer tokens inside the z-score).
        ref = saliency_weights(signal, mask, **RELEASE)
        assert torch.equal(w[out.normalised_BT], ref[out.normalised_BT])
        adv_BT = token_advantages(adv, w)
        pos = w > 0
        assert torch.equal(torch.sign(adv_BT)[pos], torch.sign(adv)[:, None].expand_as(w)[pos])


def test_grail_with_constant_saliency_reduces_to_grpo_apart_from_the_overrides():
    mask = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    answer = torch.tensor([[False, False, False, False, True, False], [False, False, True, False, False, False]])
    after = torch.tensor([[False] * 5 + [True], [False] * 3 + [True, False, False]])
    out = grail_weights_from_saliency(torch.full((2, 6), 0.37), torch.tensor([-1.0, 0.0]), mask, answer, after,
                                      rollout_symmetry="wrong", **RELEASE)
    expected = torch.where(answer, 5.0, uniform_weights(mask))  # w_mean = 1 = uniform off the answer
    assert torch.equal(out.weights_BT, expected)


# ---------------------------------------------------------------------------------------------------------------
# Random-reweighting control (METHODS.md 4)
# ---------------------------------------------------------------------------------------------------------------

def test_permuted_weights_preserve_each_rows_multiset_and_the_other_positions():
    for seed in range(4):
        g = torch.Generator().manual_seed(seed)
        w = torch.rand(6, 11, generator=g) * 5
        permute = torch.rand(6, 11, generator=g) < 0.6
        permute[0] = False  # nothing to permute → identity
        out = permuted_weights(w, permute, generator=g)
        assert torch.equal(out[~permute], w[~permute])
        for i in range(6):
            assert sorted(out[i][permute[i]].tolist()) == sorted(w[i][permute[i]].tolist())
        assert not torch.equal(out, w)  # something moved (5 rows of ~6 distinct values)


def test_permuted_weights_are_reproducible_with_a_generator():
    w = torch.arange(20.0).reshape(2, 10)
    permute = torch.ones(2, 10, dtype=torch.bool)
    a = permuted_weights(w, permute, torch.Generator().manual_seed(7))
    b = permuted_weights(w, permute, torch.Generator().manual_seed(7))
    assert torch.equal(a, b)


def test_permuted_weights_draw_every_permutation_uniformly():
    # One row with 4 permuted positions (values 1..4) around 2 fixed ones, repeated 24 000 times in one call.
    # Each of the 4! = 24 arrangements should appear with frequency 1/24 ± 0.01 (binomial sd ≈ 0.0013), and
    # every permuted position receive every value (marginal 1/4).
    n = 24_000
    row = torch.tensor([1.0, 9.0, 2.0, 3.0, 8.0, 4.0])
    permute = torch.tensor([True, False, True, True, False, True])
    out = permuted_weights(row.expand(n, 6), permute.expand(n, 6), torch.Generator().manual_seed(0))
    assert (out[:, 1] == 9).all() and (out[:, 4] == 8).all()
    perms = out[:, permute]
    counts = {p: 0 for p in itertools.permutations([1.0, 2.0, 3.0, 4.0])}
    for p in map(tuple, perms.tolist()):
        counts[p] += 1
    assert len(counts) == 24
    assert all(abs(c / n - 1 / 24) < 0.01 for c in counts.values())
    for value in (1.0, 2.0, 3.0, 4.0):
        freq = (perms == value).float().mean(0)
        assert ((freq - 0.25).abs() < 0.02).all()
