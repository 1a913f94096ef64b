"""Fidelity to the GRAIL release (issue: "the paper's run, exactly").

Each test holds a slow, literal re-implementation of what the release's trainer computes, written from its
description in ../shared/METHODS.md (2 and 3, "GRAIL's OAR-G baseline"), step by step in the release's order:
its own box finder (brace depth, no escapes), token positions by re-encoding the text before the box and the
box itself after a dummy prefix, a full (B, T, V) logits tensor, the (B, T) slices `[-(T+1):-1]`. grail's
vectorised code must give the same weights on every row whose weights can change the loss (A ≠ 0), and the
same token advantages Â on every row.
"""

import pytest
import torch
import torch.nn.functional as F

from grail.methods import bilevel
from grail.methods.table import checked
from grail.methods.weighting import grail_weights, oar_g_weights
from grail.models.tiny import build_tiny_model
from grail.options.choices import WeightingOptions

MARKER = "\\boxed{"


@pytest.fixture(scope="module")
def model64(tokenizer):
    model = build_tiny_model(tokenizer, seed=1)
    with torch.no_grad():  # sharper distributions than a fresh init, so the signals vary
        model.get_input_embeddings().weight.mul_(3.0)
    return model.double().eval()


def _batch(tokenizer):
    prompts = ["Q: 1+2\nA:", "Q: 3*4\nA:", "Q: 5-1\nA:", "Q: 2+2\nA:", "Q: 9-3\nA:", "Q: 7*5-7\nA:"]
    completions = [" 1+2=3. so \\boxed{3}", " 3*4=12. hmm 12", " 5-1=4. 4-1=3. \\boxed{3} done",
                   " 2+2=4 \\boxed{4}", " 9-3=6. \\boxed{6}. \\boxed{7}", " 7*5=35, 35-7=28. \\boxed{2{8}}"]
    p = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    c = tokenizer(completions, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False)
    adv = torch.tensor([0.5, -0.5, -0.25, 0.0, -1.0, 0.75], dtype=torch.float64)
    return p["input_ids"], p["attention_mask"], c["input_ids"], c["attention_mask"], adv


# ---- the release, literally ----------------------------------------------------------------------------------

def _release_box(text):
    """First complete `\\boxed{...}` as (start, end) characters: plain brace depth, `\\{` not special."""
    i = 0
    while (start := text.find(MARKER, i)) != -1:
        j, depth = start + len(MARKER), 1
        while j < len(text) and depth > 0:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        if depth == 0:
            return start, j
        i = start + len(MARKER)
    return None


def _release_box_masks(tokenizer, completion_ids):
    """(box, boundary, content, post) masks (B, T), token positions by re-encoding after a dummy prefix."""
    B, T = completion_ids.shape
    box, boundary, content, post = (torch.zeros(B, T, dtype=torch.bool) for _ in range(4))
    dummy = len(tokenizer.encode("a", add_special_tokens=False))
    encode_mid = lambda text: tokenizer.encode("a" + text, add_special_tokens=False)[dummy:]  # noqa: E731
    for i in range(B):
        text = tokenizer.decode(completion_ids[i].tolist(), skip_special_tokens=True)
        span = _release_box(text)
        if span is None:
            continue
        start = len(encode_mid(text[: span[0]]))
        end = min(start + len(encode_mid(text[span[0] : span[1]])), T)
        marker_end = min(start + len(encode_mid(MARKER)), end)
        box[i, start:end] = True
        boundary[i, start:marker_end] = True
        boundary[i, end - 1] = True
        content[i, marker_end : end - 1] = True
        post[i, end:] = True
    return box, boundary, content, post


