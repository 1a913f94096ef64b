"""A model the probes cannot read is refused by name, never silently: causal-LM-shaped modules built in the test, each
without one piece the probes reach for (its config, its decoder layers, its decoder, its output layer, a backbone
output with `last_hidden_state`); the message names the model's class and the missing piece. The families grail runs
on: tests/test_architectures.py."""

import pytest
import torch
from torch import nn

from grail.methods import output_layer, probes


class _Config:
    num_hidden_layers = 2


CONFIG = _Config()


class _Backbone(nn.Module):
    def __init__(self, layers_name="layers"):
        super().__init__()
        self.embed_tokens = nn.Embedding(10, 4)
        setattr(self, layers_name, nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)]))


class _FakeLM(nn.Module):
    """A causal-LM-shaped module; each test removes one piece."""

    def __init__(self, config=CONFIG, layers_name="layers", head=True):
        super().__init__()
        self.config = config
        self.model = _Backbone(layers_name)
        self.lm_head = nn.Linear(4, 10, bias=False) if head else None

    def get_decoder(self):
        return self.model

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def get_output_embeddings(self):
        return self.lm_head


class _NoDecoder(_FakeLM):
    get_decoder = None


class _DecoderIsSelf(_FakeLM):
    def get_decoder(self):
        return self


@pytest.mark.parametrize("model, call, match", [
    (_FakeLM(config=None), lambda m: probes.leaf_module(m, "first"), r"_FakeLM has no `config`"),
    (_FakeLM(config=object()), lambda m: probes.leaf_module(m, "middle"),
     r"_FakeLM: config.num_hidden_layers is None"),
    (_FakeLM(layers_name="blocks"), lambda m: probes.decoder_layers(m), None),  # found by the search: no error
    (_FakeLM(config=type("C", (), {"num_hidden_layers": 3})()), lambda m: probes.leaf_module(m, "last"),
     r"decoder_layers: _FakeLM has no nn.ModuleList of length num_hidden_layers=3.*saliency_leaf='embeddings'"),
    (_NoDecoder(), lambda m: probes.backbone(m), r"_NoDecoder.get_decoder\(\) is missing.*get_decoder\(\) returning"),
    (_DecoderIsSelf(), lambda m: probes.backbone(m), r"_DecoderIsSelf.get_decoder\(\) returned the model itself"),
    (_FakeLM(head=False), lambda m: output_layer.output_logits(m, torch.zeros(1, 4), 1.0),
     r"_FakeLM.get_output_embeddings\(\) returned NoneType, not a linear output layer.*lm_head"),
])
def test_an_unreadable_model_is_refused_naming_it_and_the_missing_piece(model, call, match):
    if match is None:
        assert call(model) is model.model.blocks
        return
    with pytest.raises(ValueError, match=match):
        call(model)


def test_a_backbone_without_last_hidden_state_is_refused():
    class TupleBackbone(nn.Module):
        def forward(self, inputs_embeds, **kwargs):
            return (inputs_embeds,)  # a tuple, as with return_dict=False: no `.last_hidden_state`

    class Headless(_FakeLM):
        def get_decoder(self):
            return TupleBackbone()

    with pytest.raises(ValueError, match=r"Headless \(TupleBackbone, from get_decoder\(\)\) returned tuple "
                                         r"without a `last_hidden_state`"):
        probes.hidden_states_BLD(Headless(), torch.ones(1, 3), inputs_embeds=torch.zeros(1, 3, 4))
