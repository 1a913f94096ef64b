"""Numerical faults during training: non-finite logits in some rows of a probe's forward, and a
leaf the answer does not depend on (zero gradient). The weights fall back to uniform on exactly those rows, the
fallback is counted (`weights/fallback_rows`), the loss and gradients stay finite, and training goes on."""

from contextlib import contextmanager

import pytest
import torch

import grail.training.trainer
from batches import loss_and_grads, make_trainer, trl_batch
from grail.methods.table import METHODS, method_names
from grail.methods.weighting import token_weights
from grail.models.tiny import build_tiny_model
from grail.options.choices import WeightingOptions
from grail.training.trainer import GRAILTrainer

PROBED = method_names(probed=True)


@contextmanager
def non_finite_rows(model, rows, value):
    """Every forward of the model puts `value` into the final hidden states (hence the logits) of batch rows `rows`."""
    def hook(module, args, out):
        out = out.clone()
        out[rows] = value
        return out

    handle = model.get_decoder().norm.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


@contextmanager
def detached_leaf(model):
    """The final hidden states are detached: the logits do not depend on the leaf (zero gradient, no graph)."""
    handle = model.get_decoder().norm.register_forward_hook(lambda module, args, out: out.detach())
    try:
        yield
    finally:
        handle.remove()


@pytest.fixture(scope="module")
def small(tokenizer):
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)
    batch = trl_batch(tokenizer)
    ids_BL = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    mask_BL = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    return model, tokenizer, ids_BL, mask_BL, batch["completion_mask"].bool(), batch["advantages"]


def _weights(small, method):
    model, tokenizer, ids_BL, mask_BL, mask_BT, adv_B = small
    options = WeightingOptions(token_weighting=method, rollout_symmetry="both")  # rows 0 and 2 (with a box) probed
    return token_weights(model, tokenizer, ids_BL, mask_BL, mask_BT, adv_B, options,
                         generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("method", PROBED)
def test_non_finite_logits_in_a_row_give_that_row_uniform_weights(small, method, value):
    mask_BT = small[4]
    clean = _weights(small, method)
    # rows 0 and 2 have a box; methods that read no box probe every row with A != 0
    expected = [True, True, True, True] if METHODS[method].rows == "advantaged" else [True, False, True, False]
    assert clean.probed_B.tolist() == expected and not clean.fallback_B.any()
    with non_finite_rows(small[0], [0], value):
        w = _weights(small, method)
    assert torch.isfinite(w.weights_BT).all()
    if not METHODS[method].calls_model:  # KTAE, the position null: no model call, so broken logits cannot reach
        assert torch.equal(w.weights_BT, clean.weights_BT)
        return
    assert w.fallback_B[0] and torch.equal(w.weights_BT[0], mask_BT[0].float())  # uniform on its real tokens
    # their copies are batched per row: "row 0" of each forward is each row's clean copy, so the rows that ran a
    # forward fall back (oar_p_amortized: its default budget of 2 exact rows covers both probed rows, so it is OAR-P)
    if method in ("oar_p", "span_mask", "oar_p_amortized"):
        assert w.fallback_B[0] and w.fallback_B[2]
    else:
        assert not w.fallback_B[2] and torch.equal(w.weights_BT[2], clean.weights_BT[2])


@pytest.mark.parametrize("method", PROBED)
def test_a_zero_gradient_leaf_gives_uniform_weights_not_a_crash(small, method):
    with detached_leaf(small[0]):
        w = _weights(small, method)
    assert torch.isfinite(w.weights_BT).all()
    if method in ("grail", "random", "oar_g"):  # gradient probes: a zero signal on every probed row
        assert w.fallback_B.tolist() == [True, False, True, False]
        assert torch.equal(w.weights_BT, small[4].float())


@pytest.mark.parametrize("path", ["separate", "fused"])
def test_training_steps_stay_finite_and_count_the_fallback(tiny_dir, tmp_path, monkeypatch, path):
    """Separate probe: NaN logits in row 0 of the probe's forward only (TRL's own forward is clean). Fused path: the
    leaf is cut off from the logits in the one forward TRL and the weights share. Two optimiser steps each."""
    trainer = make_trainer(GRAILTrainer, tiny_dir, tmp_path, token_weighting="grail", saliency_path=path,
                           rollout_symmetry="both")
    model = trainer.model
    if path == "separate":
        probe = grail.training.trainer.token_weights

        def poisoned(*args, **kwargs):
            with non_finite_rows(args[0], [0], float("nan")):
                return probe(*args, **kwargs)

        monkeypatch.setattr(grail.training.trainer, "token_weights", poisoned)
        expected = [True, False, False, False]
    else:
        cut = detached_leaf(model)  # kept referenced: a collected context manager would remove its hook
        cut.__enter__()
        expected = [True, False, True, False]
    optimiser = torch.optim.SGD(model.parameters(), lr=1e-3)
    for _ in range(2):
        loss, grads = loss_and_grads(trainer, trl_batch(trainer.processing_class))
        assert torch.isfinite(loss) and grads and all(torch.isfinite(g).all() for g in grads)
        assert trainer.last_token_weights.fallback_B.tolist() == expected
        optimiser.step()
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert trainer._metrics["train"]["weights/fallback_rows"] == [float(sum(expected))] * 2
