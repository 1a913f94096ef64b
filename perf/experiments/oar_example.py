"""OAR-P's importances on one finished answer, before and after the fix of its P_final (docs/methods/oar_p.md).

Before: P_final = the next-token distribution after the last token (`last_position`), KL formed in float32.
After: P_final = softmax of the mean logits over the positions predicting the answer box (`answer_mean`, the
default now), KL formed in float64. Each is run with a float32 and a float64 model: an importance that changes
with the model's precision is rounding, not signal.

    python perf/experiments/oar_example.py        # uses (or trains, ~1 min) the cached warm start of `grail demo`
"""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grail.methods import oar_probes, probes
from grail.methods.bilevel import oar_weights_from_importance
from grail.methods.spans import answer_spans
from grail.methods.table import scored_tokens
from grail.models.warmstart import warm_start
from grail.options.choices import WarmStartConfig, WeightingOptions

PROMPT, COMPLETION = "Q: 7*5-7-1\nA:", " 7*5=35, 35-7=28, now 28-1=27. \\boxed{27}"


def kl_float32(p_logits, q_logits):
    logp, logq = torch.log_softmax(p_logits.float(), -1), torch.log_softmax(q_logits.float(), -1)
    return (logp.exp() * (logp - logq)).sum(-1)


def importances(model, ids, attn, spans, mask, distribution, kl):
    saved, probes.kl_divergence = probes.kl_divergence, kl
    try:
        return oar_probes.oar_p_importance(model, ids, attn, mask, spans.box_BT, distribution=distribution,
                                       pad_token_id=0, temperature=1.0, chunk_tokens=4096)[0]
    finally:
        probes.kl_divergence = saved


def main() -> None:
    path = warm_start(WarmStartConfig())
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    prompt = tokenizer(PROMPT, return_tensors="pt").input_ids
    completion = tokenizer(COMPLETION, return_tensors="pt", add_special_tokens=False).input_ids
    ids, mask = torch.cat([prompt, completion], 1), torch.ones_like(completion, dtype=torch.bool)
    attn = torch.ones_like(ids)
    spans = answer_spans(tokenizer, completion, mask)
    tokens = [tokenizer.decode([t]) for t in completion[0]]
    # (label, distribution, KL, model dtype): the old default as computed before; the same distribution computed
    # exactly (float64 KL and model); the new default with a float32 and a float64 model.
    configs = [("last_position, KL fp32, model fp32 (before)", "last_position", kl_float32, torch.float32),
               ("last_position, KL fp64, model fp64 (exact)", "last_position", probes.kl_divergence, torch.float64),
               ("answer_mean, KL fp64, model fp32 (after)", "answer_mean", probes.kl_divergence, torch.float32),
               ("answer_mean, KL fp64, model fp64 (exact)", "answer_mean", probes.kl_divergence, torch.float64)]
    runs = [importances(model.to(dtype), ids, attn, spans, mask, dist, kl) for _, dist, kl, dtype in configs]
    print("| token | " + " | ".join(label for label, *_ in configs) + " |")
    print("|---" * (len(configs) + 1) + "|")
    for t, token in enumerate(tokens):
        print(f"| `{token}` | " + " | ".join(f"{run[t].item():.2e}" for run in runs) + " |")
    options = WeightingOptions(token_weighting="oar_p")  # the released reshaping, reasoning tokens scored
    scored = scored_tokens(spans, mask, options)
    weights = [oar_weights_from_importance(run[None], mask, scored, quantile=options.oar_quantile,
                                           beta=options.oar_beta, floor=options.oar_floor).weights_BT[0]
               for run in runs]
    print(f"reasoning-token weights, before vs exact: largest difference {(weights[0] - weights[1]).abs().max():.3g}")
    print(f"reasoning-token weights, after vs exact: largest difference {(weights[2] - weights[3]).abs().max():.3g}")


if __name__ == "__main__":
    main()
