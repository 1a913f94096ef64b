"""grail.options.sampling: parameter checks, the HF keyword arguments, the length cap, and HF sampling on the tiny model
(n samples per prompt in prompt order, seeded, token counts through the first end token)."""

import importlib.util

import pytest
import torch

from grail.models.tiny import build_tiny_model
from grail.options.sampling import (
    HFSampler,
    Sample,
    SamplingParams,
    generate_batch,
    hf_generation_kwargs,
    new_token_limit,
)

PROMPTS = ["Q: 1+2\nA:", "Q: 12*3-4\nA:", "Q: 5\nA:"]  # different lengths: the batch is left-padded


@pytest.fixture
def model(tokenizer):
    """The embedded tiny model (default size), freshly initialised: its completions are arbitrary tokens."""
    return build_tiny_model(tokenizer, seed=0)


# ---- SamplingParams -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, named", [
    ({"n": 0}, "n=0"),
    ({"max_new_tokens": 0}, "max_new_tokens=0"),
    ({"temperature": -0.1}, "temperature=-0.1"),
    ({"top_p": 0.0}, "top_p=0.0"),
    ({"top_p": 1.5}, "top_p=1.5"),
    ({"top_k": -1}, "top_k=-1"),
    ({"temperature": 0.0, "n": 3}, "greedy decoding"),
])
def test_bad_sampling_params_are_refused_naming_the_value(kwargs, named):
    with pytest.raises(ValueError, match=named):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("kwargs", [{"temperature": 0.0, "n": 1}, {"top_p": 1.0, "top_k": 0}])
def test_boundary_sampling_params_are_accepted(kwargs):
    SamplingParams(**kwargs)  # greedy with one sample; top_p 1 and top_k 0 (both off)


# ---- hf_generation_kwargs -----------------------------------------------------------------------------------------
def test_temperature_0_is_greedy_without_sampling_knobs(tokenizer):
    kwargs = hf_generation_kwargs(tokenizer, SamplingParams(n=1, temperature=0.0, top_p=0.5, top_k=7,
                                                            max_new_tokens=11))
    # HF warns about (and ignores) temperature/top_p/top_k when do_sample is False: none are passed
    assert kwargs == {"max_new_tokens": 11, "do_sample": False, "pad_token_id": tokenizer.pad_token_id}


def test_positive_temperature_samples_with_every_knob_passed_through(tokenizer):
    kwargs = hf_generation_kwargs(tokenizer, SamplingParams(n=2, temperature=0.7, top_p=0.9, top_k=13,
                                                            max_new_tokens=5))
    assert kwargs == {"max_new_tokens": 5, "do_sample": True, "pad_token_id": tokenizer.pad_token_id,
                      "temperature": 0.7, "top_p": 0.9, "top_k": 13}


# ---- new_token_limit ----------------------------------------------------------------------------------------------
def test_new_token_limit_at_the_edges_of_the_context(model):
    positions = model.config.max_position_embeddings
    assert new_token_limit(model, positions - 1, 8192) == 1  # one position left: one token
    assert new_token_limit(model, 10, positions - 10) == positions - 10  # exactly what fits is not cut
    assert new_token_limit(model, 10, positions) == positions - 10
    with pytest.raises(ValueError, match=f"{positions + 3} tokens leaves no room"):
        new_token_limit(model, positions + 3, 1)


def test_the_longest_prompt_of_a_batch_sets_the_cap(tokenizer):
    """Left padding makes every row as long as the longest prompt; the cap is positions minus that length."""
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, max_positions=40)
    longest = max(len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in PROMPTS)
    model.generation_config.min_new_tokens = 40 - longest  # no end token before the cap
    out = generate_batch(model, tokenizer, PROMPTS, n=1, gen_kwargs=hf_generation_kwargs(
        tokenizer, SamplingParams(n=1, temperature=0.0, max_new_tokens=1000)))
    assert [s.num_tokens for (s,) in out] == [40 - longest] * len(PROMPTS)


# ---- HFSampler / generate_batch on the tiny model -----------------------------------------------------------------
def test_n_samples_per_prompt_seeded(model, tokenizer):
    params = SamplingParams(n=2, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=8)
    sampler = HFSampler(model, tokenizer, batch_size=2)  # 3 prompts: two batches
    rng_before = torch.random.get_rng_state()
    first = sampler.generate(PROMPTS, params, seed=0)
    assert torch.equal(torch.random.get_rng_state(), rng_before)  # the caller's RNG is left alone
    assert [len(group) for group in first] == [2, 2, 2]
    assert all(isinstance(s, Sample) and 1 <= s.num_tokens <= 8 for group in first for s in group)
    assert sampler.generate(PROMPTS, params, seed=0) == first  # same seed, same samples
    other = sampler.generate(PROMPTS, params, seed=1)
    # an untrained model's next-token distribution is near uniform over ~400 tokens: 48 draws never all repeat
    assert other != first
    texts = [s.text for group in first for s in group]
    assert len(set(texts)) > 1  # sampling, not one completion repeated


