"""Token weights for one batch: the functional API (usable without TRL) and the one place a method is chosen.

`token_weights(model, tokenizer, batch, adv_B, options)` runs the method's probe on the model (`grail.probes`),
turns the per-token signal into weights with the pure functions of `grail.core`, and returns a `TokenWeights`.
`GRAILTrainer` calls exactly this (optionally handing in a signal it already has, see `signal_BT`); other
trainers (verl, a custom loop) call the one-line wrappers at the bottom (`grail_weights`, `oar_g_weights`, ...),
which take a Hugging Face causal LM, prompt and completion ids with masks, and the sequence advantages, and
return the (B, T) weights. Use them as Â = weights_BT · A[:, None] in your policy-gradient loss.

Rows whose weights cannot change the loss are not probed: a row with A_i = 0 has Â = 0 whatever its weights,
and (GRAIL, controls) a row outside `rollout_symmetry` or without a box gets uniform weights anyway. Their
signal is taken constant, which gives them the weights the method would give a row with no information.
This is exact for the loss and saves the probe's cost on those rows (on GRPO batches, every group whose
completions all agree).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace

import torch

from grail import core, probes
from grail.options import Method, WeightingOptions
from grail.spans import AnswerSpans, answer_spans

SALIENCY_METHODS = ("grail", "random")  # the answer-NLL saliency probe (fusable with the training forward)
SIGNAL_METHODS = ("grail", "random", "entropy")  # signal → log-z-score → affine → clip, GRAIL's pipeline
OAR_METHODS = ("oar_g", "oar_p")  # importance → bi-level reshaping


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
    path: str = "none"  # "fused" (signal from the training forward), "separate", "skipped", "none"
    seconds: float = 0.0  # wall time spent computing these weights

    @classmethod
    def tensor_fields(cls) -> list[str]:
        return [f.name for f in fields(cls) if f.name not in ("path", "seconds")]

    def as_batch_entries(self) -> dict[str, torch.Tensor]:
        """The tensors, for storing in a TRL batch dict (split and shuffled with it by row)."""
        return {f"weights_{name}": getattr(self, name) for name in self.tensor_fields()}

    @classmethod
    def from_batch(cls, inputs: dict, path: str) -> TokenWeights:
        """Rebuild from `as_batch_entries` entries of a batch dict."""
        return cls(**{name: inputs[f"weights_{name}"] for name in cls.tensor_fields()}, path=path)

    @classmethod
    def concat(cls, parts: Sequence[TokenWeights], path: str) -> TokenWeights:
        """Row-wise concatenation of the weights of consecutive chunks of one batch; seconds add up."""
        return cls(**{name: torch.cat([getattr(p, name) for p in parts]) for name in cls.tensor_fields()},
                   path=path, seconds=sum(p.seconds for p in parts))


def batch_spans(tokenizer, completion_ids_BT: torch.Tensor, mask_BT: torch.Tensor,
                options: WeightingOptions) -> AnswerSpans:
    """The answer spans the options ask for (a method that reads no box still gets them, for the diagnostics)."""
    return answer_spans(tokenizer, completion_ids_BT, mask_BT, box=options.answer_box)


def scored_tokens(spans: AnswerSpans, mask_BT: torch.Tensor, options: WeightingOptions) -> torch.Tensor:
    """(B, T) bool: OAR's scored tokens: the reasoning segment, or every real completion token."""
    return mask_BT.clone() if options.oar_scope == "completion" else spans.reasoning_BT & mask_BT


def probe_rows(adv_B: torch.Tensor, spans: AnswerSpans, mask_BT: torch.Tensor,
               options: WeightingOptions) -> torch.Tensor:
    """(B,) bool: rows whose weights can change the loss, the only rows a probe needs to run on."""
    method = options.token_weighting
    rows_B = (adv_B != 0) & mask_BT.any(1)
    if method in SIGNAL_METHODS:
        return rows_B & core.reweighted_rows(adv_B, options.rollout_symmetry) & spans.has_box_B
    if method in OAR_METHODS:
        rows_B = rows_B & scored_tokens(spans, mask_BT, options).any(1)
        return rows_B & spans.has_box_B if options.oar_distribution == "answer_mean" else rows_B
    return torch.zeros_like(rows_B)


