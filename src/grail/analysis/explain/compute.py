r"""`grail explain`, the computing side: where each method puts the credit, token by token.

For each prompt (a `ExplainRow`, already rendered in the run's prompt format):
  1. completions: sampled from the model with the run's rollout settings (`sample_completions`), or given;
  2. advantages: each completion graded against the row's reference answer with the run's reward, and the
     rewards turned into group advantages as GRPO forms them (`group_advantages`); or one given advantage for
     every completion (a bare prompt has no answer to grade against);
  3. per method: the probe's raw per-token signal (`grail.methods.weighting.run_probe`) and the weights
     (`grail.methods.weighting.token_weights` handed that signal: the method's own pipeline, exactly as training runs
     it; nothing here re-implements a method), on the rows the method would probe in training;
  4. per method: the position profile of `grail.methods.diagnostics` (mean weight per tenth of the reasoning, over the
     rows with A ≠ 0, pooled over every prompt), the `weights/position_profile` metric of a training run; and the
     same over correct (A > 0) and wrong (A < 0) rows apart (`outcome_profiles`), as the GRAIL release plots it.
`grail.analysis.explain.html` turns the `Explanation` into the page; `grail.analysis.explain.cli` is the command.

Each prompt's completions are one batch in TRL's layout (prompt ⊕ completion, completions right-padded; the
prompt is the same for the whole group, so it needs no padding). A completion's tokens are its sampled ids up to
and including the first end-of-sequence token, as TRL's completion mask has them; given completions are the
tokenizer's ids of the text, nothing appended.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from grail.methods.diagnostics import finish, weight_sums
from grail.methods.spans import token_char_offsets
from grail.methods.table import METHODS, method_spec, options_for
from grail.methods.weighting import batch_spans, probe_rows, run_probe, token_weights
from grail.options.choices import WeightingOptions
from grail.options.sampling import SamplingParams, hf_generation_kwargs, new_token_limit

__all__ = ["SCALE_REWARDS", "CompletionView", "ExplainRow", "Explanation", "MethodTokens", "RowView", "explain",
           "group_advantages", "sample_completions", "token_texts"]

SCALE_REWARDS = ("group", "batch", "none")  # TRL's scale_rewards choices
NUM_BINS = 10  # position-profile bins, as the trainer logs them
OUTCOMES = ("correct", "wrong")  # rows with A > 0 and A < 0: the profile split the GRAIL release plots


@dataclass(frozen=True)
class ExplainRow:
    """One prompt to explain."""

    prompt: str  # the text the model reads, rendered in the run's prompt format
    answer: Any = None  # the reference answer the reward grades against; None = unknown
    completions: tuple[str, ...] | None = None  # given completions; None = sample them
    label: str = ""  # where the prompt came from, for the page


@dataclass(frozen=True)
class MethodTokens:
    """One method on one completion: one value per real token."""

    weights: tuple[float, ...]  # w
    signal: tuple[float, ...] | None  # the probe's raw signal; None where the probe did not run on this row
    note: str  # why the row got the method's uninformed weights, or ""


@dataclass(frozen=True)
class CompletionView:
    row: int  # index of the prompt
    sample: int  # index of the completion in its group
    text: str  # the completion's tokens decoded (special tokens kept): "".join(tokens)
    tokens: tuple[str, ...]  # each token's text (a character split over tokens is on the first of them)
    answer: tuple[bool, ...]  # inside the answer box's braces (`AnswerSpans.answer_BT`)
    box: tuple[bool, ...]  # the whole answer box, `\boxed{` and `}` included (`AnswerSpans.box_BT`)
    reasoning: tuple[bool, ...]  # before the box (`AnswerSpans.reasoning_BT`)
    reward: float | None  # None: not graded (a given advantage)
    advantage: float  # A; the token advantage is Â = w · A
    methods: dict[str, MethodTokens]


@dataclass(frozen=True)
class RowView:
    index: int
    label: str
    prompt: str
    answer: str | None
    completions: tuple[CompletionView, ...]


@dataclass(frozen=True)
class Explanation:
    rows: tuple[RowView, ...]
    methods: tuple[str, ...]
    labels: dict[str, str]  # each method's name in tables (`MethodSpec.label`)
    profiles: dict[str, tuple[float, ...]]  # method → mean weight per position bin (0 for an empty bin)
    profile_counts: dict[str, tuple[int, ...]]  # method → reasoning tokens per bin (rows with A ≠ 0)
    advantage_source: str  # how the advantages were formed, in words
    # method → {"correct": profile over the rows with A > 0, "wrong": with A < 0} (the GRAIL release's split)
    outcome_profiles: dict[str, dict[str, tuple[float, ...]]] = field(default_factory=dict)
    outcome_counts: dict[str, dict[str, tuple[int, ...]]] = field(default_factory=dict)

    def completions(self) -> list[CompletionView]:
        return [c for row in self.rows for c in row.completions]


def group_advantages(rewards: Sequence[Sequence[float]], scale_rewards: str) -> list[list[float]]:
    """GRPO's sequence advantages, as TRL 1.16 forms them (`GRPOTrainer._generate_and_score_completions`, one
    reward function): A = r − mean(group); `group`: divided by (std of the group + 1e-4); `batch`: divided by
    (std of every reward + 1e-4); `none`: not divided. std is the unbiased (n − 1) one; a group (or batch) of
    one has std 0. `rewards`: one list per prompt (its group)."""
    if scale_rewards not in SCALE_REWARDS:
        raise ValueError(f"scale_rewards={scale_rewards!r}: choose one of {', '.join(SCALE_REWARDS)}.")

    def std(values: Sequence[float]) -> float:
        if len(values) < 2:
            return 0.0
        mean = sum(values) / len(values)
        return (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5

    batch_std = std([r for group in rewards for r in group])
    out = []
    for group in rewards:
        mean = sum(group) / len(group)
        scale = {"group": std(group) + 1e-4, "batch": batch_std + 1e-4, "none": 1.0}[scale_rewards]
        out.append([(r - mean) / scale for r in group])
    return out


def _eos_ids(model, tokenizer) -> set[int]:
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    eos = tokenizer.eos_token_id if eos is None else eos
    return set(eos) if isinstance(eos, list | tuple) else {eos}


def sample_completions(model, tokenizer, prompt: str, params: SamplingParams, seed: int) -> list[list[int]]:
    """`params.n` completions of `prompt` (HF `generate`, seeded), each its ids through the first end-of-sequence
    token (all generated ids if there is none), the tokens TRL's completion mask keeps."""
    device = next(model.parameters()).device
    batch = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).to(device)
    prompt_tokens = batch["input_ids"].shape[1]
    kwargs = {**hf_generation_kwargs(tokenizer, params),
              "max_new_tokens": new_token_limit(model, prompt_tokens, params.max_new_tokens)}
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.no_grad():
        torch.manual_seed(seed)
        ids_BL = model.generate(**batch, **kwargs, num_return_sequences=params.n)
    eos = _eos_ids(model, tokenizer)
    out = []
    for row in ids_BL[:, prompt_tokens:].tolist():
        end = next((i + 1 for i, token in enumerate(row) if token in eos), len(row))
        out.append(row[:end])
    return out


