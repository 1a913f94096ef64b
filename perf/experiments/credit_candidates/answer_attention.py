"""Candidate credit signal (issue 45): the attention the answer span pays to each completion token.

Signal, per row and completion token t (at the token's own position S + t, OAR's reading):

    s_t = mean over the chosen layers ℓ and the heads h of  mean over answer queries q of  α^{ℓ,h}_{q → S+t}

where α is the post-softmax attention of layer ℓ, head h, and the answer queries are the positions that PREDICT the
answer tokens (`answer_attention_queries="predicting"`, S − 1 + t for t in the probe's answer span: the positions
whose logits the answer's likelihood is read from, as GRAIL's NLL) or the answer tokens' own positions (`"token"`).
`answer_attention_layers=k` averages the last k layers; 0 averages all of them. Every query's attention sums to 1
over the L input positions, so a row's signal over its prompt and completion positions sums to 1 (the prompt's
share is not returned). The signal goes through GRAIL's normalisation (`saliency_pipeline`): attention is a positive,
multiplicative quantity with a heavy tail (sink tokens hold most of it), which the log and the per-row z-score of
GRAIL's pipeline handle; OAR's bi-level map takes log(1 + I), which is linear for I ≪ 1, so a sink would take the
whole min-max range and push every other token to the floor.

How the weights are obtained: sdpa and flash attention do not return attention weights. For this one forward the
model is switched to eager attention (`set_attn_implementation("eager")`, transformers' public switch, restored in a
`finally`), and a forward hook on each `self_attn` module reduces that layer's (B, H, L, L) weights to the answer
queries' average as soon as the layer returns, so at most one layer's weights are alive at a time (what eager
attention allocates anyway). Cost: one no-grad forward with eager attention: O(B·H·L²) memory for one layer and the
unfused attention's time (on CPU at 256 tokens eager and sdpa cost about the same; on a GPU at 1024 tokens eager is
several times slower than the fused kernel in the attention, which is a minor part of a small model's forward).

Shape letters beyond grail's: H attention heads.
"""

from __future__ import annotations

import torch

from grail import MethodOption, MethodSpec
from grail.methods.builtin import SALIENCY_READS, saliency_pipeline
from grail.methods.spans import align_to_completion

__all__ = ["SPEC", "answer_attention_BL", "attention_modules"]


def attention_modules(model) -> list[torch.nn.Module]:
    """The decoder's self-attention modules, in layer order (Llama, Qwen, Gemma 3: `model.layers[i].self_attn`)."""
    found = [module for name, module in model.named_modules() if name.endswith("self_attn")]
    if not found:
        raise ValueError(f"answer_attention: {type(model).__name__} has no module named '*.self_attn'; the probe "
                         f"reads the attention weights of each decoder layer's self-attention.")
    return found


