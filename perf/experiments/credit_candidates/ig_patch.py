"""ig_patch: integrated gradients from the clean reasoning to the all-pad reasoning, in a few steps.

attr_patch linearises the answer's log-probability J = log π(answer | ·) at the clean input, where one token's
substitution by the pad token is a large move (e_pad − e_t is as long as an embedding), so the first-order term can
miss what the substitution does. Integrated gradients (Sundararajan et al. 2017) follow the path instead:
e(α) = e + α · m ⊙ (e_pad − e), α from 0 to 1, m = 1 on the reasoning tokens (the completion before the answer box;
the prompt and the box stay clean), and attribute

    Δ_t = ∫₀¹ ∇_{e_t} J(e(α)) dα · (e_pad − e_t) ≈ (1/K) Σ_k ∇_{e_t} J(e(α_k)) · (e_pad − e_t),  α_k = (k − ½)/K,

so that Σ_t Δ_t over the reasoning → J(all reasoning padded) − J(clean) as K grows (completeness). Few steps do not
get there where J(α) is sharp: on the tiny random model (tests/test_credit_candidates_grad.py's) J(α) is smooth to
α ≈ 0.95 and then jumps (the embeddings close in on the pad's), so the midpoint sum misses most of the change even at
K = 64; the tests check each step's per-token derivative instead. The path moves every
reasoning token at once: it attributes the effect of removing the whole reasoning, not OAR-P's one token at a time,
but each token's share is read along a path that reaches the substitution, not at its start. K = 1 is one gradient
at the half-padded reasoning (attr_patch's cost); K = `ig_patch_steps` (2 by default) costs K forwards and K
backwards. Signal |Δ_t|, read at the token's own embedding; tokens off the path (the box) get (1/K) Σ_k ∇ J · (e_pad −
e_t) at their clean embedding. Pipeline: OAR's bi-level reshaping, as attr_patch.
"""

from __future__ import annotations

import torch

from credit_candidates.attr_patch import nonnegative_bilevel
from credit_candidates.gradients import embedding_gradient, pad_embedding, patch_delta_BT
from grail import MethodOption, MethodSpec
from grail.methods import builtin, probes
from grail.methods.sharding import unsharded


def ig_delta(model, input_ids_BL: torch.Tensor, attention_mask_BL: torch.Tensor, answer_BT: torch.Tensor, *,
             temperature: float, pad_token_id: int, steps: int) -> torch.Tensor:
    """(B, T) signed Δ_t of the module docstring (midpoint rule, `steps` points), 0 on padding, float32 at least."""
    if steps < 1:
        raise ValueError(f"ig_patch_steps={steps}: give at least 1 step")
    T = answer_BT.shape[1]
    mask_BT = probes.completion_mask_BT(attention_mask_BL, T)
    has_answer_B = answer_BT.any(1)
    before_BT = torch.arange(T, device=answer_BT.device) < answer_BT.int().argmax(1, keepdim=True)  # before the box
    path_BT = mask_BT & before_BT & has_answer_B[:, None]
    embed = probes.leaf_module(model, "embeddings")
    with torch.no_grad(), unsharded(model):
        e_BLD = embed(input_ids_BL)
    e_pad_D = pad_embedding(model, pad_token_id, e_BLD)
    S = input_ids_BL.shape[1] - T
    path_BL = torch.cat([path_BT.new_zeros(path_BT.shape[0], S), path_BT], 1)  # the prompt stays clean
    move_BLD = (e_pad_D - e_BLD) * path_BL[..., None].to(e_BLD.dtype)  # (B, L, D)
    ones_B = torch.ones(input_ids_BL.shape[0], device=input_ids_BL.device)
    total_BT = None
    for k in range(steps):
        alpha = (k + 0.5) / steps
        _, grad_BLD = embedding_gradient(model, input_ids_BL, attention_mask_BL, answer_BT, ones_B,
                                         temperature=temperature, embeddings_BLD=e_BLD + alpha * move_BLD)
        delta_BT = patch_delta_BT(e_BLD, grad_BLD, e_pad_D, T)
        total_BT = delta_BT if total_BT is None else total_BT + delta_BT
    return total_BT / steps * mask_BT


def _probe(model, rows, options, generator):
    delta_BT = ig_delta(model, rows.input_ids_BL, rows.attention_mask_BL, rows.answer_BT,
                        temperature=options.temperature, pad_token_id=builtin.pad_token_id(model),
                        steps=options.method_options["ig_patch_steps"])
    return delta_BT.abs().float()


SPEC = MethodSpec(
    "ig_patch", "IG-patch", _probe, nonnegative_bilevel, rows="bilevel",
    reads=builtin.BILEVEL_READS + ("answer_nll_span",),
    options=(MethodOption("ig_patch_steps", 2, "K: gradients along the path from the clean to the padded reasoning "
                          "(midpoint rule); the probe costs K forwards and K backwards", minimum=1, maximum=64),),
    unshardable="screening plug-in: not run on sharded models",
    title="Integrated gradients of log π(answer) from the clean to the pad-substituted reasoning, in K steps",
    summary="(1/K) Σ_k ∇_{e_t} log π(answer)(e + α_k m ⊙ (e_pad − e)) · (e_pad − e_t), OAR's bi-level reshaping.",
    cost="K forwards and K backwards to the embeddings (K = ig_patch_steps, 2 by default) on the rows it reweights",
    reference="Sundararajan et al. 2017 (integrated gradients); a screened candidate",
)
