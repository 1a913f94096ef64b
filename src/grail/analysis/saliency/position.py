r"""Saliency AUROC with the token's position held fixed, and the signal's profile over positions.

Pure code (torch and the standard library; no model). `grail.analysis.saliency.quality` computes each scored token's
position and calls this; `grail.analysis.saliency.token_labels` holds the pooled AUROC and the labels.

Positions, per trace (completion-token indices; the reasoning is the tokens before the answer box,
`grail.methods.spans.AnswerSpans`):
  - distance d_t = k0 − t, where k0 is the index of the first token of the answer box (`box_BT`'s first): the
    last reasoning token has d = 1 (`box_distance_BT`);
  - relative position p_t = t / R, R = the trace's reasoning tokens, in [0, 1) (`relative_position_BT`).

Position-matched AUROC (`matched_auroc_result`), the chance that a critical token outranks a filler token AT THE SAME
DISTANCE from the box:
  1. Standing. Raw scores are not comparable across traces (a corrupted trace's gradients dwarf its reference's),
     and the pairs of step 3 cross traces. With `scale="window"` (the default, the counterpart of within-trace
     pairs) each score is read against its own trace's last D reasoning tokens, the same positions in every trace:
         u_t = (#{j in W_g : s_j < s_t} + ½ #{j in W_g : s_j = s_t}) / |W_g|,  W_g = {j in trace g : d_j <= D},
     D = `window`, default the fewest tokens any trace passes in (`saliency_auroc` passes every reasoning token of a
     scored row, labelled or not, so W_g is exactly distances 1..D in every trace). u is a non-decreasing map of
     the score within a trace (so within-trace rankings survive, up to ties beyond the window's extremes) and
     ignores the row's scale. A signal that depends only on distance has the same window values in every trace,
     so u is the same function of distance everywhere and ties within a bin: 0.5 exactly. A percentile over the
     WHOLE trace would not do: it also depends on the trace's length, which at a fixed distance correlates with the
     label (a two-word object lengthens every sentence and puts a format word where a digit would be), and a pure
     distance signal then scores 0.40 on the natural-contrast set (tests/test_saliency_position.py). With
     `scale="raw"` (the counterpart of `pairs="all"`) the scores are compared as they are.
  2. Bins of distance: b_t = ⌊(d_t − 1) / w⌋, w = `bin_width` (default 1: the exact distance).
  3. Estimator (stratified Mann–Whitney): with W_b = Σ_{c,f in bin b} [1(u_c > u_f) + ½ 1(u_c = u_f)] and
     P_b = n_c,b · n_f,b over the critical and filler tokens of bin b, pooled over traces and examples,
         AUROC_matched = Σ_b W_b / Σ_b P_b = Σ_b (P_b / Σ_b' P_b') · AUROC_b,
     the pairs-weighted mean of the within-bin AUROCs: the AUROC over the (critical, filler) pairs that share a
     distance, each pair counted once (van Elteren's test weights the bins by 1/(n_b + 1) instead, for power; we
     estimate a probability, so every matched pair counts the same, and one bin gives back the pooled AUROC).
  A bin without both classes has no pair and adds nothing: it is counted and named in the result's note, not an
  error. CI: the percentile bootstrap over examples of `token_labels.auroc_result` (a drawn example brings all its
  tokens, in their bins).
Why pairs across traces, not within a trace as the pooled figure: a trace has ONE token at each distance, so exact
bins hold no within-trace pair; wider bins keep only pairs a few tokens apart, whose order the solution's template
fixes, and a signal that is nothing but distance then scores what that order says (natural-contrast set, tiny
tokenizer, 200 rows: 0.00 within bins of 4 distances, 0.29 within bins of 8; the multi-step filler set has no
within-trace pair at all in bins of up to 8). Across traces, wider bins leave the same order inside each bin (a pure
distance signal: 0.40 on the natural-contrast set in bins of 4, tests/test_saliency_position.py); exact bins compare
tokens at the same distance, where a pure distance signal ties.

What it does not hold fixed: the position from the start (a trace's length varies at a fixed distance), so a signal of
that position alone can score far from 0.5 here; and a distance with one class drops its tokens. The stricter figure
is `grail.analysis.saliency.fixed_position` (why, with the measurements, in its docstring).

Position profile (`position_profile`): per class (critical, filler) and relative-position bin ⌊p_t · bins⌋, the
mean score, the mean within-trace percentile u_t (scale-free: comparable across rows and methods) and the count.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Literal

import torch

from grail.analysis.saliency.token_labels import (
    CRITICAL,
    FILLER,
    UNLABELLED,
    AurocResult,
    stratified_interval,
    stratified_wins_pairs,
)

__all__ = ["box_distance_BT", "matched_auroc_result", "position_profile", "PositionProfile", "relative_position_BT",
           "Scale", "trace_percentile", "window_standing"]

Scale = Literal["window", "raw"]


# ---- positions ----------------------------------------------------------------------------------------------------
def box_distance_BT(box_BT: torch.Tensor) -> torch.Tensor:
    """(B, T) int64: k0 − t, k0 = the index of the row's first box token (d = 1 on the token before the box; 0 on
    the box's first token, negative after it). A row without a box token gets k0 = T."""
    B, T = box_BT.shape
    t_BT = torch.arange(T, device=box_BT.device).expand(B, T)
    k0_B = torch.where(box_BT.any(1), box_BT.int().argmax(1), torch.full((B,), T, device=box_BT.device))
    return k0_B[:, None] - t_BT


