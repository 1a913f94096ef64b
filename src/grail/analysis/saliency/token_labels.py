r"""Ground-truth token labels for saliency quality, and the AUROC that scores a per-token signal against them.

Pure code (torch and the standard library; no model). `grail.analysis.saliency.quality` runs the methods and calls this.

Saliency rows: one dict per example, with
  - `prompt`: str, the prompt text (already rendered: a chat template, if any, applied), or chat messages (the
    synthetic task's words style), which `grail.analysis.saliency.quality` renders with the tokenizer's chat template;
  - `solution`: str, a reference completion containing a complete `\boxed{...}` answer;
  - `critical_spans`: [[start, end], ...], character ranges [start, end) of `solution` that the answer depends on;
  - `filler_spans`: [[start, end], ...], character ranges of `solution` that it does not depend on.
Other keys are ignored. Spans may be empty lists, must lie inside the solution and must not overlap across the two
kinds. `saliency_row(example)` converts a synthetic-task `grail.tasks.arithmetic.TaskExample` (critical = roles in
`CRITICAL_ROLES`, operator and result digits; filler = filler-word letters) and `synthetic_rows` draws a set.

Token labels (`token_labels`), from each token's character range [a, b) in the text it was cut from:
  1. CRITICAL if any of its characters is critical (a token merging "=" and "35" is critical);
  2. else FILLER if it has at least one non-whitespace character and all of them are filler (a byte-level " now"
     is filler: the space it carries is not evidence either way);
  3. else UNLABELLED (format, operands, the answer, whitespace-only tokens, a filler/format mix, empty ranges),
     left out of the AUROC.

AUROC: the probability that a critical token's score exceeds a filler token's, ties counted 1/2 (the Mann–Whitney
U statistic), i.e. wins / pairs over (critical, filler) token pairs, pooled over all examples (no per-example mean).
1 = every critical token above every filler token, 0.5 = no information, 0 = reversed. Which pairs (`Pairs`):
  - "within_trace" (default): a critical and a filler token of the same trace. Every method normalises its weights
    per row, and a raw signal's scale differs from row to row (a confidently predicted answer has a near-zero NLL
    gradient), so pairs across rows would mostly compare row scales; this counts only rankings a row can express.
  - "all": every critical token against every filler token of the data set (one pool of tokens).
Confidence interval (`auroc_result`): percentile bootstrap over examples: resample the examples with replacement,
recompute with the drawn examples (one drawn k times counts k times: its within-trace pairs k times, its tokens k
times in "all"); resamples without a pair are dropped (`AurocResult.note` says how many).
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Literal

import torch

from grail.evaluation import bootstrap
from grail.tasks.arithmetic import TaskConfig, TaskExample
from grail.tasks.boxed import first_boxed, last_boxed
from grail.tasks.synthetic import generate

__all__ = ["CRITICAL", "FILLER", "ROW_KEYS", "UNLABELLED", "AurocResult", "auroc_result", "char_labels",
           "check_row", "check_spans_map", "corrupted_solution", "is_messages", "Pairs", "percentile_interval",
           "pooled_auroc", "resample_counts", "saliency_row", "span_runs", "stratified_interval",
           "stratified_wins_pairs", "synthetic_rows", "token_labels", "trace_wins_pairs"]

CRITICAL, FILLER, UNLABELLED = 1, 0, -1
ROW_KEYS = ("prompt", "solution", "critical_spans", "filler_spans")
_PICK_BOX = {"first": first_boxed, "last": last_boxed}
_INTEGER = re.compile(r"\s*(-?\d+)\s*")


# ---- rows ---------------------------------------------------------------------------------------------------------
def span_runs(mask: Sequence[bool]) -> list[list[int]]:
    """Maximal runs of True as [start, end) pairs: the character spans of a per-character mask, as rows hold them."""
    runs, start = [], None
    for i, flag in enumerate([*mask, False]):
        if flag and start is None:
            start = i
        elif not flag and start is not None:
            runs.append([start, i])
            start = None
    return runs


def saliency_row(example: TaskExample) -> dict:
    """A synthetic-task example as a saliency row (its `to_row()` keys plus the two span lists)."""
    return {**example.to_row(), "critical_spans": span_runs(example.critical_mask()),
            "filler_spans": span_runs(example.filler_mask())}


def synthetic_rows(task: TaskConfig | None = None, n: int = 64, split: str = "heldout", seed: int = 0) -> list[dict]:
    """`n` saliency rows of the synthetic task. Filler exists only with `task.filler_rate > 0`: the default here is
    `TaskConfig(filler_rate=0.6)` (the training default, 0, would leave the AUROC undefined)."""
    return [saliency_row(e) for e in generate(task or TaskConfig(filler_rate=0.6), n, split, seed)]


def is_messages(prompt) -> bool:
    """Whether `prompt` is a non-empty list of chat messages ({"role", "content"} dicts)."""
    return isinstance(prompt, list) and bool(prompt) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in prompt)


def check_row(row: dict, index: int, box: str = "first") -> None:
    """Raise ValueError naming row `index`'s problem and the fix; None if the row is a valid saliency row."""
    where = f"saliency row {index}"
    if not isinstance(row, dict):
        raise ValueError(f"{where} is a {type(row).__name__}, not a dict with keys {', '.join(ROW_KEYS)}.")
    missing = [k for k in ROW_KEYS if k not in row]
    if missing:
        raise ValueError(f"{where} has no {', '.join(map(repr, missing))}: saliency rows need {', '.join(ROW_KEYS)} "
                         f"(spans are [start, end) character offsets into solution); convert synthetic examples "
                         f"with grail.analysis.saliency.token_labels.saliency_row(example).")
    for key in ("prompt", "solution"):
        if key == "prompt" and is_messages(row[key]):
            continue
        if not isinstance(row[key], str) or not row[key]:
            kind = "a non-empty string" + (" or chat messages" if key == "prompt" else "")
            raise ValueError(f"{where}: {key!r} must be {kind}, got {row[key]!r:.80}.")
    if _PICK_BOX[box](row["solution"]) is None:
        raise ValueError(f"{where}: the solution has no complete \\boxed{{...}}; the probes explain the answer's "
                         f"likelihood, so end the reference solution with its boxed final answer.")
    n = len(row["solution"])
    for key in ("critical_spans", "filler_spans"):
        spans = row[key]
        if not isinstance(spans, (list, tuple)) or not all(
                isinstance(s, (list, tuple)) and len(s) == 2 and all(isinstance(x, int) for x in s) for s in spans):
            raise ValueError(f"{where}: {key!r} must be a list of [start, end] integer pairs, got {spans!r:.80}.")
        bad = [s for s in spans if not 0 <= s[0] < s[1] <= n]
        if bad:
            raise ValueError(f"{where}: {key} {bad[0]} is not a non-empty range inside the solution "
                             f"(0 <= start < end <= {n}).")
    labels = char_labels(n, row["critical_spans"], [])
    clash = next((i for s, e in row["filler_spans"] for i in range(s, e) if labels[i] == CRITICAL), None)
    if clash is not None:
        raise ValueError(f"{where}: solution character {clash} is in both a critical and a filler span; a character "
                         f"has one label, so make the spans disjoint.")


