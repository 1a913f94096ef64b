"""grail.methods.probes on a tiny Qwen3 built in the test: each probe against a reference computed another way (full
logits, `output_hidden_states`, a slicing shift written here, one forward per perturbed copy), plus the invariants every
probe keeps (no parameter .grad, requires_grad unchanged, detached float32, 0 on padding, left padding changes
nothing)."""

import pytest
import torch

from grail.methods import oar_probes, probes
from grail.methods.core import kl_divergence
from grail.models.tiny import build_tiny_model

PAD = 0  # the tiny tokenizer's pad (= eos) id
P, T = 6, 10  # prompt and completion widths of the test batch


@pytest.fixture(scope="module")
def model(tokenizer):
    model = build_tiny_model(tokenizer, seed=0, hidden_size=64, intermediate_size=128, max_positions=64)
    # Random init gives near-uniform distributions; sharper weights make KLs and saliencies less tiny.
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(8.0)
    return model.eval()


@pytest.fixture(scope="module")
def model64(model):
    """A float64 copy: references then agree to rounding far below the 1e-5 tolerances used below."""
    import copy

    return copy.deepcopy(model).double().eval()


WINDOW = 6  # the tiny Gemma 3's sliding window: shorter than every row of the test batches


def tiny_gemma3(tokenizer, softcap: float | None = None, attention: str = "sdpa"):
    """A float64 Gemma 3 (scaled embeddings, QK norm, sliding and full layers, optional logit soft-capping) small
    enough for a unit test: sliding layers before and after a full one, so a copy's states beyond the window reach it
    through the full layer."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
                              sliding_window=WINDOW, final_logit_softcapping=softcap, pad_token_id=PAD,
                              bos_token_id=None, eos_token_id=tokenizer.eos_token_id, attn_implementation=attention,
                              layer_types=["sliding_attention", "full_attention", "sliding_attention",
                                           "sliding_attention"])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Gemma3ForCausalLM(config)
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(4.0)  # sharper distributions, as for the Qwen3 above
    return model.double().eval()


@pytest.fixture(scope="module")
def models64(tokenizer, model64):
    """name → a float64 model: the tiny Qwen3, the tiny Gemma 3 as the real 270M has it (no soft-cap), and with a
    soft-cap low enough to bind on its logits (its P_final is pooled per position)."""
    return {"qwen3": model64, "gemma3": tiny_gemma3(tokenizer), "gemma3_softcap": tiny_gemma3(tokenizer, softcap=1.0)}


def _batch():
    """Three rows in TRL's layout (P = 6 left-padded prompt, T = 10 right-padded completion):
    row 0 full; row 1 prompt left-padded by 2, completion of 7; row 2 prompt left-padded by 1, completion of 5.
    Answers: row 0 tokens 6..7, row 1 token 4, row 2 none."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 300, (3, P + T), generator=g)
    attn = torch.ones(3, P + T, dtype=torch.long)
    attn[1, :2], attn[1, P + 7 :] = 0, 0
    attn[2, :1], attn[2, P + 5 :] = 0, 0
    ids[attn == 0] = PAD
    answer = torch.zeros(3, T, dtype=torch.bool)
    answer[0, 6:8], answer[1, 4] = True, True
    return ids, attn, answer


def _completion_mask(attn):
    return attn[:, P:].bool()


def _reference_logits(model, ids, attn, **kwargs):
    return model(input_ids=ids, attention_mask=attn, **kwargs).logits


# ----------------------------------------------------------------------------------------------------------------
# Plumbing


def test_leaf_module_matches_output_hidden_states(model):
    ids, attn, _ = _batch()
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
    ids, attn, answer = _batch()
    frozen = next(model.parameters())
    frozen.requires_grad_(False)  # a mix of frozen and trainable parameters, as under PEFT
    try:
        before = {name: p.requires_grad for name, p in model.named_parameters()}
        with torch.set_grad_enabled(grad_mode):
            results = list(_all_probes(model, ids, attn, answer, _completion_mask(attn)))
        assert all(p.grad is None for p in model.parameters())
        assert {name: p.requires_grad for name, p in model.named_parameters()} == before
        assert not model.training
        for result in results:
            assert result.shape == (3, T) and result.dtype == torch.float32 and not result.requires_grad
            assert torch.isfinite(result).all() and (result >= 0).all()
            assert (result[~_completion_mask(attn)] == 0).all()  # 0 on padding
    finally:
        frozen.requires_grad_(True)


