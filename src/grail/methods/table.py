"""The table of token-weighting methods: one `MethodSpec` per `token_weighting` choice, and `TokenWeights`.

Everything that differs between methods is an entry here: its probe (the model call that gives a per-token
signal), which rows it probes, how the signal becomes weights (GRAIL's saliency pipeline, OAR's bi-level
reshaping, or none), what the trainer's fused path takes from TRL's own forward, and the functional API's
documentation. `grail.methods.weighting` and `grail.training.trainer` read the entry and never branch on a method's
name; a new method is one entry (plus its Literal in `grail.options.choices.Method`, which a test holds equal to this
table's keys).

Rows whose weights cannot change the loss are not probed: a row with A_i = 0 has Â = 0 whatever its weights, and
(GRAIL, controls) a row outside `rollout_symmetry` or without a box gets uniform weights anyway.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Literal, NamedTuple

import torch

from grail.methods import bilevel, core, oar_probes, probes
from grail.methods.spans import AnswerSpans
from grail.options.choices import WeightingOptions

__all__ = ["METHODS", "OAR_P_FLOOR", "MethodSpec", "ProbeBatch", "TokenWeights", "method_spec", "oar_p_floor",
           "scored_tokens", "zscore_tokens"]


@dataclass
class TokenWeights:
    """Weights for one batch and what the diagnostics need to describe them. All (B, T) / (B,) tensors."""

    weights_BT: torch.Tensor  # float32, detached, 0 on padding
    reasoning_BT: torch.Tensor  # bool: real tokens before the answer box (every real token of a row with no box)
    normalised_BT: torch.Tensor  # bool: tokens whose weight came from GRAIL's normalisation (clip fractions)
    has_box_B: torch.Tensor  # bool: the row has a complete box with at least one answer token
    fallback_B: torch.Tensor  # bool: the probe's signal was zero/NaN/inf on the row → uniform weights
    probed_B: torch.Tensor  # bool: rows the probe ran on (weights that can change the loss)
    clip_BT: torch.Tensor  # int8: GRAIL's pre-override clipping, −1 low / +1 high (`core.SaliencyWeights.clip_BT`)
    reweighted_BT: torch.Tensor  # bool: real tokens of the rows GRAIL's normalisation ran on (release clip fractions)
    path: str = "none"  # "fused" (signal from the training forward), "separate", "skipped", "rollout", "none"
    seconds: float = 0.0  # wall time spent computing these weights

    BATCH_PREFIX = "grail_tw_"  # key prefix of the tensors stored in a TRL batch dict (`as_batch_entries`)

    @classmethod
    def tensor_fields(cls) -> list[str]:
        return [f.name for f in fields(cls) if f.name not in ("path", "seconds")]

    def as_batch_entries(self) -> dict[str, torch.Tensor]:
        """The tensors, for storing in a TRL batch dict (split and shuffled with it by row)."""
        return {self.BATCH_PREFIX + name: getattr(self, name) for name in self.tensor_fields()}

    @classmethod
    def in_batch(cls, inputs: dict) -> bool:
        return cls.BATCH_PREFIX + "weights_BT" in inputs

    @classmethod
    def from_batch(cls, inputs: dict, path: str) -> TokenWeights:
        """Rebuild from `as_batch_entries` entries of a batch dict."""
        return cls(**{name: inputs[cls.BATCH_PREFIX + name] for name in cls.tensor_fields()}, path=path)

    @classmethod
    def concat(cls, parts: Sequence[TokenWeights], path: str) -> TokenWeights:
        """Row-wise concatenation of the weights of consecutive chunks of one batch; seconds add up."""
        return cls(**{name: torch.cat([getattr(p, name) for p in parts]) for name in cls.tensor_fields()},
                   path=path, seconds=sum(p.seconds for p in parts))


class ProbeBatch(NamedTuple):
    """The probed rows of a batch, in TRL's layout (prompt left-padded, completion the last T columns)."""

    input_ids_BL: torch.Tensor
    attention_mask_BL: torch.Tensor
    answer_BT: torch.Tensor  # bool: the answer tokens the probe explains (`AnswerSpans.probe_span`)
    scored_BT: torch.Tensor  # bool: OAR's scored tokens (`scored_tokens`)


