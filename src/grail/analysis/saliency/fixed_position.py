r"""Saliency AUROC with position held fixed in every sense: the estimator that a signal of position alone cannot move.

Pure code (torch and the standard library; no model). `grail.analysis.saliency.quality` computes each scored token's
position and calls this; the label sets it is meant for are `grail.analysis.saliency.counterbalanced` (groups of
traces of one layout, built so that both classes occur at every position) and `grail.analysis.saliency.rollout_labels`
(the models' own sampled rollouts, counterbalanced only by chance).

Why not `grail.analysis.saliency.position.matched_auroc_result`: its strata are distances to the box alone, pooled
over traces of different lengths, and its standing is read against the last D tokens of each trace. A signal that
depends on the position from the START (a U over the trace, a function of t / R) is not constant at a fixed distance
when the traces' lengths R differ, so it can score far from 0.5 there (tests/test_saliency_counterbalanced.py records
one that does). And on the multi-step sets half the labelled tokens sit at distances with one class only.

The estimator (`fixed_position_auroc_result`), for tokens n with score s_n, label (critical / contrast), group g_n,
trace, and position t_n (the token's index in its completion; the reasoning is t = 0..R−1, R = the trace's reasoning
tokens, the index of the box's first token):
  1. Standing. With `scale="trace"` (default) each score is read against ALL its trace's reasoning tokens, labelled or
     not: u_n = (#{j in trace : s_j < s_n} + ½ #{j in trace : s_j = s_n}) / R (`position.trace_percentile`). This
     ignores each trace's scale and is a non-decreasing map of the score within a trace. With `scale="raw"` the
     scores are compared as they are (for signals whose scale is comparable across traces).
  2. Strata: h_n = (g_n, R_n, t_n). Inside a stratum every token has the same position from the start (t), the same
     distance to the box (R − t) and the same relative position (t / R); within a group (one prompt, the caller's
     choice) also the same absolute position in the model's input. A signal f(t, R) that is a function of position
     alone, whatever the function, gives every trace of length R the same scores at the same positions, hence the
     same standings u: every pair in a stratum ties and the AUROC is ½ EXACTLY (with `scale="raw"` as well), and so
     is every bootstrap draw.
  3. Estimator (stratified Mann–Whitney, `token_labels.stratified_wins_pairs`): pairs (critical c, contrast f) of
     one stratum, i.e. of two different traces of one group and length, at the same position:
         AUROC = Σ_h W_h / Σ_h P_h,   W_h = Σ_{c,f in h} [1(u_c > u_f) + ½ 1(u_c = u_f)],   P_h = n_c,h · n_f,h,
     the pairs-weighted mean of the per-stratum AUROCs.
  4. Shares: a labelled token enters iff its stratum holds both classes; the result counts, per class, the tokens
     that entered (`n_critical`, `n_filler`) and all the labelled ones (`labelled_critical`, `labelled_filler`), and
     its note says the shares. Nothing is imputed for the rest: a token that entered no stratum is not evidence.
  5. CI: percentile bootstrap over GROUPS (a drawn group brings all its traces; strata never cross groups, so a
     resample keeps every pair whole), `token_labels.resample_counts` / `percentile_interval`. With one group for
     all (pairs across prompts) the unit is instead `unit_N`, e.g. the prompt of each sampled rollout (its samples
     are not independent): a drawn unit brings its tokens with its multiplicity k, and a pair of tokens of units a
     and b counts k_a · k_b times (`token_labels.stratified_wins_pairs`), so pairs across units enter every resample
     that holds both units.
Groups: for `grail.analysis.saliency.counterbalanced` rows, their `group` (one problem told in several layouts of
equal length); for sampled rollouts, the prompt (samples of one prompt that happen to share a length), or one group
for all (pairs across prompts: position from the start of the completion still fixed, the prompt's length not).
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from grail.analysis.saliency.position import trace_percentile
from grail.analysis.saliency.token_labels import (
    CRITICAL,
    UNLABELLED,
    AurocResult,
    stratified_interval,
    stratified_wins_pairs,
)

__all__ = ["fixed_position_auroc_result", "FixedScale", "position_only_signals", "reasoning_lengths"]

FixedScale = Literal["trace", "raw"]


def reasoning_lengths(trace_N: torch.Tensor, position_N: torch.Tensor) -> torch.Tensor:
    """(N,) int64: R of each token's trace, the number of the trace's tokens. Raises ValueError unless each trace's
    positions are exactly 0..R−1 (every reasoning token passed, each once): the standing and the guarantee of the
    module docstring need the whole trace."""
    trace, position = trace_N.long().cpu(), position_N.long().cpu()
    _, trace, count_G = torch.unique(trace, return_inverse=True, return_counts=True)
    G = len(count_G)
    high_G = torch.full((G,), -1, dtype=torch.long).scatter_reduce_(0, trace, position, "amax")
    low_G = torch.full((G,), 1 << 62, dtype=torch.long).scatter_reduce_(0, trace, position, "amin")
    # without a repeat, a trace's R distinct positions are exactly 0..R-1 iff the lowest is 0 and the highest R-1
    repeated = len(torch.unique(torch.stack([trace, position], 1), dim=0)) != len(trace) if len(trace) else False
    if repeated:
        raise ValueError("fixed_position_auroc_result: a trace holds two tokens at one position; pass every "
                         "reasoning token of a trace once, at positions 0..R-1.")
    bad = ((low_G != 0) | (high_G + 1 != count_G)).nonzero().flatten()
    if len(bad):
        g = int(bad[0])
        raise ValueError(f"fixed_position_auroc_result: trace {g} (in order of id) holds {int(count_G[g])} tokens at "
                         f"positions {int(low_G[g])}..{int(high_G[g])}; pass every reasoning token of a trace once, "
                         f"at positions 0..R-1 (labelled or not).")
    return count_G[trace]


def fixed_position_auroc_result(scores_N: torch.Tensor, labels_N: torch.Tensor, group_N: torch.Tensor,
                                trace_N: torch.Tensor, position_N: torch.Tensor, *, unit_N: torch.Tensor | None = None,
                                scale: FixedScale = "trace", num_bootstrap: int = 1000, confidence: float = 0.95,
                                seed: int = 0) -> AurocResult:
    """The fixed-position AUROC of the module docstring, with its percentile-bootstrap CI over groups.

    Args:
        scores_N: (N,) finite scores of every reasoning token of every trace; labels_N: (N,) CRITICAL / FILLER
            (the contrast: filler or format) / UNLABELLED (these count in the standing only).
        group_N: (N,) group ids (strata and the bootstrap's unit); trace_N: (N,) trace ids (a trace lies in one
            group); position_N: (N,) int index of the token in its completion, 0..R−1 per trace.
        unit_N: (N,) the bootstrap's unit when it is not the group (module docstring, 5; a trace lies in one unit);
            None: the group.
        scale: "trace" (standing within the trace) or "raw". num_bootstrap, confidence, seed: as
            `token_labels.auroc_result` (the unit is the group, or `unit_N`).
    Returns:
        `AurocResult`: n_critical / n_filler = the tokens that entered (strata with both classes), labelled_critical /
        labelled_filler = all labelled tokens, n_examples = units (groups) with a labelled token; NaN with a note
        when no stratum holds both classes.
    """
    if scale not in ("trace", "raw"):
        raise ValueError(f"scale={scale!r}: choose 'trace' (standing within the trace) or 'raw'.")
    if not 0 < confidence < 1 or num_bootstrap < 0:
        raise ValueError(f"fixed_position_auroc_result: need 0 < confidence < 1 and num_bootstrap >= 0, got "
                         f"{confidence}, {num_bootstrap}.")
    trace, group, position = trace_N.long().cpu(), group_N.long().cpu(), position_N.long().cpu()
    unit = group if unit_N is None else unit_N.long().cpu()
    for ids, name in ((group, "group"), (unit, "unit")):
        if len(trace) and _splits_a_trace(trace, ids):
            raise ValueError(f"fixed_position_auroc_result: a trace's tokens carry more than one {name} id; a trace "
                             f"lies in one {name}.")
    length = reasoning_lengths(trace, position)
    values = trace_percentile(scores_N, trace) if scale == "trace" else scores_N.detach().double().cpu()
    keep = labels_N.cpu() != UNLABELLED
    values, critical = values[keep], labels_N.cpu()[keep] == CRITICAL
    _, example = torch.unique(unit[keep], return_inverse=True)
    E = int(example.max()) + 1 if len(example) else 0
    key = torch.stack([group[keep], length[keep], position[keep]], 1)
    _, stratum = torch.unique(key, dim=0, return_inverse=True) if len(key) else (None, key[:, 0])
    S = int(stratum.max()) + 1 if len(stratum) else 0
    crit_S = torch.zeros(S).index_add_(0, stratum, critical.float())
    fill_S = torch.zeros(S).index_add_(0, stratum, (~critical).float())
    usable = ((crit_S > 0) & (fill_S > 0))[stratum]
    n_c, n_f = int((critical & usable).sum()), int((~critical & usable).sum())
    all_c, all_f = int(critical.sum()), int((~critical).sum())
    shares = (f"entered: {n_c} of {all_c} critical ({_share(n_c, all_c)}) and {n_f} of {all_f} contrast "
              f"({_share(n_f, all_f)}) labelled tokens, in {int(((crit_S > 0) & (fill_S > 0)).sum())} of {S} strata "
              f"(group, length, position)")
    layouts = torch.unique(torch.stack([group, length], 1), dim=0)[:, 0] if len(group) else group
    split = int((torch.unique(layouts, return_counts=True)[1] > 1).sum()) if len(layouts) else 0
    if split:  # a group's rows that tokenize to other lengths: they pair only with rows of their own length
        shares += f"; {split} of {len(torch.unique(group))} groups hold traces of more than one reasoning length"
    counts = {"labelled_critical": all_c, "labelled_filler": all_f}
    if not n_c:
        why = "no critical token" if not all_c else "no contrast token" if not all_f else \
            "no stratum (group, length, position) holds both a critical and a contrast token"
        return AurocResult(math.nan, math.nan, math.nan, 0, 0, E, note=f"undefined: {why}; {shares}", **counts)
    wins_S, pairs_S = stratified_wins_pairs(values, critical, stratum)
    point = float(wins_S.sum() / pairs_S.sum())
    if num_bootstrap == 0:
        return AurocResult(point, math.nan, math.nan, n_c, n_f, E, note=shares, **counts)
    low, high, dropped = stratified_interval(values, critical, stratum, example, E, num_bootstrap, confidence, seed)
    what = "group" if unit_N is None else "unit"
    few = f"only {E} {what}: every resample is that {what}, so the interval has no width" if E == 1 else ""
    return AurocResult(point, low, high, n_c, n_f, E, note="; ".join(x for x in (shares, dropped, few) if x),
                       **counts)


def _splits_a_trace(trace: torch.Tensor, ids: torch.Tensor) -> bool:
    """Whether some trace's tokens carry more than one of `ids`."""
    _, trace_ids = torch.unique(trace, return_inverse=True)
    pairs = torch.unique(trace_ids * (int(ids.max() - ids.min()) + 1) + (ids - ids.min()))
    return len(pairs) != int(trace_ids.max()) + 1


