"""The gradient family of credit candidates (perf/experiments/credit_candidates: attr_patch, contrastive, ig_patch)
on a tiny Qwen3 built in the test: each passes the public checker, keeps the probe invariants (shape, padding,
detached), and equals a reference computed another way: a central finite difference of the answer log-probability
through the model's own forward in float64. The contrastive fallback is counted. (The screen's choice,
grail_over_surprise, ships with grail-rl: tests/test_grail_over_surprise.py.)"""

import copy
from collections import Counter

import pytest
import torch
from credit_candidates import CANDIDATES, attr_patch, contrastive, ig_patch

import grail
from probe_batches import PAD, probe_model, text_rows


@pytest.fixture(scope="module")
def model(tokenizer):
    return probe_model(tokenizer, max_positions=96)


def _rms_norm_in_input_dtype(self, hidden_states):
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


@pytest.fixture
def model64(model, monkeypatch):
    """A float64 copy that is float64 throughout: transformers' Qwen3RMSNorm computes in float32 whatever the input
    (rounding of ~1e-7 relative, which a finite difference divides by its step), so the test computes it in the
    input's dtype, for the probe and the reference alike."""
    from transformers.models.qwen3 import modeling_qwen3

    monkeypatch.setattr(modeling_qwen3.Qwen3RMSNorm, "forward", _rms_norm_in_input_dtype)
    return copy.deepcopy(model).double().eval()


def _spans(tokenizer, ids, attn, T):
    from grail.methods.spans import answer_spans

    return answer_spans(tokenizer, ids[:, -T:], attn[:, -T:].bool())


def _answer_logp(model, ids, attn, T, target_BT, e_BLD):
    """Σ log π over target_BT per row, from the model's own forward on `inputs_embeds` (the reference path)."""
    logits = model(inputs_embeds=e_BLD, attention_mask=attn).logits[:, -T - 1:-1]
    logp = torch.log_softmax(logits.double(), -1).gather(-1, ids[:, -T:, None]).squeeze(-1)
    return (logp * target_BT).sum(1)  # (B,)


def _content_and_brace(spans, T):
    """(B, T) bool: the box's tokens from its first content token on (the content and the closing brace)."""
    return spans.box_BT & (torch.arange(T) >= spans.answer_BT.int().argmax(1, keepdim=True))


@pytest.mark.parametrize("name", list(CANDIDATES))
def test_every_candidate_passes_the_public_checker(name):
    report = grail.check_method(CANDIDATES[name], raise_on_failure=False)
    assert report.ok, report.text()


