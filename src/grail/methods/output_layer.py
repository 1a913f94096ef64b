"""The output layer, from hidden rows to logits, and the per-position readers built on it (`grail.methods.probes`,
`grail.methods.oar_probes`, the label sets' log-probabilities).

Logits are formed only at the positions a caller needs: the output layer runs on selected hidden rows with its
weights detached, then the output transforms the model applies after it, read from its text config with TRL's rules
(`trl.trainer.utils.add_fused_lm_head`): a logit scale (`logit_scale`, `output_multiplier`, `lm_head_multiplier`, or
1 / `logits_scaling`: Cohere, Granite, Falcon-H1, MiniCPM), then soft-capping `c · tanh(z / c)`
(`final_logit_softcapping`: Gemma 2 and 3), then / temperature. The result equals the model's own logits / temperature
(tests/test_architectures.py). A model without a config or a linear output layer gets a `ValueError` naming the
model class, the missing piece and the fix (`MODEL_FIX`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from grail.methods.sharding import output_layer_weights

__all__ = ["at_least_float32", "logit_transform", "MODEL_FIX", "output_is_linear", "output_logits", "per_position_BT",
           "text_config", "token_logprobs_BT"]


# The fix every "cannot read this model" error ends with (here and in grail.methods.probes).
MODEL_FIX = ("grail's probes support Hugging Face causal LMs (`AutoModelForCausalLM`, e.g. LlamaForCausalLM, "
             "Qwen3ForCausalLM); for another model, give it ")


def text_config(model: nn.Module):
    config = getattr(model, "config", None)
    if config is None:
        raise ValueError(f"{type(model).__name__} has no `config`: the probes read num_hidden_layers and the output "
                         f"transforms from it. {MODEL_FIX}a transformers `PretrainedConfig` as `.config`.")
    return config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config


def at_least_float32(values: torch.Tensor) -> torch.dtype:
    return torch.promote_types(values.dtype, torch.float32)  # float32 at least (float64 stays float64)


def logit_transform(model: nn.Module) -> tuple[float, float | None]:
    """(scale, softcap) the model applies after its output layer: logits = c · tanh(scale · z / c) (softcap c), or
    scale · z (softcap None). Read from the text config with TRL's rules (module docstring)."""
    config = text_config(model)
    scale = getattr(config, "logit_scale", None)
    for name in ("output_multiplier", "lm_head_multiplier"):
        scale = getattr(config, name, None) if scale is None else scale
    logits_scaling = getattr(config, "logits_scaling", None)
    if scale is None and logits_scaling is not None:
        scale = logits_scaling if getattr(config, "model_type", None) == "hyperclovax" else 1 / logits_scaling
    return (1.0 if scale is None else float(scale)), getattr(config, "final_logit_softcapping", None)


def output_is_linear(model: nn.Module) -> bool:
    """Whether the logits are linear in the final hidden state (no soft-capping): only then is the output layer on a
    mean hidden state the mean of the logits."""
    return logit_transform(model)[1] is None


def _output_layer(model: nn.Module) -> nn.Module:
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    weight = getattr(head, "weight", None)
    shape = getattr(weight, "ds_shape", None) or getattr(weight, "shape", ())  # ZeRO-3: the full shape of a partition
    if not isinstance(weight, torch.Tensor) or len(shape) != 2:
        raise ValueError(f"output_logits: {type(model).__name__}.get_output_embeddings() "
                         f"{'is missing' if not callable(get) else f'returned {type(head).__name__}'}, not a linear "
                         f"output layer with a (V, D) `.weight`; the probes form logits only at the positions they "
                         f"need. {MODEL_FIX}get_output_embeddings() returning its lm_head (an nn.Linear).")
    return head


def output_logits(model: nn.Module, hidden_ND: torch.Tensor, temperature: float) -> torch.Tensor:
    """Output layer on selected hidden rows, its weights detached (no graph into them), then the model's logit scale
    and soft-capping (`logit_transform`), / temperature; float32 at least (a float64 model keeps float64: OAR-G's KL
    under σ = 1e-3 noise needs its precision). Equals the model's own logits / temperature (tested per architecture,
    tests/test_architectures.py). On a sharded model, only inside `unsharded(model)`."""
    head = _output_layer(model)
    weight, bias = output_layer_weights(model, head)
    logits = F.linear(hidden_ND.to(weight.dtype), weight, bias)
    logits = logits.to(at_least_float32(logits))  # (N, V)
    scale, softcap = logit_transform(model)
    if scale != 1.0:
        logits = logits * scale
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    return logits / temperature  # (N, V)


@torch.no_grad()
def per_position_BT(model: nn.Module, hidden_BTD: torch.Tensor, mask_BT: torch.Tensor, temperature: float,
                    read: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
                    chunk_positions: int = 1024, width: int | None = None) -> torch.Tensor:
    """(B, T) float32 `read(logits_NV, rows_N, cols_N)` → (N,) at every position of `mask_BT` (0 elsewhere), from the
    hidden states at the predicting positions; the output layer runs on at most `chunk_positions` positions at a time
    (memory: chunk_positions × V float32). With `width`, `read` gives (N, width) values from the same logits and the
    result is (B, T, width). No gradient."""
    out_BT = torch.zeros((*mask_BT.shape, width) if width is not None else mask_BT.shape, dtype=torch.float32,
                         device=mask_BT.device)
    rows, cols = mask_BT.nonzero(as_tuple=True)
    step = max(1, chunk_positions)
    for start in range(0, rows.numel(), step):
        r, c = rows[start : start + step], cols[start : start + step]
        out_BT[r, c] = read(output_logits(model, hidden_BTD[r, c], temperature), r, c).float()
    return out_BT


def token_logprobs_BT(model: nn.Module, hidden_BTD: torch.Tensor, mask_BT: torch.Tensor, targets_BT: torch.Tensor,
                      temperature: float, chunk_positions: int = 1024) -> torch.Tensor:
    """(B, T) float32 log softmax(logits / temperature)[targets_BT] at every position of `mask_BT` (0 elsewhere): the
    one reader of a token's log-probability (GRAIL's surprise, the label sets' log π). No gradient."""
    return per_position_BT(model, hidden_BTD, mask_BT, temperature, lambda logits_NV, r, c: torch.log_softmax(
        logits_NV, dim=-1).gather(1, targets_BT[r, c, None])[:, 0], chunk_positions)
