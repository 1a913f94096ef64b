"""Paired differences between any two arms of a finished comparison (`grail compare --resume DIR --pairs a:b,...`):
GRAIL against its nulls (random, position, the rescaled arm), from the same runs. The report pairs every arm with its
reference; this pairs any two, with the report's own statistics (summary.paired_stats): per seed s both arms
finished, d_s = a_s − b_s; the 95% t-interval over seeds, the exact sign-flip p and the percentile bootstrap interval.
With several pairs, each metric's sign-flip p-values also get Holm's adjustment over its pairs (stats.holm): the p to
read when the pairs are a family of secondary comparisons. Read from the comparison's report.json (its per-arm values
and their seeds)."""

from __future__ import annotations

from grail.analysis.compare.stats import holm
from grail.analysis.compare.summary import paired_stats

__all__ = ["pairs_markdown", "paired_arms", "parse_pairs", "with_holm"]


def parse_pairs(text: str, flag: str) -> list[tuple[str, str]]:
    """"a:b,c:d" → [(a, b), (c, d)] (arm labels as the report writes them)."""
    pairs = [tuple(p.split(":")) for p in text.split(",") if p]
    if not pairs or any(len(p) != 2 or not all(p) for p in pairs):
        raise ValueError(f"{flag} {text!r}: give each pair as a:b, comma-separated (e.g. grail:random,grail:none).")
    return pairs


def _per_seed(report: dict, metric: str, arm: str) -> dict[int, float]:
    metrics = report["metrics"]
    if metric not in metrics:
        raise ValueError(f"the report has no metric {metric!r} (it has: {', '.join(metrics)}); give --metrics "
                         f"some of those.")
    per_arm = metrics[metric]["per_arm"]
    if arm not in per_arm:
        raise ValueError(f"the report has no arm {arm!r} (arms: {', '.join(per_arm)}); name arms as the report "
                         f"does, e.g. grail:random.")
    stat = per_arm[arm]
    if len(stat["seeds"]) != len(stat["values"]):
        raise ValueError(f"{metric} of {arm}: {len(stat['seeds'])} seeds but {len(stat['values'])} values; the "
                         f"report.json is damaged: render it again (grail compare --resume DIR --report-only).")
    return dict(zip(stat["seeds"], stat["values"], strict=True))


def paired_arms(report: dict, a: str, b: str, metric: str) -> dict:
    """a − b over the seeds both finished, as the report pairs an arm with its reference (the t-interval's fields,
    the seeds, the sign-flip p and the bootstrap interval), in the report's units (fractions for accuracies)."""
    first, second = _per_seed(report, metric, a), _per_seed(report, metric, b)
    seeds = sorted(set(first) & set(second))
    if len(seeds) < 2:
        raise ValueError(f"{a} and {b} share {len(seeds)} finished seed(s) on {metric}: no interval; finish more "
                         f"(grail compare --resume DIR).")
    return {**paired_stats(second, first, reference=b), "a": a, "b": b, "metric": metric}


def with_holm(rows: list[dict]) -> list[dict]:
    """Each row with `holm_p`: its sign-flip p adjusted over the rows of the same metric (Holm)."""
    out = [dict(r) for r in rows]
    for metric in dict.fromkeys(r["metric"] for r in out):
        family = [r for r in out if r["metric"] == metric]
        for r, p in zip(family, holm([r["sign_flip_p"] for r in family]), strict=True):
            r["holm_p"] = p
    return out


def pairs_markdown(rows: list[dict], scale: float = 100.0) -> str:
    lines = ["| pair | metric | seeds | mean ± half-width [95% t] | sign-flip p | Holm p | bootstrap 95% |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        boot = r["bootstrap"]
        lines.append(f"| {r['a']} − {r['b']} | {r['metric']} | {r['n']} | {scale * r['mean']:+.1f} ± "
                     f"{scale * r['half_width']:.1f} [{scale * r['low']:+.1f}, {scale * r['high']:+.1f}] | "
                     f"{r['sign_flip_p']:.3f} | {r['holm_p']:.3f} | [{scale * boot[0]:+.1f}, {scale * boot[1]:+.1f}] |")
    return "\n".join(lines)
