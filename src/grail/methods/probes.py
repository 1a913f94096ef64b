"""Model-touching probes: GRAIL's answer-NLL saliency and token entropies (docs/methods/grail.md,
docs/methods/entropy.md), and the model plumbing they share with OAR's probes (`grail.methods.oar_probes`).

Every probe takes TRL's batch layout: `input_ids_BL = cat(prompt_ids_BS, completion_ids_BT)`, prompts left-padded,
completions right-padded, `attention_mask_BL` alike, L = S + T. It returns a float32, detached (B, T) tensor on the
ids' device, 0 on padding and on unscored tokens. Gradients are taken only with `torch.autograd.grad(...,
inputs=[leaf])` on a fresh leaf, so no parameter `.grad` is written; `requires_grad` of parameters and
`model.training` are never changed. Logits are formed only at the positions a probe needs (the backbone
`model.get_decoder()` runs, then the output layer on the selected hidden rows) and are divided by the sampling
temperature wherever a distribution is formed. On a model sharded over processes (DeepSpeed ZeRO-3, torch FSDP2) a
probe gathers the output layer once (`grail.methods.sharding.unsharded`), runs FSDP2 forwards through the model's own
forward (`backbone_output`), and a probe with a data-dependent number of forwards keeps the processes in step
(`in_lockstep`): every process gets the weights an unsharded model gives (tests/test_fsdp_cpu.py,
tests/test_deepspeed_cpu.py).

Position ids are not passed: the backbone numbers positions 0..L−1 whatever the padding, exactly as in TRL's own
forward. With rotary position embeddings (Qwen3, Llama: every model of the GRAIL paper) attention depends only on
position differences, so a left-padded row gives the same outputs as the row alone (tested to 1e-5); a model with
absolute position embeddings would need explicit `position_ids`.

What a probe needs of the model (anything else gets a `ValueError` naming the model class, the missing piece and the
fix, never a silent fallback): `config.num_hidden_layers` (the text config's, for multimodal configs);
`get_decoder()` returning the backbone, a module other than the model whose output has `.last_hidden_state`;
`get_input_embeddings()`; `get_output_embeddings()` with a `.weight` (V, D), a linear layer; the decoder layers as an
`nn.ModuleList` (the backbone's `.layers`, else the first one of length num_hidden_layers). The output layer and
the output transforms applied after it (logit scale, soft-capping) live in `grail.methods.output_layer`;
soft-capping makes the logits non-linear in the hidden state, so a distribution from a MEAN hidden state is not the
mean of the logits (`output_layer.output_is_linear`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import get_args

import torch
from torch import nn

from grail.methods.core import entropy_from_logits, gradient_activation_saliency
from grail.methods.output_layer import MODEL_FIX, output_logits, per_position_BT, text_config, token_logprobs_BT
from grail.methods.sharding import announce_forward, is_fsdp2, lockstep, unsharded
from grail.methods.spans import align_to_completion
from grail.options.choices import Leaf

__all__ = [
    "answer_nll_saliency", "backbone", "backbone_output", "check_batch", "completion_mask_BT",
    "decoder_layers", "hidden_states_BLD", "in_lockstep", "leaf_gradient", "leaf_module", "leaf_output_tensor",
    "LEAVES", "output_of", "token_entropies", "zeros_BT",
]

LEAVES: tuple[Leaf, ...] = get_args(Leaf)


# ---------------------------------------------------------------------------------------------------------------
# Model plumbing: the backbone, the decoder layers, the leaf module, the output layer.



def _num_layers(model: nn.Module) -> int:
    num_layers = getattr(text_config(model), "num_hidden_layers", None)
    if not isinstance(num_layers, int) or num_layers < 1:
        raise ValueError(f"{type(model).__name__}: config.num_hidden_layers is {num_layers!r}; the leaves 'first', "
                         f"'middle', 'last' are numbered by it. {MODEL_FIX}a config with num_hidden_layers.")
    return num_layers


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder layer list: the backbone's `.layers` if it is an `nn.ModuleList` of length
    `config.num_hidden_layers`, else the first such `nn.ModuleList` in the model (PEFT wrappers, other names)."""
    num_layers = _num_layers(model)
    get_decoder = getattr(model, "get_decoder", None)
    layers = getattr(get_decoder(), "layers", None) if callable(get_decoder) else None
    if isinstance(layers, nn.ModuleList) and len(layers) == num_layers:
        return layers
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) == num_layers:
            return module
    raise ValueError(f"decoder_layers: {type(model).__name__} has no nn.ModuleList of length num_hidden_layers="
                     f"{num_layers} (the decoder layers, whose outputs are the leaves 'first', 'middle', 'last'). Use "
                     f"saliency_leaf='embeddings', or give the model's backbone its layers as `.layers`, an "
                     f"nn.ModuleList.")