def _share(k: int, n: int) -> str:
    return f"{100 * k / n:.0f}%" if n else "n/a"


def position_only_signals(position_N: torch.Tensor, length_N: torch.Tensor, labels_N: torch.Tensor,
                          seed: int = 0) -> dict[str, torch.Tensor]:
    """Signals that are functions of position alone, each (N,) float64, for tokens at `position_N` (t, from the
    start of the reasoning) of traces of `length_N` (R) reasoning tokens: increasing and decreasing in t, rising
    towards the box (−(R − t)), U-shaped over t / R, periodic (sin t), random per position (one seeded draw per t,
    the same in every trace), and the worst case, the share of critical tokens among the labelled ones at each t
    (`labels_N`: a prior over positions fitted to the labels, still a function of t alone). The position-fixed
    AUROC scores each exactly 0.5; `grail.analysis.saliency.position.matched_auroc_result` need not
    (perf/experiments/position_signals.py, tests/test_saliency_counterbalanced.py)."""
    t, R = position_N.double(), length_N.double()
    where = position_N.long()
    table = torch.rand(int(where.max()) + 1 if len(where) else 1, generator=torch.Generator().manual_seed(seed),
                       dtype=torch.float64)
    labelled = labels_N != UNLABELLED
    critical = (labels_N == CRITICAL).double()
    hits = torch.zeros(len(table), dtype=torch.float64).index_add_(0, where[labelled], critical[labelled])
    seen = torch.zeros(len(table), dtype=torch.float64).index_add_(0, where[labelled], labelled[labelled].double())
    return {"increasing": t, "decreasing": -t, "towards the box": -(R - t), "U over t/R": (t / R - 0.5) ** 2,
            "periodic": torch.sin(t), "random per position": table[where],
            "P(critical | position)": (hits / seen.clamp_min(1))[where]}
