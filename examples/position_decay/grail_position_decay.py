"""A token-weighting method in one file: later tokens of the reasoning get more of the advantage, by a geometric
ramp, mass-preserving per row. Its signal needs no model call (`calls_model=False`). Install this folder
(`pip install ./examples/position_decay`) and `grail train --token_weighting position_decay --position_decay_rate 0.9`
works, as do compare arms, `grail explain --method position_decay`, `grail.weights_for("position_decay", ...)` and
`grail methods check position_decay`."""

import torch

from grail import MethodOption, MethodSpec, TokenWeights


def _signal(model, rows, options, generator):
    """(rows, T) rate^(reasoning tokens after this one) on reasoning tokens, 0 elsewhere; `model` is None."""
    rate = options.method_options["position_decay_rate"]
    reasoning_BT = rows.reasoning_BT.float()
    to_end_BT = reasoning_BT.flip(1).cumsum(1).flip(1) - 1  # reasoning tokens after each one
    return torch.where(rows.reasoning_BT, rate ** to_end_BT, torch.zeros_like(reasoning_BT))


def _weights(spec, signal_BT, adv_B, spans, mask_BT, rows_B, options, generator, min_importance):
    """Selected rows: reasoning tokens ∝ the signal, other real tokens 1, then divided by the row's mean weight
    (so it averages 1); other rows 1. 0 on padding."""
    real_BT = mask_BT.bool()
    raw_BT = torch.where(spans.reasoning_BT, signal_BT, torch.ones_like(signal_BT)) * real_BT
    mean_B = raw_BT.sum(1) / real_BT.sum(1).clamp(min=1)
    weights_BT = torch.where(rows_B[:, None], raw_BT / mean_B.clamp(min=1e-12)[:, None], real_BT.float())
    return TokenWeights.simple(weights_BT, spans, rows_B)


SPEC = MethodSpec(
    "position_decay", "position decay", _signal, _weights, rows="advantaged", calls_model=False,
    options=(MethodOption("position_decay_rate", 0.9, "ratio of a token's weight to the next one's", minimum=0.0,
                          maximum=1.0),),
    title="Position decay (example plug-in): the advantage ramps up towards the end of the reasoning",
    cost="no model call", reference="examples/position_decay in grail-rl",
)
