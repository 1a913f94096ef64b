"""Token-weighting core: pure tensor functions. Imports only torch (and the option names of `grail.options.choices`); no
model, config, logger or `.item()`.

Every method gives each completion token a weight w_{i,t} >= 0, and the policy-gradient loss uses the
token advantage  Â_{i,t} = w_{i,t} · A_i  in place of A_i (docs/methods/index.md, notation). Plain GRPO is
w ≡ 1. Weights are constants in the loss: they are detached here, so no gradient flows through them.

Shape letters: grail/__init__.py (B rows, T completion tokens, L input positions, D hidden, V vocabulary).
"""

from __future__ import annotations

from typing import NamedTuple, get_args

import torch

from grail.options.choices import RolloutSymmetry

__all__ = [
    "answer_span_overrides", "entropy_from_logits", "gradient_activation_saliency", "grail_weights_from_saliency",
    "kl_divergence", "log_zscore", "permuted_weights", "reweighted_rows", "ROLLOUT_SYMMETRIES", "row_mean_rescaled",
    "saliency_weights", "SaliencyWeights", "token_advantages", "tokens_through_span", "uniform_weights",
    "valid_signal_rows"
]


def uniform_weights(mask_BT: torch.Tensor) -> torch.Tensor:
    """Plain GRPO: weight 1 on every real completion token, 0 on padding.

    Args:
        mask_BT: (B, T) bool, True on real completion tokens.
    Returns:
        (B, T) float32 weights. With these, `token_advantages` reproduces TRL's (B,) advantage exactly
        on real tokens (TRL masks padding out of the loss anyway).
    """
    return mask_BT.to(torch.float32)


def token_advantages(adv_B: torch.Tensor, weights_BT: torch.Tensor) -> torch.Tensor:
    """Â_{i,t} = w_{i,t} · A_i, the (B, T) advantage handed to TRL's loss.

    Args:
        adv_B: (B,) scalar advantage per completion (TRL's group-relative advantage).
        weights_BT: (B, T) non-negative token weights; detached here (weights are constants in the loss).
    Returns:
        (B, T) tensor in adv_B's dtype. Invariant: sign(Â_{i,t}) = sign(A_i) wherever w_{i,t} > 0.
    """
    if adv_B.dim() != 1 or weights_BT.dim() != 2 or weights_BT.shape[0] != adv_B.shape[0]:
        raise ValueError(f"token_advantages: expected adv (B,) and weights (B, T), got "
                         f"{tuple(adv_B.shape)} and {tuple(weights_BT.shape)}")
    return weights_BT.detach().to(adv_B.dtype) * adv_B.unsqueeze(1)  # (B, T)


def gradient_activation_saliency(grad_BLD: torch.Tensor, hidden_BLD: torch.Tensor) -> torch.Tensor:
    """GRAIL's per-position saliency s = ‖ ∂ℓ/∂h ⊙ h ‖₂ over the hidden dimension (docs/methods/grail.md step 4).

    Args:
        grad_BLD: (B, L, D) gradient of the answer NLL with respect to the leaf h.
        hidden_BLD: (B, L, D) the leaf h itself.
    Returns:
        (B, L) float32, detached, >= 0. Per input position: align it to completion tokens with
        `grail.methods.spans.align_to_completion(..., at="predicting")`.
    """
    return (grad_BLD.detach().float() * hidden_BLD.detach().float()).norm(dim=-1)  # (B, L)