def relative_position_BT(reasoning_BT: torch.Tensor) -> torch.Tensor:
    """(B, T) float32: t / R on reasoning tokens (t counted over the row's reasoning tokens, R their number), in
    [0, 1); 0 elsewhere."""
    reasoning = reasoning_BT.bool()
    t_BT = reasoning.long().cumsum(1) - 1
    R_B1 = reasoning.sum(1, keepdim=True).clamp_min(1)
    return torch.where(reasoning, t_BT.float() / R_B1, torch.zeros((), device=reasoning.device))


# ---- the matched AUROC --------------------------------------------------------------------------------------------
def trace_percentile(scores_N: torch.Tensor, trace_N: torch.Tensor) -> torch.Tensor:
    """(N,) float64: u_n = (#{s < s_n} + ½ #{s = s_n}) / n_trace over the tokens of n's trace (a constant trace: ½)."""
    scores, trace = scores_N.detach().double().cpu(), trace_N.long().cpu()
    if not len(scores):
        return scores
    _, trace = torch.unique(trace, return_inverse=True)
    order = torch.unique(scores, sorted=True, return_inverse=True)[1]
    K = int(order.max()) + 1
    keys_U, key_N = torch.unique(trace * K + order, sorted=True, return_inverse=True)
    count_U = torch.zeros(len(keys_U), dtype=torch.float64).index_add_(0, key_N, torch.ones_like(scores))
    trace_U = keys_U // K
    n_G = torch.zeros(int(trace.max()) + 1, dtype=torch.float64).index_add_(0, trace_U, count_U)
    below_U = count_U.cumsum(0) - count_U - (n_G.cumsum(0) - n_G)[trace_U]
    return (below_U + 0.5 * count_U)[key_N] / n_G[trace]