@pytest.mark.parametrize("question", ["Q: 7*5-8\nA:", "Q: 7*5-8, a prompt longer than every completion here\nA:"])
def test_signals_have_the_batch_shape_and_are_zero_on_padding_and_without_an_answer(model, tokenizer, question):
    ids, attn, T = text_rows(tokenizer, [question, "Q: 9+6-4\nA:", "Q: 9+6-4\nA:"],
                          [" 7*5=35, 35-8=27. so \\boxed{27}", " 9+6=15 \\boxed{15}", " 9+6=14. 14-4=10."])
    spans = _spans(tokenizer, ids, attn, T)
    mask_BT = attn[:, -T:].bool()
    adv_B = torch.tensor([1.0, 1.0, -1.0])
    signals = {
        "attr_patch": attr_patch.attr_patch_signal(model, ids, attn, spans.box_BT, temperature=1.0, pad_token_id=PAD),
        "contrastive": contrastive.contrastive_signal(model, tokenizer, ids, attn, adv_B, T, temperature=1.0,
                                                      pad_token_id=PAD, counts=Counter()),
        "ig_patch": ig_patch.ig_delta(model, ids, attn, spans.box_BT, temperature=1.0, pad_token_id=PAD, steps=2),
    }
    for name, signal in signals.items():
        assert signal.shape == mask_BT.shape and signal.dtype == torch.float32 and not signal.requires_grad, name
        assert (signal[~mask_BT] == 0).all(), name
        assert (signal[2] == 0).all(), f"{name}: the row without a box has nothing to explain"
        assert (signal[0][mask_BT[0]] > 0).any() and torch.isfinite(signal).all(), name
    assert not any(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("signal", ["drop", "magnitude"])
def test_attr_patch_is_the_first_order_change_of_the_answer_log_prob(model64, tokenizer, signal):
    """Δ_t = ∇_{e_t} log π(answer) · (e_pad − e_t) against (f(ε) − f(−ε)) / 2ε, f(ε) = log π(answer) with
    e_t → e_t + ε (e_pad − e_t), through the model's own forward in float64. Reading at the predicting position
    (GRAIL's) instead of the token's own, or differentiating the wrong target, fails this."""
    ids, attn, T = text_rows(tokenizer, ["Q: 7*5-8\nA:", "Q: 9+6-4\nA:"],
                          [" 7*5=35, 35-8=27. so \\boxed{27}", " 9+6=15 \\boxed{15}"])
    box_BT = _spans(tokenizer, ids, attn, T).box_BT
    got = attr_patch.attr_patch_signal(model64, ids, attn, box_BT, temperature=1.0, pad_token_id=PAD, signal=signal)
    embed = model64.get_input_embeddings()
    with torch.no_grad():
        e = embed(ids)
        e_pad = embed(torch.tensor([[PAD]]))[0, 0]
        eps, S = 1e-5, ids.shape[1] - T
        for b in range(2):
            for t in torch.nonzero(attn[b, S:]).flatten().tolist():
                f = []
                for sign in (1, -1):
                    moved = e.clone()
                    moved[b, S + t] += sign * eps * (e_pad - e[b, S + t])
                    f.append(_answer_logp(model64, ids, attn, T, box_BT, moved)[b])
                delta = (f[0] - f[1]) / (2 * eps)
                want = -delta if signal == "drop" else delta.abs()
                assert float(got[b, t]) == pytest.approx(float(want), rel=1e-4, abs=1e-7), (b, t)


def test_attr_patch_reads_the_tokens_own_embedding_not_the_predicting_one(model64, tokenizer):
    """The one-position shift: the last box token (the closing brace) is an input to nothing in the answer, so its
    own Δ is 0, while the token before it (which predicts it) has one."""
    ids, attn, T = text_rows(tokenizer, ["Q: 7*5-8\nA:"], [" 7*5=35 \\boxed{27}"])
    box_BT = _spans(tokenizer, ids, attn, T).box_BT
    got = attr_patch.attr_patch_signal(model64, ids, attn, box_BT, temperature=1.0, pad_token_id=PAD)
    last = int(box_BT[0].nonzero().max())
    assert float(got[0, last]) == 0 and float(got[0, last - 1]) > 0


def test_contrastive_gradient_adds_the_forced_copy_over_the_shared_prefix(model64, tokenizer):
    """Rows 0 and 1 share the prompt and the text before the box, so row 0's forced copy IS row 1:
    J_0 = log π(row 0's content and brace) − log π(row 1's content and brace | row 0's prefix). Finite differences of
    J_0 with each prefix token moved towards the pad in both sequences at once (they share it) match the signal."""
    ids, attn, T = text_rows(tokenizer, ["Q: 7*5-8\nA:"] * 2, [" 7*5=35 so \\boxed{27}", " 7*5=35 so \\boxed{28}"])
    spans = _spans(tokenizer, ids, attn, T)
    counts = Counter()
    got = contrastive.contrastive_signal(model64, tokenizer, ids, attn, torch.tensor([1.0, -1.0]), T,
                                         temperature=1.0, pad_token_id=PAD, counts=counts)
    assert counts == Counter(rows=2, contrasted=2, no_box=0, fallback=0)
    target_BT = _content_and_brace(spans, T)  # the marker tokens' log-probs cancel in J and are left out
    first = int(spans.answer_BT[0].nonzero().min())
    embed = model64.get_input_embeddings()
    S = ids.shape[1] - T
    with torch.no_grad():
        e = embed(ids)
        e_pad = embed(torch.tensor([[PAD]]))[0, 0]
        for t in range(first):
            f = []
            for sign in (1, -1):
                moved = e.clone()
                moved[:, S + t] += sign * 1e-5 * (e_pad - e[0, S + t])  # the shared prefix moves in both rows
                logp = _answer_logp(model64, ids, attn, T, target_BT, moved)
                f.append(logp[0] - logp[1])
            delta = (f[0] - f[1]) / 2e-5
            assert float(got[0, t]) == pytest.approx(abs(float(delta)), rel=1e-4, abs=1e-7), t


def test_contrastive_picks_the_farthest_advantage_and_counts_its_fallbacks(model, tokenizer):
    """Group A (rows 0-3): answers 27, 28, 26, 27. Row 0 (A > 0) contrasts with the lowest-A different answer
    (row 2), row 1 (A < 0) with the highest (row 0). Group B (rows 4-6): every box says 11 (rows 4, 5: fallback)
    and row 6 has no box."""
    prompts = ["Q: 7*5-8\nA:"] * 4 + ["Q: 9+6-4\nA:"] * 3
    completions = [" 35-8=27 \\boxed{27}", " 35-8=28 \\boxed{28}", " 35-8=26 \\boxed{26}", " 35-8=27 \\boxed{27}",
                   " 15-4=11 \\boxed{11}", " so \\boxed{11}", " 15-4=11"]
    ids, attn, T = text_rows(tokenizer, prompts, completions)
    adv = torch.tensor([0.5, -0.2, -0.8, 0.5, 0.3, -0.3, 0.0])
    _, competitor = contrastive.competitor_rows(tokenizer, ids, attn, adv, T)
    assert competitor == [2, 0, 0, 2, -2, -2, -1]
    counts = Counter()
    signal = contrastive.contrastive_signal(model, tokenizer, ids, attn, adv, T, temperature=1.0, pad_token_id=PAD,
                                            counts=counts)
    assert counts == Counter(rows=7, contrasted=4, fallback=2, no_box=1)
    # the fallback row's target is its own answer (attr_patch's on content and brace): a signal, not zeros
    spans = _spans(tokenizer, ids, attn, T)
    expected = attr_patch.attr_patch_signal(model, ids, attn, _content_and_brace(spans, T), temperature=1.0,
                                            pad_token_id=PAD)
    torch.testing.assert_close(signal[4:], expected[4:], rtol=1e-5, atol=1e-7)
    assert (signal[6] == 0).all()


def test_ig_patch_averages_each_tokens_directional_derivative_along_the_path(model64, tokenizer):
    """Δ_t (K = 2) against (1/K) Σ_k (f_t(α_k + h) − f_t(α_k − h)) / 2h, f_t(a) = log π(box) at the path point
    e(α_k) with token t's embedding moved a further (a − α_k)(e_pad − e_t): the path moves the reasoning only, and
    each token's share is read at its own embedding in the direction of its own substitution. (Completeness against
    J(padded) − J(clean) is not tested: on this random model J(α) jumps in the last 5% of the path, which a few
    midpoint steps cannot integrate; that is a property of the candidate, reported, not a defect of the code.)"""
    ids, attn, T = text_rows(tokenizer, ["Q: 7*5-8\nA:", "Q: 9+6-4\nA:"],
                          [" 7*5=35, 35-8=27. so \\boxed{27}", " 9+6=15 \\boxed{15}"])
    spans = _spans(tokenizer, ids, attn, T)
    K, h, S = 2, 1e-5, ids.shape[1] - T
    got = ig_patch.ig_delta(model64, ids, attn, spans.box_BT, temperature=1.0, pad_token_id=PAD, steps=K)
    path_BT = spans.reasoning_BT & attn[:, -T:].bool()
    with torch.no_grad():
        e = model64.get_input_embeddings()(ids)
        direction = model64.get_input_embeddings()(torch.tensor([[PAD]]))[0, 0] - e  # (B, L, D)
        path_BLD = direction * torch.cat([path_BT.new_zeros(2, S), path_BT], 1)[..., None]
        for b, t in [(0, 0), (0, 5), (1, 3), (0, int(path_BT[0].sum()) + 1)]:  # the last: a box token, off the path
            want = 0.0
            for k in range(K):
                point = e + (k + 0.5) / K * path_BLD
                f = []
                for sign in (1, -1):
                    moved = point.clone()
                    moved[b, S + t] += sign * h * direction[b, S + t]
                    f.append(_answer_logp(model64, ids, attn, T, spans.box_BT, moved)[b])
                want += float(f[0] - f[1]) / (2 * h) / K
            assert float(got[b, t]) == pytest.approx(want, rel=1e-4, abs=1e-7), (b, t)


def test_a_screening_variant_is_its_candidate_with_the_option_fixed(model, tokenizer):
    from grail.methods.spec import ProbeBatch
    from grail.options.choices import WeightingOptions

    ids, attn, T = text_rows(tokenizer, ["Q: 7*5-8\nA:"], [" 7*5=35, 35-8=27. so \\boxed{27}"])
    box_BT = _spans(tokenizer, ids, attn, T).box_BT
    got = CANDIDATES["attr_patch_drop"].probe(model, ProbeBatch(ids, attn, box_BT, box_BT), WeightingOptions(), None)
    want = attr_patch.attr_patch_signal(model, ids, attn, box_BT, temperature=1.0, pad_token_id=PAD, signal="drop")
    assert torch.equal(got, want) and (got < 0).any() and (got > 0).any()  # signed
    assert CANDIDATES["attr_patch_drop"].options == () and CANDIDATES["contrastive_saliency"].options == ()


def test_contrastive_counts_each_method_under_its_own_name(model, tokenizer):
    """The probe counts under `token_weighting`, so contrastive and its screening variant run side by side (one
    `saliency_auroc` call) keep separate counts."""
    from grail.methods.spec import ProbeBatch
    from grail.options.choices import WeightingOptions

    ids, attn, T = text_rows(tokenizer, ["Q: 7*5-8\nA:"] * 2, [" 7*5=35 so \\boxed{27}", " 7*5=35 so \\boxed{28}"])
    box_BT = _spans(tokenizer, ids, attn, T).box_BT
    rows = ProbeBatch(ids, attn, box_BT, box_BT, torch.tensor([1.0, -1.0]), None, tokenizer)
    contrastive.COUNTS.pop("contrastive_saliency", None)
    before = Counter(contrastive.COUNTS["contrastive"])
    options = WeightingOptions(token_weighting="contrastive_saliency")
    signal = CANDIDATES["contrastive_saliency"].probe(model, rows, options, None)
    want = contrastive.contrastive_signal(model, tokenizer, ids, attn, rows.adv_B, T, temperature=1.0,
                                          pad_token_id=PAD, read="saliency", counts=Counter())
    assert torch.equal(signal, want)
    assert contrastive.COUNTS["contrastive_saliency"] == Counter(rows=2, contrasted=2, no_box=0, fallback=0)
    assert contrastive.COUNTS["contrastive"] == before
