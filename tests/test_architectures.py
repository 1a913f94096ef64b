"""The architecture matrix: every method on small random-initialised models of each family grail is meant to run on
(Qwen3 4B/8B, OctoThinker and R1-Distill-Llama are Llama; the others are architectures whose internals differ where
the probes reach in: Gemma 3 scales its embeddings and soft-caps its logits, Phi-3 fuses q/k/v and gate/up, the MoE
routes and adds an aux loss, OLMo 2 norms after each block, Qwen2 has attention biases, Mistral a sliding window).

Per family: the probes' plumbing reproduces the model's own logits and hidden states; every method gives finite
weights that are non-uniform on the rows it probes; left padding changes nothing; the fused path equals the separate
pass; one training step changes the parameters. (A model the probes cannot read: tests/test_unreadable_models.py.)
"""

import copy

import pytest
import torch
import transformers
from datasets import Dataset
from torch import nn

from grail.evaluation.rewards import exact_int_reward
from grail.methods import oar_probes, output_layer, probes
from grail.methods.weighting import batch_spans, method_function, probe_rows, run_probe, token_weights
from grail.options.choices import WeightingOptions
from grail.training.config import GRAILConfig
from grail.training.trainer import GRAILTrainer

SIZES = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=128)

# family → (config class, its own keyword arguments). `tie` marks a model with tied input/output embeddings.
FAMILIES = {
    "llama": ("LlamaConfig", {}),  # OctoThinker, DeepSeek-R1-Distill-Llama
    "qwen3": ("Qwen3Config", {"head_dim": 8, "tie_word_embeddings": True}),  # Qwen3-4B: tied embeddings
    "qwen3_untied": ("Qwen3Config", {"head_dim": 8}),  # Qwen3-8B
    "qwen2": ("Qwen2Config", {}),
    "qwen3_moe": ("Qwen3MoeConfig", {"head_dim": 8, "num_experts": 4, "num_experts_per_tok": 2,
                                     "moe_intermediate_size": 32, "output_router_logits": True,
                                     "router_aux_loss_coef": 0.01}),
    "mistral": ("MistralConfig", {"sliding_window": 16}),  # shorter than the batch: the window binds
    # Gemma 3 (tied, scaled embeddings). The soft-cap is set low so that it binds on a random model's logits.
    "gemma3": ("Gemma3TextConfig", {"head_dim": 8, "final_logit_softcapping": 1.0, "sliding_window": 16}),
    "olmo2": ("Olmo2Config", {}),
    "phi3": ("Phi3Config", {}),
    "granite": ("GraniteConfig", {"logits_scaling": 4.0}),  # logits / logits_scaling after the output layer
}
DEFAULT = ("llama", "qwen3", "qwen3_moe", "gemma3", "phi3", "olmo2")  # one per family in the default suite
SLOW = tuple(name for name in FAMILIES if name not in DEFAULT)


def _families(names=tuple(FAMILIES)):
    return [pytest.param(name, marks=() if name in DEFAULT else pytest.mark.slow) for name in names]


@pytest.fixture(scope="module")
def models(tokenizer):
    """family → a random-initialised float32 model in eval mode (built once per module, on first use)."""
    built = {}

    def build(name):
        if name not in built:
            config_class, kwargs = FAMILIES[name]
            config = getattr(transformers, config_class)(
                vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                bos_token_id=None, dtype="float32", **SIZES, **kwargs)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(0)
                model = transformers.AutoModelForCausalLM.from_config(config)
                # A random model's next-token distributions are near uniform (entropies ≈ log V, KLs ≈ 0): larger
                # embeddings make the signals vary (and Gemma's logits reach its soft-cap).
                with torch.no_grad():
                    model.get_input_embeddings().weight.mul_(4.0)
            model.generation_config.pad_token_id = tokenizer.pad_token_id
            model.generation_config.eos_token_id = tokenizer.eos_token_id
            built[name] = model.eval()
        return built[name]

    return build


# ------------------------------------------------------------------------------------------------------------------
# The batch, in TRL's layout.

PROMPTS = ["Q: 3+4*5\nA:", "Q: 3+4*5\nA:", "Q: 9-5\nA:", "Q: 9-5\nA:"]
COMPLETIONS = [" 4*5=20, 20+3=23. \\boxed{23}", " 3+4=7, 7*5=35 so \\boxed{35} ok", " 9-5=4 \\boxed{4}",
               " 9-5 is 5"]  # rows 0-2 close a box (row 1 has text after it); row 3 has none
ADVANTAGES = [0.5, -0.5, -0.25, 0.25]  # both signs; every row A ≠ 0


