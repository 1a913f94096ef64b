"""LoRA / PEFT and activation checkpointing: every method trains, the weights are the merged model's, fused saliency
runs under non-reentrant checkpointing and equals the separate pass, and reentrant checkpointing falls back."""

import copy

import pytest
import torch
from peft import LoraConfig

from batches import loss_and_grads, make_trainer, trl_batch
from grail.methods.table import METHODS as METHOD_TABLE
from grail.methods.weighting import token_weights
from grail.training.trainer import GRAILTrainer

METHODS = list(METHOD_TABLE)  # every method of the table
LORA = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)


def _checkpointed(trainer):
    """What transformers' Trainer.train() does when activation_checkpointing is set (these tests call the loss
    directly)."""
    if trainer.args.activation_checkpointing:
        trainer.model.activation_checkpointing_enable(
            activation_checkpointing_kwargs=trainer.args.activation_checkpointing_kwargs)
    return trainer


def _varied(trainer):
    """A larger embedding scale makes a fresh model's saliency and entropies vary (see test_fused_equals_separate)."""
    with torch.no_grad():
        trainer.accelerator.unwrap_model(trainer.model).get_input_embeddings().weight.mul_(3.0)
    return trainer


@pytest.mark.parametrize("method, leaf", [("grail", "embeddings"), ("grail", "middle"), ("entropy", "embeddings")])
def test_fused_equals_separate_under_non_reentrant_checkpointing(tiny_dir, tmp_path, method, leaf):
    """transformers 5's default checkpointing (use_reentrant=False) recomputes inside autograd: the fused gradient
    query works through it and gives the separate pass's weights, and the loss and gradients of no checkpointing."""
    results = {}
    for name, path, checkpointing in (("fused", "fused", True), ("separate", "separate", True),
                                      ("plain", "separate", False)):
        trainer = _checkpointed(_varied(make_trainer(
            GRAILTrainer, tiny_dir, tmp_path, token_weighting=method, saliency_leaf=leaf, rollout_symmetry="both",
            saliency_path=path, activation_checkpointing=checkpointing)))
        assert trainer.model.is_activation_checkpointing == checkpointing
        results[name] = (loss_and_grads(trainer, trl_batch(trainer.processing_class)), trainer.last_token_weights)
    (fused, w_fused), (separate, w_separate), (plain, w_plain) = results["fused"], results["separate"], results["plain"]
    assert w_fused.path == "fused" and w_separate.path == "separate"
    assert w_separate.normalised_BT.sum() >= 10 and w_separate.weights_BT[w_separate.normalised_BT].std() > 0.02
    torch.testing.assert_close(w_fused.weights_BT, w_separate.weights_BT, rtol=0, atol=1e-5)
    torch.testing.assert_close(w_plain.weights_BT, w_separate.weights_BT, rtol=0, atol=1e-5)
    for (loss_a, grads_a), (loss_b, grads_b) in ((fused, plain), (separate, plain)):
        torch.testing.assert_close(loss_a, loss_b, rtol=0, atol=1e-5)
        for g, g_ref in zip(grads_a, grads_b, strict=True):
            torch.testing.assert_close(g, g_ref, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("method", ["grail", "oar_g", "random"])
def test_reentrant_checkpointing_falls_back_to_a_separate_pass_that_works(tiny_dir, tmp_path, method):
    """use_reentrant=True answers only .backward(): fusing is refused by name, and the separate probe (a gradient
    query) runs with checkpointing switched off for it, giving the weights of an unchekpointed model."""
    kwargs = {"activation_checkpointing_kwargs": {"use_reentrant": True}}
    reentrant = _checkpointed(_varied(make_trainer(GRAILTrainer, tiny_dir, tmp_path, token_weighting=method,
                                                   rollout_symmetry="both", activation_checkpointing=True, **kwargs)))
    assert "reentrant" in reentrant.fused_unavailable or method == "oar_g"  # OAR-G never fuses
    plain = _varied(make_trainer(GRAILTrainer, tiny_dir, tmp_path, token_weighting=method, rollout_symmetry="both",
                                 saliency_path="separate"))
    batch = trl_batch(reentrant.processing_class)
    torch.manual_seed(0)
    reentrant._generator.manual_seed(0)
    loss, _ = loss_and_grads(reentrant, batch)
    assert reentrant.model.is_activation_checkpointing  # restored after the probe
    plain._generator.manual_seed(0)
    loss_and_grads(plain, batch)
    assert reentrant.last_token_weights.probed_B.any()
    torch.testing.assert_close(reentrant.last_token_weights.weights_BT, plain.last_token_weights.weights_BT,
                               rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="reentrant"):
        make_trainer(GRAILTrainer, tiny_dir, tmp_path, token_weighting="grail", saliency_path="fused",
                     activation_checkpointing=True, **kwargs)


def _lora_trainer(tiny_dir, tmp_path, method, **fields):
    trainer = make_trainer(GRAILTrainer, tiny_dir, tmp_path, peft_config=LoraConfig(**LORA), token_weighting=method,
                           rollout_symmetry="both", **fields)
    with torch.no_grad():  # LoRA starts with B = 0 (the adapter is a no-op); make it change the model
        generator = torch.Generator().manual_seed(1)
        for name, param in trainer.model.named_parameters():
            if "lora_B" in name:
                param.copy_(0.5 * torch.randn(param.shape, generator=generator))
    return trainer


@pytest.mark.parametrize("method", METHODS)
def test_lora_trains_the_adapter_only_with_the_merged_models_weights(tiny_dir, tmp_path, method):
    """With a LoRA adapter the saliency methods run the separate pass (fusing is refused by name; entropy still
    fuses: it needs no gradient), the weights are the functional API's on the merged model, and an optimiser step
    changes adapter parameters only. (Entropy is compared on its separate pass: TRL forms its fused entropies in
    float32, and fused = separate is tested elsewhere.)"""
    spec = METHOD_TABLE[method]
    if spec.fuse == "saliency":
        assert "PEFT" in _lora_trainer(tiny_dir, tmp_path, method).fused_unavailable
    trainer = _varied(_lora_trainer(tiny_dir, tmp_path, method, saliency_path="separate"))
    trainer.model.double()  # float64: the adapter's x·W + x·A·B and the merged x·(W + A·B) round alike
    batch = trl_batch(trainer.processing_class)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    generator_state = trainer._generator.get_state()
    loss_and_grads(trainer, batch)
    weights = trainer.last_token_weights
    assert weights.path == ("separate" if spec.probe else "none")
    merged = copy.deepcopy(trainer.accelerator.unwrap_model(trainer.model)).merge_and_unload()  # a copy: in place
    options = trainer.weighting  # would change the trainer's model
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    reference = token_weights(merged, trainer.tokenizer, input_ids, attention, batch["completion_mask"].bool(),
                              batch["advantages"], options,
                              generator=torch.Generator().set_state(generator_state))
    torch.testing.assert_close(weights.weights_BT, reference.weights_BT, rtol=0, atol=1e-5)
    if spec.probe is not None:
        assert weights.probed_B.any()
    trainer.optimizer = torch.optim.SGD([p for p in trainer.model.parameters() if p.requires_grad], lr=1.0)
    trainer.optimizer.step()
    changed = {n for n, p in trainer.model.named_parameters() if not torch.equal(p.detach(), before[n])}
    assert changed and all("lora_" in n for n in changed)


@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("method", ["grail", "oar_g", "oar_p", "entropy"])
def test_lora_with_activation_checkpointing_works_for_every_method(tiny_dir, tmp_path, method, reentrant):
    """PEFT with checkpointing, reentrant (TRL's choice for PEFT + ZeRO-3) or not: every method runs its separate
    pass and gives the weights it gives without checkpointing."""
    kwargs = {"activation_checkpointing_kwargs": {"use_reentrant": reentrant}}
    checkpointed = _checkpointed(_lora_trainer(tiny_dir, tmp_path, method, activation_checkpointing=True, **kwargs))
    assert checkpointed.model.is_activation_checkpointing
    plain = _lora_trainer(tiny_dir, tmp_path, method)
    batch = trl_batch(checkpointed.processing_class)
    for trainer in (checkpointed, plain):
        trainer._generator.manual_seed(0)
        loss, grads = loss_and_grads(trainer, batch)
        assert torch.isfinite(loss) and grads
    assert checkpointed.last_token_weights.probed_B.any()
    torch.testing.assert_close(checkpointed.last_token_weights.weights_BT, plain.last_token_weights.weights_BT,
                               rtol=0, atol=1e-5)
