"""OAR-P's exact prefix sharing (grail.methods.kv_prefix, oar_probes._oar_p_prefix_shared) against one whole forward
per perturbed copy, in float64: on the tiny Qwen3, on tiny Gemma 3 models whose rows run past their sliding window (with
and without logit soft-capping, sdpa and eager attention), on Mistral's sliding window; the fallback where the cache
cannot be cut; and how one row's copies are cut into chunks."""

import pytest
import torch

from grail.methods import kv_prefix, oar_probes
from grail.methods.core import kl_divergence
from probe_batches import (
    PAD,
    P,
    T,
    completion_mask,
    float64_copy,
    influencing_tokens,
    padded_rows,
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


def oar_p_importance_loop(model, ids, attn, scored, answer, span_tokens=1, *, distribution, pad_token_id,
                          temperature):
    """The naive reference: for every scored (row, t), one full-logits forward of the row with token t replaced by
    the pad token (mask unchanged), one at a time; I = KL(P_final ‖ P_final^(t)). With span_tokens = k, each row's
    scored tokens, in order, in consecutive groups of k: one forward per group with all of it replaced, and each
    token gets its group's KL (the span baseline)."""
    importance = torch.zeros(ids.shape[0], T)
    with torch.no_grad():
        for i in range(ids.shape[0]):
            if distribution == "answer_mean" and not answer[i].any():
                continue
            clean = reference_answer_logits(reference_logits(model, ids[i : i + 1], attn[i : i + 1])[0], attn[i],
                                             answer[i], distribution, temperature)
            for group in scored[i].nonzero().flatten().split(span_tokens):
                copy = ids[i : i + 1].clone()
                copy[0, P + group] = pad_token_id
                perturbed = reference_answer_logits(reference_logits(model, copy, attn[i : i + 1])[0], attn[i],
                                                     answer[i], distribution, temperature)
                importance[i, group] = kl_divergence(clean, perturbed).to(importance.dtype)
    return importance


@pytest.mark.parametrize("family", ["qwen3", "gemma3", "gemma3_softcap"])
@pytest.mark.parametrize("distribution", ["last_position", "answer_mean"])
def test_oar_p_batched_and_prefix_shared_match_the_loop(models64, family, distribution, monkeypatch):
    model64 = models64[family]
    ids, attn, answer, scored = scored_batch()
    kwargs = dict(distribution=distribution, pad_token_id=PAD, temperature=0.7)
    expected = oar_p_importance_loop(model64, ids, attn, scored, answer, **kwargs)
    influencing = influencing_tokens(scored, answer, distribution)
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
            assert got[0, 2] == 0 and (got[2] == 0).all() and (got[~completion_mask(attn)] == 0).all()
    assert torch.equal(oar_probes.oar_p_importance(model64, ids, attn, scored, answer, chunk_tokens=40, **kwargs),
                       oar_probes._oar_p_prefix_shared(model64, ids, attn, scored, answer, chunk_tokens=40, **kwargs))


def _long_batch():
    """Three rows longer than Gemma's window (P = 4, T = 24): row 0 full (28 real tokens), row 1 prompt left-padded by
    1 and a completion of 18 (21), row 2 left-padded by 2, completion of 22 (24). Every completion token scored but
    one; answers late in each completion."""
    P_, T_ = 4, 24
    ids, attn = padded_rows(P_, T_, 1, [(0, T_), (1, 18), (2, 22)])
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
        # one copy per whole forward: no padding. A padded batch through eager attention in float64 gives NaN, real
        # positions included (transformers' own behaviour: seen in float64 only; float32 and sdpa give none)
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
    ids, attn, answer, scored = scored_batch()
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


def test_prefix_chunks_respect_the_memory_bound_and_cover_every_copy():
    positions = list(range(20, 60))
    for chunk_tokens in (1, 100, 300, 10_000):
        chunks = kv_prefix.prefix_chunks(positions, 60, chunk_tokens)
        assert [i for a, b in chunks for i in range(a, b)] == list(range(len(positions)))
        assert all(b - a == 1 or (b - a) * 60 <= chunk_tokens for a, b in chunks)
    # Unbounded memory: chunks shrink towards the end of the row, where recomputing the gap costs most.
    sizes = [b - a for a, b in kv_prefix.prefix_chunks(positions, 60, 10_000)]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] > sizes[-1]



