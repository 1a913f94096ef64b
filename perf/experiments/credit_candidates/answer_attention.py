"""Candidate credit signal (screened): the attention the answer span pays to each completion token.

Signal, per row and completion token t (at the token's own position S + t, OAR's reading):

    s_t = mean over the chosen layers ℓ and the heads h of  mean over answer queries q of  α^{ℓ,h}_{q → S+t} · n^{ℓ,h}_t

where α is the post-softmax attention of layer ℓ, head h, and the answer queries are the positions that PREDICT the
answer tokens (`answer_attention_queries="predicting"`, S − 1 + t for t in the probe's answer span: the positions
whose logits the answer's likelihood is read from, as GRAIL's NLL) or the answer tokens' own positions (`"token"`).
`answer_attention_layers=k` averages the last k layers; 0 averages all of them. n = 1 with
`answer_attention_weighting="attention"` (raw attention, the default); with `"value_norm"`, n^{ℓ,h}_t = ‖W_O^h v^h_t‖,
the norm of what token t's value adds to the residual stream through head h (Kobayashi et al. 2020, "Attention is
not only a weight", arXiv 2004.10102: a token with a large weight but a small transformed value moves nothing).
With raw attention every query's weights sum to 1 over the L input positions, so a row's signal over its prompt and
completion positions sums to 1 (the prompt's share is not returned).

The signal goes through GRAIL's normalisation (`saliency_pipeline`): attention is a positive, multiplicative quantity
with a heavy tail (sink tokens hold most of it), which the log and the per-row z-score of GRAIL's pipeline handle;
OAR's bi-level map takes log(1 + I), which is linear for I ≪ 1, so a sink would take the whole min-max range and
push every other token to the floor.

How the weights are obtained: sdpa and flash attention do not return attention weights. For this one forward the
model is switched to eager attention (`set_attn_implementation("eager")`, transformers' public switch, restored in a
`finally`), and a forward hook on each `self_attn` module reduces that layer's (B, H, L, L) weights to the answer
queries' average as soon as the layer returns, so at most one layer's weights are alive at a time (what eager
attention allocates anyway); `"value_norm"` also hooks each `v_proj`. Cost: one no-grad forward with eager
attention: O(B·H·L²) memory for one layer, and the unfused attention's time (on CPU, the embedded tiny model, 8 rows of
249 tokens: 1.1–1.2× one sdpa forward in three runs on a loaded machine, "value_norm" about 8% more; on a GPU the
fused kernels' advantage is larger, not measured here).

Shape letters beyond grail's: H attention heads, K key/value heads, E head size.
"""

from __future__ import annotations

import torch

from grail import MethodOption, MethodSpec
from grail.methods.builtin import SALIENCY_READS, saliency_pipeline
from grail.methods.spans import align_to_completion

__all__ = ["SPEC", "answer_attention_BL", "attention_modules", "value_norms_BLH"]


def attention_modules(model) -> list[torch.nn.Module]:
    """The decoder's self-attention modules, in layer order (Llama, Qwen, Gemma 3: `model.layers[i].self_attn`)."""
    found = [module for name, module in model.named_modules() if name.endswith("self_attn")]
    if not found:
        raise ValueError(f"answer_attention: {type(model).__name__} has no module named '*.self_attn'; the probe "
                         f"reads the attention weights of each decoder layer's self-attention.")
    return found