def window_standing(scores_N: torch.Tensor, trace_N: torch.Tensor, distance_N: torch.Tensor,
                    window: int | None = None) -> tuple[torch.Tensor, int]:
    """(u_N float64, D): each score's mid-rank standing among its trace's tokens at distance <= D (step 1 of the
    module docstring); D = `window`, or the fewest tokens of any trace. A trace with no token within D: u = ½."""
    scores, trace, distance = scores_N.detach().double().cpu(), trace_N.long().cpu(), distance_N.long().cpu()
    if window is not None and window < 1:
        raise ValueError(f"window={window} must be >= 1 (a number of reasoning tokens before the box) or None.")
    ids, trace, size_G = torch.unique(trace, return_inverse=True, return_counts=True)
    D = int(size_G.min()) if window is None and len(ids) else (window or 0)
    u = torch.full_like(scores, 0.5)
    for g in range(len(ids)):
        members = (trace == g).nonzero().squeeze(1)
        ref = scores[members][distance[members] <= D].sort().values
        if len(ref):
            s = scores[members]
            below = torch.searchsorted(ref, s, right=False)
            equal = torch.searchsorted(ref, s, right=True) - below
            u[members] = (below + 0.5 * equal).double() / len(ref)
    return u, D


def _ranges(values: list[int]) -> str:
    """[1, 2, 3, 7, 9, 10] → "1-3, 7, 9-10"."""
    out, start = [], None
    for i, v in enumerate(values):
        start = v if start is None else start
        if i + 1 == len(values) or values[i + 1] != v + 1:
            out.append(str(v) if v == start else f"{start}-{v}")
            start = None
    return ", ".join(out)


def matched_auroc_result(scores_N: torch.Tensor, labels_N: torch.Tensor, example_N: torch.Tensor,
                         distance_N: torch.Tensor, trace_N: torch.Tensor | None = None, *, bin_width: int = 1,
                         scale: Scale = "window", window: int | None = None, num_bootstrap: int = 1000,
                         confidence: float = 0.95, seed: int = 0) -> AurocResult:
    """The position-matched AUROC of the module docstring, with its percentile-bootstrap CI over examples.

    Args:
        scores_N: (N,) scores; labels_N: (N,) CRITICAL / FILLER / UNLABELLED (unlabelled tokens count in the
            window, then are dropped). example_N: (N,) example ids (the bootstrap's unit).
        distance_N: (N,) int distance to the box, >= 1 (`box_distance_BT`). trace_N: (N,) trace ids (None: the
            example). bin_width: distances per bin (>= 1). scale: "window" or "raw"; window: D (None: the fewest
            tokens of any trace) (module docstring).
        num_bootstrap, confidence, seed: as `token_labels.auroc_result`.
    Returns:
        `AurocResult`: n_critical / n_filler count the tokens in bins with both classes; `note` names the bins
        without both (distances) and the tokens they hold; NaN with a note when no bin has both.
    """
    if bin_width < 1 or scale not in ("window", "raw"):
        raise ValueError(f"bin_width={bin_width} must be >= 1 and scale={scale!r} 'window' or 'raw'.")
    if not 0 < confidence < 1 or num_bootstrap < 0:
        raise ValueError(f"matched_auroc_result: need 0 < confidence < 1 and num_bootstrap >= 0, got {confidence}, "
                         f"{num_bootstrap}.")
    trace_ids = (example_N if trace_N is None else trace_N).cpu()
    if len(distance_N) and int(distance_N.min()) < 1:
        raise ValueError(f"matched_auroc_result: distance {int(distance_N.min())} < 1; only reasoning tokens (before "
                         f"the box) have a distance to it.")
    if scale == "window":
        values, D = window_standing(scores_N, trace_ids, distance_N, window)
    else:
        values, D = scores_N.detach().double().cpu(), None
    keep = (labels_N != UNLABELLED).cpu()
    distance = distance_N.long().cpu()[keep]
    values, critical = values[keep], (labels_N.cpu()[keep] == CRITICAL)
    _, example = torch.unique(example_N.cpu()[keep], return_inverse=True)
    bin_N = (distance - 1) // bin_width
    E = int(example.max()) + 1 if len(example) else 0
    n_bins = int(bin_N.max()) + 1 if len(bin_N) else 0
    crit_S = torch.zeros(n_bins).index_add_(0, bin_N, critical.float())
    fill_S = torch.zeros(n_bins).index_add_(0, bin_N, (~critical).float())
    both_S = (crit_S > 0) & (fill_S > 0)
    one_class = [b for b in range(n_bins) if not both_S[b] and (crit_S[b] or fill_S[b])]
    usable = both_S[bin_N]
    n_c, n_f = int((critical & usable).sum()), int((~critical & usable).sum())
    unit = "distance" if bin_width == 1 else f"bins of {bin_width} distances, first distance"
    note = f"scores read against each trace's last {D} reasoning tokens" if D is not None else ""
    if one_class:
        lost_c = int(crit_S[one_class].sum())
        lost_f = int(fill_S[one_class].sum())
        firsts = [b * bin_width + 1 for b in one_class]
        where = _ranges(firsts) if bin_width == 1 else ", ".join(map(str, firsts))
        note += ("; " if note else "") + (f"{len(one_class)} of {len(one_class) + int(both_S.sum())} bins lack a "
                                          f"class and add no pair ({unit} {where}; {lost_c} critical and {lost_f} "
                                          f"filler tokens)")
    if not n_c:
        why = "no critical token" if not len(critical) or not critical.any() else \
            "no filler token" if critical.all() else "no distance bin holds both a critical and a filler token"
        return AurocResult(math.nan, math.nan, math.nan, 0, 0, E, note="; ".join(x for x in (f"undefined: {why}",
                                                                                              note) if x))
    wins_S, pairs_S = stratified_wins_pairs(values, critical, bin_N)
    point = float(wins_S.sum() / pairs_S.sum())
    if num_bootstrap == 0:
        return AurocResult(point, math.nan, math.nan, n_c, n_f, E, note=note)
    low, high, dropped = stratified_interval(values, critical, bin_N, example, E, num_bootstrap, confidence, seed)
    return AurocResult(point, low, high, n_c, n_f, E, note="; ".join(x for x in (note, dropped) if x))


