"""Token weights for one batch: the functional API (usable without TRL); it runs a method's `grail.methods.table` entry.

`token_weights(model, tokenizer, batch, adv_B, options)` runs the method's probe on the model (`grail.methods.probes`),
turns the per-token signal into weights with the pure functions of `grail.methods.core`, and returns a `TokenWeights`.
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
from collections.abc import Callable
from dataclasses import replace

import torch

from grail.methods import core, probes
from grail.methods.spans import AnswerSpans, align_to_completion, answer_spans
from grail.methods.spec import MethodSpec, ProbeBatch, TokenWeights, TrainingReads
from grail.methods.table import METHODS, checked, method_spec, probed_rows, scored_tokens
from grail.options.choices import WeightingOptions

__all__ = ["batch_spans", "fused_leaf_name", "fused_probe_signal", "fused_signal", "method_function", "probe_batch",
           "probe_rows", "run_probe", "token_weights", "weights_for", "weights_from_signal"]  # and `<method>_weights`


def batch_spans(tokenizer, completion_ids_BT: torch.Tensor, mask_BT: torch.Tensor,
                options: WeightingOptions) -> AnswerSpans:
    """The answer spans the options ask for (a method that reads no box still gets them, for the diagnostics)."""
    return answer_spans(tokenizer, completion_ids_BT, mask_BT, box=options.answer_box)


def _spec_of(options: WeightingOptions, spec: MethodSpec | None) -> MethodSpec:
    """The method's table entry: `spec` when the caller looked it up already (once per batch), else from the table."""
    if spec is None:
        return method_spec(options.token_weighting)
    if spec.name != options.token_weighting:
        raise ValueError(f"spec {spec.name!r} does not match token_weighting={options.token_weighting!r}")
    return spec


def _resolved(spec: MethodSpec, options: WeightingOptions) -> WeightingOptions:
    """`options` with the method's own options complete (defaults for those not given)."""
    if len(options.method_options) == len(spec.options):
        return options
    return replace(options, method_options=spec.resolve_options(options.method_options))


def probe_rows(adv_B: torch.Tensor, spans: AnswerSpans, mask_BT: torch.Tensor,
               options: WeightingOptions, spec: MethodSpec | None = None) -> torch.Tensor:
    """(B,) bool: rows whose weights can change the loss, the only rows a probe needs to run on. `spec`: the
    method's `METHODS` entry, when the caller has it (None: looked up from `options.token_weighting`)."""
    return probed_rows(_spec_of(options, spec), adv_B, spans, mask_BT, options)


def run_probe(model, input_ids_BL: torch.Tensor, attention_mask_BL: torch.Tensor, spans: AnswerSpans,
              mask_BT: torch.Tensor, rows_B: torch.Tensor, options: WeightingOptions,
              generator: torch.Generator | None = None, spec: MethodSpec | None = None, *,
              adv_B: torch.Tensor | None = None, tokenizer=None, state=None) -> torch.Tensor:
    """The method's per-token signal (B, T) on `rows_B` (other rows 0), computed on those rows only. `spec`: as
    for `probe_rows`. `adv_B` and `tokenizer` reach the probe in its `ProbeBatch` (methods that read the group's
    outcomes or the text), and so does `state`, the method's per-run state (`MethodSpec.state`; None: a fresh one for
    this call, for a method that keeps state)."""
    spec = _spec_of(options, spec)
    options = _resolved(spec, options)
    if spec.probe is None:
        raise ValueError(f"token_weighting={spec.name!r} has no probe")
    if model is None and spec.calls_model:
        raise ValueError(f"token_weighting={spec.name!r}: its probe calls the model, and model is None; pass the "
                         f"model (only a method declaring calls_model=False runs without one).")
    if state is None and spec.state is not None:
        state = spec.state()
    rows = probe_batch(input_ids_BL, attention_mask_BL, spans, mask_BT, rows_B, options, adv_B=adv_B,
                       tokenizer=tokenizer, state=state)
    return _on_rows(spec.probe(model, rows, options, generator), rows_B, mask_BT)


