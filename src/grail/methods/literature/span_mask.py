"""Counterfactual span masking (arXiv 2602.09331, "Beyond Uniform Credit: Causal Credit Assignment for Policy
Optimization"; released trainer: Lexsi-Labs/aligntune, counterfact_grpo), a plug-in.

Each reasoning span (an arithmetic step `a op b = c`, or a sentence) is replaced by pad tokens in a copy of the row;
the span's importance is the drop of the answer's log-likelihood, log p(answer | row) − log p(answer | copy), spread
evenly over its tokens on top of a base of 0.2. Reasoning tokens' importance is min-max scaled to [0.5, 1] per row,
formatting tokens (`=`, `#`, `-` runs) are multiplied by 0.1, and w = w_min + (boost − w_min) · importance on
reasoning tokens, answer_weight on the box, then the row is rescaled to mean 1 ("gradient conservation"). The weights
are positive, so the sign of A is kept. The copies reuse OAR-P's perturbation rules: the substitute is the pad token,
the attention mask is unchanged, and they run in chunks of at most `perturbation_chunk_tokens` tokens.
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F

from grail.methods import core
from grail.methods.builtin import pad_token_id
from grail.methods.output_layer import output_logits
from grail.methods.probes import hidden_states_BLD, in_lockstep
from grail.methods.sharding import unsharded
from grail.methods.spans import token_char_offsets
from grail.methods.spec import MethodOption, MethodSpec, TokenWeights
from grail.tasks.boxed import char_span_to_token_positions

__all__ = ["OPEN_CHOICES", "SPEC", "reasoning_spans"]

OPEN_CHOICES = (
    "The answer whose likelihood drops is the row's own sampled box (answer_nll_span), without end-of-text or "
    "padding; the released trainer sums every token after the answer marker, padding included.",
    "The box tokens get answer_weight (1.5); the release gives it only after a 'Final Answer' marker, so a \\boxed "
    "answer got the floor 0.5 there.",
    "Gradient conservation (row mean 1) is on, as in the release's trainer class (its library default is off).",
    "Spans: arithmetic steps first (at most max_spans // 2), then sentences ending in . ! ? or a blank line, at least "
    "5 tokens; spans over 50 tokens or over 30% backslashes are skipped; at most max_spans per row (release).",
    "Negative drops (distractor spans) are min-max scaled like the rest, so they sit at the floor, never below it "
    "(release).",
)
ARITHMETIC = re.compile(r"\d+(?:\.\d+)?(?:\s*[-+*/×÷]\s*\d+(?:\.\d+)?)+\s*=\s*\d+(?:\.\d+)?")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n\s*\n")
FORMATTING = {"#", "##", "###", "####", "=", "==", "===", "====", "-", "--", "---"}
BASE, MIN_SENTENCE, MAX_SPAN = 0.2, 5, 50


def reasoning_spans(text: str, offsets: list[tuple[int, int]], reasoning: list[bool],
                    max_spans: int) -> list[tuple[int, int]]:
    """Token ranges [s, e) of the spans of one completion (module docstring); inside its reasoning tokens."""
    n = sum(reasoning)  # reasoning tokens come first
    end_char = offsets[n - 1][1] if n else 0

    def tokens(a: int, b: int) -> tuple[int, int]:
        covered = char_span_to_token_positions(offsets[:n], a, b)
        return (covered[0], covered[-1] + 1) if covered else (0, 0)

    arithmetic = [tokens(m.start(), m.end()) for m in ARITHMETIC.finditer(text[:end_char])][: max_spans // 2]
    sentences, start = [], 0
    for m in [*SENTENCE_END.finditer(text[:end_char]), None]:
        stop = m.start() if m else end_char
        s, e = tokens(start, stop)
        if e - s >= MIN_SENTENCE and not any(s < e2 and e > s2 for s2, e2 in arithmetic):
            sentences.append((s, e))
        start = m.end() if m else end_char
    keep = [(s, e) for s, e in arithmetic + sentences if 0 < e - s <= MAX_SPAN
            and text[offsets[s][0]:offsets[e - 1][1]].count("\\") <= 0.3 * (offsets[e - 1][1] - offsets[s][0])]
    return sorted(keep[:max_spans])


def _answer_logprob(model, ids_CN, answer_CN, chunk_tokens: int, temperature: float) -> torch.Tensor:
    """(C,) Σ log p(answer tokens) of each copy (rows of equal length), in chunks of ≤ chunk_tokens tokens."""
    out, per_chunk = [], max(1, chunk_tokens // ids_CN.shape[1])
    for start in range(0, ids_CN.shape[0], per_chunk):
        ids, answer = ids_CN[start:start + per_chunk], answer_CN[start:start + per_chunk]
        hidden = hidden_states_BLD(model, torch.ones_like(ids), input_ids=ids)[:, :-1]
        where = answer[:, 1:]  # position p predicts token p + 1
        logp = F.log_softmax(output_logits(model, hidden[where], temperature), dim=-1)
        token_lp = logp.gather(1, ids[:, 1:][where][:, None]).squeeze(1)
        out.append(torch.zeros(ids.shape[0], dtype=token_lp.dtype, device=ids.device).index_add_(
            0, where.nonzero()[:, 0], token_lp))
    return torch.cat(out)


def _probe(model, rows, options, generator) -> torch.Tensor:
    """(rows, T) importance in [0.5, 1] on reasoning tokens with spans (0.5 when a row has none), 0 elsewhere."""
    T, own, pad = rows.answer_BT.shape[1], options.method_options, pad_token_id(model)
    importance_BT = torch.zeros(rows.answer_BT.shape, dtype=torch.float32, device=rows.answer_BT.device)
    with torch.no_grad(), unsharded(model), in_lockstep(model):  # a data-dependent number of forwards
        for i in range(rows.input_ids_BL.shape[0]):
            real = rows.attention_mask_BL[i].bool()
            ids_n = rows.input_ids_BL[i][real]
            S = len(ids_n) - int(real[-T:].sum())  # real prompt tokens (the completion is right-padded)
            completion = ids_n[S:].tolist()
            reasoning = rows.reasoning_BT[i][: len(completion)].tolist()
            text, offsets = token_char_offsets(rows.tokenizer, completion)
            spans = reasoning_spans(text, offsets, reasoning, own["span_mask_max_spans"])
            n = sum(reasoning)
            imp = torch.full((n,), BASE, dtype=torch.float64)
            if spans:
                copies = ids_n.repeat(len(spans) + 1, 1)
                for c, (s, e) in enumerate(spans, start=1):
                    copies[c, S + s:S + e] = pad
                answer_n = torch.zeros(len(ids_n), dtype=torch.bool, device=ids_n.device)
                answer_n[S:] = rows.answer_BT[i][: len(completion)]
                lp = _answer_logprob(model, copies, answer_n.expand_as(copies), options.perturbation_chunk_tokens,
                                     options.temperature).double()
                if not torch.isfinite(lp).all():  # non-finite logits: no signal; the pipeline gives uniform weights
                    importance_BT[i, torch.nonzero(rows.reasoning_BT[i]).squeeze(1)[:n]] = float("nan")
                    continue
                for (s, e), drop in zip(spans, (lp[0] - lp[1:]).tolist(), strict=True):
                    imp[s:e] += drop / (e - s)
            low, high = imp.min(), imp.max()
            imp = 0.5 + 0.5 * (imp - low) / (high - low) if high > low else torch.full_like(imp, 0.5)
            fmt = torch.tensor([text[a:b].strip() in FORMATTING for a, b in offsets[:n]], dtype=torch.bool)
            imp[fmt] *= 0.1
            importance_BT[i, torch.nonzero(rows.reasoning_BT[i]).squeeze(1)[:n]] = imp.float().to(importance_BT.device)
    return importance_BT


def _pipeline(spec, signal_BT, adv_B, spans, mask_BT, rows_B, options, generator, min_importance):
    """w = w_min + (boost − w_min)·importance on reasoning, answer_weight on the box, rescaled to row mean 1."""
    own = options.method_options
    signal_BT, rows_ok_B, fallback_B = TokenWeights.finite_signal(signal_BT.float(), mask_BT, rows_B)
    low, boost = own["span_mask_min_weight"], own["span_mask_boost"]
    weights_BT = torch.where(spans.reasoning_BT, low + (boost - low) * signal_BT, torch.full_like(signal_BT, low))
    weights_BT = torch.where(spans.box_BT, own["span_mask_answer_weight"], weights_BT)
    # uniform rows (not probed, or fallen back) have mean 1 and come back unchanged
    weights_BT = core.row_mean_rescaled(torch.where(rows_ok_B[:, None], weights_BT, 1.0), mask_BT)
    return TokenWeights.simple(weights_BT, spans, rows_B, fallback_B)


SPEC = MethodSpec(
    "span_mask", "span masking", _probe, _pipeline, rows="advantaged", auroc=False,
    reads=("answer_nll_span", "perturbation_chunk_tokens"),
    options=(MethodOption("span_mask_boost", 2.0, "weight of the most important reasoning token", minimum=0.0),
             MethodOption("span_mask_min_weight", 0.5, "weight of importance 0 (non-reasoning floor)", minimum=0.0),
             MethodOption("span_mask_answer_weight", 1.5, "weight of the answer box's tokens", minimum=0.0),
             MethodOption("span_mask_max_spans", 10, "spans masked per row (one forward each)", minimum=1)),
    title="Counterfactual span masking (drop of the answer's log-likelihood when a reasoning span is masked)",
    summary=" ".join(__doc__.split("\n\n")[1].split()),
    example="span_mask_max_spans=6", cost="one no-grad forward per reasoning span (at most max_spans) and one per row",
    reference="arXiv 2602.09331 (counterfactual credit assignment); released trainer Lexsi-Labs/aligntune",
    open_choices=OPEN_CHOICES,
)
