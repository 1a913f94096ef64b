"""The built-in methods: GRPO, GRAIL, OAR-G, OAR-P and the random and entropy controls (docs/methods/), as
`MethodSpec` entries (`BUILTIN`) with their probes and pipelines. `grail.methods.table` registers them first; the
methods from the literature (KTAE, span masking, EAPO) are plug-ins registered the way any user's method is
(`grail.methods.literature`).
"""

from __future__ import annotations

import torch

from grail.methods import bilevel, core, oar_probes, probes
from grail.methods.spans import AnswerSpans
from grail.methods.spec import MethodOption, MethodSpec, ProbeBatch, TokenWeights
from grail.options.choices import WeightingOptions

__all__ = ["BILEVEL_READS", "BUILTIN", "OAR_P_FLOOR", "SALIENCY_READS", "bilevel_pipeline", "oar_p_floor",
           "oar_p_signal", "saliency_pipeline", "scored_tokens", "entropy_probe", "pad_token_id", "uniform_pipeline",
           "zscore_tokens"]

# The option fields each reusable piece reads (`MethodSpec.reads`): a plug-in that reuses a pipeline or a row
# selection adds these to its own.
SALIENCY_READS = ("rollout_symmetry", "weight_mean", "weight_std", "weight_min", "weight_max", "zscore_scope",
                  "answer_nll_span")  # saliency_pipeline (answer_nll_span: zscore_scope="to_answer"); rows="saliency"
BILEVEL_READS = ("oar_variant", "oar_scope", "oar_distribution", "oar_quantile", "oar_beta", "oar_floor")
GRAIL_PROBE_READS = ("saliency_leaf", "saliency_path")  # _saliency_probe and its fused path


def scored_tokens(spans: AnswerSpans, mask_BT: torch.Tensor, options: WeightingOptions) -> torch.Tensor:
    """(B, T) bool: OAR's scored tokens: the reasoning segment, or every real completion token."""
    return mask_BT.clone() if options.oar_scope == "completion" else spans.reasoning_BT & mask_BT


def zscore_tokens(spans: AnswerSpans, mask_BT: torch.Tensor, options: WeightingOptions) -> torch.Tensor:
    """(B, T) bool: the tokens GRAIL's per-row z-score uses: every real token (`zscore_scope="completion"`, the
    release), or those up to and including the last token of the answer NLL span (`"to_answer"`)."""
    if options.zscore_scope == "to_answer":
        return core.tokens_through_span(spans.probe_span(options.answer_nll_span), mask_BT)
    return mask_BT.bool()


# ---- probes: (model, rows, options, generator) → (rows, T) signal ----------------------------------------------
def _saliency_probe(model, rows: ProbeBatch, options: WeightingOptions, generator) -> torch.Tensor:
    return probes.answer_nll_saliency(model, rows.input_ids_BL, rows.attention_mask_BL, rows.answer_BT,
                                      temperature=options.temperature, leaf=options.saliency_leaf)


def entropy_probe(model, rows: ProbeBatch, options: WeightingOptions, generator) -> torch.Tensor:
    return probes.token_entropies(model, rows.input_ids_BL, rows.attention_mask_BL, rows.answer_BT.shape[1],
                                  temperature=options.temperature)


def _oar_g_probe(model, rows: ProbeBatch, options: WeightingOptions, generator) -> torch.Tensor:
    release = options.oar_variant == "grail_release"  # the GRAIL release's own OAR-G (docs/methods/oar_g.md)
    return oar_probes.oar_g_importance(model, rows.input_ids_BL, rows.attention_mask_BL, rows.scored_BT, rows.answer_BT,
                                   distribution=options.oar_distribution, noise_std=options.oar_noise_std,
                                   temperature=1.0 if release else options.temperature, generator=generator,
                                   at="predicting" if release else "token", noisy_product=release)


OAR_P_SPAN = "oar_p_span_tokens"  # the span baseline's k (1: token-level OAR-P)


def oar_p_signal(model, rows: ProbeBatch, options: WeightingOptions, span_tokens: int = 1) -> torch.Tensor:
    """OAR-P's importance on `rows` with the run's OAR options (`span_tokens` > 1: the span baseline)."""
    return oar_probes.oar_p_importance(model, rows.input_ids_BL, rows.attention_mask_BL, rows.scored_BT, rows.answer_BT,
                                   distribution=options.oar_distribution, pad_token_id=pad_token_id(model),
                                   temperature=options.temperature, chunk_tokens=options.perturbation_chunk_tokens,
                                   span_tokens=span_tokens)


def _oar_p_probe(model, rows: ProbeBatch, options: WeightingOptions, generator) -> torch.Tensor:
    return oar_p_signal(model, rows, options, span_tokens=options.method_options[OAR_P_SPAN])


def pad_token_id(model) -> int:
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
    """w = 1 on every real token (GRPO)."""
    return TokenWeights.simple(core.uniform_weights(mask_BT), spans, rows_B)


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
    return TokenWeights.simple(out.weights_BT, spans, rows_B, out.fallback_B)


def _oar_check(options: WeightingOptions, config) -> str | None:
    if options.zscore_scope != "completion":
        return (f"zscore_scope={options.zscore_scope!r}, token_weighting={options.token_weighting!r}: OAR has no "
                f"z-score (its scored tokens are oar_scope's, and oar_scope='reasoning' already stops before the box); "
                f"use zscore_scope='completion' with {options.token_weighting}")
    return None


def _oar_p_check(options: WeightingOptions, config) -> str | None:
    if options.oar_variant == "grail_release":
        return ("oar_variant='grail_release', token_weighting='oar_p': the GRAIL release has no OAR-P; use "
                "oar_variant='oar_excerpt' with token_weighting='oar_p'")
    return _oar_check(options, config)


