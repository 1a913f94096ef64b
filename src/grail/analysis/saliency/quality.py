r"""Saliency quality against ground truth: does a method's per-token signal (and its final weights) rank the tokens the
answer depends on above the tokens it does not?

API (all a caller needs; `grail.analysis.saliency.token_labels` holds the row format, the labelling rule and the AUROC):

    from grail.analysis.saliency.quality import saliency_auroc, checkpoints_saliency_auroc, synthetic_rows, as_json
    rows = synthetic_rows(TaskConfig(filler_rate=0.6), n=64)          # or any rows with the saliency-row keys
    results = saliency_auroc(model, tokenizer, rows)                    # every method with a probe, options=None
    results["grail"]["signal"].auroc, results["grail"]["weights"].ci_low, ...   # AurocResult fields
    per_step = checkpoints_saliency_auroc("runs/x", rows)               # {N: results} for runs/x/checkpoint-N/
    json.dumps(as_json(results))

What is measured, per example (`prompt`, `solution`, `critical_spans`, `filler_spans`;
`grail.analysis.saliency.token_labels`):
  1. Two teacher-forced traces: prompt + reference solution as the completion ("reference", advantage A = +1) and
     prompt + the solution with its boxed answer replaced by a wrong number ("corrupted", A = −1), so that wrong
     rows exist: the GRAIL release reweights only rows with A ≤ 0 (`rollout_symmetry="wrong"`). `options.traces`
     keeps one kind or both. Batches hold traces of several examples; there are no groups, only these advantages.
  2. Token labels from character labels through the tokenizer's offsets (`return_offsets_mapping`, so a fast
     tokenizer is required), by the rule of `grail.analysis.saliency.token_labels.token_labels`. Only reasoning tokens
     (before the answer box, `grail.methods.spans.AnswerSpans.reasoning_BT`) are scored: weights in and after the box
     are fixed by GRAIL's overrides, not by saliency.
  3. Per method (`grail.methods.table.METHODS`, run through `grail.methods.weighting.run_probe` /
     `weights_from_signal`):
     - "signal": the method's probe output on every trace (both advantage signs): GRAIL's saliency, OAR's
       importance, the entropy. For `random` the signal is a seeded uniform random score (its probe is GRAIL's
       saliency, which is not what the control ranks tokens by): the expected AUROC is 0.5.
     - "weights": the method's final weights, on the rows the method reweights (`probe_rows`: for grail, random and
       entropy under rollout_symmetry="wrong" the corrupted traces only; OAR every row). Rows the method leaves
       at weight 1 carry no ranking and are left out. For `random` these are GRAIL's weights permuted over the
       reasoning tokens.
  4. `AurocResult` per (method, signal|weights): Mann–Whitney AUROC, ties ½, over (critical, filler) pairs of the same
     trace (`options.pairs="within_trace"`; "all" pairs every critical token with every filler token), pooled over
     examples, with a seeded percentile-bootstrap CI over examples (both traces of an example move together).
     Within a row every pipeline's weights are a non-decreasing function of its signal (GRAIL's z-score and clip,
     OAR's bi-level map), so with within-trace pairs "weights" differs from "signal" only by the rows it scores,
     the ties that clipping or OAR's floor create, and (random) the permutation.
     Beside it, `matched` (the distance-matched AUROC, `grail.analysis.saliency.position`) and `fixed` (position
     fixed in every sense: strata (group, reasoning length, position), pairs across the traces of a group,
     `grail.analysis.saliency.fixed_position`; the group is the row's `group` key, `options.fixed_group`), whose
     result counts the labelled tokens that entered it.
Rows may carry `group` (the fixed AUROC's group: `grail.analysis.saliency.counterbalanced`'s groups, a sampled
rollout's prompt) and `advantage` (the reference trace's A instead of +1: a sampled rollout's graded advantage).
GRAIL's per-token signal (leaf = embeddings) is the saliency of the input that PREDICTS the token, i.e. of the previous
token's embedding (docs/methods/grail.md, step 4); OAR-P's and OAR-G's (oar_excerpt) are of the token itself (the
GRAIL release's OAR-G, oar_variant="grail_release", also reads the predicting position). The AUROC reads each signal
where the method puts it; `options.read_at_token=("grail",)` also reports GRAIL's read at the token's own position.

Errors: rows lacking a key, with bad spans or without a box → ValueError naming the row; no filler (or no critical)
token at all → ValueError (the AUROC is undefined; for the synthetic task set filler_rate > 0). A method/part with
no labelled token to score (e.g. grail's weights with traces="reference") gets AUROC NaN and a `note`.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import torch

from grail.analysis.saliency.fixed_position import fixed_position_auroc_result
from grail.analysis.saliency.position import (
    box_distance_BT,
    matched_auroc_result,
    position_profile,
    relative_position_BT,
)
from grail.analysis.saliency.token_labels import (
    UNLABELLED,
    AurocResult,
    Pairs,
    auroc_result,
    char_labels,
    check_row,
    check_spans_map,
    corrupted_solution,
    is_messages,
    saliency_row,
    synthetic_rows,
    token_labels,
)
from grail.methods.spans import predicting_to_token
from grail.methods.table import method_names, method_spec, options_for
from grail.methods.weighting import batch_spans, probe_rows, run_probe, weights_from_signal
from grail.options.checkpoint_dirs import checkpoint_dirs
from grail.options.choices import WeightingOptions
from grail.options.prompts import has_chat_template, plain_prefix, render_plain

__all__ = ["AurocResult", "SaliencyQualityOptions", "Trace", "as_json", "checkpoints_saliency_auroc", "load_model_dir",
           "model_dir_saliency_auroc", "render_messages", "saliency_auroc", "saliency_row", "sampling_prompt",
           "synthetic_rows", "teacher_forced_traces", "trace_batch"]

Traces = Literal["both", "reference", "corrupted"]
FixedGroup = Literal["row", "all"]


@dataclass(frozen=True)
class SaliencyQualityOptions:
    """weighting: the methods' options (`token_weighting` is set per method; default: the released values).
    traces: which teacher-forced traces are scored ("both", "reference" A=+1, "corrupted" A=−1).
    pairs: which (critical, filler) pairs the AUROC counts: "within_trace" (default) or "all"
    (`grail.analysis.saliency.token_labels`).
    batch_size: traces per model call. num_bootstrap, confidence: the CI over examples (0 resamples: no CI).
    seed: seeds the CI, the corrupted answers, OAR-G's noise and the random control.
    bin_width, window: the position-matched AUROC's distance bins and reference window
    (`grail.analysis.saliency.position.matched_auroc_result`; 1 = exact distances, None = the shortest trace).
    profile_bins: relative-position bins of the position profile (`position.position_profile`).
    fixed_group: the fixed-position AUROC's group (`grail.analysis.saliency.fixed_position`): "row" = each row's
    `group` key (a counterbalanced group, a sampled rollout's prompt), else the row itself (then a row's traces, of
    one layout, give no pair); "all" = one group (pairs across rows of equal reasoning length), its interval a
    bootstrap over the rows' `group` keys (a rollout's prompt: its samples are not independent).
    read_at_token: methods whose signal is GRAIL's saliency (fuse="saliency": grail), read at the position that
    PREDICTS each token, to report also read at the token's OWN position (the embedding of the token itself, where
    OAR reads), as the method `<method>@token` of the results, its signal only
    (`grail.methods.spans.predicting_to_token`; no extra pass).
    states: {method: its per-run state (`MethodSpec.state`)} handed to that method's probe on every batch, so that a
    method that learns (oar_p_amortized's predictor) is scored as a run that already holds the state would score the
    rows, and goes on updating it; a method not named gets a fresh state per batch, as outside a trainer."""

    weighting: WeightingOptions = field(default_factory=WeightingOptions)
    traces: Traces = "both"
    pairs: Pairs = "within_trace"
    batch_size: int = 8
    num_bootstrap: int = 1000
    confidence: float = 0.95
    seed: int = 0
    bin_width: int = 1
    window: int | None = None
    profile_bins: int = 10
    fixed_group: FixedGroup = "row"
    read_at_token: tuple[str, ...] = ()
    states: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if self.traces not in ("both", "reference", "corrupted"):
            raise ValueError(f"traces={self.traces!r}: choose 'both', 'reference' or 'corrupted'.")
        if self.pairs not in ("within_trace", "all"):
            raise ValueError(f"pairs={self.pairs!r}: choose 'within_trace' or 'all'.")
        if self.fixed_group not in ("row", "all"):
            raise ValueError(f"fixed_group={self.fixed_group!r}: choose 'row' (the rows' group key) or 'all'.")
        if self.batch_size < 1 or self.num_bootstrap < 0 or not 0 < self.confidence < 1:
            raise ValueError(f"batch_size={self.batch_size} must be >= 1, num_bootstrap={self.num_bootstrap} >= 0 "
                             f"and confidence={self.confidence} in (0, 1).")
        if self.bin_width < 1 or self.profile_bins < 1 or (self.window is not None and self.window < 1):
            raise ValueError(f"bin_width={self.bin_width} and profile_bins={self.profile_bins} must be >= 1, "
                             f"window={self.window} None or >= 1.")


@dataclass
class Trace:
    """One teacher-forced trace of a labelled row: its prompt and completion ids, a label per completion token."""

    example: int
    group: int  # the fixed-position AUROC's group (`row["group"]`, else the row's index; 0 with fixed_group="all")
    unit: int  # its bootstrap unit with fixed_group="all": `row["group"]` (a rollout's prompt), else the row's index
    prompt_ids: list[int]
    completion_ids: list[int]
    labels: list[int]  # per completion token
    advantage: float


def _encode(tokenizer, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    try:
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    except NotImplementedError as err:
        raise ValueError(f"saliency quality maps characters to tokens with return_offsets_mapping, which "
                         f"{type(tokenizer).__name__} lacks; load a fast tokenizer (use_fast=True).") from err
    return enc["input_ids"], [tuple(o) for o in enc["offset_mapping"]]


def sampling_prompt(tokenizer, messages: list[dict]) -> str:
    """Chat messages as training renders them for SAMPLING: `render_messages` without the space it ends a plain
    prompt with (a sampled completion of a base model starts with that space, inside its first token)."""
    if has_chat_template(tokenizer):
        return render_messages(tokenizer, messages)
    return plain_prefix(tokenizer) + render_plain(messages)


def render_messages(tokenizer, messages: list[dict]) -> str:
    """Chat messages as the model reads them in training: with the tokenizer's chat template (generation prompt
    added), or, for a tokenizer without one (a base model, e.g. Gemma 3 270M), as training's plain text
    (`grail.options.prompts.render_plain`, after the tokenizer's BOS text) and one space, so that the teacher-forced
    solution starts where a sampled answer does, after "Answer: " (a sampled answer carries that space inside its
    first token; here it is a token of the prompt)."""
    if has_chat_template(tokenizer):
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return plain_prefix(tokenizer) + render_plain(messages) + " "


def teacher_forced_traces(tokenizer, rows: Sequence[dict], options: SaliencyQualityOptions) -> list[Trace]:
    """The rows' traces as `options.traces` asks (the reference solution, A = +1, and/or the same with a wrong boxed
    answer, A = −1), each token labelled; ValueError when a row is malformed or no trace holds both classes."""
    box = options.weighting.answer_box
    traces = []
    for i, row in enumerate(rows):
        check_row(row, i, box)
        labels_C = char_labels(len(row["solution"]), row["critical_spans"], row["filler_spans"])
        prompt = row["prompt"]
        if is_messages(prompt):  # chat messages (the words style, the label sets): rendered as training renders them
            prompt = render_messages(tokenizer, prompt)
        prompt_ids, _ = _encode(tokenizer, prompt)
        ids, offsets = _encode(tokenizer, row["solution"])
        labels_N = token_labels(row["solution"], labels_C, offsets)
        check_spans_map(row, i, offsets, labels_N)
        unit = int(row.get("group", i))
        group = 0 if options.fixed_group == "all" else unit
        if options.traces in ("both", "reference"):
            traces.append(Trace(i, group, unit, prompt_ids, ids, labels_N, float(row.get("advantage", 1.0))))
        if options.traces in ("both", "corrupted"):
            text, labels = corrupted_solution(row["solution"], labels_C, f"{options.seed}:{i}", box)
            ids, offsets = _encode(tokenizer, text)
            traces.append(Trace(i, group, unit, prompt_ids, ids, token_labels(text, labels, offsets), -1.0))
    counts = {kind: sum(t.labels.count(kind) for t in traces) for kind in (1, 0)}
    if not counts[0] or not counts[1]:
        missing = "filler" if not counts[0] else "critical"
        raise ValueError(f"the {len(rows)} saliency rows have no {missing} token, so the AUROC of critical vs filler "
                         f"is undefined; give rows with both kinds of spans (for the synthetic task, filler exists "
                         f"only with filler_rate > 0, e.g. synthetic_rows(TaskConfig(filler_rate=0.6))).")
    return traces


def trace_batch(traces: Sequence[Trace], pad_id: int, device) -> tuple[torch.Tensor, ...]:
    """TRL's layout: prompts left-padded, completions right-padded. Returns ids_BL, attn_BL, mask_BT, labels_BT."""
    S = max(len(t.prompt_ids) for t in traces)
    T = max(len(t.completion_ids) for t in traces)
    ids, attn, labels = [], [], []
    for t in traces:
        ps, cs = S - len(t.prompt_ids), T - len(t.completion_ids)
        ids.append([pad_id] * ps + t.prompt_ids + t.completion_ids + [pad_id] * cs)
        attn.append([0] * ps + [1] * (len(t.prompt_ids) + len(t.completion_ids)) + [0] * cs)
        labels.append(t.labels + [UNLABELLED] * cs)
    ids_BL = torch.tensor(ids, device=device)
    attn_BL = torch.tensor(attn, device=device)
    return ids_BL, attn_BL, attn_BL[:, S:].bool(), torch.tensor(labels)


