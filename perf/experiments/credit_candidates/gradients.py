"""What the gradient candidates share: the gradient of a sum of answer log-probabilities with respect to the input
embeddings, and the two ways of reading it per token.

The leaf is the input embeddings e = E[y] (the embedding module's output, so a model that scales its embeddings,
Gemma 3, has the scale inside e and inside e_pad alike), passed to the backbone as `inputs_embeds`; the output layer
is applied only at the target positions, its weights detached, logits / temperature (`grail.methods.probes.
output_logits`). No parameter `.grad` is written (`torch.autograd.grad` to the leaf only). Layout and shape letters:
`grail.methods.probes` (TRL's: prompt left-padded to S, completion right-padded, L = S + T).
"""

from __future__ import annotations

import torch

from grail.methods import output_layer, probes
from grail.methods.sharding import unsharded
from grail.methods.spans import align_to_completion


def embedding_gradient(model, input_ids_BL: torch.Tensor, attention_mask_BL: torch.Tensor, target_BT: torch.Tensor,
                       coef_B: torch.Tensor, *, temperature: float,
                       embeddings_BLD: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(e_BLD, grad_BLD): the input embeddings and ∂J/∂e, J = Σ_b coef_b Σ_{t: target_bt} log π(y_bt | y_<t).

    One forward and one backward to the embeddings. `target_BT`: (B, T) bool, the completion tokens whose log-probs
    enter J; `coef_B`: (B,) float, each row's sign or weight in J. Rows without a target token get a zero gradient.
    `embeddings_BLD`: the point at which to differentiate (default: the clean embeddings E[input_ids]); the targets
    stay `input_ids`. Both tensors are detached, in the model's dtype (float64 stays float64)."""
    T = target_BT.shape[1]
    embed = probes.leaf_module(model, "embeddings")
    rows, cols = target_BT.bool().nonzero(as_tuple=True)
    with torch.enable_grad(), unsharded(model):
        e_BLD = (embed(input_ids_BL) if embeddings_BLD is None else embeddings_BLD).detach().requires_grad_()
        if rows.numel() == 0:
            return e_BLD.detach(), torch.zeros_like(e_BLD)
        hidden_BLD = probes.hidden_states_BLD(model, attention_mask_BL, inputs_embeds=e_BLD)
        hidden_ND = align_to_completion(hidden_BLD, T, at="predicting")[rows, cols]
        logp_NV = torch.log_softmax(output_layer.output_logits(model, hidden_ND, temperature), dim=-1)
        targets_N = align_to_completion(input_ids_BL, T, at="token")[rows, cols]
        logp_N = logp_NV.gather(1, targets_N[:, None]).squeeze(1)
        objective = (coef_B.to(logp_N.dtype)[rows] * logp_N).sum()
        grad_BLD = probes.leaf_gradient(objective, e_BLD)
    return e_BLD.detach(), grad_BLD.detach()


def pad_embedding(model, pad_token_id: int, like_BLD: torch.Tensor) -> torch.Tensor:
    """(D,) the pad token's input embedding, as the embedding module gives it (OAR-P's substitute)."""
    embed = probes.leaf_module(model, "embeddings")
    with torch.no_grad(), unsharded(model):
        return embed(torch.tensor([[pad_token_id]], device=like_BLD.device))[0, 0].to(like_BLD.dtype)


def patch_delta_BT(e_BLD: torch.Tensor, grad_BLD: torch.Tensor, e_pad_D: torch.Tensor, T: int) -> torch.Tensor:
    """(B, T) ∇_{e_t} J · (e_pad − e_t) at each completion token's OWN position (where OAR-P substitutes): the
    first-order change of J when token t alone is replaced by the pad token. float32 at least, signed."""
    dtype = output_layer.at_least_float32(e_BLD)
    delta_BL = (grad_BLD.to(dtype) * (e_pad_D.to(dtype) - e_BLD.to(dtype))).sum(-1)  # (B, L)
    return align_to_completion(delta_BL, T, at="token")


def saliency_BT(e_BLD: torch.Tensor, grad_BLD: torch.Tensor, T: int) -> torch.Tensor:
    """(B, T) GRAIL's ‖∂J/∂e ⊙ e‖₂ at the position that PREDICTS each completion token (docs/methods/grail.md)."""
    dtype = output_layer.at_least_float32(e_BLD)
    return align_to_completion((grad_BLD.to(dtype) * e_BLD.to(dtype)).norm(dim=-1), T, at="predicting")