def value_norms_BLH(module: torch.nn.Module, values_BLX: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, L, H) ‖W_O^h v^h_l‖: the norm of what each position's value adds to the output through head h.
    `values_BLX`: the `v_proj` output (B, L, K·E); head h reads key/value head h // (H / K), as `repeat_kv` does."""
    weight_DX = module.o_proj.weight  # (D, H·E): column block h is head h's W_O^h
    B, L, width = values_BLX.shape
    size = weight_DX.shape[1] // heads  # E
    values_HNE = (values_BLX.view(B * L, width // size, size).repeat_interleave(heads // (width // size), dim=1)
                  .transpose(0, 1).float())  # N = B·L positions
    weight_HED = weight_DX.float().view(-1, heads, size).permute(1, 2, 0)
    return torch.bmm(values_HNE, weight_HED).norm(dim=-1).T.reshape(B, L, heads)  # (H, N, D) → (B, L, H)


def answer_attention_BL(model, input_ids_BL: torch.Tensor, attention_mask_BL: torch.Tensor, answer_BT: torch.Tensor,
                        *, queries: str = "predicting", last_layers: int = 0,
                        weighting: str = "attention") -> torch.Tensor:
    """(B, L) float32: the attention the answer queries pay to each input position (× the value norm with
    `weighting="value_norm"`), averaged over the answer queries, the heads and the chosen layers (module docstring).
    0 on every position of a row without answer tokens.

    Args:
        input_ids_BL, attention_mask_BL: (B, L) TRL's layout (prompt left-padded, completion the last T columns).
        answer_BT: (B, T) bool, the answer tokens whose queries are read.
        queries: "predicting" (positions S − 1 + t) or "token" (S + t).
        last_layers: average the last `last_layers` layers; 0 = all.
        weighting: "attention" (α) or "value_norm" (α · ‖W_O^h v^h‖).
    """
    if weighting not in ("attention", "value_norm"):
        raise ValueError(f"answer_attention: weighting must be 'attention' or 'value_norm', got {weighting!r}")
    B, L = input_ids_BL.shape
    T = answer_BT.shape[1]
    query_BL = torch.zeros(B, L, dtype=torch.bool, device=input_ids_BL.device)
    align_to_completion(query_BL, T, at=queries)[:] = answer_BT.to(query_BL.device)  # a view: writes query_BL
    query_weight_BL = query_BL.float() / query_BL.sum(1, keepdim=True).clamp(min=1)  # mean over a row's queries
    modules = attention_modules(model)
    read = {id(module): module for module in (modules[-last_layers:] if last_layers else modules)}
    total_BL = torch.zeros(B, L, dtype=torch.float32, device=input_ids_BL.device)
    values: dict[int, torch.Tensor] = {}  # id(self_attn) → its v_proj output in this forward ("value_norm")

    def reduce(module, args, output):
        weights_BHLL = output[1]
        if weights_BHLL is None:
            raise RuntimeError("answer_attention: the attention module returned no weights; eager attention did "
                               "not take effect (a model class that ignores set_attn_implementation?).")
        if id(module) in read:
            heads = weights_BHLL.shape[1]
            # A query with every key masked (padding; under a sliding window, a right-pad position far from the last
            # real token) can have NaN weights in eager attention: select the answer queries, do not multiply by 0.
            answer_BHLL = torch.where(query_BL[:, None, :, None], weights_BHLL.float(), 0.0)
            keys_BHL = (answer_BHLL * query_weight_BL[:, None, :, None]).sum(2)  # Σ_q w_q α[b, h, q, k]
            if weighting == "value_norm":
                keys_BHL = keys_BHL * value_norms_BLH(module, values.pop(id(module)), heads).transpose(1, 2)
            total_BL.add_(keys_BHL.mean(1))
        # That NaN also reaches the query's output and, through the next layer's values (0 weight × NaN = NaN), every
        # real token (seen in float64 with sliding windows), in every layer, read or not. sdpa's output there is
        # finite: zero it on padding.
        out_BLD = output[0]
        padding_BL1 = ~attention_mask_BL.bool()[:, :, None]
        return (torch.where(padding_BL1, out_BLD.nan_to_num(0.0), out_BLD), None, *output[2:])

    previous = model.config._attn_implementation
    handles = [module.register_forward_hook(reduce) for module in modules]
    if weighting == "value_norm":
        handles += [module.v_proj.register_forward_hook(
            lambda _m, _a, out, key=key: values.__setitem__(key, out)) for key, module in read.items()]
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
                                       last_layers=own["answer_attention_layers"],
                                       weighting=own["answer_attention_weighting"])
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
        MethodOption("answer_attention_weighting", "attention", "raw attention weights, or each weight times the "
                     "norm of what the key's value adds through that head, ‖W_O^h v^h‖ (Kobayashi et al. 2020)",
                     choices=("attention", "value_norm")),
    ),
    title="Answer attention: the attention the answer span pays to each token, through GRAIL's normalisation",
    summary="One no-grad forward with eager attention; per layer, a hook averages the post-softmax attention of the "
            "answer's query positions over the queries and heads; the layers' average at each completion token's own "
            "position is the signal, turned into weights by GRAIL's pipeline (log, per-row z-score, clip, "
            "answer-span overrides).",
    example="answer_attention_layers=2",
    cost="one no-grad forward with eager attention (sdpa returns no weights): one layer's (rows, heads, L, L) "
         "weights alive at a time, the unfused attention's time",
    reference="attention as explanation: Abnar & Zuidema 2020 (arXiv 2005.00928, raw attention); Kobayashi et al. "
              "2020 (arXiv 2004.10102, value norms); a screened candidate",
    open_choices=("Raw attention (or attention × value norm) averaged over heads and layers, not attention rollout "
                  "(Abnar & Zuidema), which multiplies the layers' attention matrices: the cheapest members of the "
                  "family.",),
)
