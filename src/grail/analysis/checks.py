r"""`check_method`: the checks every token-weighting method passes, runnable by any method's author.

grail-rl's own tests call it for every method of the table (plug-ins included), as scikit-learn's `check_estimator`
serves built-in and third-party estimators alike. It runs the method, through the same functions training uses, on
the embedded tiny model (built in code, nothing downloaded) and a fixed batch: two groups of four rollouts of one
prompt each, right-padded completions of different lengths, advantages of both signs and zero, one row without a
box. `grail methods check NAME` runs it from the command line.

The checks (each a `CheckResult`; `MethodReport.ok` when every one passed or was skipped with a reason):
  1. `shape`: (B, T) float32 weights, finite.
  2. `padding`: weight 0 on every padding token.
  3. `detached`: the weights do not require grad, and no parameter's `.grad` was written.
  4. `reweights`: some selected row's weights differ from 1 (the method is not silently GRPO); a method without a
     probe (`rows="none"`) instead gives exactly 1 on every real token.
  5. `sign` (`preserves_sign`): every real token's weight is > 0, so Â has A's sign.
  6. `mass` (`preserves_mass`): each selected row's weights average 1 over its real tokens.
  7. `seeded`: the same seed gives the same weights (the method draws its randomness from the generator it is
     handed, or none).
  8. `options`: changing a `SCOPED_OPTIONS` field the method does not declare in `reads` leaves the weights
     unchanged (an undeclared field it does read would be refused on the command line while it works).
  9. `model_free` (`calls_model=False`, run first): the method runs with `model=None`, as training runs it.
 10. `fused` (`fuse`): the signal read from a training forward (`weighting.fused_signal`, or for `fuse="probe"`
     `weighting.fused_probe_signal` on that forward's reads) equals the probe's on the selected rows, and so do the
     weights.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, replace

import torch

from grail.methods.spec import SCOPED_OPTIONS, MethodSpec
from grail.options.choices import WeightingOptions

__all__ = ["CheckResult", "MethodCheckError", "MethodReport", "check_method", "check_batch"]

# A value other than the default for each SCOPED_OPTIONS field, valid with every other default (check 8).
ALTERNATIVES = {
    "answer_nll_span": "content", "saliency_leaf": "middle", "rollout_symmetry": "both", "weight_mean": 1.2,
    "weight_std": 1.0, "weight_min": 0.3, "weight_max": 3.0, "zscore_scope": "to_answer",
    "oar_variant": "grail_release", "oar_scope": "completion", "oar_distribution": "last_position",
    "oar_quantile": 0.5, "oar_beta": 2.0, "oar_floor": 0.3, "oar_noise_std": 1e-2, "oar_min_importance": 1e-3,
    "perturbation_chunk_tokens": 7, "saliency_path": "separate",
}
SEED = 1234
TOLERANCE = 1e-4


class MethodCheckError(AssertionError):
    """A method failed `check_method`; the message lists every failed check."""


@dataclass
class CheckResult:
    name: str
    passed: bool | None  # None: skipped (not applicable), `detail` says why
    detail: str = ""


@dataclass
class MethodReport:
    method: str
    results: list[CheckResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.passed is not False for r in self.results)

    def text(self) -> str:
        marks = {True: "ok  ", False: "FAIL", None: "skip"}
        lines = [f"{self.method}: {'passed' if self.ok else 'FAILED'}"]
        lines += [f"  {marks[r.passed]} {r.name}" + (f": {r.detail}" if r.detail else "") for r in self.results]
        return "\n".join(lines)


def check_batch(tokenizer):
    """(input_ids_BL, attention_mask_BL, mask_BT, adv_B): the fixed batch (see the module docstring)."""
    prompts = ["Q: 7*5-8\nA:"] * 4 + ["Q: 9+6-4\nA:"] * 4
    completions = [" 7*5=35, 35-8=27. so \\boxed{27}", " 7*5=35 then 35-8=28 \\boxed{28}", " 7*5=36",
                   " 7*5=35. 35-8=27. \\boxed{27}",
                   " 9+6=15, 15-4=11 \\boxed{11}", " 9+6=14. 14-4=10. now \\boxed{10}", " 9+6=15 \\boxed{15}",
                   " 9+6=15. 15-4=11. \\boxed{11}"]
    adv_B = torch.tensor([0.75, -0.75, -0.75, 0.75, 0.5, -1.0, -0.5, 0.0])
    p = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    c = tokenizer(completions, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False)
    input_ids_BL = torch.cat([p["input_ids"], c["input_ids"]], 1)
    attention_mask_BL = torch.cat([p["attention_mask"], c["attention_mask"]], 1)
    return input_ids_BL, attention_mask_BL, c["attention_mask"].bool(), adv_B


def _model_and_tokenizer():
    from grail.models.tiny import build_tiny_model, build_tokenizer

    tokenizer = build_tokenizer()
    model = build_tiny_model(tokenizer, seed=0)
    with torch.no_grad():  # sharper distributions than a fresh init (whose entropies are all ≈ log V)
        model.get_input_embeddings().weight.mul_(3.0)
    return model.eval(), tokenizer


def check_method(spec_or_name: MethodSpec | str, *, model=None, tokenizer=None, raise_on_failure: bool = True,
                 options: WeightingOptions | None = None) -> MethodReport:
    """Run the checks of the module docstring on a method (a `MethodSpec`, registered or not, or a registered
    name). `model`, `tokenizer`: a causal LM and its tokenizer (default: the embedded tiny model, built here);
    `options`: the `WeightingOptions` to run with (default: the released values). Raises `MethodCheckError` listing
    the failed checks unless `raise_on_failure=False`; returns the `MethodReport`."""
    from grail.methods.table import checked, method_spec

    spec = method_spec(spec_or_name) if isinstance(spec_or_name, str) else spec_or_name
    if model is None or tokenizer is None:
        model, tokenizer = _model_and_tokenizer()
    base = replace(options or WeightingOptions(), token_weighting=spec.name)
    spec, options = checked(base, spec=spec)
    batch = check_batch(tokenizer)
    report = MethodReport(spec.name)
    run = _Runner(spec, model, tokenizer, batch)
    if not spec.calls_model and spec.probe is not None:  # first: every later run of it goes without the model
        report.results.append(_model_free(run, options))
        if report.results[-1].passed is False:
            return _finish(report, raise_on_failure)
    try:
        weights = run(options)
    except Exception as err:  # the method does not run at all: that is the report
        report.results.append(CheckResult("runs", False, f"{type(err).__name__}: {err}"))
        return _finish(report, raise_on_failure)
    report.results += _basic_checks(spec, model, run, weights, batch)
    report.results.append(_seeded(run, options, weights.weights_BT))
    report.results.append(_options_scoped(spec, run, options, weights.weights_BT, checked)
                          if report.results[-1].passed else CheckResult("options", None, "needs seeded weights"))
    report.results.append(_fused(spec, model, run, options, batch))
    return _finish(report, raise_on_failure)


def _finish(report: MethodReport, raise_on_failure: bool) -> MethodReport:
    if raise_on_failure and not report.ok:
        raise MethodCheckError(report.text())
    return report


class _Runner:
    """The method's weights on the check batch through `weighting.token_weights`, with a freshly seeded generator."""

    def __init__(self, spec, model, tokenizer, batch):
        self.spec, self.model, self.tokenizer, self.batch = spec, model, tokenizer, batch

    def __call__(self, options, model="default", signal_BT=None):
        from grail.methods.weighting import token_weights

        input_ids_BL, attention_mask_BL, mask_BT, adv_B = self.batch
        generator = torch.Generator().manual_seed(SEED)
        return token_weights(self.model if model == "default" else model, self.tokenizer, input_ids_BL,
                             attention_mask_BL, mask_BT, adv_B, options, generator=generator, spec=self.spec,
                             signal_BT=signal_BT)


