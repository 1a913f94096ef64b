"""The three literature plug-ins (grail.methods.literature) against slow literal references written from their
definitions (each module's docstring), on hand-made batches: KTAE, counterfactual span masking, EAPO-style
reallocation. Each reference is loops over rows and tokens, with no code shared with the implementation."""

import math

import pytest
import torch

from grail.methods.literature import eapo, ktae, span_mask
from grail.methods.table import METHODS
from grail.methods.weighting import weights_for
from grail.models.tiny import build_tiny_model
from grail.options.choices import WeightingOptions

# ---------------------------------------------------------------------------------------------------------------
# KTAE


def _fisher_literal(a, b, c, d):
    """Two-sided Fisher exact p: Σ P(table) over tables with the same margins and P ≤ P(observed)."""
    n_c, n_w, K = a + c, b + d, a + b
    N = n_c + n_w

    def prob(k):
        return math.comb(n_c, k) * math.comb(n_w, K - k) / math.comb(N, K)

    observed = prob(a)
    return min(1.0, sum(prob(k) for k in range(max(0, K - n_w), min(K, n_c) + 1) if prob(k) <= observed * (1 + 1e-7)))


def _h(p):
    return -sum(q * math.log2(q) for q in (p, 1 - p) if q > 0)


def _kt_literal(rows, correct, alpha=1.0, beta=1.0, tf=True, top=1.0):
    """{token id: kt} of one group of rollouts (lists of token ids), from the formulas of ktae's docstring."""
    n_c, n_w = sum(correct), len(correct) - sum(correct)
    N = n_c + n_w
    t_c = sum(len(r) for r, ok in zip(rows, correct, strict=True) if ok)
    t_w = sum(len(r) for r, ok in zip(rows, correct, strict=True) if not ok)
    out = {}
    for v in sorted({t for r in rows for t in r}):
        a = sum(1 for r, ok in zip(rows, correct, strict=True) if ok and v in r)
        b = sum(1 for r, ok in zip(rows, correct, strict=True) if not ok and v in r)
        c, d = n_c - a, n_w - b
        p = _fisher_literal(a, b, c, d)
        F = math.exp(-2 * p) if p < 1 - 1e-9 else 0.0  # p = 1 (up to the sum's rounding): no association
        h_present = _h(a / (a + b)) if a + b else 0
        h_absent = _h(c / (c + d)) if c + d else 0
        ig = _h(n_c / N) - ((a + b) / N * h_present + (c + d) / N * h_absent)
        x = math.asin(math.sqrt(a / (a + c + 1e-10))) - math.asin(math.sqrt(b / (b + d + 1e-10)))
        if tf:
            avg = (t_c + t_w) / 2
            kc, kw = 2.0 * (1 - 0.5 + 0.5 * t_c / avg), 2.0 * (1 - 0.5 + 0.5 * t_w / avg)
            fc = sum(r.count(v) for r, ok in zip(rows, correct, strict=True) if ok) / t_c
            fw = sum(r.count(v) for r, ok in zip(rows, correct, strict=True) if not ok) / t_w
            tfc, tfw = fc * 3.0 / (fc + kc), fw * 3.0 / (fw + kw)
            x += tfc / (tfw + 1e-5) - tfw / (tfc + 1e-5)
        s = (alpha * F + beta * ig) * x / (alpha + beta)
        out[v] = (1 / (1 + math.exp(-s)) - 0.5) * 2 * top if abs(s) < 700 else math.copysign(top, s)
    return out


@pytest.mark.parametrize("tf, top", [(True, 1.0), (False, 0.5)])
def test_ktae_key_token_scores_equal_the_literal_definition(tf, top):
    rows = [[5, 6, 7, 7, 9], [5, 6, 8], [5, 9, 9, 4], [6, 7, 3, 3], [5, 8, 2]]
    correct = [True, True, False, False, True]
    T = max(map(len, rows))
    ids = torch.tensor([r + [0] * (T - len(r)) for r in rows])
    mask = torch.tensor([[t < len(r) for t in range(T)] for r in rows])
    kt = ktae.key_token_scores(ids, mask, torch.tensor(correct), tf=tf, top=top)
    want = _kt_literal(rows, correct, tf=tf, top=top)
    for i, r in enumerate(rows):
        for t, v in enumerate(r):
            assert kt[i, t].item() == pytest.approx(want[v], abs=1e-9), (i, t, v)
    assert torch.all(kt[~mask] == 0)
    assert torch.all(ktae.key_token_scores(ids, mask, torch.ones(5, dtype=torch.bool)) == 0)  # one outcome: no kt


