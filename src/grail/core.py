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