@pytest.mark.parametrize("family", ["qwen3", "gemma3"])
@pytest.mark.parametrize("distribution", ["last_position", "answer_mean"])
def test_oar_p_spans_replace_each_group_of_k_tokens_together_on_both_paths(models64, family, distribution,
                                                                           monkeypatch):
    model64 = models64[family]
    ids, attn, answer, scored = scored_batch()
    kwargs = dict(distribution=distribution, pad_token_id=PAD, temperature=0.7)
    # the implementation cuts spans from the tokens P_final can see (causality: the others get no copy)
    expected = oar_p_importance_loop(model64, ids, attn, influencing_tokens(scored, answer, distribution), answer, 3,
                                     **kwargs)
    for chunk_tokens in (1, 40):  # one copy per chunk; a row's copies split across chunks
        for name in ("_oar_p_batched", "_oar_p_prefix_shared"):
            with monkeypatch.context() as patch:
                if name == "_oar_p_prefix_shared":
                    patch.setattr(oar_probes, "_oar_p_batched", None)
                got = getattr(oar_probes, name)(model64, ids, attn, scored, answer, chunk_tokens=chunk_tokens,
                                                span_tokens=3, **kwargs)
            scale = expected.amax(1, keepdim=True).clamp(min=1e-30)
            assert ((got - expected).abs() / scale).max() < 1e-5, (name, chunk_tokens)
    row = got[0][influencing_tokens(scored, answer, distribution)[0]]
    assert torch.equal(row[:3], row[:1].expand(3))  # a span's tokens share its value
    token_level = oar_probes.oar_p_importance(model64, ids, attn, scored, answer, chunk_tokens=40, **kwargs)
    assert not torch.allclose(got, token_level)
    assert torch.equal(oar_probes.oar_p_importance(model64, ids, attn, scored, answer, chunk_tokens=40, span_tokens=1,
                                                   **kwargs), token_level)  # k = 1 is OAR-P itself
    with pytest.raises(ValueError, match="span_tokens must be >= 1"):
        oar_probes.oar_p_importance(model64, ids, attn, scored, answer, chunk_tokens=40, span_tokens=0, **kwargs)


def test_the_span_option_reaches_oar_ps_probe(tmp_path, monkeypatch):
    """`--oar_p_span_tokens 4` (an arm `oar_p@oar_p_span_tokens=4`) is OAR-P's own option, recorded with the run, and
    is what its probe hands oar_p_importance; other methods refuse it."""
    from grail.methods import builtin
    from grail.methods.spec import ProbeBatch
    from grail.training.overrides import build_config, merge, parse_flags

    cfg = build_config(merge(None, parse_flags(["--token_weighting", "oar_p", "--oar_p_span_tokens", "4",
                                                "--output_dir", str(tmp_path)])))
    assert cfg.to_dict()["method_options"] == {"oar_p_span_tokens": 4}
    seen = {}
    monkeypatch.setattr(oar_probes, "oar_p_importance", lambda *a, **kw: seen.update(kw))
    empty = torch.zeros(1, 1, dtype=torch.long)
    builtin._oar_p_probe(type("M", (), {"generation_config": None, "config": type("C", (), {"pad_token_id": 0})})(),
                         ProbeBatch(empty, empty, empty.bool(), empty.bool()), cfg.weighting_options(), None)
    assert seen["span_tokens"] == 4
    with pytest.raises(ValueError, match="oar_p_span_tokens"):
        build_config(merge(None, parse_flags(["--token_weighting", "grail", "--oar_p_span_tokens", "4",
                                              "--output_dir", str(tmp_path)])))
