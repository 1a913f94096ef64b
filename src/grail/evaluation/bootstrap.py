"""The percentile bootstrap of a mean, the one the package uses everywhere (standard library only, so that the light
commands can import it): evaluation's CIs over problems (grail.evaluation.scores), `grail compare`'s interval over
seeds (grail.analysis.compare.stats) and the scripts of perf/.

    draw      R resamples of the P values with replacement, each a list of P indices from random.Random(seed)
              (`randrange(P)`, resample after resample); the resampled mean of each of M rows of values uses the
              same indices, so statistics of one unit (acc@n and pass@k of one problem) move together
    rule      sort the R resampled means; the interval at `level` is [m₍lo₎, m₍hi₎] (0-based ranks) with
              tail = (1 − level) / 2, lo = ⌊tail · (R − 1)⌋, hi = ⌈(1 − tail) · (R − 1)⌉: the sorted means'
              entries just outside the two tails (never an interpolation), so the interval never narrows below the
              quantiles a linear interpolation would give

With R = 20,000 and level 0.95: lo = ⌊0.025 · 19,999⌋ = 499 and hi = ⌈0.975 · 19,999⌉ = 19,500.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

__all__ = ["bootstrap_intervals", "percentile_interval", "resampled_means"]


def _check(resamples: int, level: float) -> None:
    if resamples < 1:
        raise ValueError(f"bootstrap: resamples must be >= 1; got {resamples}.")
    if not 0.0 < level < 1.0:
        raise ValueError(f"bootstrap: level must be in (0, 1), e.g. 0.95; got {level}.")


def resampled_means(values_MP: Sequence[Sequence[float]], resamples: int, rng: random.Random) -> list[list[float]]:
    """(M, R): each row's mean over R resamples of its P units, every row resampled with the same indices (the
    module docstring's draw, taken from `rng`, which it advances by R · P draws).

    Args:
        values_MP: M ≥ 1 rows of the same P ≥ 1 units (e.g. per-problem acc@n and pass@k).
    """
    rows = [[float(v) for v in row] for row in values_MP]
    num_units = len(rows[0]) if rows else 0
    if num_units == 0 or any(len(row) != num_units for row in rows):
        raise ValueError(f"bootstrap: need rows of the same length >= 1; got lengths {[len(r) for r in rows]}.")
    means_MR: list[list[float]] = [[] for _ in rows]
    for _ in range(resamples):
        index_P = [rng.randrange(num_units) for _ in range(num_units)]
        for row, means_R in zip(rows, means_MR, strict=True):
            means_R.append(sum(map(row.__getitem__, index_P)) / num_units)
    return means_MR


def percentile_interval(means_R: Sequence[float], level: float) -> tuple[float, float]:
    """The module docstring's rule: (m₍⌊tail·(R−1)⌋₎, m₍⌈(1−tail)·(R−1)⌉₎) of the sorted resampled means."""
    _check(len(means_R), level)
    ordered = sorted(means_R)
    tail, last = (1.0 - level) / 2.0, len(ordered) - 1
    return ordered[math.floor(tail * last)], ordered[math.ceil((1.0 - tail) * last)]


def bootstrap_intervals(values_MP: Sequence[Sequence[float]], *, resamples: int, level: float,
                        seed: int) -> list[tuple[float, float]]:
    """The percentile bootstrap interval of the mean of each of M rows (one shared draw of R resamples from
    random.Random(seed); the rule of the module docstring). A constant row gives low == high == its value's
    resampled mean."""
    _check(resamples, level)
    return [percentile_interval(means_R, level)
            for means_R in resampled_means(values_MP, resamples, random.Random(seed))]
