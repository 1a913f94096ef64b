"""grail.methods.probes on a tiny Qwen3 built in the test: each probe against a reference computed another way (full
logits, `output_hidden_states`, a slicing shift written here, one forward per perturbed copy), plus the invariants every
probe keeps (no parameter .grad, requires_grad unchanged, detached float32, 0 on padding, left padding changes
nothing)."""

import pytest
import torch

from grail.methods import oar_probes, probes
from grail.methods.core import kl_divergence
from grail.models.tiny import build_tiny_model
from probe_batches import (
    PAD,
    P,
    T,
    completion_mask,
    float64_copy,
    influencing_tokens,
    probe_batch,
    probe_model,
    reference_answer_logits,
    reference_logits,
    scored_batch,
)


@pytest.fixture(scope="module")
def model(tokenizer):
    return probe_model(tokenizer)


@pytest.fixture(scope="module")
def model64(model):
    return float64_copy(model)


# ----------------------------------------------------------------------------------------------------------------
# Plumbing


def test_leaf_module_matches_output_hidden_states(model):
    ids, attn, _ = probe_batch()
    outputs = {}
    names = probes.LEAVES
    hooks = [probes.leaf_module(model, leaf).register_forward_hook(
        lambda _m, _a, out, leaf=leaf: outputs.__setitem__(leaf, probes.leaf_output_tensor(out))) for leaf in names]
    with torch.no_grad():
        hidden = model(input_ids=ids, attention_mask=attn, output_hidden_states=True).hidden_states
    for hook in hooks:
        hook.remove()
    layers = model.config.num_hidden_layers  # 4: k = 1, 2, 3
    for leaf, k in zip(names, (0, 1, layers // 2, layers - 1), strict=True):
        assert torch.equal(outputs[leaf], hidden[k]), leaf
    assert probes.leaf_module(model, "middle") is model.model.layers[1]


def test_leaf_module_rejects_unknown_leaf_and_too_shallow_models(model, tokenizer):
    with pytest.raises(ValueError, match="leaf must be one of"):
        probes.leaf_module(model, "top")
    shallow = build_tiny_model(tokenizer, num_layers=1, hidden_size=16, intermediate_size=16)
    with pytest.raises(ValueError, match="leaf='embeddings'"):
        probes.leaf_module(shallow, "last")


def test_leaf_output_tensor_takes_the_first_item_of_a_tuple():
    x = torch.ones(2)
    assert probes.leaf_output_tensor(x) is x and probes.leaf_output_tensor((x, None)) is x


# ----------------------------------------------------------------------------------------------------------------
# Invariants shared by every probe


def _all_probes(model, ids, attn, answer, scored):
    yield probes.answer_nll_saliency(model, ids, attn, answer, temperature=0.7)
    yield probes.answer_nll_saliency(model, ids, attn, answer, temperature=0.7, leaf="last")
    yield probes.token_entropies(model, ids, attn, T, temperature=0.7)
    for distribution in oar_probes.DISTRIBUTIONS:
        yield oar_probes.oar_g_importance(model, ids, attn, scored, answer, distribution=distribution, noise_std=1e-2,
                                      temperature=0.7, generator=torch.Generator().manual_seed(1))
        yield oar_probes.oar_p_importance(model, ids, attn, scored, answer, distribution=distribution, pad_token_id=PAD,
                                      temperature=0.7, chunk_tokens=64)


@pytest.mark.parametrize("grad_mode", [True, False])
def test_probes_touch_no_parameter_state_and_return_detached_float32(model, grad_mode):
    ids, attn, answer = probe_batch()
    frozen = next(model.parameters())
    frozen.requires_grad_(False)  # a mix of frozen and trainable parameters, as under PEFT
    try:
        before = {name: p.requires_grad for name, p in model.named_parameters()}
        with torch.set_grad_enabled(grad_mode):
            results = list(_all_probes(model, ids, attn, answer, completion_mask(attn)))
        assert all(p.grad is None for p in model.parameters())
        assert {name: p.requires_grad for name, p in model.named_parameters()} == before
        assert not model.training
        for result in results:
            assert result.shape == (3, T) and result.dtype == torch.float32 and not result.requires_grad
            assert torch.isfinite(result).all() and (result >= 0).all()
            assert (result[~completion_mask(attn)] == 0).all()  # 0 on padding
    finally:
        frozen.requires_grad_(True)


def test_probes_in_training_mode_leave_it_on(model):
    ids, attn, answer = probe_batch()
    model.train()
    try:
        results = list(_all_probes(model, ids, attn, answer, completion_mask(attn)))
        assert model.training and all(p.grad is None for p in model.parameters())
    finally:
        model.eval()
    for result, expected in zip(results, _all_probes(model, ids, attn, answer, completion_mask(attn)), strict=True):
        torch.testing.assert_close(result, expected)  # no dropout in the tiny model: same values


def test_probes_under_gradient_checkpointing_in_training_mode(tokenizer, monkeypatch):
    """Checkpointed layers in training mode drop the KV cache: OAR-P falls back to the plain batched path, and every
    probe gives the values it gives in eval mode without checkpointing."""
    model = build_tiny_model(tokenizer, seed=1, hidden_size=32, intermediate_size=64, max_positions=64).eval()
    ids, attn, answer = probe_batch()
    expected = list(_all_probes(model, ids, attn, answer, completion_mask(attn)))
    batched_calls = []
    plain = oar_probes._oar_p_batched
    monkeypatch.setattr(oar_probes, "_oar_p_batched", lambda *a, **k: batched_calls.append(1) or plain(*a, **k))
    model.activation_checkpointing_enable()  # use_reentrant=False (TRL's default; reentrant forbids autograd.grad)
    model.train()
    got = list(_all_probes(model, ids, attn, answer, completion_mask(attn)))
    assert batched_calls == [1, 1] and model.training and all(p.grad is None for p in model.parameters())
    for one, other in zip(got, expected, strict=True):
        torch.testing.assert_close(one, other, atol=1e-4 * other.max().item(), rtol=1e-4)  # float32 KL rounding


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_left_padding_changes_no_probe_value(model, model64, dtype):
    ids, attn, answer = (x[[1, 0, 2]] for x in probe_batch())  # row 1 first: OAR-G then draws it the same noise
    scored = completion_mask(attn)
    # Row 1 alone, prompt stripped of its 2 pads (P' = 4) vs row 1 in the batch next to longer prompts.
    lm = model if dtype == torch.float32 else model64
    alone = list(_all_probes(lm, ids[:1, 2:], attn[:1, 2:], answer[:1], scored[:1]))
    batched = list(_all_probes(lm, ids, attn, answer, scored))
    # float32: the layouts round differently, and OAR-G divides rounding by its small noise (J's gradient is O(σ))
    tol = 1e-3 if dtype == torch.float32 else 1e-5
    for one, many in zip(alone, batched, strict=True):
        assert many[0].max() > 0
        torch.testing.assert_close(one[0], many[0], atol=min(1e-5, tol * many[0].max().item()), rtol=tol)


def test_nothing_to_explain_returns_zeros_without_running_the_model(model):
    ids, attn, answer = probe_batch()
    calls = []
    handle = model.model.register_forward_hook(lambda *_: calls.append(1))
    none = torch.zeros_like(answer)
    try:
        results = [probes.answer_nll_saliency(model, ids, attn, none, temperature=1.0),
                   oar_probes.oar_g_importance(model, ids, attn, none, answer, distribution="last_position",
                                           noise_std=1e-3, temperature=1.0),
                   oar_probes.oar_p_importance(model, ids, attn, none, answer, distribution="last_position",
                                           pad_token_id=PAD, temperature=1.0, chunk_tokens=64)]
    finally:
        handle.remove()
    assert calls == [] and all(torch.equal(r, torch.zeros(3, T)) for r in results)


# ----------------------------------------------------------------------------------------------------------------
# GRAIL saliency


def _reference_saliency(model, ids, attn, answer, temperature, k):
    """Full logits of a normal forward with output_hidden_states, the shift written as slicing, grad w.r.t.
    hidden_states[k] (the gradient at a layer output does not depend on what is upstream of it)."""
    with torch.enable_grad():
        if k == 0:
            embeds = model.get_input_embeddings()(ids).detach().requires_grad_()
            out = model(inputs_embeds=embeds, attention_mask=attn)
            h = embeds
        else:
            out = model(input_ids=ids, attention_mask=attn, output_hidden_states=True)
            h = out.hidden_states[k]
        logp = torch.log_softmax(out.logits[:, :-1] / temperature, dim=-1)  # position j predicts token j + 1
        token_logp = logp.gather(2, ids[:, 1:, None]).squeeze(2)  # (B, L − 1)
        nll = -(token_logp[:, P - 1 :] * answer).sum()  # completion token t is ids[:, P + t], predicted at P + t − 1
        (grad,) = torch.autograd.grad(nll, [h])
    saliency = (grad * h).norm(dim=-1)[:, P - 1 : -1]
    return (saliency * completion_mask(attn)).detach()


@pytest.mark.parametrize(("leaf", "k"), [("embeddings", 0), ("middle", 2), ("last", 3)])
def test_saliency_matches_a_full_logits_reference(model, leaf, k):
    ids, attn, answer = probe_batch()
    got = probes.answer_nll_saliency(model, ids, attn, answer, temperature=0.7, leaf=leaf)
    # The reference's lm_head weights (tied to the embeddings) are not detached: that changes no gradient w.r.t. h.
    torch.testing.assert_close(got, _reference_saliency(model, ids, attn, answer, 0.7, k), rtol=1e-4, atol=1e-6)
    assert (got[0, :7] > 0).all() and (got[1, :5] > 0).all()
    assert (got[2] == 0).all()  # no answer token in row 2: exactly 0 (rows are independent)


def test_saliency_alignment_one_answer_token(model):
    ids, attn, _ = probe_batch()
    answer = torch.zeros(3, T, dtype=torch.bool)
    answer[0, 4] = True  # predicted at input position P + 3
    got = probes.answer_nll_saliency(model, ids, attn, answer, temperature=1.0)
    assert got[0, 4] > 0  # the position that predicts the answer token
    assert (got[0, 5:] == 0).all()  # positions after it cannot influence its log-probability (causality)
    assert (got[0, :4] > 0).all() and (got[1:] == 0).all()


# ----------------------------------------------------------------------------------------------------------------
# Entropy


def test_token_entropies_match_full_logits(model):
    ids, attn, _ = probe_batch()
    with torch.no_grad():
        logp = torch.log_softmax(reference_logits(model, ids, attn)[:, P - 1 : -1] / 0.7, dim=-1)
    expected = -(logp.exp() * logp).sum(-1) * completion_mask(attn)
    for chunk in (1, 7, 1024):
        got = probes.token_entropies(model, ids, attn, T, temperature=0.7, chunk_positions=chunk)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------------------------------------------
# OAR


def _reference_oar_g(model, ids, attn, scored, answer, distribution, noise_std, temperature, seed):
    embeds = model.get_input_embeddings()(ids).detach().requires_grad_()
    noise = torch.randn(ids.shape[0], T, embeds.shape[-1], generator=torch.Generator().manual_seed(seed))
    noisy = embeds + torch.cat([torch.zeros(ids.shape[0], P, embeds.shape[-1]), noise * noise_std * scored[..., None]],
                               dim=1)
    with torch.no_grad():
        clean = model(input_ids=ids, attention_mask=attn).logits
    with torch.enable_grad():
        logits = model(inputs_embeds=noisy, attention_mask=attn).logits
        total = 0
        for i in range(ids.shape[0]):
            if scored[i].any() and (distribution == "last_position" or answer[i].any()):
                p0 = reference_answer_logits(clean[i], attn[i], answer[i], distribution, temperature)
                pn = reference_answer_logits(logits[i], attn[i], answer[i], distribution, temperature)
                total = total + kl_divergence(p0, pn)
        (grad,) = torch.autograd.grad(total, [embeds])
    return ((grad * embeds).sum(-1).abs()[:, P:] * scored).detach()


@pytest.mark.parametrize("distribution", ["last_position", "answer_mean"])
def test_oar_g_matches_reference_with_the_same_noise(model64, distribution):
    ids, attn, answer, scored = scored_batch()
    got = oar_probes.oar_g_importance(model64, ids, attn, scored, answer, distribution=distribution, noise_std=1e-2,
                                  temperature=0.7, generator=torch.Generator().manual_seed(3))
    expected = _reference_oar_g(model64, ids, attn, scored, answer, distribution, 1e-2, 0.7, seed=3).float()
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5 * expected.max().item())
    influencing = influencing_tokens(scored, answer, distribution)
    assert (got[influencing] > 0).all() and (got[scored & ~influencing] == 0).all()
    assert got[0, 2] == 0 and (got[2] == 0).all() and (got[~completion_mask(attn)] == 0).all()


def test_oar_g_without_noise_is_near_zero(model):
    ids, attn, answer, scored = scored_batch()
    kwargs = dict(distribution="last_position", temperature=1.0, generator=torch.Generator().manual_seed(0))
    noisy = oar_probes.oar_g_importance(model, ids, attn, scored, answer, noise_std=1e-2, **kwargs)
    clean = oar_probes.oar_g_importance(model, ids, attn, scored, answer, noise_std=0.0, **kwargs)
    assert clean.max() < 1e-3 * noisy.max()  # the KL at its minimum has zero gradient


def test_oar_p_answer_mean_row_without_answer_is_zero(model64):
    ids, attn, answer, _ = scored_batch()
    scored = completion_mask(attn)  # row 2 scored, but it has no answer tokens
    got = oar_probes.oar_p_importance(model64, ids, attn, scored, answer, distribution="answer_mean", pad_token_id=PAD,
                                  temperature=1.0, chunk_tokens=64)
    influencing = influencing_tokens(scored, answer, "answer_mean")
    assert (got[2] == 0).all() and (got[influencing] > 0).all() and (got[~influencing] == 0).all()
