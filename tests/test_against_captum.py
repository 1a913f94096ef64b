"""Our gradient attributions against captum's, a maintained attribution library ("where one computes a
candidate, use it or test yours against it"): GRAIL's saliency ‖∂ℓ/∂e ⊙ e‖ is the norm over the features of captum's
LayerGradientXActivation on the embedding layer, and ig_patch's integrated gradients (midpoint rule, K steps, the
reasoning moved towards the pad) are minus captum's LayerIntegratedGradients from the pad-substituted baseline
(method "riemann_middle", the same K points), on the reasoning tokens. Both on a tiny Qwen3 in float64."""

import pytest
import torch
from credit_candidates import ig_patch

from grail.methods import probes
from grail.methods.spans import answer_spans
from probe_batches import PAD, WORKED, float64_copy, probe_model, text_rows

captum_attr = pytest.importorskip("captum.attr")

TEMPERATURE = 0.7


@pytest.fixture(scope="module")
def model64(tokenizer):
    return float64_copy(probe_model(tokenizer, max_positions=96))


@pytest.fixture(scope="module")
def batch(tokenizer):
    ids, attn, T = text_rows(tokenizer, *WORKED)
    return ids, attn, T, answer_spans(tokenizer, ids[:, -T:], attn[:, -T:].bool())


def _answer_logp(model, T, box_BT):
    """captum's forward: ids, mask → (B,) Σ log π(box token) at the temperature, each row its own output."""
    def forward(ids, attn):
        logits = model(input_ids=ids, attention_mask=attn).logits[:, -T - 1:-1] / TEMPERATURE
        logp = torch.log_softmax(logits, -1).gather(-1, ids[:, -T:, None]).squeeze(-1)
        return (logp * box_BT.repeat(ids.shape[0] // box_BT.shape[0], 1)).sum(1)
    return forward


def test_grail_saliency_is_captums_gradient_times_activation(model64, batch):
    ids, attn, T, spans = batch
    ours = probes.answer_nll_saliency(model64, ids, attn, spans.box_BT, temperature=TEMPERATURE)  # (B, T)
    method = captum_attr.LayerGradientXActivation(_answer_logp(model64, T, spans.box_BT),
                                                  model64.get_input_embeddings())
    attr_BLD = method.attribute(ids, additional_forward_args=(attn,))
    # ours is read at the position that predicts each token: the previous position's embedding
    theirs = attr_BLD.norm(dim=-1)[:, -T - 1:-1]
    mask = attn[:, -T:].bool()
    assert ours[mask].abs().max() > 0
    torch.testing.assert_close(ours[mask].double(), theirs[mask], rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("steps", [2, 4])  # captum asks for at least 2
def test_ig_patch_is_captums_layer_integrated_gradients_from_the_padded_reasoning(model64, batch, steps):
    ids, attn, T, spans = batch
    ours = ig_patch.ig_delta(model64, ids, attn, spans.box_BT, temperature=TEMPERATURE, pad_token_id=PAD,
                             steps=steps)  # (B, T): (1/K) Σ_k ∇J(e(α_k)) · (e_pad − e_t)
    before_BT = torch.arange(T) < spans.box_BT.int().argmax(1, keepdim=True)
    path_BT = attn[:, -T:].bool() & before_BT
    baseline = ids.clone()
    baseline[:, -T:][path_BT] = PAD  # the reasoning replaced by the pad; the prompt and the box stay
    method = captum_attr.LayerIntegratedGradients(_answer_logp(model64, T, spans.box_BT),
                                                  model64.get_input_embeddings())
    attr_BLD = method.attribute(ids, baselines=baseline, additional_forward_args=(attn,), n_steps=steps,
                                method="riemann_middle")
    theirs_BT = attr_BLD.sum(-1)[:, -T:]  # (x − x') · mean gradient = (e_t − e_pad) · ...: minus ours
    assert path_BT.sum() >= 10 and ours[path_BT].abs().max() > 0
    torch.testing.assert_close(ours[path_BT].double(), -theirs_BT[path_BT], rtol=1e-5, atol=1e-9)