def char_labels(length: int, critical_spans: Sequence[Sequence[int]],
                filler_spans: Sequence[Sequence[int]]) -> list[int]:
    """Per character of a text of `length`: CRITICAL, FILLER or UNLABELLED (critical wins an overlap)."""
    labels = [UNLABELLED] * length
    if any(not 0 <= start <= end <= length for spans in (critical_spans, filler_spans) for start, end in spans):
        raise ValueError(f"char_labels: a span lies outside the text [0, {length}); spans are [start, end) offsets.")
    for kind, spans in ((FILLER, filler_spans), (CRITICAL, critical_spans)):
        for start, end in spans:
            labels[start:end] = [kind] * (end - start)
    return labels


def token_labels(text: str, labels_C: Sequence[int], offsets: Sequence[Sequence[int]]) -> list[int]:
    """One label per token from its character range [a, b) in `text` (rules 1-3 of the module docstring)."""
    out = []
    for a, b in offsets:
        chars = labels_C[a:b]
        if CRITICAL in chars:
            out.append(CRITICAL)
            continue
        visible = [label for label, ch in zip(chars, text[a:b], strict=True) if not ch.isspace()]
        out.append(FILLER if visible and all(label == FILLER for label in visible) else UNLABELLED)
    return out


def check_spans_map(row: dict, index: int, offsets: Sequence[Sequence[int]], labels_N: Sequence[int]) -> None:
    """Raise ValueError naming row `index` when one of its spans lies in no token of its kind: a critical span in no
    CRITICAL token, a filler span in no FILLER token (rules 1-2 of the module docstring). `offsets`, `labels_N`: the
    tokenized solution's character ranges and `token_labels`."""
    text = row["solution"]
    for key, kind, name in (("critical_spans", CRITICAL, "critical"), ("filler_spans", FILLER, "filler")):
        for start, end in row[key]:
            touching = [(a, b, label) for (a, b), label in zip(offsets, labels_N, strict=True) if a < end and b > start]
            if any(label == kind for _, _, label in touching):
                continue
            cut = [text[a:b] for a, b, _ in touching]
            why = ("no token covers it" if not touching else
                   "its tokens also cover characters outside filler spans (a filler token's non-space characters "
                   "must all be filler)" if kind == FILLER else "no token covers it")
            raise ValueError(f"saliency row {index}: {name} span [{start}, {end}) {text[start:end]!r} maps to no "
                             f"{name} token: {why}; the tokenizer cuts it as {cut!r}. Make the span cover whole "
                             f"tokens (a filler span the whole word, e.g. with the space the tokenizer attaches) or "
                             f"drop it.")


