"""How closely one computation of a method's token weights follows another (bf16 against fp32, an approximation
against the exact probe): per-row rank agreement and the advantages whose sign changes.

Pure tensor functions (torch only). Shapes: B rows, T completion tokens; masks are bool, True = a real token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["WeightFidelity", "ranks", "row_spearman_B", "weight_fidelity"]


def ranks(values_N: torch.Tensor) -> torch.Tensor:
    """Average ranks (1 = smallest, ties share the mean of their ranks) of a 1-D tensor, as float64."""
    values_N = values_N.double()
    order = torch.argsort(values_N, stable=True)
    ranked = torch.empty_like(values_N)
    ranked[order] = torch.arange(1, values_N.numel() + 1, dtype=torch.float64)
    unique, inverse = torch.unique(values_N, return_inverse=True)
    sums = torch.zeros(unique.numel(), dtype=torch.float64).index_add_(0, inverse, ranked)
    counts = torch.zeros(unique.numel(), dtype=torch.float64).index_add_(0, inverse, torch.ones_like(ranked))
    return (sums / counts)[inverse]


def row_spearman_B(a_BT: torch.Tensor, b_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """(B,) Spearman's rank correlation of a and b over each row's masked tokens (the Pearson correlation of their
    average ranks). NaN for a row with fewer than 2 tokens or where either side is constant (no ranking to
    compare: a uniform row agrees with any other only trivially, so it is not counted either way)."""
    out = torch.full((a_BT.shape[0],), float("nan"), dtype=torch.float64)
    for i in range(a_BT.shape[0]):
        a_N, b_N = a_BT[i][mask_BT[i]], b_BT[i][mask_BT[i]]
        if a_N.numel() < 2 or bool((a_N == a_N[0]).all()) or bool((b_N == b_N[0]).all()):
            continue
        ra, rb = ranks(a_N), ranks(b_N)
        ra, rb = ra - ra.mean(), rb - rb.mean()
        out[i] = (ra @ rb) / torch.sqrt((ra @ ra) * (rb @ rb))
    return out


@dataclass(frozen=True)
class WeightFidelity:
    rows: int  # rows with a ranking on both sides (non-NaN Spearman)
    spearman_median: float | None
    spearman_min: float | None
    sign_changed_share: float  # of the masked tokens with a non-zero advantage on either side
    max_abs_weight_diff: float


def weight_fidelity(weights_a_BT: torch.Tensor, weights_b_BT: torch.Tensor, adv_B: torch.Tensor,
                    mask_BT: torch.Tensor) -> WeightFidelity:
    """Agreement of two computations of the same weights on the same rows: Spearman per row over the real tokens
    (median and worst over rows that have a ranking), the share of tokens whose advantage Â = w · A changes sign
    (zero counts as a sign), and the largest weight difference."""
    rho_B = row_spearman_B(weights_a_BT, weights_b_BT, mask_BT)
    kept = rho_B[~torch.isnan(rho_B)]
    adv_a_BT, adv_b_BT = weights_a_BT * adv_B[:, None], weights_b_BT * adv_B[:, None]
    live_BT = mask_BT & ((adv_a_BT != 0) | (adv_b_BT != 0))
    changed = (torch.sign(adv_a_BT) != torch.sign(adv_b_BT)) & live_BT
    live = int(live_BT.sum())
    diff = (weights_a_BT - weights_b_BT).abs()[mask_BT]
    return WeightFidelity(rows=int(kept.numel()),
                          spearman_median=float(kept.quantile(0.5)) if kept.numel() else None,
                          spearman_min=float(kept.min()) if kept.numel() else None,
                          sign_changed_share=int(changed.sum()) / live if live else 0.0,
                          max_abs_weight_diff=float(diff.max()) if diff.numel() else 0.0)
