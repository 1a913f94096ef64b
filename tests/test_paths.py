"""grail.training.paths: which weight path a setup can take and what the trainer refuses before the first step, as
functions of plain values, checked without building a trainer (tests/test_trainer.py builds one)."""

import pytest
import torch
from torch import nn

from grail.methods.table import method_spec
from grail.training import paths


def _never() -> bool:
    pytest.fail("leaf_trainable was asked although an earlier reason already rules fusing out")


def _reason(name="grail", saliency_path="auto", weights_from="current_policy", leaf_trainable=lambda: True, **setup):
    setup = {"peft": False, "sharded": None, "deepspeed": False, "reentrant": False, **setup}
    return paths.fused_unavailable_reason(method_spec(name), saliency_path, weights_from,
                                          leaf_trainable=leaf_trainable, **setup)


def test_grail_fuses_when_nothing_stands_in_the_way():
    assert _reason() is None
    assert _reason("entropy", peft=True, leaf_trainable=_never) is None  # TRL's forward has the entropies anyway


@pytest.mark.parametrize("name, kwargs, why", [
    ("none", {}, "token_weighting='none' has no saliency, entropy or probe signal"),
    ("oar_g", {}, "has no saliency, entropy or probe signal"),
    ("grail", {"saliency_path": "separate"}, "saliency_path='separate'"),
    ("grail", {"weights_from": "rollout_policy"}, "weights_from='rollout_policy' computes weights at generation"),
    ("grail", {"peft": True}, "PEFT/LoRA"),
    ("grail", {"sharded": "FSDP"}, "FSDP (parameters are gathered"),
    ("grail", {"deepspeed": True}, "DeepSpeed (its engine hooks"),
    ("grail", {"reentrant": True}, "reentrant activation checkpointing"),
])
def test_each_reason_not_to_fuse_is_named(name, kwargs, why):
    assert why in _reason(name, leaf_trainable=_never, **kwargs)


def test_frozen_embeddings_are_asked_last():
    assert _reason(leaf_trainable=lambda: False).startswith("frozen embeddings")


def test_fused_asked_for_where_it_cannot_run_is_refused_with_the_alternatives():
    with pytest.raises(ValueError, match="saliency_path='fused' cannot work here: PEFT.*'auto'.*'separate'"):
        paths.check_fused_request("fused", "PEFT")
    paths.check_fused_request("auto", "PEFT")  # auto falls back to the separate pass
    paths.check_fused_request("fused", None)


@pytest.mark.parametrize("on, kwargs, reentrant", [
    (False, {"use_reentrant": True}, False),  # checkpointing off: nothing to re-enter
    (True, None, False), (True, {}, False),  # transformers 5's default is non-reentrant
    (True, {"use_reentrant": False}, False), (True, {"use_reentrant": True}, True),
])
def test_reentrant_checkpointing(on, kwargs, reentrant):
    assert paths.reentrant_checkpointing(on, kwargs) is reentrant


@pytest.mark.parametrize("processes, engine, checkpointing, why", [
    (2, None, False, r"one process without an engine wrapper only \(this launch: 2 process\(es\), DDP\)"),
    (1, "DeepSpeed", False, r"1 process\(es\), DeepSpeed"),
    (1, None, True, "KV cache off under activation checkpointing; set activation_checkpointing false"),
])
def test_shared_prompt_is_refused_where_it_cannot_work(processes, engine, checkpointing, why):
    with pytest.raises(ValueError, match=f"shared_prompt=true cannot work here: .*{why}.*Set shared_prompt false"):
        paths.check_shared_prompt(True, processes, engine, checkpointing)
    paths.check_shared_prompt(False, processes, engine, checkpointing)  # off: nothing to refuse


def test_shared_prompt_on_one_plain_process_is_accepted():
    paths.check_shared_prompt(True, 1, None, False)


class _NoEmbeddings(nn.Module):
    """A model without get_input_embeddings: no probe can reach its leaf."""

    def forward(self, input_ids):
        return torch.zeros(input_ids.shape)


def test_a_model_the_probes_cannot_reach_is_refused_naming_the_accessor():
    with pytest.raises(ValueError, match="get_input_embeddings"):
        paths.check_probe_reaches_the_model(method_spec("grail"), _NoEmbeddings(), "embeddings")
    with pytest.raises(ValueError, match="get_input_embeddings"):
        paths.check_probe_reaches_the_model(method_spec("oar_g"), _NoEmbeddings(), "embeddings")
    paths.check_probe_reaches_the_model(method_spec("none"), _NoEmbeddings(), "embeddings")  # no probe
    paths.check_probe_reaches_the_model(method_spec("ktae"), _NoEmbeddings(), "embeddings")  # calls no model


def test_the_fused_saliency_leaf_is_checked_too():
    model = nn.Module()
    model.get_input_embeddings = lambda: nn.Embedding(4, 2)  # the embeddings are there, the decoder layers are not
    with pytest.raises(ValueError, match="no `config`: the probes read num_hidden_layers"):
        paths.check_probe_reaches_the_model(method_spec("grail"), model, "middle")
    paths.check_probe_reaches_the_model(method_spec("grail"), model, "embeddings")
    paths.check_probe_reaches_the_model(method_spec("oar_g"), model, "middle")  # no fused saliency: the leaf is unread