def _basic_checks(spec, model, run, weights, batch) -> list[CheckResult]:
    _, _, mask_BT, adv_B = batch
    w_BT, rows_B = weights.weights_BT, weights.probed_B
    out = []
    shape_ok = w_BT.shape == mask_BT.shape and w_BT.dtype == torch.float32 and bool(torch.isfinite(w_BT).all())
    out.append(CheckResult("shape", shape_ok, "" if shape_ok else f"got {tuple(w_BT.shape)} {w_BT.dtype} (finite: "
                           f"{bool(torch.isfinite(w_BT).all())}), expected {tuple(mask_BT.shape)} float32, finite"))
    pad = w_BT[~mask_BT]
    out.append(CheckResult("padding", bool((pad == 0).all()),
                           "" if bool((pad == 0).all()) else f"{int((pad != 0).sum())} padding tokens have weight ≠ 0"))
    grads = [name for name, p in model.named_parameters() if p.grad is not None]
    detached = not w_BT.requires_grad and not grads
    why = "the weights require grad" if w_BT.requires_grad else f"the probe wrote .grad of {grads[0] if grads else ''}"
    out.append(CheckResult("detached", detached, "" if detached else why))
    real_rows_BT = mask_BT & rows_B[:, None]
    if spec.rows == "none":
        ok = bool((w_BT[mask_BT] == 1).all())
        out.append(CheckResult("reweights", ok, "rows='none': w = 1 everywhere" if ok else
                               "rows='none' but some real token's weight is not 1"))
    elif not rows_B.any():
        out.append(CheckResult("reweights", False, "no row of the check batch was selected (rows="
                               f"{spec.rows!r}); the method can never reweight"))
    else:
        moved = bool((w_BT[real_rows_BT] != 1).any())
        out.append(CheckResult("reweights", moved, f"{int(rows_B.sum())} rows selected" if moved else
                               "every selected row has w = 1 on every token: the method trains as GRPO"))
    if spec.preserves_sign:
        ok = bool((w_BT[mask_BT] > 0).all())
        out.append(CheckResult("sign", ok, "" if ok else f"min weight {float(w_BT[mask_BT].min()):.4g} ≤ 0 with "
                               "preserves_sign=True"))
    else:
        out.append(CheckResult("sign", None, "preserves_sign=False"))
    if spec.preserves_mass and rows_B.any():
        mean_B = (w_BT * mask_BT).sum(1)[rows_B] / mask_BT.sum(1)[rows_B]
        worst = float((mean_B - 1).abs().max())
        out.append(CheckResult("mass", worst <= TOLERANCE, f"max |row mean − 1| = {worst:.2e}"))
    else:
        out.append(CheckResult("mass", None, "preserves_mass=False" if not spec.preserves_mass else "no row"))
    return out