Probe = Callable[[torch.nn.Module, ProbeBatch, WeightingOptions, "torch.Generator | None"], torch.Tensor]
ToWeights = Callable[..., TokenWeights]


@dataclass(frozen=True)
class MethodSpec:
    """One token-weighting method. See the module docstring; `weighting.token_weights` runs it."""

    name: str
    label: str  # its name in tables (`grail demo`)
    probe: Probe | None  # (model, rows, options, generator) → (rows, T) signal; None: no probe (uniform)
    pipeline: Literal["uniform", "saliency", "bilevel"]  # how the signal becomes weights
    fuse: Literal["saliency", "entropy"] | None  # what the fused path reads from TRL's forward (None: no fusing)
    permutes: bool  # the weights are randomly permuted over each row's reasoning tokens (the random control)
    min_importance: Callable[..., float] | None = None  # (model, options) → the signal's rounding floor (OAR-P)
    unshardable: str = ""  # why its probe cannot run on a sharded model (ZeRO-3, FSDP); "" = it can
    title: str = ""  # the functional API's docstring: what it computes ...
    example: str = ""  # ... an example override ...
    cost: str = ""  # ... and what it costs


def scored_tokens(spans: AnswerSpans, mask_BT: torch.Tensor, options: WeightingOptions) -> torch.Tensor:
    """(B, T) bool: OAR's scored tokens: the reasoning segment, or every real completion token."""
    return mask_BT.clone() if options.oar_scope == "completion" else spans.reasoning_BT & mask_BT


def zscore_tokens(spans: AnswerSpans, mask_BT: torch.Tensor, options: WeightingOptions) -> torch.Tensor:
    """(B, T) bool: the tokens GRAIL's per-row z-score uses: every real token (`zscore_scope="completion"`, the
    release), or those up to and including the last token of the answer NLL span (`"to_answer"`)."""
    if options.zscore_scope == "to_answer":
        return core.tokens_through_span(spans.probe_span(options.answer_nll_span), mask_BT)
    return mask_BT.bool()


def probed_rows(spec: MethodSpec, adv_B: torch.Tensor, spans: AnswerSpans, mask_BT: torch.Tensor,
                options: WeightingOptions) -> torch.Tensor:
    """(B,) bool: rows whose weights can change the loss under `spec`, the only rows its probe needs."""
    rows_B = (adv_B != 0) & mask_BT.any(1)
    if spec.pipeline == "saliency":
        return rows_B & core.reweighted_rows(adv_B, options.rollout_symmetry) & spans.has_box_B
    if spec.pipeline == "bilevel":
        rows_B = rows_B & scored_tokens(spans, mask_BT, options).any(1)
        return rows_B & spans.has_box_B if options.oar_distribution == "answer_mean" else rows_B
    return torch.zeros_like(rows_B)


# ---- probes: (model, rows, options, generator) → (rows, T) signal ----------------------------------------------
def _saliency_probe(model, rows: ProbeBatch, options: WeightingOptions, generator) -> torch.Tensor:
    return probes.answer_nll_saliency(model, rows.input_ids_BL, rows.attention_mask_BL, rows.answer_BT,
                                      temperature=options.temperature, leaf=options.saliency_leaf)


def _entropy_probe(model, rows: ProbeBatch, options: WeightingOptions, generator) -> torch.Tensor:
    return probes.token_entropies(model, rows.input_ids_BL, rows.attention_mask_BL, rows.answer_BT.shape[1],
                                  temperature=options.temperature)