def run_probe(model, input_ids_BL: torch.Tensor, attention_mask_BL: torch.Tensor, spans: AnswerSpans,
              mask_BT: torch.Tensor, rows_B: torch.Tensor, options: WeightingOptions,
              generator: torch.Generator | None = None) -> torch.Tensor:
    """The method's per-token signal (B, T) on `rows_B` (other rows 0), computed on those rows only."""
    T = mask_BT.shape[1]
    index = rows_B.nonzero().squeeze(1)
    ids, attn = input_ids_BL[index], attention_mask_BL[index]
    answer = spans.probe_span(options.answer_nll_span)[index]
    method = options.token_weighting
    if method in SALIENCY_METHODS:
        signal = probes.answer_nll_saliency(model, ids, attn, answer, temperature=options.temperature,
                                            leaf=options.saliency_leaf)
    elif method == "entropy":
        signal = probes.token_entropies(model, ids, attn, T, temperature=options.temperature)
    elif method == "oar_g":
        release = options.oar_variant == "grail_release"
        signal = probes.oar_g_importance(model, ids, attn, scored_tokens(spans, mask_BT, options)[index], answer,
                                         distribution=options.oar_distribution, noise_std=options.oar_noise_std,
                                         temperature=1.0 if release else options.temperature, generator=generator,
                                         at="predicting" if release else "token", noisy_product=release)
    elif method == "oar_p":
        pad = _pad_token_id(model)
        signal = probes.oar_p_importance(model, ids, attn, scored_tokens(spans, mask_BT, options)[index], answer,
                                         distribution=options.oar_distribution, pad_token_id=pad,
                                         temperature=options.temperature,
                                         chunk_tokens=options.perturbation_chunk_tokens)
    else:
        raise ValueError(f"token_weighting={method!r} has no probe")
    full = torch.zeros(mask_BT.shape, dtype=torch.float32, device=mask_BT.device)
    full[index] = signal.to(full.device, torch.float32)
    return full


def weights_from_signal(signal_BT: torch.Tensor, adv_B: torch.Tensor, spans: AnswerSpans, mask_BT: torch.Tensor,
                        rows_B: torch.Tensor, options: WeightingOptions,
                        generator: torch.Generator | None = None, min_importance: float = 0.0) -> TokenWeights:
    """Turn a probe's signal into weights (pure tensor code; the single branch on the method). `min_importance`:
    OAR's rounding floor in nats (`oar_p_floor` for OAR-P; the caller passes 0 for OAR-G, which has none)."""
    method = options.token_weighting
    # Rows not probed get a constant signal: the weights the method gives a row with no information.
    signal_BT = torch.where(rows_B[:, None], signal_BT.float(), torch.ones_like(signal_BT, dtype=torch.float32))
    no_fallback = torch.zeros_like(rows_B)
    no_clip = torch.zeros(mask_BT.shape, dtype=torch.int8, device=mask_BT.device)
    if method == "none":
        return TokenWeights(core.uniform_weights(mask_BT), spans.reasoning_BT, torch.zeros_like(mask_BT),
                            spans.has_box_B, no_fallback, rows_B, no_clip, torch.zeros_like(mask_BT))
    if method in SIGNAL_METHODS:
        out = core.grail_weights_from_saliency(
            signal_BT, adv_B, mask_BT, spans.answer_BT, spans.after_BT, rollout_symmetry=options.rollout_symmetry,
            weight_mean=options.weight_mean, weight_std=options.weight_std, weight_min=options.weight_min,
            weight_max=options.weight_max)
        weights_BT = out.weights_BT
        if method == "random":
            weights_BT = core.permuted_weights(weights_BT, spans.reasoning_BT & mask_BT, generator)
        # The release's clip fractions count every real token of the rows it normalised. grail does not compute
        # the saliency of rows with A = 0 (Â = 0 whatever w), so they are left out rather than counted unclipped.
        reweighted_BT = (out.reweighted_B & (adv_B != 0))[:, None] & mask_BT.bool()
        return TokenWeights(weights_BT, spans.reasoning_BT, out.normalised_BT, spans.has_box_B,
                            out.fallback_B & rows_B, rows_B, out.clip_BT, reweighted_BT)
    if method in OAR_METHODS:
        scored_BT = scored_tokens(spans, mask_BT, options)
        out = core.oar_weights_from_importance(
            signal_BT, mask_BT, scored_BT, quantile=options.oar_quantile, beta=options.oar_beta,
            floor=options.oar_floor, min_importance=min_importance,
            tau_rule="sorted_index" if options.oar_variant == "grail_release" else "interpolate")
        return TokenWeights(out.weights_BT, spans.reasoning_BT, torch.zeros_like(mask_BT), spans.has_box_B,
                            out.fallback_B & rows_B, rows_B, no_clip, torch.zeros_like(mask_BT))
    raise ValueError(f"unknown token_weighting {method!r}")


