"""grail.methods.weighting: the functional API on a tiny model built here, row selection, skipping, options."""

import pytest
import torch

from grail.methods import probes, weighting
from grail.methods.table import METHODS, method_names
from grail.methods.weighting import method_function, probe_rows, run_probe, token_weights
from grail.models.tiny import build_tiny_model
from grail.options.choices import WeightingOptions


@pytest.fixture(scope="module")
def model(tokenizer):
    model = build_tiny_model(tokenizer, seed=0)
    with torch.no_grad():  # sharper distributions than a fresh init (whose entropies are all ≈ log V)
        model.get_input_embeddings().weight.mul_(3.0)
    return model.eval()


def _batch(tokenizer):
    prompts = ["Q: 1+2\nA:", "Q: 3*4\nA:", "Q: 5-1\nA:", "Q: 2+2\nA:", "Q: 9-3\nA:"]
    completions = [" 1+2=3. so \\boxed{3}", " 3*4=1", " 5-1=4. 4-1=3. \\boxed{3}", " 2+2=4 \\boxed{4}",
                   " 9-3=6. \\boxed{6}"]
    p = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    c = tokenizer(completions, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False)
    adv = torch.tensor([0.5, -0.5, -0.25, 0.0, -1.0])
    return p["input_ids"], p["attention_mask"], c["input_ids"], c["attention_mask"], adv


@pytest.mark.parametrize("method", method_names(probed=True))
def test_functional_api_returns_detached_weights_and_touches_no_grad(model, tokenizer, method):
    prompt_ids, prompt_mask, completion_ids, completion_mask, adv = _batch(tokenizer)
    weights = method_function(method)(model, tokenizer, prompt_ids, prompt_mask, completion_ids, completion_mask,
                                       adv, rollout_symmetry="both", oar_scope="completion")
    assert weights.shape == completion_ids.shape and weights.dtype == torch.float32
    assert not weights.requires_grad
    assert all(p.grad is None for p in model.parameters())
    spec = METHODS[method]
    real = completion_mask.bool()
    assert torch.all(weights[~real] == 0) and torch.isfinite(weights).all()
    adv_BT = weights * adv[:, None]
    if spec.preserves_sign:
        assert torch.all(weights[real] > 0)
        assert torch.equal(torch.sign(adv_BT[real]), torch.sign(adv[:, None].expand_as(adv_BT)[real]))
    # row 1 has no box: GRAIL's pipeline leaves it uniform; the other probes run on it
    probed = (adv != 0) & torch.tensor([True, spec.rows != "saliency", True, True, True])
    if spec.groups:  # every row is its own group here: no group has both outcomes, so nothing to reweight
        assert torch.all(weights[real] == 1)
    else:
        assert (weights[probed][real[probed]] != 1).any()  # the probed rows really were reweighted
    if spec.preserves_mass and spec.rows != "saliency":  # mass preserved (OAR: over every completion token here)
        torch.testing.assert_close(weights[probed].sum(1), real[probed].sum(1).float())


def test_rows_whose_weights_cannot_change_the_loss_are_not_probed(tokenizer):
    *_, completion_ids, completion_mask, adv = _batch(tokenizer)
    mask = completion_mask.bool()
    spans = weighting.batch_spans(tokenizer, completion_ids, mask, WeightingOptions())
    assert spans.has_box_B.tolist() == [True, False, True, True, True]
    rows = lambda **kw: probe_rows(adv, spans, mask, WeightingOptions(**kw)).tolist()  # noqa: E731
    # GRAIL, rollout_symmetry wrong (A ≤ 0): row 1 has no box, row 3 has A = 0
    assert rows(token_weighting="grail") == [False, False, True, False, True]
    assert rows(token_weighting="grail", rollout_symmetry="correct") == [True, False, False, False, False]
    # OAR's default answer_mean needs a box; last_position probes every row with A ≠ 0
    assert rows(token_weighting="oar_p") == [True, False, True, False, True]
    assert rows(token_weighting="oar_p", oar_distribution="last_position") == [True, True, True, False, True]
    assert rows(token_weighting="none") == [False] * 5