def token_texts(tokenizer, ids: Sequence[int]) -> tuple[str, list[str]]:
    """(text, one string per token) with "".join(strings) == text: the tokenizer's own decode of `ids` (special
    tokens kept) cut at each token's character range (`grail.methods.spans.token_char_offsets`). Tokens that together
    make one character share its range; the character is shown on the first of them, the others are ""."""
    try:
        text, offsets = token_char_offsets(tokenizer, ids)
    except ValueError:  # a decoder DecodeStream does not reproduce: decode token by token
        pieces = [tokenizer.decode([i], skip_special_tokens=False) for i in ids]
        return "".join(pieces), pieces
    pieces, shown = [], 0
    for start, end in offsets:
        start = max(start, shown)
        pieces.append(text[start:end] if end > start else "")
        shown = max(shown, end)
    return text, pieces


def _note(name: str, adv: float, has_box: bool, probed: bool, fallback: bool, options: WeightingOptions) -> str:
    """Why a row got the method's uninformed weights ("" when it got informed ones, or for `none`)."""
    spec = METHODS[name]
    if spec.probe is None:
        return ""
    if probed:
        return "the signal was zero, NaN or inf on this row: uniform weights" if fallback else ""
    if adv == 0:
        return "A = 0: the row carries no gradient, so training does not probe it"
    if not has_box:
        return "no complete \\boxed{}: uniform weights"
    if spec.rows == "saliency":
        return (f"not reweighted under rollout_symmetry={options.rollout_symmetry!r} (only the answer-span "
                f"overrides apply)")
    return "no scored tokens: uniform weights"