def _top_entropy_check(options: WeightingOptions, config) -> str | None:
    if config is not None and not 0 <= config.top_entropy_quantile < 1:
        return (f"top_entropy_quantile={config.top_entropy_quantile!r}: top_entropy keeps the tokens above that "
                f"entropy quantile; set it in [0, 1) (0.2 keeps the top 20%), or use token_weighting='none'")
    return None


_GRAIL_PAPER = "Pala et al. 2026, arXiv 2606.04889 (GRAIL); released code: declare-lab/grail"
_OAR_PAPER = "Li et al. 2026, arXiv 2601.07408 (OAR)"

BUILTIN: tuple[MethodSpec, ...] = (
    MethodSpec("none", "GRPO", probe=None, pipeline=uniform_pipeline, rows="none",
               title="GRPO: every token gets the sequence advantage (w = 1)",
               summary="The baseline every method is compared with: TRL's GRPO loss, unchanged.",
               cost="nothing", reference="Shao et al. 2024, arXiv 2402.03300 (GRPO)"),
    MethodSpec("grail", "GRAIL", _saliency_probe, saliency_pipeline, rows="saliency", fuse="saliency",
               reads=SALIENCY_READS + GRAIL_PROBE_READS, preserves_mass=False,
               title="GRAIL (gradient × activation saliency of the answer's NLL)",
               summary="The saliency of each token's activation for the negative log-likelihood of the answer box, "
                       "through a per-row z-score, an affine map and a clip, with fixed weights on the answer span "
                       "(docs/methods/grail.md).",
               example="saliency_leaf='middle', rollout_symmetry='both'",
               cost="one forward and one backward to the leaf on the rows it reweights (none when fused with TRL's "
                    "forward)", reference=_GRAIL_PAPER),
    MethodSpec("oar_g", "OAR-G", _oar_g_probe, bilevel_pipeline, rows="bilevel", check=_oar_check,
               reads=BILEVEL_READS + ("answer_nll_span", "oar_noise_std"),
               title="OAR-G (gradient proxy of the answer distribution's KL under embedding noise)",
               summary="The gradient of the KL between the clean and a noised answer distribution with respect to "
                       "each token's embedding noise, bi-level reshaped with a mass-preserving rescale "
                       "(docs/methods/oar_g.md).",
               example="oar_variant='grail_release' (GRAIL's OAR-G baseline, exactly)",
               cost="two forwards and one backward to the embeddings", reference=_OAR_PAPER),
    MethodSpec("oar_p", "OAR-P", _oar_p_probe, bilevel_pipeline, rows="bilevel", min_importance=oar_p_floor,
               reads=BILEVEL_READS + ("answer_nll_span", "oar_min_importance", "perturbation_chunk_tokens"),
               check=_oar_p_check, auroc=False,
               options=(MethodOption(OAR_P_SPAN, 1, "tokens replaced together in one perturbed copy, each getting the "
                                     "span's KL: about T/k copies instead of T (1: OAR-P itself)", minimum=1),),
               title="OAR-P (answer-distribution KL when each scored token is replaced by the pad token)",
               summary="One perturbed copy of the row per scored token, batched with a shared KV-cache prefix; the "
                       "KL of the answer distribution is the token's importance, bi-level reshaped as OAR-G's "
                       "(docs/methods/oar_p.md).",
               example="perturbation_chunk_tokens=8192 to bound memory",
               cost="one no-grad forward per scored token, batched in chunks that share the clean prefix",
               reference=_OAR_PAPER),
    MethodSpec("random", "random", _saliency_probe, saliency_pipeline, rows="saliency", fuse="saliency",
               permutes=True, reads=SALIENCY_READS + GRAIL_PROBE_READS, preserves_mass=False,
               title="Random control (GRAIL's weights for a row, permuted over its reasoning tokens)",
               summary="Same weight distribution as GRAIL's on every row, no saliency information: what GRAIL "
                       "gains over it is the information (docs/methods/random.md).",
               example="rollout_symmetry='both'",
               cost="as GRAIL's; same weight distribution, no saliency information", reference=_GRAIL_PAPER),
    MethodSpec("entropy", "entropy", entropy_probe, saliency_pipeline, rows="saliency", fuse="entropy",
               reads=SALIENCY_READS + ("saliency_path",), preserves_mass=False,
               title="Entropy control (token entropy through GRAIL's normalisation)",
               summary="The sampling distribution's entropy at each token instead of the saliency, through GRAIL's "
                       "pipeline: a cheap, gradient-free signal (docs/methods/entropy.md).",
               example="weight_std=1.0",
               cost="one no-grad forward (none when fused with TRL's forward)", reference=_GRAIL_PAPER),
    MethodSpec("top_entropy", "top-20% entropy", probe=None, pipeline=uniform_pipeline, rows="none",
               config={"top_entropy_quantile": 0.2}, check=_top_entropy_check,
               title="Top-entropy tokens only (TRL's top_entropy_quantile: the loss keeps the 20% highest-entropy "
                     "tokens)",
               summary="TRL's own option, exposed as an arm: in each micro-batch, the tokens whose entropy is at or "
                       "above the (1 − ρ) quantile over all processes keep their policy loss, the others get none; "
                       "Â = A everywhere (ρ = top_entropy_quantile, 0.2 as the paper recommends).",
               cost="nothing beyond GRPO (TRL's forward computes the entropies)",
               reference="Wang et al. 2025, arXiv 2506.01939 ('Beyond the 80/20 rule'); TRL GRPOConfig",
               open_choices=("The threshold is per micro-batch over all processes (TRL's implementation), not per "
                             "row or group; the KL term is not masked.",)),
)
