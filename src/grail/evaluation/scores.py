"""Evaluation scores: acc@n, unbiased pass@k, bootstrap CIs over problems, averages over benchmarks,
paired differences.

Pure functions on per-sample correctness (no model, no I/O; standard library only). docs/guides/evaluation.md:

    acc@n   = (1/P) Σ_p c_p / n                                  (c_p correct samples out of n for problem p)
    pass@k  = (1/P) Σ_p [1 − C(n − c_p, k) / C(n, k)]           (Chen et al. 2021, "Evaluating LLMs trained on code")
    unweighted average    = (1/B) Σ_b metric_b                    (each benchmark counts once)
    size-weighted average = Σ_b P_b · metric_b / Σ_b P_b          (= total over all problems / total problems)

Departures from / additions to the paper (which reports no uncertainty):
    1. Every number carries a percentile bootstrap CI over problems (95% by default; the draw and the quantile
       rule are grail.evaluation.bootstrap's). Within one benchmark, acc@n and every pass@k share the same
       resampled problem indices, so their CIs are mutually consistent.
    2. The averages' CIs come from a stratified bootstrap: problems are resampled within each benchmark
       (keeping its size) and both averages are recomputed per resample, so the CI reflects every benchmark's
       sampling noise with the right weight.
    3. Benchmarks may use different n. The averages then cover pass@k only for k ≤ min n (the k every
       benchmark has); acc@n is averaged as is (each acc@n is an unbiased estimate of per-sample accuracy,
       whatever its n).
    4. Two results on the same problems are compared by their paired difference of acc@n (b − a), with a
       bootstrap CI that resamples problems and keeps the pairing (`paired_difference`).

Shape letters (grail/__init__.py): P problems, N samples per problem, R bootstrap resamples, M metrics stacked
together, K values of k.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from grail.evaluation.bootstrap import bootstrap_intervals, percentile_interval, resampled_means

__all__ = [
    "AVERAGE_LABELS", "Average", "AverageKind", "average_scores", "BenchmarkScore", "bootstrap_ci", "Estimate",
    "format_markdown", "paired_difference", "pass_at_k", "score_benchmark", "to_json"
]

AverageKind = Literal["unweighted", "size_weighted"]
AVERAGE_LABELS: dict[str, str] = {
    "unweighted": "average (unweighted over benchmarks)",
    "size_weighted": "average (size-weighted over problems)",
}


@dataclass(frozen=True)
class Estimate:
    """A point estimate and its bootstrap CI (95% unless the producing call set `level`)."""

    value: float
    low: float
    high: float


@dataclass(frozen=True)
class BenchmarkScore:
    """One benchmark's metrics. The per-problem arrays feed `average_scores` and are left out of the repr."""

    name: str
    num_problems: int
    n: int  # samples per problem
    acc_at_n: Estimate
    pass_at_k: dict[int, Estimate]  # every k in 1..n
    mean_completion_tokens: float  # mean over all P·n samples
    per_problem_acc: tuple[float, ...] = field(default=(), repr=False)  # (P,) c_p / n
    per_problem_pass: dict[int, tuple[float, ...]] = field(default_factory=dict, repr=False)  # k -> (P,)
    per_problem_tokens: tuple[float, ...] = field(default=(), repr=False)  # (P,) mean tokens over the n samples