def _pool(total: dict[str, torch.Tensor] | None, sums: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`weight_sums` of two batches pooled (sums add, `max` takes the max)."""
    if total is None:
        return sums
    return {k: torch.maximum(total[k], v) if k == "max" else total[k] + v for k, v in sums.items()}


def _explain_group(model, tokenizer, row_index: int, prompt_ids: list[int], completions: list[list[int]],
                   rewards: list[float] | None, adv_G: list[float], methods: Sequence[str],
                   options: WeightingOptions, generator: torch.Generator, sums: dict):
    """The views of one prompt's completions; adds each method's `weight_sums` to `sums[method]`."""
    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    S, T = len(prompt_ids), max(len(c) for c in completions)
    G = len(completions)
    ids_BL = torch.full((G, S + T), pad, dtype=torch.long)
    mask_BT = torch.zeros((G, T), dtype=torch.bool)
    for b, completion in enumerate(completions):
        ids_BL[b, :S] = torch.tensor(prompt_ids)
        ids_BL[b, S : S + len(completion)] = torch.tensor(completion)
        mask_BT[b, : len(completion)] = True
    ids_BL, mask_BT = ids_BL.to(device), mask_BT.to(device)
    attention_BL = torch.cat([torch.ones((G, S), dtype=torch.long, device=device), mask_BT.long()], dim=1)
    adv_B = torch.tensor(adv_G, dtype=torch.float32, device=device)
    spans = batch_spans(tokenizer, ids_BL[:, S:], mask_BT, options)
    per_method = {}
    for name in methods:
        spec = method_spec(name)
        opts = options_for(spec, options)
        rows_B = probe_rows(adv_B, spans, mask_BT, opts, spec)
        signal_BT = None
        if spec.probe is not None and bool(rows_B.any()):
            signal_BT = run_probe(model, ids_BL, attention_BL, spans, mask_BT, rows_B, opts, generator, spec,
                                  adv_B=adv_B, tokenizer=tokenizer)
        out = token_weights(model, tokenizer, ids_BL, attention_BL, mask_BT, adv_B, opts, spans=spans,
                            signal_BT=signal_BT, generator=generator, spec=spec)
        for key, keep_B in ((name, adv_B != 0), ((name, "correct"), adv_B > 0), ((name, "wrong"), adv_B < 0)):
            kept_B = torch.where(keep_B, adv_B, torch.zeros_like(adv_B))  # weight_sums describes rows with A ≠ 0
            sums[key] = _pool(sums.get(key), weight_sums(
                out.weights_BT, kept_B, out.weights_BT * kept_B[:, None], mask_BT, out.reasoning_BT,
                out.normalised_BT, weight_min=opts.weight_min, weight_max=opts.weight_max, num_bins=NUM_BINS))
        per_method[name] = (out, signal_BT, rows_B)
    views = []
    for b, completion in enumerate(completions):
        n = len(completion)
        text, pieces = token_texts(tokenizer, completion)
        tokens = {}
        for name, (out, signal_BT, rows_B) in per_method.items():
            probed = bool(rows_B[b])
            signal = tuple(signal_BT[b, :n].tolist()) if probed and signal_BT is not None else None
            tokens[name] = MethodTokens(tuple(out.weights_BT[b, :n].tolist()), signal,
                                        _note(name, adv_G[b], bool(spans.has_box_B[b]), probed,
                                              bool(out.fallback_B[b]), options))
        views.append(CompletionView(
            row_index, b, text, tuple(pieces), tuple(spans.answer_BT[b, :n].tolist()),
            tuple(spans.box_BT[b, :n].tolist()), tuple(spans.reasoning_BT[b, :n].tolist()),
            None if rewards is None else rewards[b], adv_G[b], tokens))
    return views


def explain(model, tokenizer, rows: Sequence[ExplainRow], methods: Sequence[str], options: WeightingOptions, *,
            sampling: SamplingParams, seed: int = 0, reward_fn: Callable[..., list[float]] | None = None,
            scale_rewards: str = "none", advantage: float | None = None) -> Explanation:
    """Signals, weights and position profiles of `methods` on each row's completions (module docstring).

    Args:
        model, tokenizer: a Hugging Face causal LM (put in eval mode: dropout off) and its fast tokenizer.
        rows: the prompts; a row's `completions`, if given, are used instead of sampling.
        methods: `token_weighting` names (`grail.methods.table.METHODS`), in the page's order.
        options: the run's `WeightingOptions` (its `token_weighting` is replaced by each method in turn).
        sampling: the rollout settings; `sampling.n` completions per row that has none given.
        seed: sampling seed of row i is seed + i; the probes' generator (random permutation, OAR-G noise) is
            seeded with `seed`.
        reward_fn: TRL's reward-function contract (`grail.evaluation.rewards`); grades every completion against
            its row's answer. scale_rewards: TRL's `scale_rewards` (`group_advantages`).
        advantage: every completion's A; None = the graded group advantages (then every row needs an answer).
    """
    if not methods:
        raise ValueError("grail explain needs at least one method, e.g. --method grail.")
    for name in methods:
        method_spec(name)  # the error lists the names
    if not rows:
        raise ValueError("grail explain needs at least one prompt (--prompt TEXT, or --dataset FILE --rows K).")
    if advantage is None and (reward_fn is None or any(r.answer is None for r in rows)):
        raise ValueError("no reference answer to grade the completions against: give the answer (--answer TEXT) or "
                         "every completion's advantage (--advantage A).")
    model.eval()
    prompt_ids, completion_ids = [], []
    for i, row in enumerate(rows):
        prompt_ids.append(tokenizer(row.prompt, add_special_tokens=False)["input_ids"])
        if row.completions is not None:
            given = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in row.completions]
            if not given or not all(given):
                raise ValueError(f"prompt {i}: a given completion is empty; give non-empty --completion texts.")
            completion_ids.append(given)
        else:
            completion_ids.append(sample_completions(model, tokenizer, row.prompt, sampling, seed + i))
    gradeable = reward_fn is not None and all(r.answer is not None for r in rows)
    rewards: list[list[float] | None] = [None] * len(rows)
    if gradeable:
        for i, (row, ids) in enumerate(zip(rows, completion_ids, strict=True)):
            texts = tokenizer.batch_decode(ids, skip_special_tokens=True)  # what TRL hands the reward functions
            rewards[i] = [float(r) for r in reward_fn(prompts=[row.prompt] * len(ids), completions=texts,
                                                      answer=[row.answer] * len(ids))]
    if advantage is None:
        advantages = group_advantages(rewards, scale_rewards)
        source = (f"graded with the reward `{getattr(reward_fn, '__name__', 'reward')}` against each prompt's "
                  f"answer; A = reward − mean of the prompt's completions"
                  + {"group": ", divided by their std + 1e-4 (scale_rewards=group)",
                     "batch": ", divided by the std of all rewards + 1e-4 (scale_rewards=batch)",
                     "none": " (scale_rewards=none: not divided by a std)"}[scale_rewards])
    else:
        advantages = [[float(advantage)] * len(ids) for ids in completion_ids]
        source = f"given: A = {advantage:g} for every completion" + (" (rewards shown, not used)" if gradeable else "")
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    sums: dict[str, dict] = {}
    views = []
    for i, row in enumerate(rows):
        completions = _explain_group(model, tokenizer, i, prompt_ids[i], completion_ids[i], rewards[i],
                                     advantages[i], methods, options, generator, sums)
        views.append(RowView(i, row.label, row.prompt, None if row.answer is None else str(row.answer),
                             tuple(completions)))
    pooled = {key: finish(s) for key, s in sums.items()}
    return Explanation(
        rows=tuple(views), methods=tuple(methods), labels={m: METHODS[m].label for m in methods},
        profiles={m: tuple(pooled[m]["position_profile"].tolist()) for m in methods},
        profile_counts={m: tuple(int(c) for c in pooled[m]["position_count"].tolist()) for m in methods},
        advantage_source=source,
        outcome_profiles={m: {o: tuple(pooled[(m, o)]["position_profile"].tolist()) for o in OUTCOMES}
                          for m in methods},
        outcome_counts={m: {o: tuple(int(c) for c in pooled[(m, o)]["position_count"].tolist()) for o in OUTCOMES}
                        for m in methods})