def test_ktae_gives_a_plus_kt_per_group_through_the_functional_api(tokenizer):
    """Two prompts × 3 rollouts: Â = A + kt with kt from each prompt's own group (special tokens excluded)."""
    model = build_tiny_model(tokenizer, seed=0)
    prompts = ["Q: 1+2\nA:"] * 3 + ["Q: 9-3\nA:"] * 3
    completions = [" 1+2=3 \\boxed{3}", " 1+2=4 \\boxed{4}", " 1+2=3 so \\boxed{3}",
                   " 9-3=6 \\boxed{6}", " 9-3=5 \\boxed{5}", " 9 minus 3 \\boxed{7}"]
    adv = torch.tensor([1 / 3, -2 / 3, 1 / 3, 2 / 3, -1 / 3, -1 / 3])
    p = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    c = tokenizer(completions, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False)
    w = weights_for("ktae", model, tokenizer, p["input_ids"], p["attention_mask"], c["input_ids"],
                    c["attention_mask"], adv)
    adv_hat = w * adv[:, None]
    for g in (slice(0, 3), slice(3, 6)):
        rows = [[int(t) for t, m in zip(ids, mask, strict=True) if m] for ids, mask in
                zip(c["input_ids"][g], c["attention_mask"][g], strict=True)]
        want = _kt_literal(rows, (adv[g] > 0).tolist())
        for i, r in enumerate(rows):
            for t, v in enumerate(r):
                expected = adv[g][i].item() + want[v]
                assert adv_hat[g][i, t].item() == pytest.approx(expected, abs=1e-5)
    assert METHODS["ktae"].groups and not METHODS["ktae"].preserves_mass


# ---------------------------------------------------------------------------------------------------------------
# Counterfactual span masking


def _answer_logprob_literal(model, ids, answer_positions):
    """Σ log p(token at p | tokens before p) over `answer_positions`, one full forward of one row."""
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids[None]).logits[0].double(), dim=-1)
    return sum(logp[p - 1, ids[p]].item() for p in answer_positions)


def test_span_masking_equals_the_literal_definition(tokenizer):
    model = build_tiny_model(tokenizer, seed=1).eval()
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    prompt, completion = "Q: 7*5-7\nA:", " First 7*5=35. Then we take away the seven. Now 35-7=28. \\boxed{28}"
    p = tokenizer([prompt], return_tensors="pt", add_special_tokens=False)
    c = tokenizer([completion], return_tensors="pt", add_special_tokens=False)
    ids = torch.cat([p["input_ids"], c["input_ids"]], 1)[0]
    S, n = p["input_ids"].shape[1], c["input_ids"].shape[1]
    w = weights_for("span_mask", model, tokenizer, p["input_ids"], p["attention_mask"], c["input_ids"],
                    c["attention_mask"], torch.tensor([-1.0]))[0]
    # literal: spans by hand (two arithmetic steps, then the sentence between them), masked one at a time
    text = tokenizer.decode(c["input_ids"][0])
    from grail.methods.spans import answer_spans, token_char_offsets

    _, offsets = token_char_offsets(tokenizer, c["input_ids"][0].tolist())
    spans_ = answer_spans(tokenizer, c["input_ids"], c["attention_mask"])
    n_reason = int(spans_.reasoning_BT[0].sum())
    box = spans_.box_BT[0].nonzero().squeeze(1).tolist()

    def tok_range(substring):
        a = text.index(substring)
        covered = [t for t in range(n) if offsets[t][0] < a + len(substring) and offsets[t][1] > a]
        return covered[0], covered[-1] + 1

    # the sentences holding a step overlap it and are dropped; the one between them is a span
    spans = sorted([tok_range("7*5=35"), tok_range("35-7=28"), tok_range("Then we take away the seven.")])
    assert spans == span_mask.reasoning_spans(text, offsets, spans_.reasoning_BT[0].tolist(), 10)
    clean = _answer_logprob_literal(model, ids, [S + t for t in box])
    imp = [0.2] * n_reason
    for s, e in spans:
        masked = ids.clone()
        masked[S + s:S + e] = tokenizer.pad_token_id
        drop = clean - _answer_logprob_literal(model, masked, [S + t for t in box])
        for t in range(s, e):
            imp[t] += drop / (e - s)
    lo, hi = min(imp), max(imp)
    imp = [0.5 + 0.5 * (v - lo) / (hi - lo) for v in imp]
    # the release's formatting tokens (a minus sign is one too)
    formatting = ("#", "##", "###", "####", "=", "==", "===", "====", "-", "--", "---")
    imp = [v * 0.1 if text[offsets[t][0]:offsets[t][1]].strip() in formatting else v for t, v in enumerate(imp)]
    want = [0.5 + 1.5 * v for v in imp] + [1.5 if t in box else 0.5 for t in range(n_reason, n)]
    mean = sum(want) / n
    want = torch.tensor([v / mean for v in want], dtype=torch.float32)
    torch.testing.assert_close(w, want, atol=2e-5, rtol=1e-4)
    assert w.mean().item() == pytest.approx(1.0, abs=1e-5) and torch.all(w > 0)