def _batch(tokenizer, extra_left_pad: int = 0):
    p = tokenizer(PROMPTS, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    c = tokenizer(COMPLETIONS, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False)
    prompt_ids, prompt_mask = p["input_ids"], p["attention_mask"]
    if extra_left_pad:
        prompt_ids = torch.cat([torch.full((len(PROMPTS), extra_left_pad), tokenizer.pad_token_id), prompt_ids], 1)
        prompt_mask = torch.cat([torch.zeros(len(PROMPTS), extra_left_pad, dtype=prompt_mask.dtype), prompt_mask], 1)
    return {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": c["input_ids"],
            "completion_mask": c["attention_mask"], "advantages": torch.tensor(ADVANTAGES)}


def _layout(batch):
    return (torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1),
            torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1))


# (method, options overrides). rollout_symmetry="both": every row with a box and A ≠ 0 is probed, whatever its sign.
METHOD_CASES = {
    **{f"grail-{leaf}": ("grail", {"saliency_leaf": leaf, "rollout_symmetry": "both"}) for leaf in probes.LEAVES},
    "oar_g": ("oar_g", {}),
    "oar_g-grail_release": ("oar_g", {"oar_variant": "grail_release"}),
    "oar_p": ("oar_p", {}),
    "oar_p-last_position": ("oar_p", {"oar_distribution": "last_position"}),
    "random": ("random", {"rollout_symmetry": "both"}),
    "entropy": ("entropy", {"rollout_symmetry": "both"}),
}


def _weights(model, tokenizer, batch, case):
    method, overrides = METHOD_CASES[case]
    torch.manual_seed(0)  # OAR-G's noise and the random permutation draw from the global RNG
    return method_function(method)(model, tokenizer, batch["prompt_ids"], batch["prompt_mask"],
                                    batch["completion_ids"], batch["completion_mask"], batch["advantages"],
                                    **overrides)


# ------------------------------------------------------------------------------------------------------------------
# The plumbing reproduces the model's own computation.


@pytest.mark.parametrize("family", _families())
def test_backbone_and_output_layer_reproduce_the_models_logits(models, tokenizer, family):
    """hidden_states_BLD + output_logits (the probes' way: backbone, then the output layer on chosen rows) equals the
    model's own forward's logits / temperature, output transforms (scale, soft-cap) included."""
    model = models(family)
    ids, attn = _layout(_batch(tokenizer))
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=attn).logits
        hidden = probes.hidden_states_BLD(model, attn, input_ids=ids)
        got = output_layer.output_logits(model, hidden.flatten(0, 1), 0.7).view_as(expected)
    real = attn.bool()
    torch.testing.assert_close(got[real], expected[real] / 0.7, rtol=1e-5, atol=1e-5)
    scale, softcap = output_layer.logit_transform(model)
    if softcap is not None or scale != 1.0:  # the transform matters here: the plain linear layer would differ
        plain = nn.functional.linear(hidden, model.get_output_embeddings().weight)
        assert (plain[real] - expected[real]).abs().max() > 1e-2