def saliency_auroc(model, tokenizer, rows: Sequence[dict], methods: Sequence[str] | None = None,
                   options: SaliencyQualityOptions | None = None) -> dict[str, dict[str, AurocResult]]:
    """AUROC of critical vs filler tokens for each method's signal and weights (see the module docstring).

    Args:
        model: a Hugging Face causal LM (not DDP-wrapped); put in eval mode for the call, then restored.
        tokenizer: its fast tokenizer. rows: saliency rows (`grail.analysis.saliency.token_labels`).
        methods: names of `grail.methods.table.METHODS` entries with a probe (None: every one,
            `method_names(probed=True)`).
        options: `SaliencyQualityOptions` (None: defaults).
    Returns:
        {method: {"signal": AurocResult, "weights": AurocResult}}; each AurocResult is the pooled AUROC with, in
        `matched`, the position-matched one and, in `profile`, the position profile
        (`grail.analysis.saliency.position`).
    """
    options = options or SaliencyQualityOptions()
    specs = {m: method_spec(m) for m in (method_names(probed=True) if methods is None else methods)}
    no_probe = [m for m, spec in specs.items() if spec.probe is None]
    if no_probe:
        raise ValueError(f"methods {no_probe} have no per-token signal; choose from "
                         f"{', '.join(method_names(probed=True))}.")
    at_token = [m for m in options.read_at_token if m not in specs or specs[m].fuse != "saliency" or
                specs[m].permutes]
    if at_token:
        raise ValueError(f"read_at_token={at_token}: only a scored method whose signal is GRAIL's saliency (read at "
                         f"the predicting position) can be read at the token's own one; e.g. ('grail',) with grail "
                         f"among the methods.")
    traces = teacher_forced_traces(tokenizer, rows, options)
    device = next(model.parameters()).device
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    generators = {m: torch.Generator(device=device).manual_seed(options.seed + zlib.crc32(m.encode())) for m in specs}
    collected = {m: {"signal": [], "weights": []} for m in specs}  # (scores, labels, example, trace, distance,
    # relative position, group, completion index) per batch
    collected |= {f"{m}@token": {"signal": []} for m in options.read_at_token}
    method_options = {m: options_for(spec, options.weighting) for m, spec in specs.items()}  # each method's, once
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(traces), options.batch_size):
            chunk = traces[start:start + options.batch_size]
            ids_BL, attn_BL, mask_BT, labels_BT = trace_batch(chunk, pad_id, device)
            adv_B = torch.tensor([t.advantage for t in chunk], device=device)
            example_BT = torch.tensor([t.example for t in chunk])[:, None].expand(labels_BT.shape)
            group_BT = torch.tensor([t.group for t in chunk])[:, None].expand(labels_BT.shape)
            unit_BT = torch.tensor([t.unit for t in chunk])[:, None].expand(labels_BT.shape)
            index_BT = torch.arange(labels_BT.shape[1]).expand(labels_BT.shape)  # t: completion index
            trace_BT = torch.arange(start, start + len(chunk))[:, None].expand(labels_BT.shape)
            spans = batch_spans(tokenizer, ids_BL[:, -mask_BT.shape[1]:], mask_BT, options.weighting)
            lost = [chunk[b].example for b in (~spans.has_box_B).nonzero().flatten().tolist()]
            if lost:
                raise ValueError(f"saliency row {lost[0]}: no answer box found in the tokenized solution (the "
                                 f"tokenizer's decode does not reproduce the box); check the tokenizer.")
            # every reasoning token is kept (labelled or not): the matched AUROC reads a score against its trace's
            # last reasoning tokens, and the AUROCs drop the unlabelled ones themselves
            reasoning_BT = (spans.reasoning_BT & mask_BT).cpu()
            distance_BT = box_distance_BT(spans.box_BT).cpu()
            position_BT = relative_position_BT(reasoning_BT)
            probed: dict = {}  # probe function → signal (grail and random share GRAIL's saliency probe)
            for m, spec in specs.items():
                opts = method_options[m]
                if spec.probe not in probed:
                    probed[spec.probe] = run_probe(model, ids_BL, attn_BL, spans, mask_BT, mask_BT.any(1), opts,
                                                   generators[m], spec, adv_B=adv_B, tokenizer=tokenizer,
                                                   state=options.states.get(m))
                signal_BT = probed[spec.probe]
                rows_B = probe_rows(adv_B, spans, mask_BT, opts, spec)
                floor = spec.rounding_floor(model, opts)
                weights_BT = weights_from_signal(signal_BT, adv_B, spans, mask_BT, rows_B, opts, generators[m],
                                                 floor, spec).weights_BT
                if m in options.read_at_token:
                    collected[f"{m}@token"]["signal"].append(tuple(x[reasoning_BT] for x in (
                        predicting_to_token(signal_BT).detach().float().cpu(), labels_BT, example_BT, trace_BT,
                        distance_BT, position_BT, group_BT, index_BT, unit_BT)))
                if spec.importance is not None:  # how the method's signal reads as importance (KTAE: |kt|)
                    signal_BT = spec.importance(signal_BT)
                if spec.permutes or opts.permute_weights:  # a permutation null: its signal is a random score
                    signal_BT = torch.rand(mask_BT.shape, generator=generators[m], device=device)
                for part, values_BT, keep_BT in (("signal", signal_BT, reasoning_BT),
                                                 ("weights", weights_BT, reasoning_BT & rows_B.cpu()[:, None])):
                    collected[m][part].append(tuple(x[keep_BT] for x in (
                        values_BT.detach().float().cpu(), labels_BT, example_BT, trace_BT, distance_BT, position_BT,
                        group_BT, index_BT, unit_BT)))
    finally:
        model.train(was_training)
    results = {}
    for m, parts in collected.items():
        results[m] = {}
        for part, pieces in parts.items():
            scores, labels, examples, traces_N, distance, position, groups, index, units = (
                torch.cat(x) for x in zip(*pieces, strict=True))
            ci = {"num_bootstrap": options.num_bootstrap, "confidence": options.confidence, "seed": options.seed}
            result = auroc_result(scores, labels, examples, traces_N, pairs=options.pairs, **ci)
            matched = matched_auroc_result(scores, labels, examples, distance, traces_N, bin_width=options.bin_width,
                                           scale="window" if options.pairs == "within_trace" else "raw",
                                           window=options.window, **ci)
            fixed = fixed_position_auroc_result(scores, labels, groups, traces_N, index,
                                                unit_N=units if options.fixed_group == "all" else None,
                                                scale="trace" if options.pairs == "within_trace" else "raw", **ci)
            result = replace(result, matched=matched, fixed=fixed,
                             profile=position_profile(scores, labels, position, traces_N, options.profile_bins))
            if part == "weights" and result.n_examples == 0:
                result = replace(result, note=f"no row reweighted: {m} with rollout_symmetry="
                                              f"{options.weighting.rollout_symmetry!r} leaves every {options.traces} "
                                              f"trace at weight 1")
            results[m][part] = result
    return results