# ---------------------------------------------------------------------------------------------------------------
# EAPO-style reallocation


def test_eapo_weights_equal_the_literal_definition():
    entropy = torch.tensor([[0.1, 2.0, 0.5, 1.2, 0.0], [0.3, 0.3, 0.3, 0.0, 0.0], [1.0, 3.0, 0.2, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 0, 0]]).bool()
    rows = torch.tensor([True, True, False])
    w = eapo.eapo_weights(entropy, mask, rows, alpha=1.5, phi=0.6)
    for i in range(3):
        real = [entropy[i, t].item() for t in range(5) if mask[i, t]]
        if not rows[i]:
            want = [1.0] * len(real)
        else:
            mean = sum(real) / len(real)
            raw = [min(1.6, max(0.4, 1 + 1.5 * (h / mean - 1))) for h in real]
            want = [v / (sum(raw) / len(raw)) for v in raw]
        torch.testing.assert_close(w[i][mask[i]], torch.tensor(want), atol=1e-6, rtol=1e-6)
        assert torch.all(w[i][~mask[i]] == 0)


def test_eapo_through_the_functional_api_keeps_sign_and_mass(tokenizer):
    model = build_tiny_model(tokenizer, seed=0)
    p = tokenizer(["Q: 1+2\nA:"] * 2, return_tensors="pt", add_special_tokens=False)
    c = tokenizer([" 1+2=3 \\boxed{3}", " 1+2=5 \\boxed{5}"], return_tensors="pt", add_special_tokens=False)
    options = WeightingOptions(method_options={"eapo_alpha": 2.0})
    w = weights_for("eapo", model, tokenizer, p["input_ids"], p["attention_mask"], c["input_ids"],
                    c["attention_mask"], torch.tensor([0.5, -0.5]), options, eapo_phi=0.9)
    assert torch.all(w > 0)
    torch.testing.assert_close(w.mean(1), torch.ones(2))
    assert (w != 1).any()


# ---------------------------------------------------------------------------------------------------------------
# grail compare with the literature arms (the command, tiny model)


def test_compare_runs_the_literature_methods_against_grail_and_the_controls(tmp_path, warm_cache):
    import json

    from conftest import WARM_STEPS
    from grail.analysis.compare.summary import RESULT_FILE
    from grail.cli import main

    cache, _ = warm_cache
    arms = "none,grail,ktae,span_mask,eapo,random,top_entropy"
    out = tmp_path / "cmp"
    argv = ["compare", "--arms", arms, "--seeds", "1", "--max_steps", "2", "--per_device_train_batch_size", "16",
            "--task_num_train", "64", "--task_num_heldout", "8", "--learning_rate", "1e-3", "--warmstart_steps",
            str(WARM_STEPS), "--auroc-rows", "0", "--cache_dir", str(cache), "--output_dir", str(out)]
    assert main(argv) == 0
    report = (out / "report.md").read_text()
    for arm in arms.split(","):
        assert f"| {arm} |" in report
        result = json.loads((out / "runs" / arm / "seed0" / RESULT_FILE).read_text())
        assert result["steps"] == 2
    resolved = json.loads((out / "runs" / "ktae" / "seed0" / "resolved_config.json").read_text())
    assert resolved["weights_from"] == "rollout_policy" and resolved["method_options"]["ktae_top"] == 1.0
    resolved = json.loads((out / "runs" / "top_entropy" / "seed0" / "resolved_config.json").read_text())
    assert resolved["top_entropy_quantile"] == 0.2