def corrupted_solution(solution: str, labels_C: Sequence[int], seed: int | str,
                       box: str = "first") -> tuple[str, list[int]]:
    """The solution with its boxed answer replaced by a wrong number, and its character labels.

    An integer answer n becomes n + k with k drawn from 1..9 (`random.Random(seed)`), anything else a number drawn
    from 1..99; the new content is UNLABELLED, labels outside the box content are kept (shifted after it). `box`:
    which complete box is the answer (`WeightingOptions.answer_box`)."""
    span = _PICK_BOX[box](solution)
    if span is None:
        raise ValueError("corrupted_solution: the solution has no complete \\boxed{...} to corrupt.")
    rng = random.Random(seed)
    match = _INTEGER.fullmatch(span.content(solution))
    wrong = str(int(match.group(1)) + rng.randint(1, 9)) if match else str(rng.randint(1, 99))
    text = solution[:span.content_start] + wrong + solution[span.content_end:]
    labels = [*labels_C[:span.content_start], *[UNLABELLED] * len(wrong), *labels_C[span.content_end:]]
    return text, labels


# ---- AUROC --------------------------------------------------------------------------------------------------------
Pairs = Literal["within_trace", "all"]


def _distinct_rank(scores_N: torch.Tensor) -> torch.Tensor:
    """(N,) int64: the rank of each score among the distinct scores (equal scores share a rank)."""
    if not torch.isfinite(scores_N).all():
        raise ValueError("AUROC: the scores contain NaN or inf; a probe returned non-finite values.")
    return torch.unique(scores_N, sorted=True, return_inverse=True)[1]