@pytest.mark.parametrize("family", _families())
def test_leaves_are_the_hidden_states_the_spec_names(models, tokenizer, family):
    """leaf_module(leaf)'s output is hidden_states[k] of output_hidden_states, k = 0, 1, L // 2, L − 1 (METHODS.md
    2.2; 4 layers: all four distinct)."""
    model = models(family)
    ids, attn = _layout(_batch(tokenizer))
    captured = {}
    hooks = [probes.leaf_module(model, leaf).register_forward_hook(
        lambda _m, _a, out, leaf=leaf: captured.__setitem__(leaf, probes.leaf_output_tensor(out)))
        for leaf in probes.LEAVES]
    try:
        with torch.no_grad():
            hidden = model(input_ids=ids, attention_mask=attn, output_hidden_states=True).hidden_states
    finally:
        for hook in hooks:
            hook.remove()
    L = model.config.num_hidden_layers
    assert probes.decoder_layers(model) is model.get_decoder().layers
    for leaf, k in zip(probes.LEAVES, (0, 1, L // 2, L - 1), strict=True):
        torch.testing.assert_close(captured[leaf], hidden[k], rtol=0, atol=0, msg=leaf)


# ------------------------------------------------------------------------------------------------------------------
# Every method, through the functional API.


@pytest.mark.parametrize("case", list(METHOD_CASES))
@pytest.mark.parametrize("family", _families())
def test_every_method_gives_finite_weights_that_vary_on_the_probed_rows(models, tokenizer, family, case):
    model = models(family)
    batch = _batch(tokenizer)
    weights = _weights(model, tokenizer, batch, case)
    mask = batch["completion_mask"].bool()
    assert weights.shape == mask.shape and torch.isfinite(weights).all() and not weights.requires_grad
    assert (weights[~mask] == 0).all() and (weights[mask] > 0).all()
    method, overrides = METHOD_CASES[case]
    ids, attn = _layout(batch)
    options = WeightingOptions(token_weighting=method, **overrides)
    info = token_weights(model, tokenizer, ids, attn, mask, batch["advantages"], options)
    # rows with a box and A ≠ 0 are probed (OAR's last_position needs no box: the row without one too)
    expected_probed = [True, True, True, options.oar_distribution == "last_position" and method.startswith("oar")]
    assert info.probed_B.tolist() == expected_probed
    assert not info.fallback_B.any(), "the probe's signal was zero or not finite on a probed row"
    reasoning = info.reasoning_BT & mask
    for row in range(len(PROMPTS)):
        if info.probed_B[row]:  # the probed signal shows: the reasoning tokens' weights differ
            assert weights[row][reasoning[row]].std() > 1e-2, f"row {row}: uniform weights on a probed row"
        else:  # a row with no box gets w = 1 everywhere
            assert torch.equal(weights[row][mask[row]], torch.ones(int(mask[row].sum())))


def _signal(model, tokenizer, batch, case):
    """The method's per-token signal (saliency, entropy, OAR importance) on the rows it probes."""
    method, overrides = METHOD_CASES[case]
    options = WeightingOptions(token_weighting=method, **overrides)
    ids, attn = _layout(batch)
    mask = batch["completion_mask"].bool()
    spans = batch_spans(tokenizer, batch["completion_ids"], mask, options)
    rows = probe_rows(batch["advantages"], spans, mask, options)
    return run_probe(model, ids, attn, spans, mask, rows, options, torch.Generator().manual_seed(0))


# Weights whose pipeline amplifies rounding on a random model: its entropies are all ≈ log V (std of log H ~1e-4 to
# 1e-3), which the per-row z-score divides by; OAR-G's KL gradient is O(σ) (σ = 1e-3) and its min-max normalisation
# does the same. Their weights move by up to ~1e-3 between two layouts in float32 (and in float64: the rotary tables
# are float32); their signals agree to rounding, and the pipeline is per row over the completion (tests/test_core.py).
ILL_CONDITIONED = ("entropy", "oar_g")


@pytest.mark.parametrize("case", list(METHOD_CASES))
@pytest.mark.parametrize("family", _families())
def test_weights_do_not_depend_on_left_padding(models, tokenizer, family, case):
    """The same rows with 3 more pad tokens on the left of every prompt give the same signal (to rounding) and the
    same weights (to 1e-5; see ILL_CONDITIONED). Rotary positions: attention depends only on position differences."""
    model = models(family)
    plain, padded = _batch(tokenizer), _batch(tokenizer, extra_left_pad=3)
    signal, signal_padded = _signal(model, tokenizer, plain, case), _signal(model, tokenizer, padded, case)
    assert signal.max() > 0
    tolerance = (1e-3 if case.startswith("oar_g") else 1e-5) * signal.max().item()  # OAR-G: rounding / σ
    torch.testing.assert_close(signal_padded, signal, rtol=1e-4, atol=tolerance)
    if METHOD_CASES[case][0] not in ILL_CONDITIONED:
        torch.testing.assert_close(_weights(model, tokenizer, padded, case), _weights(model, tokenizer, plain, case),
                                   rtol=0, atol=1e-5)


@pytest.mark.parametrize("family, soft_capped", [("llama", False), ("gemma3", True)])
def test_oar_answer_mean_is_the_mean_of_the_models_logits(models, tokenizer, family, soft_capped):
    """METHODS.md 3: OAR's answer_mean distribution is the softmax of the MEAN of the logits over the positions that
    predict the answer. oar_probes forms it as the output layer on the mean hidden state where the logits are linear
    in the hidden state, and from the per-position logits under soft-capping (Gemma)."""
    model = models(family)
    assert output_layer.output_is_linear(model) is not soft_capped
    batch = _batch(tokenizer)
    ids, attn = _layout(batch)
    T = batch["completion_ids"].shape[1]
    answer = torch.zeros_like(batch["completion_mask"], dtype=torch.bool)
    answer[0, 3:9] = True  # any set of positions: what matters is the mean over several
    pool, _ = oar_probes._answer_pool_BL(attn, answer, "answer_mean")
    with torch.no_grad():
        hidden = probes.hidden_states_BLD(model, attn, input_ids=ids)
        got = oar_probes._pooled_logits(model, hidden, pool, 1.0)[0]
        logits = model(input_ids=ids, attention_mask=attn).logits[0, -T - 1 : -1]  # the predicting positions
    torch.testing.assert_close(got, logits[answer[0]].mean(0), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------------------------------
# Through GRAILTrainer: fused = separate, and a training step.


def _trainer(model, tokenizer, tmp_path, **fields):
    args = GRAILConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=2,
                       max_completion_length=32, report_to="none", beta=0.0, learning_rate=1e-2, **fields)
    dataset = Dataset.from_list([{"prompt": PROMPTS[0], "answer": "23"}] * 4)
    return GRAILTrainer(model=copy.deepcopy(model), processing_class=tokenizer, reward_funcs=[exact_int_reward],
                        args=args, train_dataset=dataset)


def _loss(trainer, inputs):
    trainer.current_gradient_accumulation_steps = 1
    trainer.model.train()
    trainer.model.zero_grad(set_to_none=True)
    loss = trainer._compute_loss(trainer.model, {**inputs, "num_items_in_batch": inputs["completion_mask"].sum()})
    loss.backward()
    return loss.detach()


@pytest.mark.parametrize("method", ["grail", pytest.param("random", marks=pytest.mark.slow)])
@pytest.mark.parametrize("family", _families())
def test_fused_equals_separate(models, tokenizer, tmp_path, family, method):
    """The fused path (the signal from TRL's own training forward) gives the separate pass's weights to 1e-5."""
    model = models(family)
    results = {}
    for path in ("fused", "separate"):
        trainer = _trainer(model, tokenizer, tmp_path, token_weighting=method, rollout_symmetry="both",
                           saliency_path=path)
        loss = _loss(trainer, _batch(tokenizer))
        assert torch.isfinite(loss)
        results[path] = trainer.last_token_weights
    fused, separate = results["fused"], results["separate"]
    assert fused.path == "fused" and separate.path == "separate"
    assert separate.probed_B.tolist() == [True, True, True, False]
    normalised = separate.normalised_BT
    assert separate.weights_BT[normalised].std() > 1e-2  # varying weights: not a vacuous comparison
    torch.testing.assert_close(fused.weights_BT, separate.weights_BT, rtol=0, atol=1e-5)


@pytest.mark.parametrize("family", _families())
def test_fused_entropies_equal_the_separate_probes(models, tokenizer, tmp_path, family):
    """The entropy control's fused signal is TRL's entropies from its training forward; the separate pass computes
    them with `probes.token_entropies`. They agree to rounding. (Its weights are compared only on the saliency paths
    above: on a random model every entropy is ≈ log V, and the per-row z-score turns float32 rounding into ~1e-3
    weight differences; see ILL_CONDITIONED.)"""
    trainer = _trainer(models(family), tokenizer, tmp_path, token_weighting="entropy", rollout_symmetry="both",
                       temperature=0.7)
    assert trainer.fused_unavailable is None
    batch = _batch(tokenizer)
    ids, attn = _layout(batch)
    T = batch["completion_ids"].shape[1]
    with torch.no_grad():
        _, fused, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, attn, T, compute_entropy=True)
        separate = probes.token_entropies(trainer.model, ids, attn, T, temperature=0.7)
    mask = batch["completion_mask"].bool()
    torch.testing.assert_close(fused[mask], separate[mask], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", _families())
def test_one_training_step_changes_the_parameters(models, tokenizer, tmp_path, family):
    """GRAIL (fused path) through TRL's loss, backward and the trainer's optimizer: every parameter that gets a
    gradient moves, and stays finite."""
    trainer = _trainer(models(family), tokenizer, tmp_path, token_weighting="grail", rollout_symmetry="both")
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    loss = _loss(trainer, _batch(tokenizer))
    assert torch.isfinite(loss) and trainer.last_token_weights.path == "fused"
    trainer.create_optimizer()
    trainer.optimizer.step()
    moved = [name for name, p in trainer.model.named_parameters() if not torch.equal(p.detach(), before[name])]
    assert moved and all(torch.isfinite(p).all() for p in trainer.model.parameters())
    assert "lm_head.weight" in moved or model_is_tied(trainer.model)
    assert any("layers.0." in name for name in moved)  # the gradient reaches the first decoder layer


def model_is_tied(model):
    return model.get_output_embeddings().weight is model.get_input_embeddings().weight