def test_probes_in_training_mode_leave_it_on(model):
    ids, attn, answer = _batch()
    model.train()
    try:
        results = list(_all_probes(model, ids, attn, answer, _completion_mask(attn)))
        assert model.training and all(p.grad is None for p in model.parameters())
    finally:
        model.eval()
    for result, expected in zip(results, _all_probes(model, ids, attn, answer, _completion_mask(attn)), strict=True):
        torch.testing.assert_close(result, expected)  # no dropout in the tiny model: same values


def test_probes_under_gradient_checkpointing_in_training_mode(tokenizer, monkeypatch):
    """Checkpointed layers in training mode drop the KV cache: OAR-P falls back to the plain batched path, and every
    probe gives the values it gives in eval mode without checkpointing."""
    model = build_tiny_model(tokenizer, seed=1, hidden_size=32, intermediate_size=64, max_positions=64).eval()
    ids, attn, answer = _batch()
    expected = list(_all_probes(model, ids, attn, answer, _completion_mask(attn)))
    batched_calls = []
    plain = oar_probes._oar_p_batched
    monkeypatch.setattr(oar_probes, "_oar_p_batched", lambda *a, **k: batched_calls.append(1) or plain(*a, **k))
    model.activation_checkpointing_enable()  # use_reentrant=False (TRL's default; reentrant forbids autograd.grad)
    model.train()
    got = list(_all_probes(model, ids, attn, answer, _completion_mask(attn)))
    assert batched_calls == [1, 1] and model.training and all(p.grad is None for p in model.parameters())
    for one, other in zip(got, expected, strict=True):
        torch.testing.assert_close(one, other, atol=1e-4 * other.max().item(), rtol=1e-4)  # float32 KL rounding


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_left_padding_changes_no_probe_value(model, model64, dtype):
    ids, attn, answer = (x[[1, 0, 2]] for x in _batch())  # row 1 first: OAR-G then draws it the same noise
    scored = _completion_mask(attn)
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
    ids, attn, answer = _batch()
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
    return (saliency * _completion_mask(attn)).detach()


@pytest.mark.parametrize(("leaf", "k"), [("embeddings", 0), ("middle", 2), ("last", 3)])
def test_saliency_matches_a_full_logits_reference(model, leaf, k):
    ids, attn, answer = _batch()
    got = probes.answer_nll_saliency(model, ids, attn, answer, temperature=0.7, leaf=leaf)
    # The reference's lm_head weights (tied to the embeddings) are not detached: that changes no gradient w.r.t. h.
    torch.testing.assert_close(got, _reference_saliency(model, ids, attn, answer, 0.7, k), rtol=1e-4, atol=1e-6)
    assert (got[0, :7] > 0).all() and (got[1, :5] > 0).all()
    assert (got[2] == 0).all()  # no answer token in row 2: exactly 0 (rows are independent)


def test_saliency_alignment_one_answer_token(model):
    ids, attn, _ = _batch()
    answer = torch.zeros(3, T, dtype=torch.bool)
    answer[0, 4] = True  # predicted at input position P + 3
    got = probes.answer_nll_saliency(model, ids, attn, answer, temperature=1.0)
    assert got[0, 4] > 0  # the position that predicts the answer token
    assert (got[0, 5:] == 0).all()  # positions after it cannot influence its log-probability (causality)
    assert (got[0, :4] > 0).all() and (got[1:] == 0).all()


# ----------------------------------------------------------------------------------------------------------------
# Entropy


