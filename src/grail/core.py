"""Token-weighting core: pure tensor functions. Imports only torch; no model, config, logger or `.item()`.

Every method gives each completion token a weight w_{i,t} >= 0, and the policy-gradient loss uses the
token advantage  Â_{i,t} = w_{i,t} · A_i  in place of A_i (../shared/METHODS.md, notation). Plain GRPO is
w ≡ 1. Weights are constants in the loss: they are detached here, so no gradient flows through them.

Dimension letters (suffixes on tensor names):
    P prompts, G completions per prompt, B = P·G rows (each group contiguous),
    T completion tokens, L prompt + completion tokens, D hidden size, V vocabulary.
Masks are bool with True = real token.
"""

from __future__ import annotations

import torch


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


def advantage_scale_ratio(adv_B: torch.Tensor, adv_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """mean |Â| over real tokens / mean |A| over the same tokens (1 for GRPO); 0-dim tensor.

    Returns 1 when every advantage is zero (a batch of all-equal groups carries no signal to rescale).
    """
    mask = mask_BT.to(adv_BT.dtype)
    num = (adv_BT.abs() * mask).sum()
    den = (adv_B.abs().unsqueeze(1) * mask).sum()
    return torch.where(den > 0, num / den.clamp(min=torch.finfo(adv_BT.dtype).tiny), torch.ones_like(num))


def masked_mean(values_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """Mean of `values_BT` over True entries of `mask_BT`; 0 when the mask is empty. 0-dim tensor."""
    mask = mask_BT.to(values_BT.dtype)
    return (values_BT * mask).sum() / mask.sum().clamp(min=1.0)


def gradient_activation_saliency(grad_BLD: torch.Tensor, hidden_BLD: torch.Tensor) -> torch.Tensor:
    """GRAIL's per-position saliency s = ‖ ∂ℓ/∂h ⊙ h ‖₂ over the hidden dimension (METHODS.md 2.4).

    Args:
        grad_BLD: (B, L, D) gradient of the answer NLL with respect to the leaf h.
        hidden_BLD: (B, L, D) the leaf h itself.
    Returns:
        (B, L) float32, detached, >= 0. Per input position: align it to completion tokens with
        `grail.spans.align_to_completion(..., at="predicting")`.
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
    """KL(P ‖ Q) = Σ_v P_v (log P_v − log Q_v), P = softmax(p_logits), Q = softmax(q_logits), in float32.

    OAR's importance is KL(P_final ‖ P_perturbed): the clean distribution is the first argument.

    Args:
        p_logits_NV, q_logits_NV: (..., V) logits of the same shape.
    Returns:
        (...) float32, >= 0 up to rounding; exactly 0 where the logits agree.
    """
    logp = torch.log_softmax(p_logits_NV.float(), dim=-1)
    logq = torch.log_softmax(q_logits_NV.float(), dim=-1)
    return (logp.exp() * (logp - logq)).sum(dim=-1)