def _seeded(run, options, w_BT) -> CheckResult:
    again = run(options).weights_BT
    same = torch.equal(again, w_BT)
    return CheckResult("seeded", same, "" if same else "two runs with the same seed gave different weights: draw "
                       "randomness from the `generator` argument")


def _options_scoped(spec, run, options, w_BT, checked) -> CheckResult:
    moved = []
    for name in SCOPED_OPTIONS:
        if name in spec.reads or name not in WeightingOptions.__dataclass_fields__:  # saliency_path: config only
            continue
        try:
            _, other = checked(replace(options, **{name: ALTERNATIVES[name]}), spec=spec)
        except ValueError:  # the combination is refused: the method does not run with it either
            continue
        if not torch.allclose(run(other).weights_BT, w_BT, rtol=0, atol=1e-6):
            moved.append(name)
    if moved:
        return CheckResult("options", False, f"{', '.join(moved)} change the weights but are not in `reads`: declare "
                           f"them (the command line refuses undeclared fields)")
    return CheckResult("options", True, f"reads {', '.join(spec.reads) or 'no option field'}")


def _model_free(run, options) -> CheckResult:
    try:
        run(options, model=None)
    except Exception as err:
        return CheckResult("model_free", False, f"calls_model=False, but the probe fails with model=None: "
                           f"{type(err).__name__}: {err}")
    return CheckResult("model_free", True, "runs with model=None")


def _fused(spec, model, run, options, batch) -> CheckResult:
    """The fused path's signal, read from a plain training-style forward (log-probs and entropies at the sampling
    temperature, the leaf captured by a hook), against the probe's, and the weights from each."""
    if spec.fuse is None:
        return CheckResult("fused", None, "fuse=None")
    from grail.methods import probes
    from grail.methods.weighting import (
        batch_spans,
        fused_leaf_name,
        fused_probe_signal,
        fused_signal,
        probe_rows,
        run_probe,
    )

    input_ids_BL, attention_mask_BL, mask_BT, adv_B = batch
    spans = batch_spans(run.tokenizer, input_ids_BL[:, -mask_BT.shape[1]:], mask_BT, options)
    rows_B = probe_rows(adv_B, spans, mask_BT, options, spec=spec)
    if not rows_B.any():
        return CheckResult("fused", False, "no selected row to compare")
    T = mask_BT.shape[1]
    leaf = fused_leaf_name(spec, options)
    with probes.output_of(probes.leaf_module(model, leaf)) if leaf else contextlib.nullcontext([]) as captured:
        logits_BTV = model(input_ids=input_ids_BL, attention_mask=attention_mask_BL).logits[:, -T - 1:-1].float()
    logp_BTV = torch.log_softmax(logits_BTV / options.temperature, dim=-1)
    logps_BT = logp_BTV.gather(-1, input_ids_BL[:, -T:, None]).squeeze(-1)
    entropies_BT = -(logp_BTV.exp() * logp_BTV).sum(-1)
    answer_BT = spans.probe_span(options.answer_nll_span) & rows_B[:, None]
    if spec.fuse == "probe":  # the probe on the forward's reads, with the generator the probe below gets
        with torch.no_grad():
            fused_BT = fused_probe_signal(spec, model, input_ids_BL, attention_mask_BL, spans, mask_BT, rows_B,
                                          options, logps_BT, entropies_BT, captured[0] if leaf else None,
                                          torch.Generator().manual_seed(SEED), adv_B=adv_B, tokenizer=run.tokenizer)
    else:
        fused_BT = fused_signal(spec, logps_BT, entropies_BT, captured[0] if leaf else None, answer_BT, options)
    model.zero_grad(set_to_none=True)
    separate_BT = run_probe(model, input_ids_BL, attention_mask_BL, spans, mask_BT, rows_B, options,
                            torch.Generator().manual_seed(SEED), spec, adv_B=adv_B, tokenizer=run.tokenizer)
    selected_BT = rows_B[:, None] & mask_BT
    scale = float(separate_BT[selected_BT].abs().max().clamp(min=1e-12))
    gap = float((fused_BT - separate_BT)[selected_BT].abs().max()) / scale
    w_gap = float((run(options, signal_BT=fused_BT).weights_BT - run(options).weights_BT).abs().max())
    ok = gap <= 1e-4 and w_gap <= 1e-3
    return CheckResult("fused", ok, f"signal max relative gap {gap:.1e}, weights max gap {w_gap:.1e}")
