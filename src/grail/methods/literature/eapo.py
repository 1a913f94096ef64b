"""EAPO/HAPO-style entropy-bounded, sign-preserving advantage reallocation (arXiv 2604.11056: v1 "Rethinking
Token-Level Credit Assignment in RLVR: A Polarity-Entropy Analysis", EAPO; v2 renames it HAPO), a plug-in.

RECONSTRUCTED FROM THE ABSTRACT: the paper's equations were not in the material available to us. What the abstract
states: a token's credit is bounded by its entropy H_t (its "capacity"); updates at low-entropy tokens saturate,
while the gains sit at high-entropy tokens of either reward sign; the method is a sign-preserving, capacity-guided
reallocation of GRPO's advantage, with two hyper-parameters (α, φ). This implementation: on every row with A ≠ 0,
w_t = clip(1 + α (H_t / mean_row(H) − 1), 1 − φ, 1 + φ), then divided by the row's mean weight, so that the row's
advantage mass is moved towards high-entropy tokens, never created (Σ Â = Σ A per row) and never flips sign
(φ ≤ 1). H_t is the entropy of the sampling distribution at token t (temperature applied), read from TRL's own
forward when fused.
"""

from __future__ import annotations

import torch

from grail.methods import core
from grail.methods.builtin import entropy_probe
from grail.methods.spec import MethodOption, MethodSpec, TokenWeights

__all__ = ["OPEN_CHOICES", "SPEC", "eapo_weights"]

OPEN_CHOICES = (
    "The weight function itself (the paper's is not available here): a clipped linear map of the entropy ratio "
    "H_t / mean_row(H), with α its slope and φ the clip half-width; defaults α = 1, φ = 0.5 are ours, not the paper's.",
    "One rule for both reward signs; the paper's four-quadrant analysis (sign × high/low entropy) may treat them "
    "differently.",
    "The mean is over the row's real completion tokens; entropy is not normalised across the batch.",
)


def eapo_weights(entropy_BT: torch.Tensor, mask_BT: torch.Tensor, rows_B: torch.Tensor, alpha: float,
                 phi: float) -> torch.Tensor:
    """(B, T) weights (module docstring) on `rows_B`, 1 on the other real tokens, 0 on padding."""
    real_BT = mask_BT.bool()
    mean_B = (entropy_BT * real_BT).sum(1) / real_BT.sum(1).clamp(min=1)
    ratio_BT = entropy_BT / mean_B.clamp(min=1e-12)[:, None]
    w_BT = core.row_mean_rescaled((1 + alpha * (ratio_BT - 1)).clamp(1 - phi, 1 + phi), mask_BT)
    flat_B = mean_B <= 0  # no entropy anywhere on the row: nothing to reallocate
    return torch.where(rows_B[:, None] & ~flat_B[:, None], w_BT, real_BT.float())


def _pipeline(spec, signal_BT, adv_B, spans, mask_BT, rows_B, options, generator, min_importance):
    own = options.method_options
    signal_BT, ok_B, fallback_B = TokenWeights.finite_signal(signal_BT.float(), mask_BT, rows_B)
    weights_BT = eapo_weights(signal_BT, mask_BT, ok_B, own["eapo_alpha"], own["eapo_phi"])
    return TokenWeights.simple(weights_BT, spans, rows_B, fallback_B)


SPEC = MethodSpec(
    "eapo", "EAPO", entropy_probe, _pipeline, rows="advantaged", fuse="entropy", reads=("saliency_path",),
    options=(MethodOption("eapo_alpha", 1.0, "slope of the weight in the entropy ratio H_t / mean_row(H)",
                          minimum=0.0),
             MethodOption("eapo_phi", 0.5, "clip half-width of the weight before the row rescale (≤ 1 keeps "
                          "the sign)", minimum=0.0, maximum=1.0)),
    title="EAPO-style entropy-bounded reallocation (A moved towards high-entropy tokens, sign and row mass kept)",
    summary=" ".join(__doc__.split("\n\n")[1].split()),
    example="eapo_alpha=2.0", cost="one no-grad forward (none when fused with TRL's forward)",
    reference="arXiv 2604.11056 (EAPO, renamed HAPO in v2); reconstructed from the abstract",
    open_choices=OPEN_CHOICES,
)