def _on_rows(signal: torch.Tensor, rows_B: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """(B, T) float32: a probe's signal on the probed rows (in order), 0 on the others."""
    full = torch.zeros(mask_BT.shape, dtype=torch.float32, device=mask_BT.device)
    full[rows_B.nonzero().squeeze(1)] = signal.to(full.device, torch.float32)
    return full


def fused_probe_signal(spec: MethodSpec, model, input_ids_BL: torch.Tensor, attention_mask_BL: torch.Tensor,
                       spans: AnswerSpans, mask_BT: torch.Tensor, rows_B: torch.Tensor, options: WeightingOptions,
                       logps_BT: torch.Tensor, entropies_BT: torch.Tensor, hidden_BLD: torch.Tensor | None,
                       generator: torch.Generator | None = None, *, adv_B: torch.Tensor | None = None,
                       tokenizer=None, state=None) -> torch.Tensor:
    """A `fuse="probe"` method's signal (B, T) on `rows_B` (other rows 0), from a training forward's reads instead of
    a forward of its own: `logps_BT`, `entropies_BT` (B, T, at the sampling temperature) and `hidden_BLD`, the output
    of the leaf `spec.fused_leaf` names in that forward (None when it names none), for the whole batch. The method's
    `fused_probe` gets them for its rows, detached, with the `ProbeBatch` `run_probe` would give its probe; it must
    give the probe's signal (`check_method`'s `fused` check holds them equal). With no row to probe it is 0 and the
    probe is not called (as the separate path skips it; the leaf is then not captured: `hidden_BLD` is None)."""
    if spec.fuse != "probe":
        raise ValueError(f"token_weighting={spec.name!r} reads no probe from the training forward (fuse={spec.fuse!r})")
    if not bool(rows_B.any()):
        return torch.zeros(mask_BT.shape, dtype=torch.float32, device=mask_BT.device)
    options = _resolved(spec, options)
    if state is None and spec.state is not None:
        state = spec.state()
    rows = probe_batch(input_ids_BL, attention_mask_BL, spans, mask_BT, rows_B, options, adv_B=adv_B,
                       tokenizer=tokenizer, state=state)
    index = rows_B.nonzero().squeeze(1)
    reads = TrainingReads(logps_BT[index].detach().float(), entropies_BT[index].detach().float(),
                          None if hidden_BLD is None else hidden_BLD[index].detach())
    return _on_rows(spec.fused_probe(model, rows, reads, options, generator), rows_B, mask_BT)


def probe_batch(input_ids_BL: torch.Tensor, attention_mask_BL: torch.Tensor, spans: AnswerSpans,
                mask_BT: torch.Tensor, rows_B: torch.Tensor, options: WeightingOptions, *,
                adv_B: torch.Tensor | None = None, tokenizer=None, state=None) -> ProbeBatch:
    """The `ProbeBatch` a probe is handed for `rows_B` of a batch (the rows in order; `options` resolved): what
    `run_probe` gives the method's probe, for a caller that calls a probe's parts itself."""
    index = rows_B.nonzero().squeeze(1)
    return ProbeBatch(input_ids_BL[index], attention_mask_BL[index],
                      spans.probe_span(options.answer_nll_span)[index], scored_tokens(spans, mask_BT, options)[index],
                      None if adv_B is None else adv_B[index], spans.reasoning_BT[index], tokenizer, state)


def weights_from_signal(signal_BT: torch.Tensor, adv_B: torch.Tensor, spans: AnswerSpans, mask_BT: torch.Tensor,
                        rows_B: torch.Tensor, options: WeightingOptions,
                        generator: torch.Generator | None = None, min_importance: float = 0.0,
                        spec: MethodSpec | None = None) -> TokenWeights:
    """Turn a probe's signal into weights with the method's pipeline (pure tensor code). `min_importance`: the
    signal's rounding floor (`MethodSpec.min_importance`; 0 for methods without one). With `permute_weights`, the
    pipeline's weights are shuffled over each row's reasoning tokens (`core.permuted_weights`). With
    `weight_rescale="row_mean"`, the pipeline's final weights (overrides and the random control's permutation
    done) are divided by their row mean (`grail.methods.core.row_mean_rescaled`), whatever the method. `spec`: as
    for `probe_rows`."""
    spec = _spec_of(options, spec)
    options = _resolved(spec, options)
    # Rows not probed get a constant signal: the weights the method gives a row with no information.
    signal_BT = torch.where(rows_B[:, None], signal_BT.float(), torch.ones_like(signal_BT, dtype=torch.float32))
    result = spec.pipeline(spec, signal_BT, adv_B, spans, mask_BT, rows_B, options, generator, min_importance)
    if options.permute_weights:  # the method's own permutation null (the random control's shuffle, any method)
        result.weights_BT = core.permuted_weights(result.weights_BT, spans.reasoning_BT & mask_BT.bool(), generator)
    if options.weight_rescale == "row_mean":
        result.weights_BT = core.row_mean_rescaled(result.weights_BT, mask_BT)
    return result


def token_weights(model, tokenizer, input_ids_BL: torch.Tensor, attention_mask_BL: torch.Tensor,
                  mask_BT: torch.Tensor, adv_B: torch.Tensor, options: WeightingOptions, *,
                  spans: AnswerSpans | None = None, signal_BT: torch.Tensor | None = None,
                  generator: torch.Generator | None = None,
                  any_process: Callable[[bool], bool] = bool, spec: MethodSpec | None = None,
                  state=None) -> TokenWeights:
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
        spec: the method's `METHODS` entry (the trainer passes the one it looked up when built); None looks it up
            from `options.token_weighting`, once for the whole batch.
        state: the method's per-run state (`MethodSpec.state`; the trainer keeps one per run); None: a fresh one.
            A process that probes only to keep in step with another (no row of its own) does not touch it.
    Returns:
        `TokenWeights`; `weights_BT` is (B, T) float32, detached, 0 on padding.
    """
    start = time.perf_counter()
    if spans is None:
        spans = batch_spans(tokenizer, input_ids_BL[:, -mask_BT.shape[1]:], mask_BT, options)
    spec = _spec_of(options, spec)
    options = _resolved(spec, options)
    rows_B = probed_rows(spec, adv_B, spans, mask_BT, options)
    path = "none"
    if spec.probe is not None and signal_BT is None:
        local_any = bool(rows_B.any())
        if not spec.calls_model:  # no model call: no collective to keep in step, so no other process's rows matter
            if local_any:
                signal_BT = run_probe(None, input_ids_BL, attention_mask_BL, spans, mask_BT, rows_B, options,
                                      generator, spec, adv_B=adv_B, tokenizer=tokenizer, state=state)
            path = "separate" if local_any else "skipped"
        elif any_process(local_any):
            run_rows = rows_B if local_any else mask_BT.any(1)
            run_spans = spans if local_any else spans._replace(answer_BT=mask_BT, box_BT=mask_BT)  # something to probe
            signal_BT = run_probe(model, input_ids_BL, attention_mask_BL, run_spans, mask_BT, run_rows, options,
                                  generator, spec, adv_B=adv_B, tokenizer=tokenizer,
                                  state=state if local_any else None)
            path = "separate"
        else:
            path = "skipped"
    elif signal_BT is not None:
        path = "fused"
    if signal_BT is None:
        signal_BT = torch.zeros(mask_BT.shape, dtype=torch.float32, device=mask_BT.device)
    floor = spec.rounding_floor(model, options)
    result = weights_from_signal(signal_BT, adv_B, spans, mask_BT, rows_B, options, generator, floor, spec)
    result.path, result.seconds = path, time.perf_counter() - start
    return result


def fused_leaf_name(spec: MethodSpec, options: WeightingOptions) -> str | None:
    """The leaf whose output the fused path captures in the training forward: `saliency_leaf` for fuse="saliency",
    the method's `fused_leaf` for fuse="probe", else none."""
    if spec.fuse == "saliency":
        return options.saliency_leaf
    return spec.fused_leaf(options) if spec.fuse == "probe" and spec.fused_leaf is not None else None


def fused_signal(spec: MethodSpec, logps_BT: torch.Tensor, entropies_BT: torch.Tensor | None,
                 hidden_BLD: torch.Tensor | None, answer_BT: torch.Tensor,
                 options: WeightingOptions | None = None) -> torch.Tensor:
    """The signal the fused path reads from a training forward instead of running the probe (`MethodSpec.fuse`):
    TRL's token entropies (`"entropy"`), or GRAIL's saliency (`"saliency"`): the answer NLL is the sum of the
    forward's log-probs over `answer_BT`, and its gradient with respect to the leaf's output `hidden_BLD` (captured
    from the same forward) comes from that graph, which is kept for the loss's backward. The separate probe computes
    the same signal from a forward of its own: `check_method` and tests/test_trainer.py (test_fused_equals_separate)
    hold them equal.

    Args:
        logps_BT: (B, T) log-probs of the completion tokens, part of the autograd graph of the forward.
        entropies_BT: (B, T) the sampling distribution's entropies (`"entropy"` only).
        hidden_BLD: (B, L, D) the leaf's output in that forward (`"saliency"` only); None when no row is selected.
        answer_BT: (B, T) bool, the answer tokens of the selected rows only (others all False).
        options: the method's options, for `spec.per_surprise` (which then divides by −logps_BT).
    Returns:
        (B, T) float32 signal, detached.
    """
    if spec.fuse == "entropy":
        return entropies_BT.detach().float()
    if spec.fuse == "probe":
        raise ValueError(f"token_weighting={spec.name!r} computes its fused signal with the model: use "
                         f"fused_probe_signal")
    if spec.fuse != "saliency":
        raise ValueError(f"token_weighting={spec.name!r} has no signal to read from the training forward (fuse=None)")
    if hidden_BLD is None or not answer_BT.any():
        return torch.zeros(logps_BT.shape, dtype=torch.float32, device=logps_BT.device)
    nll = -(logps_BT * answer_BT).sum()  # the answer NLL: a sum of the forward's own log-probs
    grad_BLD = probes.leaf_gradient(nll, hidden_BLD, retain_graph=True)
    saliency_BL = core.gradient_activation_saliency(grad_BLD, hidden_BLD)
    saliency_BT = align_to_completion(saliency_BL, logps_BT.shape[1], at="predicting").float()
    if spec.per_surprise is None:
        return saliency_BT
    if options is None:
        raise ValueError(f"fused_signal: token_weighting={spec.name!r} reads its options (per_surprise); pass them")
    return spec.per_surprise(saliency_BT, -logps_BT.detach().float(), options).float()


# ---- the functional API: one function per method ---------------------------------------------------------

def weights_for(method: str, model, tokenizer, prompt_ids, prompt_mask, completion_ids, completion_mask, advantages,
                options: WeightingOptions | None = None, **overrides) -> torch.Tensor:
    """`method`'s token weights for a batch, without TRL: (B, T) float32 (0 on padding). Any registered method
    (`grail.methods.table.METHODS`); the arguments are those of `method_function(method)`'s docstring. A keyword
    override is a `WeightingOptions` field or one of the method's own options (`MethodSpec.options`)."""
    spec = method_spec(method)
    declared = {o.name for o in spec.options}
    own = {k: overrides.pop(k) for k in list(overrides) if k in declared}
    base = options or WeightingOptions()
    own = {**(base.method_options if base.token_weighting == method else {}), **own}
    spec, options = checked(replace(base, token_weighting=method, **overrides, method_options=own))
    input_ids_BL = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask_BL = torch.cat([prompt_mask, completion_mask], dim=1)
    return token_weights(model, tokenizer, input_ids_BL, attention_mask_BL, completion_mask.bool(),
                         advantages, options, spec=spec).weights_BT


_API_DOC = """{title} token weights for a batch, without TRL. Returns (B, T) float32 weights (0 on padding).

    Args:
        model: Hugging Face causal LM (e.g. `AutoModelForCausalLM.from_pretrained(...)`), not DDP-wrapped; None
            for a method whose probe makes no model call (`MethodSpec.calls_model=False`).
        tokenizer: its tokenizer (the answer box is found in the decoded completion).
        prompt_ids, prompt_mask: (B, S) prompts, LEFT-padded (mask 1 = real token).
        completion_ids, completion_mask: (B, T) completions, RIGHT-padded.
        advantages: (B,) sequence advantages A_i (e.g. group-relative rewards).
        options: a `WeightingOptions` (default: the released values); keyword overrides win over it,
            e.g. `{example}`.
    The token advantage is Â = weights · advantages[:, None]. {notes}
    """


def method_function(method: str) -> Callable[..., torch.Tensor]:
    """`weights_for` bound to `method`, named `<method>_weights`, with the method's own docstring. The module
    exports one per registered method with a probe: `grail_weights`, `oar_g_weights`, ... (also a plug-in's)."""
    spec = method_spec(method)

    def weights(model, tokenizer, prompt_ids, prompt_mask, completion_ids, completion_mask, advantages,
                options: WeightingOptions | None = None, **overrides) -> torch.Tensor:
        return weights_for(method, model, tokenizer, prompt_ids, prompt_mask, completion_ids, completion_mask,
                           advantages, options, **overrides)

    weights.__name__ = weights.__qualname__ = f"{method}_weights"
    weights.__doc__ = _API_DOC.format(title=spec.title, example=spec.example or "weight_std=1.0",
                                      notes=f"Cost: {spec.cost}.")
    return weights


def __getattr__(name: str):
    """`<method>_weights` for every method of the table with a probe, model-free ones included (the methods without
    one, `none` and `top_entropy`, have w = 1)."""
    method = name.removesuffix("_weights")
    if name.endswith("_weights") and method in METHODS and METHODS[method].probe is not None:
        return method_function(method)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *(f"{m}_weights" for m, spec in METHODS.items() if spec.probe is not None)])