def token_weights(model, tokenizer, input_ids_BL: torch.Tensor, attention_mask_BL: torch.Tensor,
                  mask_BT: torch.Tensor, adv_B: torch.Tensor, options: WeightingOptions, *,
                  spans: AnswerSpans | None = None, signal_BT: torch.Tensor | None = None,
                  generator: torch.Generator | None = None,
                  any_process: Callable[[bool], bool] = bool) -> TokenWeights:
    """Weights for one batch in TRL's layout (prompt left-padded, completion right-padded after it).

    Args:
        model: a Hugging Face causal LM (unwrapped: not the DDP wrapper).
        tokenizer: its tokenizer (finds the `\\boxed{}` answer span from the completion ids).
        input_ids_BL, attention_mask_BL: (B, L) prompt ⊕ completion; the completion is the last T columns.
        mask_BT: (B, T) bool, real completion tokens that enter the loss.
        adv_B: (B,) sequence advantages A_i.
        options: `WeightingOptions`.
        spans: precomputed `answer_spans(...)` (the trainer computes them once per rollout batch).
        signal_BT: a precomputed per-token signal (the trainer's fused saliency, or TRL's entropies); skips
            the probe. Must be valid on `probe_rows(...)`.
        generator: RNG for the random control's permutation and OAR-G's noise (None → torch's global RNG).
        any_process: reduces a local bool over all processes (the trainer passes an all-gather). If no row
            needs the probe on any process, the probe is skipped; if another process needs it, this one runs
            it too (on its own rows, result unused), so sharded models run the same collectives everywhere.
    Returns:
        `TokenWeights`; `weights_BT` is (B, T) float32, detached, 0 on padding.
    """
    start = time.perf_counter()
    if spans is None:
        spans = batch_spans(tokenizer, input_ids_BL[:, -mask_BT.shape[1]:], mask_BT, options)
    rows_B = probe_rows(adv_B, spans, mask_BT, options)
    path = "none"
    if options.token_weighting != "none" and signal_BT is None:
        local_any = bool(rows_B.any())
        if any_process(local_any):
            run_rows = rows_B if local_any else mask_BT.any(1)
            run_spans = spans if local_any else spans._replace(answer_BT=mask_BT, box_BT=mask_BT)  # something to probe
            signal_BT = run_probe(model, input_ids_BL, attention_mask_BL, run_spans, mask_BT, run_rows, options,
                                  generator)
            path = "separate"
        else:
            path = "skipped"
    elif signal_BT is not None:
        path = "fused"
    if signal_BT is None:
        signal_BT = torch.zeros(mask_BT.shape, dtype=torch.float32, device=mask_BT.device)
    floor = oar_p_floor(model, options) if options.token_weighting == "oar_p" else 0.0
    result = weights_from_signal(signal_BT, adv_B, spans, mask_BT, rows_B, options, generator, floor)
    result.path, result.seconds = path, time.perf_counter() - start
    return result


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