def as_json(results: dict[str, dict[str, AurocResult]]) -> dict:
    """`saliency_auroc`'s result as plain dicts, `matched` and `profile` nested in each (NaN stays a float: json.dumps
    writes NaN)."""
    return {m: {part: r.as_dict() for part, r in parts.items()} for m, parts in results.items()}


def model_dir_saliency_auroc(path: str | Path, rows: Sequence[dict], methods: Sequence[str] | None = None,
                             options: SaliencyQualityOptions | None = None, device: str | None = None,
                             dtype: torch.dtype | None = None) -> dict[str, dict[str, AurocResult]]:
    """`saliency_auroc` for a `save_pretrained` directory (model and tokenizer), loaded by `load_model_dir`."""
    model, tokenizer = load_model_dir(path, device, dtype)
    return saliency_auroc(model, tokenizer, rows, methods, options)


def load_model_dir(path: str | Path, device: str | None = None, dtype: torch.dtype | None = None):
    """(model, tokenizer) of a `save_pretrained` directory, OSError naming it when it is not one. device: default cuda
    if available, else cpu; dtype: default bfloat16 on cuda, float32 on cpu (as `grail eval`)."""
    from transformers import AutoTokenizer

    from grail.models.warmstart import load_inference_model

    path = Path(path)
    if not path.is_dir():
        raise OSError(f"model directory {str(path)!r} does not exist; give a save_pretrained directory.")
    try:
        return load_inference_model(path, device, dtype), AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as err:
        raise OSError(f"cannot load a model and tokenizer from {str(path)!r} ({err}); is it a complete "
                      f"save_pretrained directory?") from err


def checkpoints_saliency_auroc(run_dir: str | Path, rows: Sequence[dict], methods: Sequence[str] | None = None,
                               options: SaliencyQualityOptions | None = None, device: str | None = None,
                               dtype: torch.dtype | None = None) -> dict[int, dict[str, dict[str, AurocResult]]]:
    """`model_dir_saliency_auroc` for every `<run_dir>/checkpoint-N/`, as {N: results}, by increasing N. Every
    checkpoint-N directory is loaded (grail.options.checkpoint_dirs; `grail.training.resume.complete_checkpoints` lists
    only the completely saved ones)."""
    found = checkpoint_dirs(run_dir)
    if not found:
        raise OSError(f"{str(run_dir)!r} has no checkpoint-N directories; give a run directory of `grail train` "
                      f"with save_steps set, or use model_dir_saliency_auroc on a model directory.")
    return {step: model_dir_saliency_auroc(path, rows, methods, options, device, dtype) for step, path in found}
