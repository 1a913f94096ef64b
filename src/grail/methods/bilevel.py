"""OAR's bi-level reshaping of token importance (docs/methods/oar_g.md): pure tensor functions, like
`grail.methods.core`.

Dimension letters: B rows, T completion tokens (grail/__init__.py has the package's legend).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from grail.methods.core import valid_signal_rows

__all__ = ["TAU_RULES", "BilevelWeights", "bilevel_weights", "oar_weights_from_importance"]



TAU_RULES = ("interpolate", "sorted_index")


def bilevel_weights(importance_BT: torch.Tensor, scored_BT: torch.Tensor, mask_BT: torch.Tensor, *,
                    quantile: float, beta: float, floor: float, tau_rule: str = "interpolate") -> torch.Tensor:
    """OAR's bi-level reshaping (docs/methods/oar_g.md), per row over its scored tokens:

        Ī = log(1 + I);   Î = (Ī − min Ī) / (max Ī − min Ī) ∈ [0, 1];   τ = q-quantile of Î
        ω_t = max(Î_t / τ, floor)               if Î_t < τ
        ω_t = 1 + β · (Î_t − τ) / (1 − τ)      otherwise
        ω ← ω · n / Σ ω                        (n = number of scored tokens: advantage mass preserved)

    τ (`tau_rule`): "interpolate" = the quantile with linear interpolation over the row's n scored values
    (torch.quantile's default; the OAR excerpt); "sorted_index" = the sorted values' entry at index
    min(floor(n · q), n − 1) (the GRAIL release's OAR-G: no interpolation).
    Release values: OAR q 0.25, β 1.0, floor 0.1; GRAIL's OAR-G baseline q 0.4, β 2.0.
    Computed in float64 (returned as float32), so that importances many orders of magnitude apart keep their
    order through log1p and the min-max scaling.

    Args:
        importance_BT: (B, T) importance I ≥ 0 (KL or |gradient · embedding|). Negative values (KL rounding)
            are clamped to 0. Values off the scored tokens are ignored (even NaN). Scored values must be
            finite: `oar_weights_from_importance` routes non-finite rows to uniform weights.
        scored_BT: (B, T) bool, the tokens to reshape (reasoning only, or every completion token); ANDed with
            mask_BT.
        mask_BT: (B, T) bool, True on real completion tokens.
        quantile, beta, floor: q ∈ [0, 1], β ≥ 0, floor ≥ 0.
        tau_rule: one of TAU_RULES.
    Returns:
        (B, T) float32, detached: reshaped ω on scored tokens, 1 on real non-scored tokens, 0 on padding.
    Edge cases: max = min (constant row, or one scored token) → ω = 1; τ = 0 → no Î is below τ, so
    ω = 1 + βÎ; τ = 1 → only Î = 1 reaches the upper branch, and its value is 1 (no 0/0); no scored token → 1
    on real tokens.
    Invariants (tested): Σ_scored ω = n per row; ω ≥ 0; ω is non-decreasing in I within a row.
    """
    if tau_rule not in TAU_RULES:
        raise ValueError(f"bilevel_weights: tau_rule must be one of {TAU_RULES}, got {tau_rule!r}")
    mask = mask_BT.bool()
    scored = scored_BT.bool() & mask
    sf = scored.to(torch.float64)
    n_B1 = sf.sum(dim=1, keepdim=True)  # (B, 1)
    imp = torch.where(scored, importance_BT.detach().double(), 0.0).clamp(min=0.0)
    ibar = torch.log1p(imp)  # (B, T)
    lo = torch.where(scored, ibar, torch.inf).amin(dim=1, keepdim=True)  # (B, 1); +inf if nothing scored
    hi = torch.where(scored, ibar, -torch.inf).amax(dim=1, keepdim=True)
    span = hi - lo
    spread_B1 = (n_B1 > 0) & (span > 0)  # False for constant rows and rows with nothing scored
    ihat = torch.where(spread_B1 & scored, (ibar - torch.where(spread_B1, lo, 0.0)) / torch.where(spread_B1, span, 1.0),
                       0.0).clamp(0.0, 1.0)  # (B, T)

    # τ over each row's scored values (non-scored sorted to the end).
    ordered = torch.where(scored, ihat, 2.0).sort(dim=1).values  # (B, T)
    last = (n_B1 - 1).clamp(min=0.0)
    if tau_rule == "sorted_index":
        tau = ordered.gather(1, torch.minimum((n_B1 * quantile).floor(), last).long())
    else:
        pos = quantile * last  # (B, 1)
        below = pos.floor()
        above = torch.minimum(below + 1, last)
        v_lo = ordered.gather(1, below.long())
        v_hi = ordered.gather(1, above.long())
        tau = v_lo + (pos - below) * (v_hi - v_lo)
    tau = torch.where(spread_B1, tau, 0.0)  # (B, 1); 0 where unused

    lower = torch.clamp(ihat / torch.where(tau > 0, tau, 1.0), min=floor)
    upper = 1.0 + beta * (ihat - tau) / torch.where(tau < 1, 1.0 - tau, 1.0)  # τ = 1 ⇒ Î − τ = 0 ⇒ 1
    omega = torch.where(ihat < tau, lower, upper)
    omega = torch.where(scored, omega, 0.0)
    total = omega.sum(dim=1, keepdim=True)  # ≥ 1 on spread rows: the maximal token has Î = 1 ≥ τ
    omega = omega * n_B1 / torch.where(total > 0, total, 1.0)
    omega = torch.where(spread_B1, omega, 1.0)  # constant rows: ω = 1
    return torch.where(scored, omega, mask.to(torch.float64)).float()


class BilevelWeights(NamedTuple):
    """Output of `oar_weights_from_importance`."""

    weights_BT: torch.Tensor  # (B, T) float32 token weights, 0 on padding
    fallback_B: torch.Tensor  # (B,) bool: scored importance all zero or not finite → uniform


def oar_weights_from_importance(importance_BT: torch.Tensor, mask_BT: torch.Tensor, scored_BT: torch.Tensor, *,
                                quantile: float, beta: float, floor: float, min_importance: float = 0.0,
                                tau_rule: str = "interpolate") -> BilevelWeights:
    """OAR's token weights for a micro-batch (docs/methods/oar_g.md), with a uniform fallback for unusable rows.

    Importances below `min_importance` (a rounding floor) are taken as 0 first: they are indistinguishable
    from rounding, so their order must not steer the weights.
    fallback_i = (row has ≥ 1 scored token) & ~valid_signal_rows(I restricted to scored tokens), i.e. some
    scored value is non-finite, or every scored value is 0 (the perturbation moved nothing above the floor:
    no information).
    Fallback rows get 1 on every real token. A row with no scored token is NOT a fallback: it gets 1 on real
    tokens as in `bilevel_weights`. Every other row: `bilevel_weights` (a constant non-zero row gives ω = 1
    there, and is not flagged).

    Args:
        importance_BT: (B, T) importance ≥ 0; values off the scored tokens are ignored (even NaN).
        mask_BT: (B, T) bool, True on real completion tokens.
        scored_BT: (B, T) bool, the tokens to reshape; ANDed with mask_BT.
        quantile, beta, floor, tau_rule: see `bilevel_weights`.
        min_importance: the rounding floor (>= 0; 0 = off).
    Returns:
        BilevelWeights(weights_BT (B, T) float32 detached, 0 on padding, never NaN; fallback_B (B,) bool).
    """
    mask = mask_BT.bool()
    scored = scored_BT.bool() & mask
    importance = importance_BT.detach().double()
    importance = torch.where(importance.abs() < min_importance, 0.0, importance)  # NaN/inf stay: not < floor
    fallback_B = scored.any(dim=1) & ~valid_signal_rows(importance, scored)
    # A fallback row's importance is replaced by zeros: bilevel_weights maps a constant row to ω = 1.
    clean = torch.where(fallback_B[:, None] | ~scored, 0.0, importance)
    weights = bilevel_weights(clean, scored, mask, quantile=quantile, beta=beta, floor=floor, tau_rule=tau_rule)
    return BilevelWeights(weights, fallback_B)