def _pad_token_id(model) -> int:
    for source in (getattr(model, "generation_config", None), model.config):
        pad = getattr(source, "pad_token_id", None)
        if pad is not None:
            return int(pad)
    raise ValueError("OAR-P substitutes the pad token, but the model has no pad_token_id; set "
                     "model.generation_config.pad_token_id (e.g. to the tokenizer's pad or eos id).")


# ---- the functional API: one function per method ---------------------------------------------------------

def _weights_for(method: Method, model, tokenizer, prompt_ids, prompt_mask, completion_ids, completion_mask,
                 advantages, options: WeightingOptions | None, overrides: dict) -> torch.Tensor:
    options = replace(options or WeightingOptions(), token_weighting=method, **overrides)
    input_ids_BL = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask_BL = torch.cat([prompt_mask, completion_mask], dim=1)
    return token_weights(model, tokenizer, input_ids_BL, attention_mask_BL, completion_mask.bool(),
                         advantages, options).weights_BT


_API_DOC = """{title} token weights for a batch, without TRL. Returns (B, T) float32 weights (0 on padding).

    Args:
        model: Hugging Face causal LM (e.g. `AutoModelForCausalLM.from_pretrained(...)`), not DDP-wrapped.
        tokenizer: its tokenizer (the answer box is found in the decoded completion).
        prompt_ids, prompt_mask: (B, P) prompts, LEFT-padded (mask 1 = real token).
        completion_ids, completion_mask: (B, T) completions, RIGHT-padded.
        advantages: (B,) sequence advantages A_i (e.g. group-relative rewards).
        options: a `WeightingOptions` (default: the released values); keyword overrides win over it,
            e.g. `{example}`.
    The token advantage is Â = weights · advantages[:, None]. {notes}
    """


def _method_function(method: Method, title: str, example: str, notes: str) -> Callable[..., torch.Tensor]:
    def weights(model, tokenizer, prompt_ids, prompt_mask, completion_ids, completion_mask, advantages,
                options: WeightingOptions | None = None, **overrides) -> torch.Tensor:
        return _weights_for(method, model, tokenizer, prompt_ids, prompt_mask, completion_ids, completion_mask,
                            advantages, options, overrides)

    weights.__name__ = weights.__qualname__ = f"{method}_weights"
    weights.__doc__ = _API_DOC.format(title=title, example=example, notes=notes)
    return weights


grail_weights = _method_function(
    "grail", title="GRAIL (gradient × activation saliency of the answer's NLL; METHODS.md 2)",
    example="saliency_leaf='middle', rollout_symmetry='both'",
    notes="Cost: one forward and one backward to the leaf on the rows it reweights.")
oar_g_weights = _method_function(
    "oar_g", title="OAR-G (gradient proxy of the answer distribution's KL under embedding noise; METHODS.md 3)",
    example="oar_variant='grail_release' (GRAIL's OAR-G baseline, exactly)",
    notes="Cost: two forwards and one backward to the embeddings.")
oar_p_weights = _method_function(
    "oar_p", title="OAR-P (answer-distribution KL when each scored token is replaced by the pad token; METHODS.md 3)",
    example="perturbation_chunk_tokens=8192 to bound memory",
    notes="Cost: one no-grad forward per scored token, batched in chunks that share the clean prefix.")
random_weights = _method_function(
    "random", title="Random control (GRAIL's weights for a row, permuted over its reasoning tokens; METHODS.md 4)",
    example="rollout_symmetry='both'",
    notes="Same weight distribution as GRAIL, no saliency information.")
entropy_weights = _method_function(
    "entropy", title="Entropy control (token entropy through GRAIL's normalisation; METHODS.md 4)",
    example="weight_std=1.0",
    notes="Gradient-free: one no-grad forward.")

METHOD_FUNCTIONS: dict[str, Callable[..., torch.Tensor]] = {
    "grail": grail_weights, "oar_g": oar_g_weights, "oar_p": oar_p_weights, "random": random_weights,
    "entropy": entropy_weights,
}
