"""grail_over_surprise (grail.methods.signals): GRAIL's saliency over the token's surprise. Its probe's saliency is
GRAIL's and its surprise is −log π from the full logits at the sampling temperature; the signal is their quotient; a
the division moves GRAIL's weights; it passes the public checker (whose `fused`
check reads the signal from a training-style forward). The trainer's fused path against the separate one is in
tests/test_trainer.py (test_fused_equals_separate)."""

import pytest
import torch

import grail
from grail.methods import probes
from grail.methods.signals.grail_over_surprise import SPEC
from grail.methods.spans import answer_spans
from grail.methods.table import METHODS
from probe_batches import WORKED, probe_model, text_rows


@pytest.fixture(scope="module")
def model(tokenizer):
    return probe_model(tokenizer, max_positions=96)


def _batch(tokenizer):
    """The worked answers in TRL's layout: ids_BL, attn_BL, T, box_BT."""
    ids, attn, T = text_rows(tokenizer, *WORKED)
    return ids, attn, T, answer_spans(tokenizer, ids[:, -T:], attn[:, -T:].bool()).box_BT


def test_it_is_a_registered_method_that_fuses():
    assert METHODS["grail_over_surprise"] is SPEC and SPEC.fuse == "saliency" and SPEC.per_surprise is not None


@pytest.mark.parametrize("leaf", ["embeddings", "middle"])
def test_saliency_is_grails_and_surprise_is_the_full_logits(model, tokenizer, leaf):
    ids, attn, T, box_BT = _batch(tokenizer)
    saliency, surprise = probes.answer_nll_saliency(model, ids, attn, box_BT, temperature=0.7, leaf=leaf,
                                                    with_surprise=True)
    torch.testing.assert_close(saliency, probes.answer_nll_saliency(model, ids, attn, box_BT, temperature=0.7,
                                                                    leaf=leaf), rtol=1e-5, atol=1e-7)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn).logits[:, -T - 1:-1] / 0.7
    want = -torch.log_softmax(logits, -1).gather(-1, ids[:, -T:, None]).squeeze(-1) * attn[:, -T:]
    torch.testing.assert_close(surprise, want.float(), rtol=1e-4, atol=1e-5)
    assert (surprise[attn[:, -T:].bool()] > 0).all()


def test_the_probe_is_the_quotient_and_moves_grails_weights(model, tokenizer):
    from grail.methods.weighting import batch_spans, probe_rows, run_probe
    from grail.options.choices import WeightingOptions

    ids, attn, T, box_BT = _batch(tokenizer)
    mask_BT, adv_B = attn[:, -T:], torch.tensor([1.0, -1.0])
    options = WeightingOptions(token_weighting="grail_over_surprise", rollout_symmetry="both", temperature=0.7,
                               method_options={"grail_over_surprise_offset": 0.25})
    spans = batch_spans(tokenizer, ids[:, -T:], mask_BT, options)
    rows_B = probe_rows(adv_B, spans, mask_BT, options, spec=SPEC)
    assert rows_B.all()
    signal = run_probe(model, ids, attn, spans, mask_BT, rows_B, options, torch.Generator().manual_seed(0), SPEC,
                       adv_B=adv_B, tokenizer=tokenizer)
    saliency, surprise = probes.answer_nll_saliency(model, ids, attn, spans.probe_span(options.answer_nll_span),
                                                    temperature=0.7, with_surprise=True)
    real = mask_BT.bool()
    torch.testing.assert_close(signal[real], (saliency / (surprise + 0.25))[real])
    assert signal[~real].eq(0).all()
    args = (ids[:, :-T], attn[:, :-T], ids[:, -T:], mask_BT, adv_B)
    kw = {"rollout_symmetry": "both", "temperature": 0.7}
    grail_w = grail.weights_for("grail", model, tokenizer, *args, **kw)
    ours = grail.weights_for("grail_over_surprise", model, tokenizer, *args, **kw)
    assert (ours - grail_w).abs().max() > 0.05  # dividing by the surprise moves the credit


def test_passes_the_public_checker():
    report = grail.check_method("grail_over_surprise", raise_on_failure=False)
    assert report.ok, report.text()
    assert any(r.name == "fused" and r.passed for r in report.results)
