"""attr_patch: attribution patching of the answer's log-probability, a first-order OAR-P.

OAR-P replaces each scored token y_t by the pad token and measures how far the answer distribution moves (one forward
per token). Here the change of the answer's log-probability log π(answer | ·) under that same substitution is
linearised at the clean input: Δ_t = ∇_{e_t} log π(answer) · (e_pad − e_t), read at the token's own embedding e_t
(where OAR-P substitutes), for every completion token from one forward and one backward. OAR's KL cannot be
linearised this way: it is minimal (0) at the clean input, so its gradient there is 0 (hence this form); the
answer's log-probability has a non-zero gradient.

Signal (`attr_patch_signal`): `magnitude` |Δ_t| (default: a token whose removal moves the answer either way
matters), or `drop` −Δ_t, signed: positive when padding the token would LOWER the answer's log-probability. The
AUROC reads the signal as it is; the pipeline clamps it at 0 first (a token that only helps when removed gets OAR's
floor weight).

Pipeline: OAR's bi-level reshaping (`builtin.bilevel_pipeline`, rows="bilevel"): the signal is a cheap stand-in for
OAR-P's importance, so it is shaped as OAR-P's is (mass-preserving, both advantage signs); the comparison with OAR-P
then isolates the signal. The answer is `answer_nll_span`'s span (the whole box by default, as GRAIL's NLL).
"""

from __future__ import annotations

import torch

from credit_candidates.gradients import embedding_gradient, pad_embedding, patch_delta_BT
from grail import MethodOption, MethodSpec
from grail.methods import builtin, probes

SIGNALS = ("magnitude", "drop")


def attr_patch_signal(model, input_ids_BL: torch.Tensor, attention_mask_BL: torch.Tensor, answer_BT: torch.Tensor, *,
                      temperature: float, pad_token_id: int, signal: str = "magnitude") -> torch.Tensor:
    """(B, T) float32: |Δ_t| (`magnitude`) or −Δ_t (`drop`), Δ_t = ∇_{e_t} Σ_{s∈answer} log π(y_s | y_<s) ·
    (e_pad − e_t) at token t's own position; 0 on padding and on rows without answer tokens."""
    if signal not in SIGNALS:
        raise ValueError(f"attr_patch_signal={signal!r}: choose one of {SIGNALS}")
    T = answer_BT.shape[1]
    ones_B = torch.ones(input_ids_BL.shape[0], device=input_ids_BL.device)
    e_BLD, grad_BLD = embedding_gradient(model, input_ids_BL, attention_mask_BL, answer_BT, ones_B,
                                         temperature=temperature)
    delta_BT = patch_delta_BT(e_BLD, grad_BLD, pad_embedding(model, pad_token_id, e_BLD), T)
    out_BT = delta_BT.abs() if signal == "magnitude" else -delta_BT
    return (out_BT * probes.completion_mask_BT(attention_mask_BL, T)).float()  # (B, T)


def _probe(model, rows, options, generator):
    return attr_patch_signal(model, rows.input_ids_BL, rows.attention_mask_BL, rows.answer_BT,
                             temperature=options.temperature, pad_token_id=builtin.pad_token_id(model),
                             signal=options.method_options["attr_patch_signal"])


def nonnegative_bilevel(spec, signal_BT, *args):
    """OAR's bi-level pipeline on max(signal, 0) (a signed signal's negative part carries no importance)."""
    return builtin.bilevel_pipeline(spec, signal_BT.clamp(min=0), *args)


SPEC = MethodSpec(
    "attr_patch", "attr-patch", _probe, nonnegative_bilevel, rows="bilevel",
    reads=builtin.BILEVEL_READS + ("answer_nll_span",),
    options=(MethodOption("attr_patch_signal", "magnitude", "|Δ| (magnitude) or −Δ (drop: padding the token lowers "
                          "the answer's log-probability), Δ = ∇_e log π(answer) · (e_pad − e)", choices=SIGNALS),),
    unshardable="screening plug-in: not run on sharded models",
    title="Attribution patching: first-order change of log π(answer) when a token is replaced by the pad token",
    summary="∇_{e_t} log π(answer) · (e_pad − e_t) at each token's own embedding, OAR's bi-level reshaping.",
    cost="one forward and one backward to the embeddings on the rows it reweights (GRAIL's separate path)",
    reference="Nanda 2023 / Syed et al. 2023 (attribution patching); Li et al. 2026 (OAR-P)",
)