def test_token_entropies_match_full_logits(model):
    ids, attn, _ = _batch()
    with torch.no_grad():
        logp = torch.log_softmax(_reference_logits(model, ids, attn)[:, P - 1 : -1] / 0.7, dim=-1)
    expected = -(logp.exp() * logp).sum(-1) * _completion_mask(attn)
    for chunk in (1, 7, 1024):
        got = probes.token_entropies(model, ids, attn, T, temperature=0.7, chunk_positions=chunk)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------------------------------------------
# OAR


def _reference_answer_logits(logits_LV, attn_L, answer_T, distribution, temperature):
    """P_final's logits from full logits of one row: last real position, or the mean over the predicting positions
    of the answer tokens (completion token t at P + t, predicted at P + t − 1)."""
    if distribution == "last_position":
        chosen = logits_LV[attn_L.nonzero().max()]
    else:
        chosen = logits_LV[P - 1 : -1][answer_T].mean(0)
    return chosen.float() / temperature


def _scored():
    ids, attn, answer = _batch()
    scored = _completion_mask(attn).clone()
    scored[0, 2] = False  # one unscored real token
    scored[2] = False  # a row with nothing scored
    return ids, attn, answer, scored


def _influencing(scored, answer, distribution):
    """Scored tokens that can change P_final: all of them for the last position; for the answer mean, those at or
    before the last position predicting an answer token (completion t' at P + t', predicted at P + t' − 1)."""
    if distribution == "last_position":
        return scored.clone()
    last = torch.where(answer.any(1), T - 1 - answer.flip(1).int().argmax(1), -1)  # last answer token t'
    return scored & (torch.arange(T)[None] <= (last - 1)[:, None])


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
                p0 = _reference_answer_logits(clean[i], attn[i], answer[i], distribution, temperature)
                pn = _reference_answer_logits(logits[i], attn[i], answer[i], distribution, temperature)
                total = total + kl_divergence(p0, pn)
        (grad,) = torch.autograd.grad(total, [embeds])
    return ((grad * embeds).sum(-1).abs()[:, P:] * scored).detach()


@pytest.mark.parametrize("distribution", ["last_position", "answer_mean"])
def test_oar_g_matches_reference_with_the_same_noise(model64, distribution):
    ids, attn, answer, scored = _scored()
    got = oar_probes.oar_g_importance(model64, ids, attn, scored, answer, distribution=distribution, noise_std=1e-2,
                                  temperature=0.7, generator=torch.Generator().manual_seed(3))
    expected = _reference_oar_g(model64, ids, attn, scored, answer, distribution, 1e-2, 0.7, seed=3).float()
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5 * expected.max().item())
    influencing = _influencing(scored, answer, distribution)
    assert (got[influencing] > 0).all() and (got[scored & ~influencing] == 0).all()
    assert got[0, 2] == 0 and (got[2] == 0).all() and (got[~_completion_mask(attn)] == 0).all()


def test_oar_g_without_noise_is_near_zero(model):
    ids, attn, answer, scored = _scored()
    kwargs = dict(distribution="last_position", temperature=1.0, generator=torch.Generator().manual_seed(0))
    noisy = oar_probes.oar_g_importance(model, ids, attn, scored, answer, noise_std=1e-2, **kwargs)
    clean = oar_probes.oar_g_importance(model, ids, attn, scored, answer, noise_std=0.0, **kwargs)
    assert clean.max() < 1e-3 * noisy.max()  # the KL at its minimum has zero gradient


def oar_p_importance_loop(model, ids, attn, scored, answer, *, distribution, pad_token_id, temperature):
    """The naive reference: for every scored (row, t), one full-logits forward of the row with token t replaced by
    the pad token (mask unchanged), one at a time; I = KL(P_final ‖ P_final^(t))."""
    importance = torch.zeros(ids.shape[0], T)
    with torch.no_grad():
        for i in range(ids.shape[0]):
            if distribution == "answer_mean" and not answer[i].any():
                continue
            clean = _reference_answer_logits(_reference_logits(model, ids[i : i + 1], attn[i : i + 1])[0], attn[i],
                                             answer[i], distribution, temperature)
            for t in scored[i].nonzero().flatten().tolist():
                copy = ids[i : i + 1].clone()
                copy[0, P + t] = pad_token_id
                perturbed = _reference_answer_logits(_reference_logits(model, copy, attn[i : i + 1])[0], attn[i],
                                                     answer[i], distribution, temperature)
                importance[i, t] = kl_divergence(clean, perturbed)
    return importance