def leaf_module(model: nn.Module, leaf: Leaf) -> nn.Module:
    """The module whose forward OUTPUT is the leaf h (docs/methods/grail.md, step 2).

    "embeddings": the input embedding module (`hidden_states[0]`); "first" / "middle" / "last": the decoder layer whose
    output is `hidden_states[k]` of `output_hidden_states`, k = 1, L // 2, L − 1 (L decoder layers), i.e. layer k − 1.
    """
    if leaf == "embeddings":
        return _input_embeddings(model)
    num_layers = _num_layers(model)
    k = {"first": 1, "middle": num_layers // 2, "last": num_layers - 1}.get(leaf)
    if k is None:
        raise ValueError(f"leaf_module: leaf must be one of {LEAVES}, got {leaf!r}")
    if k < 1:
        raise ValueError(f"leaf_module: leaf={leaf!r} needs hidden_states[{k}] with k >= 1, but the model has only "
                         f"{num_layers} decoder layer(s); use leaf='embeddings'")
    return decoder_layers(model)[k - 1]


def leaf_output_tensor(output) -> torch.Tensor:
    """The hidden tensor of a module's output: the output itself, or the first item of a tuple / list."""
    return output if isinstance(output, torch.Tensor) else output[0]


def _with_leaf(output, hidden: torch.Tensor):
    """`output` with its hidden tensor replaced by `hidden` (same container type)."""
    if isinstance(output, torch.Tensor):
        return hidden
    return type(output)((hidden, *output[1:]))


@contextmanager
def _fresh_leaf(module: nn.Module) -> Iterator[list[torch.Tensor]]:
    """While active, `module`'s output h is replaced by `h.detach().requires_grad_()`, appended to the yielded list:
    backpropagation stops at the leaf, so nothing upstream (and no parameter) receives a gradient."""
    captured: list[torch.Tensor] = []

    def hook(_module, _args, output):
        leaf = leaf_output_tensor(output).detach().requires_grad_()
        captured.append(leaf)
        return _with_leaf(output, leaf)

    handle = module.register_forward_hook(hook)
    try:
        yield captured
    finally:
        handle.remove()


def _input_embeddings(model: nn.Module) -> nn.Module:
    get = getattr(model, "get_input_embeddings", None)
    embeddings = get() if callable(get) else None
    if not isinstance(embeddings, nn.Module):
        raise ValueError(f"{type(model).__name__}: get_input_embeddings() is missing or returned {embeddings!r}; the "
                         f"probes take the input embeddings as the leaf (and OAR-G perturbs them). {MODEL_FIX}"
                         f"get_input_embeddings() returning the token embedding module.")
    return embeddings


def backbone(model: nn.Module) -> nn.Module:
    """`model.get_decoder()`: the decoder stack without the output layer (its output has `.last_hidden_state`)."""
    get = getattr(model, "get_decoder", None)
    decoder = get() if callable(get) else None
    if not isinstance(decoder, nn.Module) or decoder is model:
        got = "is missing" if not callable(get) else ("returned the model itself" if decoder is model
                                                      else f"returned {decoder!r}")
        raise ValueError(f"backbone: {type(model).__name__}.get_decoder() {got}; the probes run the backbone (the "
                         f"decoder stack without the output layer) and apply the output layer only where they need "
                         f"logits. {MODEL_FIX}get_decoder() returning the backbone, whose forward(input_ids= or "
                         f"inputs_embeds=, attention_mask=, use_cache=False) returns `.last_hidden_state`.")
    return decoder


def backbone_output(model: nn.Module, attention_mask_BL: torch.Tensor, use_cache: bool = False, **inputs):
    """The backbone's output (`.last_hidden_state` (B, L, D), `.past_key_values` with `use_cache`).

    The backbone runs alone, except on a model sharded by torch's FSDP2: there the model's own forward runs (with
    `logits_to_keep=1`: one position's logits per row) and the backbone's output is taken from it, because FSDP2
    gathers and releases its units in hooks around the ROOT's forward and a backbone called alone leaves units it
    groups with the output layer half-run. Inside `in_lockstep`, each call first tells the other processes that
    this one runs a forward."""
    decoder = backbone(model)
    announce_forward(model)
    if is_fsdp2(model):
        captured: list = []
        handle = decoder.register_forward_hook(lambda _module, _args, out: captured.append(out))
        try:
            model(attention_mask=attention_mask_BL, use_cache=use_cache, logits_to_keep=1, **inputs)
        finally:
            handle.remove()
        output = captured[-1] if captured else None
    else:
        output = decoder(attention_mask=attention_mask_BL, use_cache=use_cache, **inputs)
    if not isinstance(getattr(output, "last_hidden_state", None), torch.Tensor):
        raise ValueError(f"hidden_states_BLD: the backbone of {type(model).__name__} ({type(decoder).__name__}, from "
                         f"get_decoder()) returned {type(output).__name__} without a `last_hidden_state` tensor. "
                         f"{MODEL_FIX}get_decoder() returning a module whose output has `.last_hidden_state` "
                         f"(B, L, D).")
    return output


def hidden_states_BLD(model: nn.Module, attention_mask_BL: torch.Tensor, **inputs) -> torch.Tensor:
    """Final hidden states (after the last norm) of the backbone, (B, L, D) (`backbone_output`)."""
    return backbone_output(model, attention_mask_BL, **inputs).last_hidden_state


@contextmanager
def output_of(module: nn.Module) -> Iterator[list[torch.Tensor]]:
    """While active, the hidden tensor of each output of `module` is appended to the yielded list (unchanged)."""
    captured: list[torch.Tensor] = []
    handle = module.register_forward_hook(lambda _module, _args, out: captured.append(leaf_output_tensor(out)))
    try:
        yield captured
    finally:
        handle.remove()


def leaf_gradient(output: torch.Tensor, leaf: torch.Tensor, retain_graph: bool = False) -> torch.Tensor:
    """∂output/∂leaf with `torch.autograd.grad` (no parameter `.grad` is written), zeros where the output does not
    depend on the leaf: a model that detaches between the leaf and the logits (a zero-gradient leaf) gives a zero
    signal, which the weighting routes to uniform weights and counts (`weights/fallback_rows`), never a crash."""
    if not output.requires_grad:
        return torch.zeros_like(leaf)
    (grad,) = torch.autograd.grad(output, inputs=[leaf], retain_graph=retain_graph, allow_unused=True)
    return torch.zeros_like(leaf) if grad is None else grad



@contextmanager
def in_lockstep(model: nn.Module) -> Iterator[None]:
    """`grail.methods.sharding.lockstep` for the probes' forwards (`backbone_output`): every process runs as many as
    the busiest, the idle ones a one-token forward through the same path."""
    one = torch.ones(1, 1, dtype=torch.long, device=next(model.parameters()).device)
    with lockstep(model, idle_forward=lambda: backbone_output(model, one, input_ids=one)):
        yield


def check_batch(name: str, input_ids_BL: torch.Tensor, attention_mask_BL: torch.Tensor, temperature: float,
           *masks_BT: torch.Tensor) -> None:
    if input_ids_BL.dim() != 2 or attention_mask_BL.shape != input_ids_BL.shape:
        raise ValueError(f"{name}: input_ids and attention_mask must both be (B, L), got "
                         f"{tuple(input_ids_BL.shape)} and {tuple(attention_mask_BL.shape)}")
    for mask_BT in masks_BT:
        if mask_BT.dim() != 2 or mask_BT.shape[0] != input_ids_BL.shape[0] or mask_BT.shape[1] >= input_ids_BL.shape[1]:
            raise ValueError(f"{name}: token masks must be (B, T) with T < L = {input_ids_BL.shape[1]}, got "
                             f"{tuple(mask_BT.shape)}")
    if not temperature > 0:
        raise ValueError(f"{name}: temperature must be > 0 (the sampling temperature), got {temperature}")


def zeros_BT(input_ids_BL: torch.Tensor, num_completion_tokens: int) -> torch.Tensor:
    return torch.zeros(input_ids_BL.shape[0], num_completion_tokens, dtype=torch.float32, device=input_ids_BL.device)


def completion_mask_BT(attention_mask_BL: torch.Tensor, num_completion_tokens: int) -> torch.Tensor:
    return align_to_completion(attention_mask_BL, num_completion_tokens, at="token").bool()  # (B, T)


# ---------------------------------------------------------------------------------------------------------------
# GRAIL: answer-NLL saliency (docs/methods/grail.md, steps 2–4).


def answer_nll_saliency(model: nn.Module, input_ids_BL: torch.Tensor, attention_mask_BL: torch.Tensor,
                        answer_BT: torch.Tensor, *, temperature: float, leaf: Leaf = "embeddings",
                        with_surprise: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """GRAIL's saliency s_{i,t} = ‖ ∂ℓ/∂h ⊙ h ‖₂ at the input position that predicts completion token t.

    ℓ = − Σ_i Σ_{t ∈ answer_i} log softmax(logits / temperature)[y_{i,t}], the logits at the predicting positions with
    the output layer's weights detached; h = the `leaf` (see `leaf_module`) as a fresh leaf. One forward and one
    backward to the leaf.

    Args:
        input_ids_BL, attention_mask_BL: (B, L) TRL layout.
        answer_BT: (B, T) bool, the answer-span tokens whose NLL is explained.
        temperature: the sampling temperature.
        leaf: "embeddings" (release default), "first", "middle", "last".
        with_surprise: also return each completion token's surprise −log π(y_t | y_<t) at `temperature` from the
            same forward (`output_layer.token_logprobs_BT`), as (saliency_BT, surprise_BT); both all 0 when no row
            has an answer.
    Returns:
        (B, T) float32 >= 0, 0 on padding. Rows without answer tokens get exactly 0 (rows are independent). If no row
        has an answer token, zeros without running the model (the caller keeps distributed processes in step).
    """
    check_batch("answer_nll_saliency", input_ids_BL, attention_mask_BL, temperature, answer_BT)
    T = answer_BT.shape[1]
    answer_BT = answer_BT.bool()
    if not answer_BT.any():
        return (zeros_BT(input_ids_BL, T),) * 2 if with_surprise else zeros_BT(input_ids_BL, T)
    rows, cols = answer_BT.nonzero(as_tuple=True)
    targets_BT = align_to_completion(input_ids_BL, T, at="token")
    mask_BT = completion_mask_BT(attention_mask_BL, T)
    with torch.enable_grad(), unsharded(model), _fresh_leaf(leaf_module(model, leaf)) as captured:
        hidden_BLD = hidden_states_BLD(model, attention_mask_BL, input_ids=input_ids_BL)
        if len(captured) != 1:
            raise RuntimeError(f"answer_nll_saliency: the leaf module ran {len(captured)} times in one forward")
        hidden_BTD = align_to_completion(hidden_BLD, T, at="predicting")
        logp_NV = torch.log_softmax(output_logits(model, hidden_BTD[rows, cols], temperature), dim=-1)
        nll = -logp_NV.gather(1, targets_BT[rows, cols, None]).sum()
        if with_surprise:  # before the backward: a sharded model (FSDP2) releases its gathered weights after it
            surprise_BT = -token_logprobs_BT(model, hidden_BTD.detach(), mask_BT, targets_BT, temperature)
        grad_BLD = leaf_gradient(nll, captured[0])
    saliency_BT = align_to_completion(gradient_activation_saliency(grad_BLD, captured[0]), T, at="predicting")
    saliency_BT = (saliency_BT * mask_BT).detach()  # (B, T)
    return (saliency_BT, surprise_BT) if with_surprise else saliency_BT


# ---------------------------------------------------------------------------------------------------------------
# Entropy control (docs/methods/entropy.md).


@torch.no_grad()
def token_entropies(model: nn.Module, input_ids_BL: torch.Tensor, attention_mask_BL: torch.Tensor,
                    num_completion_tokens: int, *, temperature: float, chunk_positions: int = 1024) -> torch.Tensor:
    """Entropy of softmax(logits / temperature) at the position that predicts each completion token: the entropy of
    the distribution the token was sampled from. No gradient.

    Args:
        input_ids_BL, attention_mask_BL: (B, L) TRL layout.
        num_completion_tokens: T.
        temperature: the sampling temperature.
        chunk_positions: logits are formed for at most this many positions at a time (memory: chunk_positions × V
            float32).
    Returns:
        (B, T) float32 >= 0, 0 on padding.
    """
    T = num_completion_tokens
    check_batch("token_entropies", input_ids_BL, attention_mask_BL, temperature)
    mask_BT = completion_mask_BT(attention_mask_BL, T)
    if not mask_BT.any():
        return zeros_BT(input_ids_BL, T)
    with unsharded(model):
        hidden_BTD = align_to_completion(hidden_states_BLD(model, attention_mask_BL, input_ids=input_ids_BL), T,
                                         at="predicting")
        return per_position_BT(model, hidden_BTD, mask_BT, temperature,
                               lambda logits_NV, r, c: entropy_from_logits(logits_NV), chunk_positions)