def test_samples_are_grouped_by_prompt_in_prompt_order(model, tokenizer):
    """top_k=1 makes every sample of a prompt its greedy completion: each group holds n copies of one text, and the
    groups differ, so a sample filed under the wrong prompt would show."""
    params = SamplingParams(n=3, temperature=1.0, top_k=1, max_new_tokens=6)
    groups = HFSampler(model, tokenizer).generate(PROMPTS, params, seed=0)
    texts = [[s.text for s in group] for group in groups]
    assert all(len(set(group)) == 1 for group in texts), texts
    assert len({group[0] for group in texts}) == len(PROMPTS), texts  # precondition: the prompts' completions differ


def test_the_model_is_put_in_eval_mode_and_restored(model, tokenizer):
    seen = []
    model.register_forward_pre_hook(lambda module, args: seen.append(module.training))
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=2)
    for training in (True, False):
        model.train(training)
        HFSampler(model, tokenizer).generate(PROMPTS[:1], params, seed=0)
        assert model.training is training
    assert seen and not any(seen)  # every forward ran in eval mode (dropout off)


def test_generation_stops_at_the_end_token_and_counts_through_it(model, tokenizer):
    """The end token is made one that greedy decoding emits early, so rows end at known places: the count is up to
    and including the first end token, the text is what comes before it, and the padding after it is not counted."""
    max_new = 12
    batch = tokenizer(PROMPTS, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    with torch.no_grad():
        reference_BT = model.generate(**batch, max_new_tokens=max_new, do_sample=False,
                                      pad_token_id=tokenizer.pad_token_id)[:, batch["input_ids"].shape[1]:]
    end = reference_BT[0, 2].item()  # row 0 now ends at its 3rd token, or earlier where that token came before
    assert end != tokenizer.eos_token_id  # precondition: the reference's row 0 had not ended by then
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, end]  # a list, as many chat models have
    out = generate_batch(model, tokenizer, PROMPTS, n=1, gen_kwargs=hf_generation_kwargs(
        tokenizer, SamplingParams(n=1, temperature=0.0, max_new_tokens=max_new)))
    eos = {tokenizer.eos_token_id, end}
    for (sample,), row in zip(out, reference_BT.tolist(), strict=True):
        stop = next((i + 1 for i, tok in enumerate(row) if tok in eos), max_new)
        assert sample.num_tokens == stop
        assert sample.text == tokenizer.decode(row[:stop], skip_special_tokens=True)
    assert out[0][0].num_tokens <= 3 < max_new  # the end token did stop row 0


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed")
def test_vllm_backend_without_vllm_says_how_to_install_it():
    from grail.options.sampling import VLLMSampler

    with pytest.raises(ImportError, match=r"\.\[vllm\].*--backend hf"):
        VLLMSampler("any/model")


# ---- generation length (moved from the harness tests) -------------------------------------------------------
def test_new_token_limit_caps_at_the_models_positions():
    from types import SimpleNamespace

    model = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=512))
    assert new_token_limit(model, 20, 8192) == 512 - 20
    assert new_token_limit(model, 20, 100) == 100
    assert new_token_limit(SimpleNamespace(config=SimpleNamespace()), 20, 8192) == 8192  # no limit known
    with pytest.raises(ValueError, match="512 tokens leaves no room .* 512 positions"):
        new_token_limit(model, 512, 8)


def test_hf_sampler_generates_at_most_what_the_model_holds(tokenizer):
    """A 64-position tiny model asked for the protocol's 8192 new tokens, with its end token suppressed: the
    completion fills the positions the prompt leaves, and stops there."""
    from grail.models.tiny import build_tiny_model

    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1, max_positions=64)
    prompt = "Q: 1+1\nA:"
    prompt_tokens = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    model.generation_config.min_new_tokens = 64 - prompt_tokens  # no end token before the cap
    params = SamplingParams(n=2)
    assert params.max_new_tokens == 8192
    samples = HFSampler(model, tokenizer).generate([prompt], params, seed=0)[0]
    assert [s.num_tokens for s in samples] == [64 - prompt_tokens] * 2