def stratified_wins_pairs(scores_N: torch.Tensor, critical_N: torch.Tensor, stratum_N: torch.Tensor,
                          counts_RN: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per stratum: Mann–Whitney wins and pairs over the (critical, other) token pairs of the same stratum, each
    token counted `counts_RN[r, n]` times.

    wins_rs = Σ_{c,f in s} m_rc m_rf [1(s_c > s_f) + ½ 1(s_c = s_f)], pairs_rs = Σ_{c in s} m_rc · Σ_{f in s} m_rf.
    Computed through the sorted (stratum, distinct score) cells: per cell, the critical mass times (the filler mass
    of the same stratum strictly below + half the filler mass in the cell). O(R·N) memory, no pairwise matrix.
    One stratum is the pooled AUROC; strata = traces the within-trace one; strata = distance bins the
    position-matched one (`grail.analysis.saliency.position`).

    Args:
        scores_N: (N,) finite scores; critical_N: (N,) bool, True = critical, False = filler.
        stratum_N: (N,) int64 ids in 0..S-1. counts_RN: (R, N) non-negative multiplicities (one bootstrap resample
            per row); None = one row of ones.
    Returns:
        (wins_RS, pairs_RS) float64, S = max(stratum_N) + 1.
    """
    rank_N = _distinct_rank(scores_N.detach().double().cpu())
    critical, stratum = critical_N.bool().cpu(), stratum_N.long().cpu()
    counts = torch.ones(1, len(rank_N), dtype=torch.float64) if counts_RN is None else counts_RN.double().cpu()
    R, S = len(counts), int(stratum.max()) + 1 if len(stratum) else 0
    K = int(rank_N.max()) + 1 if len(rank_N) else 1
    keys_U, key_N = torch.unique(stratum * K + rank_N, sorted=True, return_inverse=True)  # cells in order
    stratum_U, U = keys_U // K, len(keys_U)
    crit_RU = torch.zeros(R, U, dtype=torch.float64).index_add_(1, key_N[critical], counts[:, critical])
    fill_RU = torch.zeros(R, U, dtype=torch.float64).index_add_(1, key_N[~critical], counts[:, ~critical])
    fill_RS = torch.zeros(R, S, dtype=torch.float64).index_add_(1, stratum_U, fill_RU)
    before_RS = fill_RS.cumsum(1) - fill_RS  # filler mass of the strata sorted before each stratum
    below_RU = fill_RU.cumsum(1) - fill_RU - before_RS[:, stratum_U]  # same stratum, strictly below the cell
    wins_RS = torch.zeros(R, S, dtype=torch.float64).index_add_(1, stratum_U, crit_RU * (below_RU + 0.5 * fill_RU))
    crit_RS = torch.zeros(R, S, dtype=torch.float64).index_add_(1, stratum_U, crit_RU)
    return wins_RS, crit_RS * fill_RS


def pooled_auroc(scores_N: torch.Tensor, critical_N: torch.Tensor,
                 counts_RN: torch.Tensor | None = None) -> torch.Tensor:
    """Mann–Whitney AUROC of critical vs the other tokens, all pairs (one stratum of `stratified_wins_pairs`), each
    token counted `counts_RN[r, n]` times: AUROC_r = wins_r / pairs_r.

    Returns:
        (R,) float64; NaN where a resample has no critical or no filler mass.
    """
    wins_RS, pairs_RS = stratified_wins_pairs(scores_N, critical_N, torch.zeros(len(scores_N), dtype=torch.long),
                                              counts_RN)
    if wins_RS.shape[1] == 0:
        return torch.full((len(wins_RS),), math.nan, dtype=torch.float64)
    return _ratio(wins_RS[:, 0], pairs_RS[:, 0])


def trace_wins_pairs(scores_N: torch.Tensor, critical_N: torch.Tensor,
                     trace_N: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per trace: the Mann–Whitney wins Σ_{c,f} [1(s_c > s_f) + ½ 1(s_c = s_f)] and the pair count n_c · n_f over
    the trace's own (critical, filler) pairs. trace_N: (N,) ids in 0..G-1. Returns (wins_G, pairs_G) float64.
    The within-trace AUROC is Σ wins / Σ pairs (a trace drawn k times: k · its wins and pairs)."""
    wins_RG, pairs_RG = stratified_wins_pairs(scores_N, critical_N, trace_N)
    return wins_RG[0], pairs_RG[0]


def _ratio(wins_R: torch.Tensor, pairs_R: torch.Tensor) -> torch.Tensor:
    return torch.where(pairs_R > 0, wins_R / pairs_R.clamp_min(1e-300), torch.full_like(wins_R, math.nan))


@dataclass(frozen=True)
class AurocResult:
    """AUROC of critical vs filler tokens with its bootstrap CI. `auroc` is NaN (and `note` says why) when there is
    no (critical, filler) pair; n_critical / n_filler count the scored tokens, n_examples the examples that have
    labelled tokens among them. `saliency_auroc` adds `matched`, `profile` and `fixed` (`as_dict` nests them)."""

    auroc: float
    ci_low: float
    ci_high: float
    n_critical: int
    n_filler: int
    n_examples: int
    note: str = ""
    matched: AurocResult | None = None  # the position-matched AUROC (grail.analysis.saliency.position), if computed
    # the mean score by relative position (a grail.analysis.saliency.position.PositionProfile, which imports this
    # module), if computed
    profile: object | None = None
    # the AUROC with position fixed in every sense (grail.analysis.saliency.fixed_position), if computed
    fixed: AurocResult | None = None
    # all labelled tokens of each class, where the estimator scores only some of them (fixed_position: n_critical of
    # labelled_critical entered); None where every labelled token is scored
    labelled_critical: int | None = None
    labelled_filler: int | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def auroc_result(scores_N: torch.Tensor, labels_N: torch.Tensor, example_N: torch.Tensor,
                 trace_N: torch.Tensor | None = None, *, pairs: Pairs = "within_trace", num_bootstrap: int = 1000,
                 confidence: float = 0.95, seed: int = 0) -> AurocResult:
    """The AUROC of the module docstring and its percentile-bootstrap CI over examples.

    Args:
        scores_N: (N,) scores of tokens; labels_N: (N,) CRITICAL / FILLER / UNLABELLED (the last are dropped).
        example_N: (N,) integer id of each token's example (the bootstrap's unit).
        trace_N: (N,) integer id of each token's trace (several traces may share an example); None = its example.
        pairs: "within_trace" or "all" (`Pairs`). num_bootstrap: resamples (0: no CI, ci_low = ci_high = NaN).
        confidence: CI level in (0, 1). seed: the resampling's torch.Generator seed (same inputs, same CI).
    """
    if pairs not in ("within_trace", "all"):
        raise ValueError(f"pairs={pairs!r}: choose 'within_trace' or 'all'.")
    if not 0 < confidence < 1 or num_bootstrap < 0:
        raise ValueError(f"auroc_result: need 0 < confidence < 1 and num_bootstrap >= 0, got {confidence}, "
                         f"{num_bootstrap}.")
    keep = labels_N != UNLABELLED
    scores, critical = scores_N[keep], labels_N[keep] == CRITICAL
    example_ids = example_N[keep].cpu()
    _, example = torch.unique(example_ids, return_inverse=True)  # ids → 0..E-1
    trace_ids = example_ids if trace_N is None else trace_N[keep].cpu()
    trace_keys, trace = torch.unique(trace_ids, return_inverse=True)
    E, n_c, n_f = int(example.max()) + 1 if len(example) else 0, int(critical.sum()), int((~critical).sum())
    if pairs == "within_trace":
        wins_G, pairs_G = trace_wins_pairs(scores, critical, trace)
        example_G = torch.zeros(len(trace_keys), dtype=torch.long).scatter_(0, trace, example)  # each trace's example
        point = _ratio(wins_G.sum()[None], pairs_G.sum()[None])
    else:
        point = pooled_auroc(scores, critical)
    if math.isnan(point[0]):
        why = "no critical token" if n_c == 0 else "no filler token" if n_f == 0 else "no trace with both kinds"
        return AurocResult(math.nan, math.nan, math.nan, n_c, n_f, E,
                           note=f"undefined: {why} (for the synthetic task, filler needs filler_rate > 0)")
    if num_bootstrap == 0:
        return AurocResult(float(point[0]), math.nan, math.nan, n_c, n_f, E)
    draws = []
    for counts_RE in resample_counts(E, num_bootstrap, len(scores), seed):
        if pairs == "within_trace":
            counts_RG = counts_RE[:, example_G]
            draws.append(_ratio(counts_RG @ wins_G, counts_RG @ pairs_G))
        else:
            draws.append(pooled_auroc(scores, critical, counts_RE[:, example]))
    low, high, note = percentile_interval(torch.cat(draws), confidence)
    return AurocResult(float(point[0]), low, high, n_c, n_f, E, note=note)


def resample_counts(E: int, num_bootstrap: int, n_tokens: int, seed: int):
    """Yields (r, E) float64 blocks of bootstrap multiplicities of E examples (each row: E draws with replacement),
    num_bootstrap rows in all, from torch.Generator().manual_seed(seed); blocks bound a (r, n_tokens) matrix to
    ~32 MB."""
    generator = torch.Generator().manual_seed(seed)
    block = max(1, 4_000_000 // max(n_tokens, E, 1))
    for start in range(0, num_bootstrap, block):
        r = min(block, num_bootstrap - start)
        picks_RE = torch.randint(E, (r, E), generator=generator)
        yield torch.zeros(r, E, dtype=torch.float64).scatter_add_(1, picks_RE, torch.ones_like(picks_RE,
                                                                                           dtype=torch.float64))


def stratified_interval(scores_N: torch.Tensor, critical_N: torch.Tensor, stratum_N: torch.Tensor,
                        example_N: torch.Tensor, E: int, num_bootstrap: int, confidence: float,
                        seed: int) -> tuple[float, float, str]:
    """(low, high, note): the percentile interval of the stratified AUROC (`stratified_wins_pairs`) over
    `num_bootstrap` resamples of the E examples (`example_N`: (N,) ids in 0..E-1; a drawn example brings all its
    tokens, in their strata), as `percentile_interval` reads them (a resample without a pair is dropped)."""
    draws = []
    for counts_RE in resample_counts(E, num_bootstrap, len(scores_N), seed):
        wins_RS, pairs_RS = stratified_wins_pairs(scores_N, critical_N, stratum_N, counts_RE[:, example_N])
        draws.append(_ratio(wins_RS.sum(1), pairs_RS.sum(1)))
    return percentile_interval(torch.cat(draws), confidence)


def percentile_interval(draws_R: torch.Tensor, confidence: float) -> tuple[float, float, str]:
    """(low, high, note): the percentile interval of the finite bootstrap draws, by the package's one percentile rule
    (`grail.evaluation.bootstrap.percentile_interval`: sorted draws at ⌊tail·(R−1)⌋ and ⌈(1−tail)·(R−1)⌉); NaN
    bounds when none is finite. The note says how many resamples had no pair to compare (NaN draws, dropped), and
    when the interval is a single bound, 0 or 1: every pair ranks one way, so every resample does too, and the zero
    width says nothing about the uncertainty."""
    finite = draws_R[torch.isfinite(draws_R)]
    dropped = len(draws_R) - len(finite)
    note = f"{dropped} of {len(draws_R)} resamples had no pair to compare and were dropped" if dropped else ""
    if not len(finite):
        return math.nan, math.nan, note
    low, high = bootstrap.percentile_interval(finite.tolist(), confidence)
    if low == high and low in (0.0, 1.0):
        note = "; ".join(x for x in (note, f"every pair ranks one way (AUROC {low:g}), so every resample does too: "
                                     "the interval's zero width is not a measure of uncertainty") if x)
    return low, high, note