def _oar_g_probe(model, rows: ProbeBatch, options: WeightingOptions, generator) -> torch.Tensor:
    release = options.oar_variant == "grail_release"  # the GRAIL release's own OAR-G (docs/methods/oar_g.md)
    return oar_probes.oar_g_importance(model, rows.input_ids_BL, rows.attention_mask_BL, rows.scored_BT, rows.answer_BT,
                                   distribution=options.oar_distribution, noise_std=options.oar_noise_std,
                                   temperature=1.0 if release else options.temperature, generator=generator,
                                   at="predicting" if release else "token", noisy_product=release)


def _oar_p_probe(model, rows: ProbeBatch, options: WeightingOptions, generator) -> torch.Tensor:
    return oar_probes.oar_p_importance(model, rows.input_ids_BL, rows.attention_mask_BL, rows.scored_BT, rows.answer_BT,
                                   distribution=options.oar_distribution, pad_token_id=_pad_token_id(model),
                                   temperature=options.temperature, chunk_tokens=options.perturbation_chunk_tokens)


def _pad_token_id(model) -> int:
    for source in (getattr(model, "generation_config", None), model.config):
        pad = getattr(source, "pad_token_id", None)
        if pad is not None:
            return int(pad)
    raise ValueError("OAR-P substitutes the pad token, but the model has no pad_token_id; set "
                     "model.generation_config.pad_token_id (e.g. to the tokenizer's pad or eos id).")


# OAR-P's rounding floor by the model's parameter dtype (nats), when oar_min_importance is None. Measured on the
# warm-started tiny model, completion `7*5=35, 35-7=28, now 28-1=27. \boxed{27}`: the same KLs from a float32 and a
# float64 forward differ by at most 2.4e-9 (KL formed in float64 both times), so 1e-8 is above float32 rounding;
# a bfloat16 forward errs by up to 1.7e-5 with `last_position` (median 5e-7, as large as the signal) and by a
# median 4e-4 with `answer_mean`, hence 1e-4 for 16-bit models.
OAR_P_FLOOR = {32: 1e-8, 16: 1e-4}


def oar_p_floor(model, options: WeightingOptions) -> float:
    """OAR-P's rounding floor: `oar_min_importance`, or by the model's dtype (`OAR_P_FLOOR`) when it is None."""
    if options.oar_min_importance is not None:
        return options.oar_min_importance
    dtype = next(model.parameters()).dtype if model is not None else torch.float32
    return OAR_P_FLOOR[16] if torch.finfo(dtype).bits <= 16 else OAR_P_FLOOR[32]


# ---- pipelines: signal → weights (pure tensor code) -------------------------------------------------------------
def uniform_pipeline(spec, signal_BT, adv_B, spans, mask_BT, rows_B, options, generator, min_importance):
    no_clip = torch.zeros(mask_BT.shape, dtype=torch.int8, device=mask_BT.device)
    return TokenWeights(core.uniform_weights(mask_BT), spans.reasoning_BT, torch.zeros_like(mask_BT),
                        spans.has_box_B, torch.zeros_like(rows_B), rows_B, no_clip, torch.zeros_like(mask_BT))


def saliency_pipeline(spec, signal_BT, adv_B, spans, mask_BT, rows_B, options, generator, min_importance):
    """GRAIL's: log → per-row z-score → affine → clip, then the answer-span overrides (docs/methods/grail.md)."""
    out = core.grail_weights_from_saliency(
        signal_BT, adv_B, mask_BT, spans.answer_BT, spans.after_BT, rollout_symmetry=options.rollout_symmetry,
        weight_mean=options.weight_mean, weight_std=options.weight_std, weight_min=options.weight_min,
        weight_max=options.weight_max, scope_BT=zscore_tokens(spans, mask_BT, options))
    weights_BT = out.weights_BT
    if spec.permutes:
        weights_BT = core.permuted_weights(weights_BT, spans.reasoning_BT & mask_BT, generator)
    # The release's clip fractions count every real token of the rows it normalised. grail does not compute the
    # saliency of rows with A = 0 (Â = 0 whatever w), so they are left out rather than counted unclipped.
    reweighted_BT = (out.reweighted_B & (adv_B != 0))[:, None] & mask_BT.bool()
    return TokenWeights(weights_BT, spans.reasoning_BT, out.normalised_BT, spans.has_box_B,
                        out.fallback_B & rows_B, rows_B, out.clip_BT, reweighted_BT)


