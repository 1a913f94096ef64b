"""Where the answer is, in token positions: completion tokens ↔ characters ↔ `\\boxed{...}` spans.

Also home of the one-position shift between input positions and the completion tokens they predict.
"""

from __future__ import annotations

from typing import Literal

import torch


def align_to_completion(values_BL: torch.Tensor, num_completion_tokens: int,
                        *, at: Literal["predicting", "token"]) -> torch.Tensor:
    """Per-input-position values (B, L, ...) → per-completion-token values (B, T, ...). The only place the
    one-position shift is written.

    TRL's layout: prompt left-padded to width P, completion right-padded after it, L = P + T, so completion
    token t (0-based) sits at input position P + t and is predicted by the output at position P + t − 1.

    Args:
        values_BL: (B, L, ...) values indexed by input position (saliency, hidden states, logits, ...).
        num_completion_tokens: T, the width of the completion block at the end of the sequence.
        at: "predicting" → the values at the position that PREDICTS token t (P − 1 + t; GRAIL's saliency,
            log-probs, entropies); "token" → the values at token t's own position (P + t; OAR's per-token
            perturbation or noise on the token's embedding).
    Returns:
        (B, T, ...) view of `values_BL`.
    """
    length, T = values_BL.shape[1], num_completion_tokens
    if not 0 < T < length:
        raise ValueError(f"align_to_completion: need 0 < T < L (at least one prompt position), got T={T}, "
                         f"L={length}")
    if at == "predicting":
        return values_BL[:, length - T - 1 : length - 1]
    if at == "token":
        return values_BL[:, length - T :]
    raise ValueError(f"align_to_completion: at must be 'predicting' or 'token', got {at!r}")