# ---- the profile --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PositionProfile:
    """Per relative-position bin (`bins` of them, bin k = positions [k/bins, (k+1)/bins)), for the critical and
    the filler tokens: mean score, mean within-trace percentile (module docstring), token count. NaN where a bin has
    no token of the class."""

    bins: int
    critical_mean: tuple[float, ...]
    filler_mean: tuple[float, ...]
    critical_rank: tuple[float, ...]
    filler_rank: tuple[float, ...]
    critical_count: tuple[int, ...]
    filler_count: tuple[int, ...]

    def as_dict(self) -> dict:
        return asdict(self)


def position_profile(scores_N: torch.Tensor, labels_N: torch.Tensor, position_N: torch.Tensor,
                     trace_N: torch.Tensor, bins: int = 10) -> PositionProfile:
    """The position profile of the module docstring. position_N: (N,) relative positions in [0, 1)
    (`relative_position_BT`); trace_N: (N,) trace ids (the percentile's unit); unlabelled tokens count in the
    percentile only."""
    if bins < 1:
        raise ValueError(f"bins={bins} must be >= 1.")
    rank = trace_percentile(scores_N, trace_N)
    scores, labels = scores_N.detach().double().cpu(), labels_N.cpu()
    bin_N = (position_N.double().cpu() * bins).long().clamp(0, bins - 1)
    out = {}
    for name, kind in (("critical", CRITICAL), ("filler", FILLER)):
        sel = labels == kind
        count = torch.zeros(bins, dtype=torch.float64).index_add_(0, bin_N[sel], torch.ones(int(sel.sum()),
                                                                                            dtype=torch.float64))
        for stat, values in (("mean", scores), ("rank", rank)):
            total = torch.zeros(bins, dtype=torch.float64).index_add_(0, bin_N[sel], values[sel])
            out[f"{name}_{stat}"] = tuple(torch.where(count > 0, total / count.clamp_min(1), math.nan).tolist())
        out[f"{name}_count"] = tuple(int(c) for c in count.tolist())
    return PositionProfile(bins=bins, **out)