@pytest.mark.parametrize("family", ["qwen3", "gemma3", "gemma3_softcap"])
@pytest.mark.parametrize("distribution", ["last_position", "answer_mean"])
def test_oar_p_batched_and_prefix_shared_match_the_loop(models64, family, distribution, monkeypatch):
    model64 = models64[family]
    ids, attn, answer, scored = _scored()
    kwargs = dict(distribution=distribution, pad_token_id=PAD, temperature=0.7)
    expected = oar_p_importance_loop(model64, ids, attn, scored, answer, **kwargs)
    influencing = _influencing(scored, answer, distribution)
    assert (expected[influencing] > 0).all() and (expected[scored & ~influencing] == 0).all()  # derived, causality
    # chunk_tokens: 1 → one copy per chunk; 40 → 2–3 copies, a row's copies split across chunks; 10_000 → one chunk
    for chunk_tokens in (1, 40, 10_000):
        for name in ("_oar_p_batched", "_oar_p_prefix_shared"):
            with monkeypatch.context() as patch:
                if name == "_oar_p_prefix_shared":  # the cache is shared on every family: no fallback
                    patch.setattr(oar_probes, "_oar_p_batched", None)
                got = getattr(oar_probes, name)(model64, ids, attn, scored, answer, chunk_tokens=chunk_tokens,
                                                **kwargs)
            scale = expected.amax(1, keepdim=True).clamp(min=1e-30)
            assert ((got - expected).abs() / scale).max() < 1e-5, (name, chunk_tokens)
            assert got[0, 2] == 0 and (got[2] == 0).all() and (got[~_completion_mask(attn)] == 0).all()
    assert torch.equal(oar_probes.oar_p_importance(model64, ids, attn, scored, answer, chunk_tokens=40, **kwargs),
                       oar_probes._oar_p_prefix_shared(model64, ids, attn, scored, answer, chunk_tokens=40, **kwargs))


def _long_batch():
    """Three rows longer than Gemma's window (P = 4, T = 24): row 0 full (28 real tokens), row 1 prompt left-padded by
    1 and a completion of 18 (21), row 2 left-padded by 2, completion of 22 (24). Every completion token scored but
    one; answers late in each completion."""
    P_, T_ = 4, 24
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 300, (3, P_ + T_), generator=g)
    attn = torch.ones(3, P_ + T_, dtype=torch.long)
    attn[1, :1], attn[1, P_ + 18:] = 0, 0
    attn[2, :2], attn[2, P_ + 22:] = 0, 0
    ids[attn == 0] = PAD
    answer = torch.zeros(3, T_, dtype=torch.bool)
    answer[0, 20:23], answer[1, 15:17], answer[2, 12] = True, True, True
    scored = attn[:, P_:].bool().clone()
    scored[0, 9] = False
    return ids, attn, answer, scored


