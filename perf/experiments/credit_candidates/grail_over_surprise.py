"""grail_over_surprise: GRAIL's saliency divided by the token's surprise.

GRAIL's saliency s_t = ‖∂ℓ/∂e ⊙ e‖₂ at the position that predicts token t tracks the token's surprise (issue 45:
it ranks inserted filler, which the model did not expect, above the arithmetic). This candidate divides it out:
signal_t = s_t / (σ_t + c), σ_t = −log π(y_t | y_<t) at the sampling temperature, read from the logits at the same
predicting position, in the same forward (the answer NLL's backward needs logits only at the answer positions; the
surprise forms the other positions' logits without a graph, in chunks). Guard: the offset c
(`grail_over_surprise_offset`, 0.1 nats by default) instead of a max(σ, floor): a near-certain token (σ → 0) is
divided by about c, not by 0, and the map stays smooth and monotone in σ. Through GRAIL's pipeline (log → z-score)
the division is a subtraction: log s_t − log(σ_t + c).

Pipeline: GRAIL's (`builtin.saliency_pipeline`, rows="saliency"): the candidate is a corrected GRAIL signal, so it
keeps GRAIL's weights map, answer overrides and row selection. In training the surprise is free (TRL's forward has
every token's log-prob) but `fused_signal` cannot divide it in, so this plug-in runs the separate path.
"""

from __future__ import annotations

import torch

from grail import MethodOption, MethodSpec
from grail.methods import builtin, probes
from grail.methods.sharding import unsharded
from grail.methods.spans import align_to_completion

CHUNK_POSITIONS = 1024  # logits for at most this many positions at a time when forming the surprise


def saliency_and_surprise(model, input_ids_BL: torch.Tensor, attention_mask_BL: torch.Tensor,
                          answer_BT: torch.Tensor, *, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """((B, T) GRAIL's saliency with leaf = embeddings, (B, T) surprise −log π(y_t | y_<t)), both float32, 0 on
    padding, from one forward and one backward. The saliency equals `probes.answer_nll_saliency`'s (tested)."""
    T = answer_BT.shape[1]
    mask_BT = probes.completion_mask_BT(attention_mask_BL, T)
    saliency_BT, surprise_BT = probes.zeros_BT(input_ids_BL, T), probes.zeros_BT(input_ids_BL, T)
    if not mask_BT.any():
        return saliency_BT, surprise_BT
    embed = probes.leaf_module(model, "embeddings")
    targets_BT = align_to_completion(input_ids_BL, T, at="token")
    with torch.enable_grad(), unsharded(model):
        e_BLD = embed(input_ids_BL).detach().requires_grad_()
        hidden_BTD = align_to_completion(probes.hidden_states_BLD(model, attention_mask_BL, inputs_embeds=e_BLD), T,
                                         at="predicting")
        rows, cols = answer_BT.bool().nonzero(as_tuple=True)
        if rows.numel():
            logp_NV = torch.log_softmax(probes.output_logits(model, hidden_BTD[rows, cols], temperature), dim=-1)
            nll = -logp_NV.gather(1, targets_BT[rows, cols, None]).sum()
            grad_BLD = probes.leaf_gradient(nll, e_BLD)
            saliency_BT = align_to_completion((grad_BLD.float() * e_BLD.detach().float()).norm(dim=-1), T,
                                              at="predicting") * mask_BT
        with torch.no_grad():
            rows, cols = mask_BT.nonzero(as_tuple=True)
            for start in range(0, rows.numel(), CHUNK_POSITIONS):
                r, c = rows[start:start + CHUNK_POSITIONS], cols[start:start + CHUNK_POSITIONS]
                logp_NV = torch.log_softmax(probes.output_logits(model, hidden_BTD[r, c], temperature), dim=-1)
                surprise_BT[r, c] = -logp_NV.gather(1, targets_BT[r, c, None]).squeeze(1).float()
    return saliency_BT.detach().float(), surprise_BT


def _probe(model, rows, options, generator):
    saliency_BT, surprise_BT = saliency_and_surprise(model, rows.input_ids_BL, rows.attention_mask_BL, rows.answer_BT,
                                                     temperature=options.temperature)
    offset = options.method_options["grail_over_surprise_offset"]
    return saliency_BT / (surprise_BT.clamp(min=0) + offset)  # (rows, T); 0 on padding (saliency 0 there)


SPEC = MethodSpec(
    "grail_over_surprise", "GRAIL / surprise", _probe, builtin.saliency_pipeline, rows="saliency",
    reads=builtin.SALIENCY_READS, preserves_mass=False,
    options=(MethodOption("grail_over_surprise_offset", 0.1, "c in s / (−log π(token) + c), nats: keeps near-certain "
                          "tokens from dividing by 0", minimum=1e-6),),
    unshardable="screening plug-in: not run on sharded models",
    title="GRAIL's saliency divided by the token's surprise (−log π(token) + c)",
    summary="GRAIL's ‖∂ℓ/∂e ⊙ e‖ at the predicting position over the token's surprise from the same forward, "
            "through GRAIL's pipeline.",
    cost="as GRAIL's separate path (one forward and one backward to the embeddings) plus the output layer at every "
         "completion position without a graph; no fused path",
    reference="issue 45 (candidate); Pala et al. 2026 (GRAIL)",
)