def answer_attention_BL(model, input_ids_BL: torch.Tensor, attention_mask_BL: torch.Tensor, answer_BT: torch.Tensor,
                        *, queries: str = "predicting", last_layers: int = 0) -> torch.Tensor:
    """(B, L) float32: the attention the answer queries pay to each input position, averaged over the answer
    queries, the heads and the chosen layers (module docstring). 0 on every position of a row without answer tokens.

    Args:
        input_ids_BL, attention_mask_BL: (B, L) TRL's layout (prompt left-padded, completion the last T columns).
        answer_BT: (B, T) bool, the answer tokens whose queries are read.
        queries: "predicting" (positions S − 1 + t) or "token" (S + t).
        last_layers: average the last `last_layers` layers; 0 = all.
    """
    B, L = input_ids_BL.shape
    T = answer_BT.shape[1]
    query_BL = torch.zeros(B, L, dtype=torch.bool, device=input_ids_BL.device)
    align_to_completion(query_BL, T, at=queries)[:] = answer_BT.to(query_BL.device)  # a view: writes query_BL
    query_weight_BL = query_BL.float() / query_BL.sum(1, keepdim=True).clamp(min=1)  # mean over a row's queries
    modules = attention_modules(model)
    read = {id(module) for module in (modules[-last_layers:] if last_layers else modules)}
    total_BL = torch.zeros(B, L, dtype=torch.float32, device=input_ids_BL.device)

    def reduce(module, args, output):
        weights_BHLL = output[1]
        if weights_BHLL is None:
            raise RuntimeError("answer_attention: the attention module returned no weights; eager attention did "
                               "not take effect (a model class that ignores set_attn_implementation?).")
        if id(module) in read:
            mean_BLL = weights_BHLL.float().mean(1)  # (B, L, L) over heads: query × key
            # A query with every key masked (padding; under a sliding window, a right-pad position far from the last
            # real token) can have NaN weights in eager attention: select the answer queries, do not multiply by 0.
            answer_BLL = torch.where(query_BL[:, :, None], mean_BLL, torch.zeros_like(mean_BLL))
            total_BL.add_((answer_BLL * query_weight_BL[:, :, None]).sum(1))  # Σ_q w_q α[b, q, k]
        # That NaN also reaches the query's output and, through the next layer's values (0 weight × NaN = NaN), every
        # real token (seen in float64 with sliding windows), in every layer, read or not. sdpa's output there is
        # finite: zero it on padding.
        out_BLD = output[0]
        padding_BL1 = ~attention_mask_BL.bool()[:, :, None]
        return (torch.where(padding_BL1, out_BLD.nan_to_num(0.0), out_BLD), None, *output[2:])

    previous = model.config._attn_implementation
    handles = [module.register_forward_hook(reduce) for module in modules]
    try:
        if previous != "eager":
            model.set_attn_implementation("eager")
        with torch.no_grad():
            model(input_ids=input_ids_BL, attention_mask=attention_mask_BL)
    finally:
        for handle in handles:
            handle.remove()
        if previous != "eager":
            model.set_attn_implementation(previous)
    return total_BL / len(read)


def _probe(model, rows, options, generator) -> torch.Tensor:
    """(rows, T): the answer span's mean attention to each completion token, at the token's own position."""
    own = options.method_options
    attention_BL = answer_attention_BL(model, rows.input_ids_BL, rows.attention_mask_BL, rows.answer_BT,
                                       queries=own["answer_attention_queries"],
                                       last_layers=own["answer_attention_layers"])
    return align_to_completion(attention_BL, rows.answer_BT.shape[1], at="token")


SPEC = MethodSpec(
    "answer_attention", "answer attention", _probe, saliency_pipeline, rows="saliency", reads=SALIENCY_READS,
    preserves_mass=False,
    options=(
        MethodOption("answer_attention_layers", 0, "average the attention of the last N decoder layers; 0 averages "
                     "every layer", minimum=0),
        MethodOption("answer_attention_queries", "predicting", "which positions' attention is read: those that "
                     "predict the answer tokens (whose logits give the answer's likelihood, as GRAIL's NLL) or the "
                     "answer tokens' own", choices=("predicting", "token")),
    ),
    title="Answer attention: the attention the answer span pays to each token, through GRAIL's normalisation",
    summary="One no-grad forward with eager attention; per layer, a hook averages the post-softmax attention of the "
            "answer's query positions over the queries and heads; the layers' average at each completion token's own "
            "position is the signal, turned into weights by GRAIL's pipeline (log, per-row z-score, clip, "
            "answer-span overrides).",
    example="answer_attention_layers=2",
    cost="one no-grad forward with eager attention (sdpa returns no weights): one layer's (rows, heads, L, L) "
         "weights alive at a time, the unfused attention's time",
    reference="attention as explanation: Abnar & Zuidema 2020 (arXiv 2005.00928, raw attention baseline); "
              "issue 45 candidate",
    open_choices=("Raw attention averaged over heads and layers, not attention rollout (Abnar & Zuidema) or "
                  "attention × value norm (Kobayashi et al. 2020): the cheapest member of the family.",),
)
