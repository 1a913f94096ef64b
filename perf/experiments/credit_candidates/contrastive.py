"""contrastive: the gradient of a contrastive answer target, log π(this row's answer) − log π(a competing answer).

GRAIL's and attr_patch's target, the answer's log-probability, also rewards tokens that make ANY well-formed answer
likely (the box, the format, surprising words that shift every continuation). The contrast keeps only what separates
this answer from another one the group produced: J_b = log π(a_b | x_b) − log π(a_j | x_b), where x_b is row b's
prompt and completion up to its box content, a_b its content and closing brace, and a_j = row j's content tokens
followed by row b's closing brace, forced into the same span (a copy of row b whose content is replaced).

Competitor: the rows of the group (same prompt ids, as KTAE) whose decoded box content differs from row b's; of
them the one farthest in advantage: the lowest A for a row with A > 0 (its most confident wrong answer), the highest
A otherwise (its best answer); the first such row on ties. Fallback: a row with a box but no different answer in its
group (every other row agrees, or has no box) takes J_b = log π(a_b | x_b), attr_patch's target on its content;
a row without a box has no answer and gets signal 0 (uniform weights). Both are counted in `COUNTS` ("fallback",
"no_box", beside "rows" and "contrasted"; by method name), which the screening script prints.

Read (`contrastive_read`): `patch` (default) |∇_{e_t} J · (e_pad − e_t)| at the token's own embedding, as attr_patch;
`saliency` GRAIL's ‖∇_e J ⊙ e‖₂ at the position that predicts the token. The prefix x_b is shared by the row and its
forced copy, so ∇_{e_t} J adds both copies' gradients at t < the content's start.

Pipeline: OAR's bi-level reshaping (as attr_patch, so the two differ only in the target). `groups=True`: the weights
are computed at rollout time on the whole batch, so that every row sees its group.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import torch

from credit_candidates.attr_patch import nonnegative_bilevel
from credit_candidates.gradients import embedding_gradient, pad_embedding, patch_delta_BT, saliency_BT
from grail import MethodOption, MethodSpec
from grail.methods import builtin, probes
from grail.methods.spans import answer_spans

READS = ("patch", "saliency")
# by method name (a screening variant counts under its own): rows probed, contrasted, fallback (a box but no different
# answer in the group), no_box
COUNTS: defaultdict[str, Counter] = defaultdict(Counter)


def competitor_rows(tokenizer, input_ids_BL: torch.Tensor, attention_mask_BL: torch.Tensor, adv_B, T: int, *,
                    box: str = "first"):
    """(spans, competitor): `answer_spans` of the completions and, per row, the index of its competing row, or −1
    (no box) or −2 (a box but no different answer in its group). See the module docstring for the rule."""
    mask_BT = probes.completion_mask_BT(attention_mask_BL, T)
    spans = answer_spans(tokenizer, input_ids_BL[:, -T:], mask_BT, box=box)
    S = input_ids_BL.shape[1] - T
    B = input_ids_BL.shape[0]
    adv = [0.0] * B if adv_B is None else adv_B.tolist()
    prompts = [tuple(input_ids_BL[b, :S][attention_mask_BL[b, :S].bool()].tolist()) for b in range(B)]
    texts = [tokenizer.decode(input_ids_BL[b, -T:][spans.answer_BT[b]].tolist()).strip() if spans.has_box_B[b]
             else None for b in range(B)]
    competitor = []
    for b in range(B):
        if texts[b] is None:
            competitor.append(-1)
            continue
        others = [j for j in range(B) if prompts[j] == prompts[b] and texts[j] is not None and texts[j] != texts[b]]
        if not others:
            competitor.append(-2)
            continue
        pick = min if adv[b] > 0 else max
        best = pick(adv[j] for j in others)
        competitor.append(next(j for j in others if adv[j] == best))
    return spans, competitor


def contrastive_signal(model, tokenizer, input_ids_BL: torch.Tensor, attention_mask_BL: torch.Tensor, adv_B,
                       num_completion_tokens: int, *, temperature: float, pad_token_id: int, read: str = "patch",
                       box: str = "first", counts: Counter | None = None) -> torch.Tensor:
    """(B, T) float32 signal of the module docstring, 0 on padding (T = num_completion_tokens, the completion block
    of TRL's layout); `counts` (default `COUNTS["contrastive"]`) is incremented."""
    if read not in READS:
        raise ValueError(f"contrastive_read={read!r}: choose one of {READS}")
    if tokenizer is None:
        raise ValueError("contrastive reads the boxed answers' text: the probe needs the tokenizer (ProbeBatch."
                         "tokenizer); pass it to token_weights / run_probe.")
    counts = COUNTS["contrastive"] if counts is None else counts
    B, L = input_ids_BL.shape
    T = num_completion_tokens
    S = L - T
    spans, competitor = competitor_rows(tokenizer, input_ids_BL, attention_mask_BL, adv_B, T, box=box)
    counts["rows"] += B
    counts["no_box"] += sum(c == -1 for c in competitor)
    counts["fallback"] += sum(c == -2 for c in competitor)
    counts["contrasted"] += sum(c >= 0 for c in competitor)
    # each row's answer: content and closing brace, completion positions [first, end]
    first, end, forced = {}, {}, []
    for b in range(B):
        if competitor[b] == -1:
            continue
        content = spans.answer_BT[b].nonzero().squeeze(1)
        first[b], end[b] = int(content[0]), int(spans.box_BT[b].nonzero().max())
        if competitor[b] >= 0:
            j = competitor[b]
            ids = input_ids_BL[b, S:S + first[b]].tolist() + input_ids_BL[j, S:][spans.answer_BT[j]].tolist() + \
                input_ids_BL[b, S + int(content[-1]) + 1:S + end[b] + 1].tolist()
            forced.append((b, ids))
    T2 = max([T] + [len(ids) for _, ids in forced])
    X = B + len(forced)
    ids_XL = torch.full((X, S + T2), pad_token_id, dtype=input_ids_BL.dtype, device=input_ids_BL.device)
    attn_XL = torch.zeros_like(ids_XL)
    target_XT = torch.zeros(X, T2, dtype=torch.bool, device=input_ids_BL.device)
    coef_X = torch.ones(X, device=input_ids_BL.device)
    ids_XL[:B, :L], attn_XL[:B, :L] = input_ids_BL, attention_mask_BL
    for b in first:
        target_XT[b, first[b]:end[b] + 1] = True
    for f, (b, ids) in enumerate(forced):
        x = B + f
        ids_XL[x, :S] = input_ids_BL[b, :S]
        attn_XL[x, :S] = attention_mask_BL[b, :S]
        ids_XL[x, S:S + len(ids)] = torch.tensor(ids, dtype=ids_XL.dtype)
        attn_XL[x, S:S + len(ids)] = 1
        target_XT[x, first[b]:len(ids)] = True
        coef_X[x] = -1.0
    e_XLD, grad_XLD = embedding_gradient(model, ids_XL, attn_XL, target_XT, coef_X, temperature=temperature)
    e_BLD, grad_BLD = e_XLD[:B, :L], grad_XLD[:B, :L].clone()
    for f, (b, _) in enumerate(forced):  # the shared prefix: the row's and its forced copy's gradients add up
        grad_BLD[b, :S + first[b]] += grad_XLD[B + f, :S + first[b]]
    if read == "patch":
        out_BT = patch_delta_BT(e_BLD, grad_BLD, pad_embedding(model, pad_token_id, e_BLD), T).abs()
    else:
        out_BT = saliency_BT(e_BLD, grad_BLD, T)
    return (out_BT * probes.completion_mask_BT(attention_mask_BL, T)).float()  # (B, T)


def _probe(model, rows, options, generator):
    return contrastive_signal(model, rows.tokenizer, rows.input_ids_BL, rows.attention_mask_BL, rows.adv_B,
                              rows.answer_BT.shape[1], temperature=options.temperature,
                              pad_token_id=builtin.pad_token_id(model),
                              read=options.method_options["contrastive_read"], box=options.answer_box,
                              counts=COUNTS[options.token_weighting])


SPEC = MethodSpec(
    "contrastive", "contrastive", _probe, nonnegative_bilevel, rows="bilevel", groups=True,
    reads=builtin.BILEVEL_READS,
    options=(MethodOption("contrastive_read", "patch", "how ∇_e [log π(answer) − log π(competing answer)] is read per "
                          "token: patch |∇·(e_pad − e)| at the token, or saliency ‖∇ ⊙ e‖ at the predicting position",
                          choices=READS),),
    unshardable="screening plug-in: not run on sharded models",
    title="Contrastive target: gradient of log π(this answer) − log π(a competing answer of the group)",
    summary="The competing answer is forced into the row's box; read as attribution patching (or GRAIL's saliency); "
            "OAR's bi-level reshaping. Rows without a different answer in the group fall back to log π(answer).",
    cost="one forward and one backward to the embeddings on about twice the rows (each row and its forced copy up to "
         "the box's end); weights at rollout time on the whole batch (groups)",
    reference="grail-rl (a screened candidate)",
)
