"""The position-only null (`--token_weighting position`): weights that depend only on where a token sits relative to
the answer box, through GRAIL's normalisation. Its saliency AUROC is the recency baseline each probe has to beat: a
probe that only tracks closeness to the answer scores what this method scores.

Signal (no model call): a row's R reasoning tokens (before the box; every real token when there is no box) get
((j + 1) / R)^p for the j-th of them (0-based), rising towards the box (`position_direction="to_box"`), or
((R − j) / R)^p, falling from the start (`"from_start"`, a primacy null); the box and what follows get 1, the
value of the reasoning token next to the box. p = `position_power`. The signal then goes through GRAIL's pipeline
(log → per-row z-score → affine → clip, the answer-span overrides) on GRAIL's rows, so its weights have the same
form as GRAIL's and differ only in where they put the credit. Any rule that is a monotone function of the distance
to the box ranks tokens the same way, so the AUROC does not depend on p; the weights do.
"""

from __future__ import annotations

import torch

from grail.methods.builtin import SALIENCY_READS, saliency_pipeline
from grail.methods.spec import MethodOption, MethodSpec, ProbeBatch

__all__ = ["SPEC", "position_signal"]


def position_signal(reasoning_BT: torch.Tensor, mask_BT: torch.Tensor, *, direction: str = "to_box",
                    power: float = 1.0) -> torch.Tensor:
    """(B, T) float32: the position rule of the module docstring. `reasoning_BT`, `mask_BT`: (B, T) bool."""
    reasoning = reasoning_BT.bool() & mask_BT.bool()
    count_B = reasoning.sum(1, keepdim=True).clamp(min=1).float()
    j_BT = reasoning.long().cumsum(1).float() - 1  # 0-based index among the row's reasoning tokens
    rank_BT = (j_BT + 1) / count_B if direction == "to_box" else (count_B - j_BT) / count_B
    next_to_box_B1 = torch.ones_like(count_B) if direction == "to_box" else 1.0 / count_B  # the box's own value
    signal_BT = torch.where(reasoning, rank_BT, next_to_box_B1.expand_as(rank_BT))
    return torch.where(mask_BT.bool(), signal_BT.pow(power), torch.zeros_like(signal_BT))


def _probe(model, rows: ProbeBatch, options, generator) -> torch.Tensor:
    T = rows.answer_BT.shape[1]
    own = options.method_options
    return position_signal(rows.reasoning_BT, rows.attention_mask_BL[:, -T:].bool(),
                           direction=own["position_direction"], power=own["position_power"])


SPEC = MethodSpec(
    "position", "position null", _probe, saliency_pipeline, rows="saliency", calls_model=False, reads=SALIENCY_READS,
    preserves_mass=False,
    options=(MethodOption("position_direction", "to_box", "where the weight rises: towards the answer box (a recency "
                          "null) or from the start (a primacy null)", choices=("to_box", "from_start")),
             MethodOption("position_power", 1.0, "exponent p of the relative position (larger: steeper)",
                          minimum=0.0)),
    title="Position-only null (weights from the token's place relative to the answer box, through GRAIL's "
          "normalisation)",
    summary="Each reasoning token's signal is its relative position, rising towards the answer box (or falling from "
            "the start); GRAIL's pipeline turns it into weights. No model call. A probe whose AUROC does not beat this "
            "method's finds nothing but closeness to the answer.",
    example="position_direction='from_start'",
    cost="no model call (a cumulative sum over the row)",
    reference="grail-rl's control for the recency confound of gradient attribution",
)