def bilevel_pipeline(spec, signal_BT, adv_B, spans, mask_BT, rows_B, options, generator, min_importance):
    """OAR's: normalised importance → bi-level reshaping with a mass-preserving rescale (docs/methods/oar_g.md)."""
    out = bilevel.oar_weights_from_importance(
        signal_BT, mask_BT, scored_tokens(spans, mask_BT, options), quantile=options.oar_quantile,
        beta=options.oar_beta, floor=options.oar_floor, min_importance=min_importance,
        tau_rule="sorted_index" if options.oar_variant == "grail_release" else "interpolate")
    no_clip = torch.zeros(mask_BT.shape, dtype=torch.int8, device=mask_BT.device)
    return TokenWeights(out.weights_BT, spans.reasoning_BT, torch.zeros_like(mask_BT), spans.has_box_B,
                        out.fallback_B & rows_B, rows_B, no_clip, torch.zeros_like(mask_BT))


_OUTPUT_SHARD = ("its probe applies the output layer's weight outside the model's forward "
                 "(grail.methods.probes.output_logits), where ZeRO-3/FSDP hold only this process's shard of it")

PIPELINES: dict[str, ToWeights] = {"uniform": uniform_pipeline, "saliency": saliency_pipeline,
                                   "bilevel": bilevel_pipeline}

METHODS: dict[str, MethodSpec] = {spec.name: spec for spec in (
    MethodSpec("none", "GRPO", probe=None, pipeline="uniform", fuse=None, permutes=False),
    MethodSpec("grail", "GRAIL", _saliency_probe, "saliency", fuse="saliency", permutes=False,
               title="GRAIL (gradient × activation saliency of the answer's NLL)",
               example="saliency_leaf='middle', rollout_symmetry='both'",
               cost="one forward and one backward to the leaf on the rows it reweights"),
    MethodSpec("oar_g", "OAR-G", _oar_g_probe, "bilevel", fuse=None, permutes=False, unshardable=_OUTPUT_SHARD,
               title="OAR-G (gradient proxy of the answer distribution's KL under embedding noise)",
               example="oar_variant='grail_release' (GRAIL's OAR-G baseline, exactly)",
               cost="two forwards and one backward to the embeddings"),
    MethodSpec("oar_p", "OAR-P", _oar_p_probe, "bilevel", fuse=None, permutes=False, min_importance=oar_p_floor,
               unshardable="its probe runs a data-dependent number of forwards per process (one per row and one per "
                           "chunk of perturbed copies), so the processes' parameter gathers would not match and the "
                           "run would hang; and " + _OUTPUT_SHARD,
               title="OAR-P (answer-distribution KL when each scored token is replaced by the pad token; "
                     ")",
               example="perturbation_chunk_tokens=8192 to bound memory",
               cost="one no-grad forward per scored token, batched in chunks that share the clean prefix"),
    MethodSpec("random", "random", _saliency_probe, "saliency", fuse="saliency", permutes=True,
               title="Random control (GRAIL's weights for a row, permuted over its reasoning tokens)",
               example="rollout_symmetry='both'",
               cost="as GRAIL's; same weight distribution, no saliency information"),
    MethodSpec("entropy", "entropy", _entropy_probe, "saliency", fuse="entropy", permutes=False,
               title="Entropy control (token entropy through GRAIL's normalisation)",
               example="weight_std=1.0",
               cost="one no-grad forward (gradient-free)"),
)}


def method_spec(name: str) -> MethodSpec:
    """The entry of `token_weighting=name`; the error lists the names."""
    try:
        return METHODS[name]
    except KeyError:
        raise ValueError(f"token_weighting={name!r} is not a method; choose one of {', '.join(METHODS)}.") from None