@dataclass(frozen=True)
class Average:
    """An average over benchmarks, with a stratified-bootstrap CI. pass@k only for k every benchmark has."""

    kind: AverageKind
    acc_at_n: Estimate
    pass_at_k: dict[int, Estimate]
    benchmarks: tuple[str, ...]
    mean_completion_tokens: float = math.nan  # averaged the same way (unweighted / size-weighted)

    @property
    def label(self) -> str:
        return AVERAGE_LABELS[self.kind]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem: the probability that a random k-subset of the n samples has a correct one.

        pass@k = 1 − C(n − c, k) / C(n, k) = 1 − Π_{i=0}^{k−1} (n − c − i) / (n − i)

    The product form (Chen et al. 2021) never builds a binomial coefficient. If n − c < k every k-subset holds a
    correct sample and the result is exactly 1. Special cases: pass@n = 1 if c > 0 else 0; pass@1 = c/n.

    Args:
        n: samples drawn (≥ 1). c: correct samples, 0 ≤ c ≤ n. k: subset size, 1 ≤ k ≤ n.
    """
    if not (isinstance(n, int) and isinstance(c, int) and isinstance(k, int)):
        raise ValueError(f"pass_at_k: n, c, k must be ints; got n={n!r}, c={c!r}, k={k!r}.")
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: need 0 <= c <= n; got c={c}, n={n}.")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: need 1 <= k <= n; got k={k}, n={n}.")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def _check_bootstrap_args(resamples: int, level: float) -> None:
    if resamples < 1:
        raise ValueError(f"bootstrap: resamples must be >= 1; got {resamples}.")
    if not 0.0 < level < 1.0:
        raise ValueError(f"bootstrap: level must be in (0, 1), e.g. 0.95; got {level}.")


def _estimates(values_MP: Sequence[Sequence[float]], resamples: int, level: float, seed: int) -> list[Estimate]:
    """Mean of each row of (M, P) with a percentile bootstrap CI; all rows share one draw of R resamples."""
    bounds_M2 = bootstrap_intervals(values_MP, resamples=resamples, level=level, seed=seed)
    return [Estimate(sum(row) / len(row), lo, hi) for row, (lo, hi) in zip(values_MP, bounds_M2, strict=True)]


def bootstrap_ci(per_problem: Sequence[float], *, resamples: int = 2000, level: float = 0.95,
                 seed: int = 0) -> Estimate:
    """Mean over problems with a percentile bootstrap CI.

    Draws R = resamples resamples of the P problems with replacement and returns the percentile interval of their
    means (grail.evaluation.bootstrap: the draw from random.Random(seed), so the global RNG is untouched, and the
    quantile rule). A constant vector gives an interval of width 0 at its value.

    Args:
        per_problem: (P,) per-problem values, P ≥ 1 (e.g. c_p / n).
    """
    _check_bootstrap_args(resamples, level)
    if len(per_problem) == 0:
        raise ValueError("bootstrap_ci: per_problem is empty; need at least one problem.")
    return _estimates([[float(v) for v in per_problem]], resamples, level, seed)[0]


def paired_difference(a: BenchmarkScore, b: BenchmarkScore, *, resamples: int = 2000, level: float = 0.95,
                      seed: int = 0) -> Estimate:
    """acc@n of `b` minus acc@n of `a` on the SAME problems, with a paired percentile bootstrap CI over problems.

        d_p = b.per_problem_acc[p] − a.per_problem_acc[p];   difference = (1/P) Σ_p d_p = b.acc@n − a.acc@n

    Each resample draws P problems with replacement and averages their d_p, so both results are resampled
    together (the pairing is kept): what both models find easy or hard cancels, and the CI is that of the
    difference, narrower than two separate CIs suggest when the models agree on most problems. The draw is
    `bootstrap_ci`'s (the same R resamples of problem indices for the same `seed`), so with `a` all zeros the
    result equals `bootstrap_ci(b.per_problem_acc)`. Identical inputs give exactly 0 with CI [0, 0]. n may
    differ between a and b (each c_p/n is an unbiased estimate of the problem's per-sample accuracy).

    Args:
        a, b: results of `score_benchmark` on the same benchmark with its problems in the same order (e.g. two
            evaluations of one loaded benchmark): same name and num_problems, per-problem arrays present. The
            order itself cannot be checked here (a BenchmarkScore holds no problem ids): it is the caller's.
    """
    _check_bootstrap_args(resamples, level)
    if a.name != b.name:
        raise ValueError(f"paired_difference: the results are of different benchmarks ({a.name!r} and {b.name!r}); "
                         f"a paired difference needs two results on the same problems.")
    if a.num_problems != b.num_problems:
        raise ValueError(f"paired_difference: {a.name!r} has {a.num_problems} problems in the first result and "
                         f"{b.num_problems} in the second; evaluate both on the same problems.")
    for which, s in (("first", a), ("second", b)):
        if s.num_problems < 1 or len(s.per_problem_acc) != s.num_problems:
            raise ValueError(f"paired_difference: the {which} result of {s.name!r} lacks per-problem accuracies for "
                             f"its {s.num_problems} problems; build it with score_benchmark.")
    diff_1P = [[y - x for x, y in zip(a.per_problem_acc, b.per_problem_acc, strict=True)]]
    return _estimates(diff_1P, resamples, level, seed)[0]


def score_benchmark(name: str, correct_PN: Sequence[Sequence[bool]], tokens_PN: Sequence[Sequence[int]], *,
                    resamples: int = 2000, level: float = 0.95, seed: int = 0) -> BenchmarkScore:
    """acc@n and pass@k for k = 1..n of one benchmark, with bootstrap CIs over problems.

    acc@n's and every pass@k's CI use the SAME resampled problem indices (one (R, P) draw), so e.g. the
    resampled pass@1 equals the resampled acc@n exactly.

    Args:
        name: benchmark name.
        correct_PN: (P, N) correct_PN[p][j] is True iff sample j of problem p is correct. Same N ≥ 1 for every p.
        tokens_PN: (P, N) completion lengths in tokens, same shape as correct_PN.
    """
    _check_bootstrap_args(resamples, level)
    if len(correct_PN) == 0:
        raise ValueError(f"score_benchmark({name!r}): no problems; need at least one.")
    if len(tokens_PN) != len(correct_PN):
        raise ValueError(f"score_benchmark({name!r}): {len(correct_PN)} problems in correct_PN but "
                         f"{len(tokens_PN)} in tokens_PN; they must pair up.")
    n = len(correct_PN[0])
    if n < 1:
        raise ValueError(f"score_benchmark({name!r}): problem 0 has no samples; need n >= 1.")
    for p, (correct_N, tokens_N) in enumerate(zip(correct_PN, tokens_PN, strict=True)):
        if len(correct_N) != n:
            raise ValueError(f"score_benchmark({name!r}): problem {p} has {len(correct_N)} samples but problem 0 "
                             f"has {n}; every problem needs the same n.")
        if len(tokens_N) != n:
            raise ValueError(f"score_benchmark({name!r}): problem {p} has {len(tokens_N)} token counts for {n} "
                             "samples; tokens_PN must match correct_PN's shape.")
    correct_P = [sum(bool(x) for x in correct_N) for correct_N in correct_PN]
    acc_P = tuple(c / n for c in correct_P)
    pass_KP = {k: tuple(pass_at_k(n, c, k) for c in correct_P) for k in range(1, n + 1)}
    tokens_P = tuple(sum(tokens_N) / n for tokens_N in tokens_PN)
    values_MP = [acc_P, *pass_KP.values()]  # (1 + n, P)
    acc, *passes = _estimates(values_MP, resamples, level, seed)
    return BenchmarkScore(
        name=name,
        num_problems=len(correct_PN),
        n=n,
        acc_at_n=acc,
        pass_at_k=dict(zip(pass_KP, passes, strict=True)),
        mean_completion_tokens=sum(tokens_P) / len(tokens_P),
        per_problem_acc=acc_P,
        per_problem_pass=pass_KP,
        per_problem_tokens=tokens_P,
    )


def average_scores(scores: Sequence[BenchmarkScore], *, resamples: int = 2000, level: float = 0.95,
                   seed: int = 0) -> tuple[Average, Average]:
    """The unweighted and the size-weighted average over benchmarks, each with a stratified bootstrap CI.

        unweighted    = (1/B) Σ_b mean_p x_{b,p}               (mean of the benchmark means)
        size_weighted = Σ_b Σ_p x_{b,p} / Σ_b P_b               (total over all problems / total problems)

    CI: per resample, problems are drawn with replacement WITHIN each benchmark (P_b draws for benchmark b, one
    draw of R resamples per benchmark, in the given order, from one random.Random(seed)), both averages are recomputed,
    and the percentile interval is taken. acc@n and every pass@k share the draws. pass@k is averaged only for
    k ≤ min_b n_b (the k every benchmark has); acc@n is averaged even when n differs.

    Args:
        scores: B ≥ 1 results of `score_benchmark` (they carry the per-problem arrays); names must be unique.
    Returns:
        (unweighted, size_weighted).
    """
    _check_bootstrap_args(resamples, level)
    if not scores:
        raise ValueError("average_scores: no benchmarks to average.")
    names = tuple(s.name for s in scores)
    if len(set(names)) != len(names):
        raise ValueError(f"average_scores: benchmark names must be unique; got {names}.")
    common_k = sorted(set.intersection(*(set(s.per_problem_pass) for s in scores)))
    for s in scores:
        if len(s.per_problem_acc) != s.num_problems or s.num_problems < 1 or \
                any(len(s.per_problem_pass[k]) != s.num_problems for k in common_k):
            raise ValueError(f"average_scores: benchmark {s.name!r} lacks per-problem values for its "
                             f"{s.num_problems} problems; build it with score_benchmark.")
    rng = random.Random(seed)  # one draw per benchmark, in the given order, from one generator
    sizes_B = [s.num_problems for s in scores]
    points_BM, means_BMR = [], []
    for s in scores:
        values_MP = [s.per_problem_acc, *(s.per_problem_pass[k] for k in common_k)]  # (M, P_b), M = 1 + len(common_k)
        points_BM.append([sum(row) / len(row) for row in values_MP])
        means_BMR.append(resampled_means(values_MP, resamples, rng))
    num_metrics, total = len(points_BM[0]), sum(sizes_B)
    unweighted_M = [sum(p[m] for p in points_BM) / len(scores) for m in range(num_metrics)]
    weighted_M = [sum(size * p[m] for size, p in zip(sizes_B, points_BM, strict=True)) / total
                  for m in range(num_metrics)]
    unweighted_MR = [[sum(means[m][r] for means in means_BMR) / len(scores) for r in range(resamples)]
                     for m in range(num_metrics)]
    weighted_MR = [[sum(size * means[m][r] for size, means in zip(sizes_B, means_BMR, strict=True)) / total
                    for r in range(resamples)] for m in range(num_metrics)]
    tokens_B = [s.mean_completion_tokens for s in scores]
    tokens = {
        "unweighted": sum(tokens_B) / len(tokens_B),
        "size_weighted": sum(t * s.num_problems for t, s in zip(tokens_B, scores, strict=True)) / total,
    }
    out = []
    for kind, point_M, means_MR in (("unweighted", unweighted_M, unweighted_MR),
                                    ("size_weighted", weighted_M, weighted_MR)):
        est = [Estimate(v, *percentile_interval(means_R, level)) for v, means_R in zip(point_M, means_MR, strict=True)]
        out.append(Average(kind=kind, acc_at_n=est[0], pass_at_k=dict(zip(common_k, est[1:], strict=True)),
                           benchmarks=names, mean_completion_tokens=tokens[kind]))
    return out[0], out[1]


def _fmt(e: Estimate | None) -> str:
    if e is None:
        return "–"
    return f"{100 * e.value:.1f} [{100 * e.low:.1f}, {100 * e.high:.1f}]"


def format_markdown(scores: Sequence[BenchmarkScore], averages: Sequence[Average]) -> str:
    """One Markdown table: a row per benchmark, then one per average.

    Columns: benchmark, problems, n, acc@n, pass@k for every k any row has ("–" where a row lacks it), mean
    completion tokens. Metrics in percent as "value [low, high]" (the bootstrap CI over problems).
    """
    ks = sorted({k for s in scores for k in s.pass_at_k} | {k for a in averages for k in a.pass_at_k})
    header = ["benchmark", "problems", "n", "acc@n % [CI]", *(f"pass@{k} % [CI]" for k in ks), "mean tokens"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    for s in scores:
        cells = [s.name, str(s.num_problems), str(s.n), _fmt(s.acc_at_n), *(_fmt(s.pass_at_k.get(k)) for k in ks),
                 f"{s.mean_completion_tokens:.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    sizes = {s.name: s.num_problems for s in scores}
    for a in averages:
        total = sum(sizes[b] for b in a.benchmarks) if all(b in sizes for b in a.benchmarks) else None
        tokens = "–" if math.isnan(a.mean_completion_tokens) else f"{a.mean_completion_tokens:.0f}"
        cells = [a.label, "–" if total is None else str(total), "–", _fmt(a.acc_at_n),
                 *(_fmt(a.pass_at_k.get(k)) for k in ks), tokens]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _estimate_json(e: Estimate) -> dict[str, float]:
    return {"value": e.value, "low": e.low, "high": e.high}


def to_json(scores: Sequence[BenchmarkScore], averages: Sequence[Average]) -> dict:
    """A JSON-serialisable summary (pass@k keys as strings; per-problem arrays omitted; NaN -> None)."""
    return {
        "benchmarks": [
            {
                "name": s.name,
                "num_problems": s.num_problems,
                "n": s.n,
                "acc_at_n": _estimate_json(s.acc_at_n),
                "pass_at_k": {str(k): _estimate_json(e) for k, e in s.pass_at_k.items()},
                "mean_completion_tokens": s.mean_completion_tokens,
            }
            for s in scores
        ],
        "averages": [
            {
                "kind": a.kind,
                "label": a.label,
                "benchmarks": list(a.benchmarks),
                "acc_at_n": _estimate_json(a.acc_at_n),
                "pass_at_k": {str(k): _estimate_json(e) for k, e in a.pass_at_k.items()},
                "mean_completion_tokens": None if math.isnan(a.mean_completion_tokens) else a.mean_completion_tokens,
            }
            for a in averages
        ],
    }