def test_probing_a_subset_of_rows_gives_those_rows_the_same_signal(model, tokenizer):
    """Rows are independent in a batched forward, so probing only the rows that matter changes nothing."""
    prompt_ids, prompt_mask, completion_ids, completion_mask, adv = _batch(tokenizer)
    ids, attn = torch.cat([prompt_ids, completion_ids], 1), torch.cat([prompt_mask, completion_mask], 1)
    mask = completion_mask.bool()
    for method in ("grail", "oar_p"):
        options = WeightingOptions(token_weighting=method, oar_scope="completion")
        spans = weighting.batch_spans(tokenizer, completion_ids, mask, options)
        every = spans.has_box_B.clone()
        subset = every & torch.tensor([False, False, True, False, True])
        full = run_probe(model, ids, attn, spans, mask, every, options)
        part = run_probe(model, ids, attn, spans, mask, subset, options)
        torch.testing.assert_close(part[subset], full[subset], rtol=1e-4, atol=1e-6)
        assert torch.all(part[~subset] == 0)


class _Forbidden(torch.nn.Module):
    def forward(self, *args, **kwargs):
        raise AssertionError("the probe ran although no row needed it")


def test_the_probe_is_skipped_when_no_row_needs_it_on_any_process(tokenizer):
    prompt_ids, prompt_mask, completion_ids, completion_mask, _ = _batch(tokenizer)
    ids, attn = torch.cat([prompt_ids, completion_ids], 1), torch.cat([prompt_mask, completion_mask], 1)
    zero_adv = torch.zeros(5)
    result = token_weights(_Forbidden(), tokenizer, ids, attn, completion_mask.bool(), zero_adv,
                           WeightingOptions(token_weighting="grail"))
    assert result.path == "skipped" and not result.probed_B.any()


def test_a_process_with_nothing_to_probe_still_runs_the_probe_when_another_needs_it(model, tokenizer,
                                                                                   monkeypatch):
    prompt_ids, prompt_mask, completion_ids, completion_mask, _ = _batch(tokenizer)
    ids, attn = torch.cat([prompt_ids, completion_ids], 1), torch.cat([prompt_mask, completion_mask], 1)
    calls = []
    real = probes.answer_nll_saliency
    monkeypatch.setattr(probes, "answer_nll_saliency", lambda *a, **k: calls.append(1) or real(*a, **k))
    result = token_weights(model, tokenizer, ids, attn, completion_mask.bool(), torch.zeros(5),
                           WeightingOptions(token_weighting="grail"), any_process=lambda local: True)
    assert calls == [1] and result.path == "separate"
    assert torch.equal(result.weights_BT[~result.has_box_B], completion_mask[~result.has_box_B].float())


@pytest.mark.parametrize("bad, named", [
    ({"weight_min": 2.0}, "weight_min"), ({"weight_std": -1.0}, "weight_std"), ({"oar_quantile": 0.0}, "oar_quantile"),
    ({"oar_floor": 1.5}, "oar_floor"), ({"perturbation_chunk_tokens": 0}, "perturbation_chunk_tokens"),
])
def test_bad_options_name_the_field(bad, named):
    with pytest.raises(ValueError, match=named):
        WeightingOptions(**bad)


def test_the_method_is_looked_up_once_per_batch(model, tokenizer, monkeypatch):
    """token_weights looks the method's table entry up once and hands it down (probe, pipeline); a caller that holds
    the entry (the trainer) passes it and no lookup happens at all. A spec of another method is refused."""
    prompt_ids, prompt_mask, completion_ids, completion_mask, adv = _batch(tokenizer)
    ids, attn = torch.cat([prompt_ids, completion_ids], 1), torch.cat([prompt_mask, completion_mask], 1)
    lookups = []
    real = weighting.method_spec
    monkeypatch.setattr(weighting, "method_spec", lambda name: lookups.append(name) or real(name))
    options = WeightingOptions(token_weighting="grail", rollout_symmetry="both")
    token_weights(model, tokenizer, ids, attn, completion_mask.bool(), adv, options)
    assert lookups == ["grail"]
    token_weights(model, tokenizer, ids, attn, completion_mask.bool(), adv, options, spec=real("grail"))
    assert lookups == ["grail"]
    with pytest.raises(ValueError, match="does not match"):
        token_weights(model, tokenizer, ids, attn, completion_mask.bool(), adv, options, spec=real("oar_g"))