def entropy_from_logits(logits_NV: torch.Tensor) -> torch.Tensor:
    """Shannon entropy −Σ_v p_v log p_v of softmax(logits) over the last dimension, in float32.

    Args:
        logits_NV: (..., V) logits, already divided by the sampling temperature.
    Returns:
        (...) float32 entropies, >= 0 (0 for a one-hot distribution, log V for uniform logits).
    """
    logp = torch.log_softmax(logits_NV.float(), dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


def kl_divergence(p_logits_NV: torch.Tensor, q_logits_NV: torch.Tensor) -> torch.Tensor:
    """KL(P ‖ Q) = Σ_v P_v (log P_v − log Q_v), P = softmax(p_logits), Q = softmax(q_logits), in float64.

    OAR's importance is KL(P_final ‖ P_perturbed): the clean distribution is the first argument. float64
    because the KL of two nearly equal distributions is a sum of cancelling terms: in float32 that sum alone
    has rounding error ~1e-7 (seen: every reasoning token of a finished answer scored 1e-7..1e-5, all of it
    rounding), while in float64 what remains is the difference the logits really carry. Cheap: one row of V.

    Args:
        p_logits_NV, q_logits_NV: (..., V) logits of the same shape.
    Returns:
        (...) float64, >= 0 up to rounding; exactly 0 where the logits agree.
    """
    logp = torch.log_softmax(p_logits_NV.double(), dim=-1)
    logq = torch.log_softmax(q_logits_NV.double(), dim=-1)
    return (logp.exp() * (logp - logq)).sum(dim=-1)


# ---------------------------------------------------------------------------------------------------------------
# GRAIL: saliency → weights (docs/methods/grail.md, steps 5–8). The entropy control (docs/methods/entropy.md)
# reuses these with the policy's token entropy as the signal.
# ---------------------------------------------------------------------------------------------------------------

_LOG_EPS = 1e-8  # log(s + 1e-8), as in the GRAIL release
_VAR_EPS = 1e-8  # z = (x − mean) / sqrt(var + 1e-8), as in the GRAIL release


def log_zscore(signal_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """Per-row z-score of the log signal over real tokens (docs/methods/grail.md, step 5).

        x_t = log(s_t + 1e-8);   z_t = (x_t − mean_row x) / sqrt(var_row x + 1e-8)

    mean and var are over the row's real tokens; var is the population variance (divide by the count).

    Args:
        signal_BT: (B, T) non-negative signal (saliency ‖∂ℓ/∂h ⊙ h‖, token entropy). Values at padding are
            ignored, even NaN.
        mask_BT: (B, T) bool, True on real completion tokens.
    Returns:
        (B, T) float32, detached; 0 on padding; a row with no real token is all 0. A row whose real values
        are not all finite (or are negative) gives non-finite z: check rows with `valid_signal_rows` first.
    Numerics: x is centred on the row's largest real value before the mean is taken (a shift the z-score
    does not see), so a constant row gives z = 0 exactly rather than rounding error / sqrt(1e-8) ≈ 1e-3.
    Invariants (tested): scale invariance, z(c·s) = z(s) for s ≫ 1e-8; per row Σ z = 0 over real tokens.
    """
    mask = mask_BT.bool()
    m = mask.to(torch.float32)
    s = torch.where(mask, signal_BT.detach().float(), torch.ones((), dtype=torch.float32))  # padding → 1
    x = torch.log(s + _LOG_EPS)  # (B, T)
    ref = torch.where(mask, x, torch.full_like(x, -torch.inf)).amax(dim=1, keepdim=True)  # (B, 1)
    x = torch.where(mask, x - torch.where(mask.any(dim=1, keepdim=True), ref, 0.0), 0.0)
    n = m.sum(dim=1, keepdim=True).clamp(min=1.0)  # (B, 1)
    mean = x.sum(dim=1, keepdim=True) / n
    var = ((x - mean).square() * m).sum(dim=1, keepdim=True) / n
    return torch.where(mask, (x - mean) / torch.sqrt(var + _VAR_EPS), 0.0)


def saliency_weights(signal_BT: torch.Tensor, mask_BT: torch.Tensor, *, weight_mean: float, weight_std: float,
                     weight_min: float, weight_max: float, scope_BT: torch.Tensor | None = None) -> torch.Tensor:
    """GRAIL's affine-and-clip of the log z-score (docs/methods/grail.md, step 5):
    w = clip(w_mean + w_std · z, w_min, w_max).

    Release values: w_mean 1.0, w_std 0.5, w_min 0.5, w_max 5.0. No renormalisation (the mean weight can
    exceed 1; `row_mean_rescaled` is the opt-in one).

    Args:
        signal_BT: (B, T) non-negative signal; see `log_zscore`.
        mask_BT: (B, T) bool, True on real completion tokens.
        scope_BT: (B, T) bool, the tokens the z-score is taken over (ANDed with mask_BT); None = every real token
            (the release). Real tokens outside it get z = 0, i.e. w_mean; their signal is ignored, even NaN.
    Returns:
        (B, T) float32, detached; 0 on padding, in [w_min, w_max] on real tokens of rows with finite signal.
        Invariant (tested): a constant row gives exactly w_mean on its real tokens.
    """
    scope = mask_BT.bool() if scope_BT is None else scope_BT.bool() & mask_BT.bool()
    z = log_zscore(signal_BT, scope)  # 0 outside the scope
    w = (weight_mean + weight_std * z).clamp(min=weight_min, max=weight_max)
    return torch.where(mask_BT.bool(), w, 0.0)


ROLLOUT_SYMMETRIES: tuple[str, ...] = get_args(RolloutSymmetry)


def reweighted_rows(adv_B: torch.Tensor, rollout_symmetry: str) -> torch.Tensor:
    """Which rows get saliency weights (docs/methods/grail.md, step 6), before the box and validity checks.

    "wrong" (release default) → A_i ≤ 0; "correct" → A_i > 0; "both" → every row.

    Args:
        adv_B: (B,) scalar advantages.
        rollout_symmetry: one of ROLLOUT_SYMMETRIES.
    Returns:
        (B,) bool.
    Raises:
        ValueError: for any other rollout_symmetry, naming the allowed values.
    """
    if rollout_symmetry == "wrong":
        return adv_B <= 0
    if rollout_symmetry == "correct":
        return adv_B > 0
    if rollout_symmetry == "both":
        return torch.ones(adv_B.shape, dtype=torch.bool, device=adv_B.device)
    raise ValueError(f"rollout_symmetry must be one of {ROLLOUT_SYMMETRIES}, got {rollout_symmetry!r}")


def valid_signal_rows(signal_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """Rows whose signal can be normalised: ≥ 1 real token, every real value finite, not every real value 0.

    Args:
        signal_BT: (B, T) signal; values at padding are ignored (even NaN or inf).
        mask_BT: (B, T) bool, True on the tokens to check.
    Returns:
        (B,) bool.
    """
    mask = mask_BT.bool()
    signal = signal_BT.detach()
    finite = (torch.isfinite(signal) | ~mask).all(dim=1)
    nonzero = ((signal != 0) & mask).any(dim=1)
    return mask.any(dim=1) & finite & nonzero


def tokens_through_span(span_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """Each row's real tokens up to and including its last `span_BT` token; every real token of a row without one.

    GRAIL's `zscore_scope="to_answer"` z-scores these (opt-in; the release uses every real token). With span_BT =
    the answer NLL span, the tokens left out are exactly those ℓ cannot depend on: token t's saliency is read at
    the position that predicts it, which lies after the last span token's predicting position iff t lies after
    the last span token (causal attention), so their saliency is exactly 0.

    Args:
        span_BT: (B, T) bool, e.g. `AnswerSpans.probe_span(answer_nll_span)`; ANDed with mask_BT.
        mask_BT: (B, T) bool, True on real completion tokens.
    Returns:
        (B, T) bool ⊆ mask_BT.
    """
    mask = mask_BT.bool()
    span = span_BT.bool() & mask
    past_last_BT = span.flip(1).long().cumsum(1).flip(1) == 0  # no span token at t or later
    return mask & ~(past_last_BT & span.any(dim=1, keepdim=True))


def row_mean_rescaled(weights_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """Opt-in scale matching (`weight_rescale="row_mean"`, not in either release): w_{i,t} / mean_t w_{i,t}, the
    mean over row i's real tokens, so that every row's mean weight is 1 and its mean |Â| = |A_i| (GRPO's).

    Args:
        weights_BT: (B, T) weights >= 0 (the final ones: after the answer-span overrides and any permutation; the
            row mean does not depend on the order of a row's values).
        mask_BT: (B, T) bool, True on real completion tokens.
    Returns:
        (B, T) float32, detached; 0 on padding. Rows whose mean is 1 come back unchanged (uniform rows exactly:
        their float32 sum is their count), as do rows with no real token or mean 0 (all-zero weights).
    Invariants (tested): per row, the mean over real tokens is 1 and the ratios of weights are kept.
    """
    mask = mask_BT.bool()
    w = torch.where(mask, weights_BT.detach().float(), 0.0)
    mean_B1 = w.sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp(min=1)
    return w / torch.where(mean_B1 > 0, mean_B1, 1.0)


def answer_span_overrides(weights_BT: torch.Tensor, answer_BT: torch.Tensor, after_BT: torch.Tensor, *,
                          weight_mean: float, weight_max: float) -> torch.Tensor:
    """GRAIL's answer-span overrides (docs/methods/grail.md, step 7): w_max strictly inside the box, w_mean on the rest.

    Args:
        weights_BT: (B, T) weights; not modified.
        answer_BT: (B, T) bool, tokens strictly inside the braces of the box → w_max.
        after_BT: (B, T) bool, the `\\boxed{` marker tokens, the closing brace and every real token after it
            → w_mean. Both masks must lie within the real tokens (else padding gets a weight).
    Returns:
        (B, T) float32, detached; other tokens unchanged. Where both masks are True (they should be disjoint),
        answer_BT wins: the token keeps w_max.
    """
    w = torch.where(after_BT.bool(), weight_mean, weights_BT.detach().float())
    return torch.where(answer_BT.bool(), weight_max, w)


class SaliencyWeights(NamedTuple):
    """Output of `grail_weights_from_saliency`."""

    weights_BT: torch.Tensor  # (B, T) float32 token weights, 0 on padding
    normalised_BT: torch.Tensor  # (B, T) bool: weight came from log-z / affine / clip (clip fractions count these)
    fallback_B: torch.Tensor  # (B,) bool: row selected for reweighting but its signal was invalid → uniform
    reweighted_B: torch.Tensor  # (B,) bool: rows whose weights came from the normalisation (selected, not fallback)
    clip_BT: torch.Tensor  # (B, T) int8: on every real token of a reweighted row, before the answer-span
    #   overrides: −1 where w_mean + w_std·z ≤ w_min, +1 where ≥ w_max, else 0; 0 on other rows (what the GRAIL
    #   release's clip fractions count, `release_diagnostics`)


def grail_weights_from_saliency(saliency_BT: torch.Tensor, adv_B: torch.Tensor, mask_BT: torch.Tensor,
                                answer_BT: torch.Tensor, after_BT: torch.Tensor, *, rollout_symmetry: str,
                                weight_mean: float, weight_std: float, weight_min: float, weight_max: float,
                                scope_BT: torch.Tensor | None = None) -> SaliencyWeights:
    """GRAIL's token weights for a micro-batch (docs/methods/grail.md, steps 5–8); with token entropy as the signal,
    the entropy control (docs/methods/entropy.md).

    1. has_box_i = any(answer_BT[i]) (the caller leaves answer/after empty for rows without a complete box).
    2. selected = reweighted_rows(A, rollout_symmetry) & has_box;
       fallback = selected & ~valid_signal_rows(signal); reweighted = selected & ~fallback.
    3. Reweighted rows: `saliency_weights`, z-scored over ALL the row's real tokens (answer span included,
       then overridden, as the release does), or over scope_BT's (validity checked over the same tokens; the
       tokens left out get w_mean). Every other row: 1 on real tokens (docs/methods/grail.md step 8 for rows
       without a box; GRPO's weight for rows step 2 did not choose; a fallback row has nothing to normalise).
    4. Rows with a box that are not fallback rows, whatever rollout_symmetry chose (docs/methods/grail.md, step 7):
       `answer_span_overrides`. A fallback row stays uniform, overrides included.

    Args:
        saliency_BT: (B, T) non-negative signal aligned to completion tokens; padding values ignored.
        adv_B: (B,) scalar advantages.
        mask_BT: (B, T) bool, True on real completion tokens.
        answer_BT, after_BT: (B, T) bool spans from the box finder (see `answer_span_overrides`); ANDed with
            mask_BT here, so they may spill onto padding.
        rollout_symmetry, weight_*, scope_BT: see `reweighted_rows`, `saliency_weights`. scope_BT None = every
            real token (the release); `tokens_through_span` gives `zscore_scope="to_answer"`'s.
    Returns:
        SaliencyWeights(weights_BT (B, T) float32 detached, 0 on padding, never NaN;
        normalised_BT (B, T) bool = reweighted rows' real tokens outside answer_BT and after_BT;
        fallback_B (B,) bool; reweighted_B (B,) bool; clip_BT (B, T) int8, see `SaliencyWeights`).
    """
    mask = mask_BT.bool()
    answer, after = answer_BT.bool() & mask, after_BT.bool() & mask
    has_box_B = answer.any(dim=1)
    selected_B = reweighted_rows(adv_B, rollout_symmetry) & has_box_B
    scope = mask if scope_BT is None else scope_BT.bool() & mask
    fallback_B = selected_B & ~valid_signal_rows(saliency_BT, scope)
    reweighted_B = selected_B & ~fallback_B
    salient = saliency_weights(saliency_BT, mask, weight_mean=weight_mean, weight_std=weight_std,
                               weight_min=weight_min, weight_max=weight_max,
                               scope_BT=scope)  # NaN on invalid rows: not selected
    weights = torch.where(reweighted_B[:, None], salient, uniform_weights(mask))  # (B, T)
    overridden_B = (has_box_B & ~fallback_B)[:, None]
    weights = answer_span_overrides(weights, answer & overridden_B, after & overridden_B,
                                    weight_mean=weight_mean, weight_max=weight_max)
    normalised = reweighted_B[:, None] & mask & ~answer & ~after
    reweighted_BT = reweighted_B[:, None] & mask
    clip_BT = ((salient >= weight_max) & reweighted_BT).to(torch.int8) - ((salient <= weight_min) & reweighted_BT).to(
        torch.int8)  # clamp returns exactly w_min / w_max, so `<=` / `>=` find the clipped tokens
    return SaliencyWeights(weights, normalised, fallback_B, reweighted_B, clip_BT)


# ---------------------------------------------------------------------------------------------------------------
# Controls (docs/methods/random.md, docs/methods/entropy.md)
# ---------------------------------------------------------------------------------------------------------------


def permuted_weights(weights_BT: torch.Tensor, permute_BT: torch.Tensor,
                     generator: torch.Generator | None = None) -> torch.Tensor:
    """The random-reweighting control (docs/methods/random.md): per row, the values at the positions where permute_BT
    is True, shuffled uniformly at random among those same positions; every other position unchanged.

    Mechanism: the k-th permuted position (in order) receives the value of the k-th position in a random
    order (argsort of uniform keys); non-permuted positions sort after, in order, onto themselves.

    Args:
        weights_BT: (B, T) weights (e.g. GRAIL's, for the same batch).
        permute_BT: (B, T) bool, the positions to shuffle (the row's reasoning tokens).
        generator: optional torch.Generator on weights_BT's device, for reproducible draws.
    Returns:
        (B, T) float32, detached. Invariants (tested): per row, the multiset of values on permute_BT is
        preserved; other positions are unchanged; over many draws every permuted position receives every
        value of its row equally often.
    """
    w = weights_BT.detach().float()
    permute = permute_BT.bool()
    B, T = w.shape
    t = torch.arange(T, device=w.device, dtype=torch.float64).expand(B, T)
    keys = torch.rand((B, T), generator=generator, device=w.device, dtype=torch.float64)  # [0, 1)
    src = torch.argsort(torch.where(permute, keys, 2.0 + t), dim=1, stable=True)  # random order, then the rest
    dst = torch.argsort(torch.where(permute, t, T + t), dim=1, stable=True)  # permuted in order, then the rest
    return torch.empty_like(w).scatter_(1, dst, w.gather(1, src))