def _leaf_and_last_hidden(model, ids, attn, leaf):
    embeds = model.get_input_embeddings()(ids).detach().requires_grad_(True)
    out = model.model(inputs_embeds=embeds, attention_mask=attn, use_cache=False, output_hidden_states=True)
    L = len(out.hidden_states) - 1
    leaf_tensor = {"embeddings": embeds, "first": out.hidden_states[1], "middle": out.hidden_states[L // 2],
                   "last": out.hidden_states[L - 1]}[leaf]
    return leaf_tensor, out.last_hidden_state


def release_grail_weights(model, tokenizer, ids, attn, completion_ids, mask, adv, *, leaf, symmetry,
                          w_mean=1.0, w_std=0.5, w_min=0.5, w_max=5.0, temperature=1.0):
    T = completion_ids.shape[1]
    with torch.enable_grad():
        leaf_tensor, last_hidden = _leaf_and_last_hidden(model, ids, attn, leaf)
        logits = F.linear(last_hidden[:, :-1][:, -T:], model.lm_head.weight.detach()) / temperature
        logps = torch.log_softmax(logits, -1).gather(-1, completion_ids[..., None]).squeeze(-1)
        box, boundary, content, post = _release_box_masks(tokenizer, completion_ids)
        loss = -logps[box].sum()
        (grads,) = torch.autograd.grad(loss, leaf_tensor)
    scores = (grads[:, -(T + 1) : -1] * leaf_tensor[:, -(T + 1) : -1].detach()).norm(dim=-1)
    fallback = ~box.any(-1, keepdim=True)
    if symmetry == "correct":
        fallback = fallback | (adv <= 0)[:, None]
    elif symmetry == "wrong":
        fallback = fallback | (adv > 0)[:, None]
    m = mask.double()
    log_s = torch.log(scores + 1e-8)
    n = m.sum(-1, keepdim=True).clamp(min=1)
    mean = (log_s * m).sum(-1, keepdim=True) / n
    std = torch.sqrt((((log_s - mean) ** 2) * m).sum(-1, keepdim=True) / n + 1e-8)
    clipped = (w_mean + (log_s - mean) / std * w_std).clamp(w_min, w_max)
    weights = torch.where(fallback, torch.ones_like(clipped), clipped) * m
    weights[content] = w_max
    weights[boundary] = w_mean
    weights[post & mask.bool()] = w_mean
    return weights


def release_oar_g_weights(model, tokenizer, ids, attn, completion_ids, mask, noise_BTD, *, sigma=1e-3, q=0.4,
                          beta=2.0, eps=1e-12):
    T = completion_ids.shape[1]
    head = model.lm_head.weight.detach()
    box = _release_box_masks(tokenizer, completion_ids)[0]
    counts = box.sum(1, keepdim=True).clamp(min=1)
    with torch.no_grad():
        clean = model.model(inputs_embeds=model.get_input_embeddings()(ids), attention_mask=attn).last_hidden_state
        p0 = torch.softmax((F.linear(clean[:, -(T + 1) : -1], head) * box[..., None]).sum(1) / counts, -1)
    embeds = model.get_input_embeddings()(ids).detach()
    noise = torch.zeros_like(embeds)
    noise[:, -(T + 1) : -1] = noise_BTD * sigma
    noisy = (embeds + noise).requires_grad_(True)
    with torch.enable_grad():
        hidden = model.model(inputs_embeds=noisy, attention_mask=attn).last_hidden_state
        log_p = torch.log_softmax((F.linear(hidden[:, -(T + 1) : -1], head) * box[..., None]).sum(1) / counts, -1)
        has = box.any(-1)
        kl = ((p0 * (torch.log(p0 + eps) - log_p)).sum(-1) * has).sum()
        (grads,) = torch.autograd.grad(kl, noisy)
    scores = (grads[:, -(T + 1) : -1] * noisy[:, -(T + 1) : -1].detach()).sum(-1).abs()
    m = mask.double()
    bar = torch.log(1 + scores) * m
    hi = (bar - (1 - m) * 1e9).max(-1, keepdim=True)[0]
    lo = (bar + (1 - m) * 1e9).min(-1, keepdim=True)[0]
    hat = (bar - lo) / (hi - lo + eps)
    n = m.sum(-1, keepdim=True)
    ordered = hat.masked_fill(~mask.bool(), float("inf")).sort(-1)[0]
    idx = torch.minimum((n * q).long(), (n.long() - 1).clamp(min=0)).clamp(min=0)
    tau = ordered.gather(-1, idx)
    omega = torch.where(hat < tau, (hat / (tau + eps)).clamp(min=0.1), 1 + beta * (hat - tau) / (1 - tau + eps)) * m
    omega = omega * n / (omega.sum(-1, keepdim=True) + 1e-8)
    return torch.where(~box.any(-1, keepdim=True), torch.ones_like(omega), omega) * m


# ---- the tests -----------------------------------------------------------------------------------------------

def _compare(weights, reference, adv, mask):
    live = adv != 0
    torch.testing.assert_close(weights[live].double(), reference[live], rtol=0, atol=1e-5)
    torch.testing.assert_close((weights.double() * adv[:, None])[mask.bool()], (reference * adv[:, None])[mask.bool()],
                               rtol=0, atol=1e-5)


@pytest.mark.parametrize("symmetry", ["wrong", "correct", "both"])
@pytest.mark.parametrize("leaf", ["embeddings", "first", "middle", "last"])
def test_grail_reproduces_the_release_nll_over_the_whole_box(model64, tokenizer, leaf, symmetry):
    prompt_ids, prompt_mask, completion_ids, completion_mask, adv = _batch(tokenizer)
    ids, attn = torch.cat([prompt_ids, completion_ids], 1), torch.cat([prompt_mask, completion_mask], 1)
    ours = grail_weights(model64, tokenizer, prompt_ids, prompt_mask, completion_ids, completion_mask, adv,
                         saliency_leaf=leaf, rollout_symmetry=symmetry)
    reference = release_grail_weights(model64, tokenizer, ids, attn, completion_ids, completion_mask, adv, leaf=leaf,
                                      symmetry=symmetry)
    _compare(ours, reference, adv, completion_mask)
    # not vacuous: the comparison covers saliency-weighted tokens that vary, and the span choice matters
    varied = ours[(adv != 0) & (reference != 1).any(1)]
    assert varied.numel() and varied[varied > 0].std() > 0.05
    content_only = grail_weights(model64, tokenizer, prompt_ids, prompt_mask, completion_ids, completion_mask, adv,
                                 saliency_leaf=leaf, rollout_symmetry=symmetry, answer_nll_span="content")
    assert (content_only - ours).abs().max() > 1e-3


def test_oar_g_grail_release_variant_reproduces_the_release(model64, tokenizer):
    prompt_ids, prompt_mask, completion_ids, completion_mask, adv = _batch(tokenizer)
    ids, attn = torch.cat([prompt_ids, completion_ids], 1), torch.cat([prompt_mask, completion_mask], 1)
    B, T = completion_ids.shape
    D = model64.config.hidden_size
    seed = 7
    options = WeightingOptions(oar_variant="grail_release")
    torch.manual_seed(seed)  # the functional API draws OAR-G's noise from the global RNG
    ours = oar_g_weights(model64, tokenizer, prompt_ids, prompt_mask, completion_ids, completion_mask, adv, options)
    # grail draws one (R, T, D) float32 normal tensor for the R probed rows (A ≠ 0 and a box), in row order; the
    # release draws noise for every row: give the probed rows grail's draw (other rows' noise cannot matter).
    torch.manual_seed(seed)
    probed = (adv != 0) & torch.tensor([True, False, True, True, True, True])
    noise = torch.zeros(B, T, D, dtype=torch.float64)
    noise[probed] = torch.randn(int(probed.sum()), T, D, dtype=torch.float32).double()
    reference = release_oar_g_weights(model64, tokenizer, ids, attn, completion_ids, completion_mask, noise)
    _compare(ours, reference, adv, completion_mask)
    assert (reference[probed] - 1).abs().max() > 0.1  # real reshaping, not all ones
    assert torch.equal(ours[1], completion_mask[1].float())  # the row without a box: w = 1
    excerpt = oar_g_weights(model64, tokenizer, prompt_ids, prompt_mask, completion_ids, completion_mask, adv,
                            oar_scope="completion", oar_quantile=0.4, oar_beta=2.0)
    assert (excerpt - ours).abs().max() > 1e-2  # the variant switch changes the weights


def test_sorted_index_tau_by_hand():
    # Ī = log1p(I) = [0, 0.2, 0.5, 1.0] → Î = Ī (min 0, max 1). q = 0.4, n = 4:
    #   sorted_index: τ = Î[floor(1.6)] = Î[1] = 0.2;  interpolate: τ = 0.2 + 0.2·(0.5 − 0.2) = 0.26.
    # sorted_index, β = 2, floor 0.1: ω = [max(0/0.2, 0.1), 1 + 2·0/0.8, 1 + 2·0.3/0.8, 1 + 2·0.8/0.8]
    #                                   = [0.1, 1, 1.75, 3], sum 5.85 → × 4 / 5.85.
    importance = torch.expm1(torch.tensor([[0.0, 0.2, 0.5, 1.0]], dtype=torch.float64))
    mask = torch.ones(1, 4, dtype=torch.bool)
    w = bilevel.bilevel_weights(importance, mask, mask, quantile=0.4, beta=2.0, floor=0.1, tau_rule="sorted_index")
    expected = torch.tensor([[0.1, 1.0, 1.75, 3.0]]) * 4 / 5.85
    torch.testing.assert_close(w, expected.float(), rtol=0, atol=1e-6)
    # interpolate: τ = 0.26 → [0.1, max(0.2/0.26, 0.1), 1 + 2·0.24/0.74, 1 + 2·0.74/0.74]
    wi = bilevel.bilevel_weights(importance, mask, mask, quantile=0.4, beta=2.0, floor=0.1)
    raw = torch.tensor([[0.1, 0.2 / 0.26, 1 + 2 * 0.24 / 0.74, 3.0]])
    torch.testing.assert_close(wi, (raw * 4 / raw.sum()).float(), rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="tau_rule"):
        bilevel.bilevel_weights(importance, mask, mask, quantile=0.4, beta=2.0, floor=0.1, tau_rule="median")


def test_rounding_floor_makes_rows_uninformative_and_zeroes_rounding():
    mask = torch.ones(2, 4, dtype=torch.bool)
    importance = torch.tensor([[3e-9, 1e-9, 2e-9, 5e-10],  # all below the floor: uninformative
                               [3e-9, 0.5, 2e-9, 1.0]])  # rounding-level entries tie at 0
    out = bilevel.oar_weights_from_importance(importance, mask, mask, quantile=0.25, beta=1.0, floor=0.1,
                                           min_importance=1e-8)
    assert out.fallback_B.tolist() == [True, False]
    assert torch.equal(out.weights_BT[0], torch.ones(4))
    assert out.weights_BT[1, 0] == out.weights_BT[1, 2]  # 3e-9 and 2e-9 are both rounding: same weight
    without = bilevel.oar_weights_from_importance(importance, mask, mask, quantile=0.25, beta=1.0, floor=0.1)
    assert without.fallback_B.tolist() == [False, False]


def test_oar_variant_resolves_its_defaults_and_rejects_what_the_release_lacks():
    excerpt, release = WeightingOptions(), WeightingOptions(oar_variant="grail_release")
    assert (excerpt.oar_scope, excerpt.oar_quantile, excerpt.oar_beta) == ("reasoning", 0.25, 1.0)
    assert (release.oar_scope, release.oar_quantile, release.oar_beta) == ("completion", 0.4, 2.0)
    assert WeightingOptions(oar_variant="grail_release", oar_quantile=0.3).oar_quantile == 0.3  # explicit wins
    assert excerpt.oar_distribution == "answer_mean" and excerpt.answer_nll_span == "box"
    with pytest.raises(ValueError, match="no OAR-P"):
        checked(WeightingOptions(oar_variant="grail_release", token_weighting="oar_p"))
    with pytest.raises(ValueError, match="oar_distribution"):
        WeightingOptions(oar_variant="grail_release", oar_distribution="last_position")
    with pytest.raises(ValueError, match="oar_variant"):
        WeightingOptions(oar_variant="oar_paper")


def test_box_finding_differs_from_the_release_only_on_unbalanced_escaped_braces():
    from grail.tasks.boxed import first_boxed

    def ours(text):
        span = first_boxed(text)
        return None if span is None else text[span.content_start : span.content_end]

    def release(text):
        span = _release_box(text)
        return None if span is None else text[span[0] + len(MARKER) : span[1] - 1]

    for text in ["so \\boxed{\\frac{1}{2}} ok", "\\boxed{\\{1, 2\\}}", "\\boxed{3} and \\boxed{4}", "\\boxed{12"]:
        assert ours(text) == release(text)  # balanced braces, escaped or not: the same box
    # README deviation 8: the release counts escaped braces
    assert (release("\\boxed{a\\}} = b"), ours("\\boxed{a\\}} = b")) == ("a\\", "a\\}")
    assert (release("\\boxed{\\{x} y"), ours("\\boxed{\\{x} y")) == (None, "\\{x")