def _assert_sharing_equals_whole_forwards(model, monkeypatch):
    """On `_long_batch`, for both distributions and three chunk sizes: OAR-P with prefix sharing equals OAR-P with a
    whole forward per copy in float64, and sharing ran (no fallback)."""
    ids, attn, answer, scored = _long_batch()
    prompts = attn[:, :4].sum(1)  # stripped position of completion token t: prompt + t
    positions = [int(p) + t for p, row in zip(prompts, scored, strict=True) for t in row.nonzero().flatten()]
    assert min(positions) < WINDOW <= 2 * WINDOW < max(positions) and attn.sum(1).min() > 3 * WINDOW
    kwargs = dict(pad_token_id=PAD, temperature=0.7)
    for distribution in oar_probes.DISTRIBUTIONS:
        # one copy per whole forward: no right padding, which eager attention turns into NaN on the padded rows
        # (a fully masked sliding window row; transformers' own behaviour, not the probes')
        expected = oar_probes._oar_p_batched(model, ids, attn, scored, answer, distribution=distribution,
                                             chunk_tokens=1, **kwargs)
        assert (expected[scored] > 0).sum() > 40  # the signal is there to compare
        # 28 → one copy per chunk; 90 → three copies, each row split over many chunks; 10_000 → few, wasteful chunks
        for chunk_tokens in (28, 90, 10_000):
            with monkeypatch.context() as patch:
                patch.setattr(oar_probes, "_oar_p_batched", None)  # sharing ran: no fallback
                got = oar_probes._oar_p_prefix_shared(model, ids, attn, scored, answer, distribution=distribution,
                                                      chunk_tokens=chunk_tokens, **kwargs)
            scale = expected.amax(1, keepdim=True).clamp(min=1e-30)
            assert ((got - expected).abs() / scale).max() < 1e-5, (distribution, chunk_tokens)
            assert (got[~scored] == 0).all()


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("softcap", [None, 1.0])
def test_oar_p_prefix_sharing_is_exact_across_gemma3_sliding_windows(tokenizer, attention, softcap, monkeypatch):
    """Rows of 21–28 tokens against a window of 6: the chunks' first substitutions lie inside the first window and far
    beyond it, so the sliding layers' prefix cache is cut."""
    _assert_sharing_equals_whole_forwards(tiny_gemma3(tokenizer, softcap=softcap, attention=attention), monkeypatch)


def test_oar_p_prefix_sharing_is_exact_on_mistral_sliding_windows(tokenizer, monkeypatch):
    """Mistral: every layer slides (its cache has no full-attention layer)."""
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                           sliding_window=WINDOW, pad_token_id=PAD, bos_token_id=None,
                           eos_token_id=tokenizer.eos_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = MistralForCausalLM(config)
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(4.0)
    _assert_sharing_equals_whole_forwards(model.double().eval(), monkeypatch)


def test_oar_p_falls_back_where_the_cache_cannot_be_cut(tokenizer, monkeypatch):
    """A bidirectional Gemma 3 (its states before p depend on the token at p) takes the whole-forward path."""
    model = tiny_gemma3(tokenizer)
    ids, attn, answer, scored = _scored()
    calls = []
    plain = oar_probes._oar_p_batched
    monkeypatch.setattr(oar_probes, "_oar_p_batched", lambda *a, **k: calls.append(1) or plain(*a, **k))
    kwargs = dict(distribution="last_position", pad_token_id=PAD, temperature=0.7, chunk_tokens=40)
    oar_probes.oar_p_importance(model, ids, attn, scored, answer, **kwargs)
    assert calls == []
    model.config.use_bidirectional_attention = True
    try:
        oar_probes.oar_p_importance(model, ids, attn, scored, answer, **kwargs)
    finally:
        model.config.use_bidirectional_attention = False
    assert calls == [1]


def test_oar_p_answer_mean_row_without_answer_is_zero(model64):
    ids, attn, answer, _ = _scored()
    scored = _completion_mask(attn)  # row 2 scored, but it has no answer tokens
    got = oar_probes.oar_p_importance(model64, ids, attn, scored, answer, distribution="answer_mean", pad_token_id=PAD,
                                  temperature=1.0, chunk_tokens=64)
    influencing = _influencing(scored, answer, "answer_mean")
    assert (got[2] == 0).all() and (got[influencing] > 0).all() and (got[~influencing] == 0).all()


def test_prefix_chunks_respect_the_memory_bound_and_cover_every_copy():
    positions = list(range(20, 60))
    for chunk_tokens in (1, 100, 300, 10_000):
        chunks = oar_probes._prefix_chunks(positions, 60, chunk_tokens)
        assert [i for a, b in chunks for i in range(a, b)] == list(range(len(positions)))
        assert all(b - a == 1 or (b - a) * 60 <= chunk_tokens for a, b in chunks)
    # Unbounded memory: chunks shrink towards the end of the row, where recomputing the gap costs most.
    sizes = [b - a for a, b in oar_probes._prefix_chunks(positions, 60, 10_000)]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] > sizes[-1]
