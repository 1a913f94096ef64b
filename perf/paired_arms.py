"""Paired differences between two arms of a finished `grail compare` that are not each other's reference: GRAIL
against its nulls (random, position, the rescaled arm), from the same runs. The report pairs every arm with GRPO;
this pairs any two, with the report's own statistics (grail.analysis.compare.summary.paired_stats): per seed s
both arms finished, d_s = a_s − b_s; the 95% t-interval over seeds, the exact sign-flip p and the percentile
bootstrap interval. With several pairs, each metric's sign-flip p-values also get Holm's adjustment over its pairs
(grail.analysis.compare.stats.holm): the p to read when the pairs are a family of secondary comparisons.

    python perf/paired_arms.py ~/runs/does-it-pay --pairs grail:random,grail:position \
        [--metrics sampled/synthetic/acc@4,greedy/synthetic/acc@1] [--json out.json]

Reads the comparison's report.json (its per-arm values and their seeds). Accuracies are printed in points; a
markdown table on stdout."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from grail.analysis.compare.stats import holm
from grail.analysis.compare.summary import paired_stats


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
                         f"report.json is damaged: render it again (grail compare --resume DIR).")
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


def markdown(rows: list[dict], scale: float = 100.0) -> str:
    lines = ["| pair | metric | seeds | mean ± half-width [95% t] | sign-flip p | Holm p | bootstrap 95% |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        boot = r["bootstrap"]
        lines.append(f"| {r['a']} − {r['b']} | {r['metric']} | {r['n']} | {scale * r['mean']:+.1f} ± "
                     f"{scale * r['half_width']:.1f} [{scale * r['low']:+.1f}, {scale * r['high']:+.1f}] | "
                     f"{r['sign_flip_p']:.3f} | {r['holm_p']:.3f} | [{scale * boot[0]:+.1f}, {scale * boot[1]:+.1f}] |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("compare_dir", help="a finished grail compare --output_dir (its report.json)")
    parser.add_argument("--pairs", required=True, help="comma-separated a:b, each printed as a − b")
    parser.add_argument("--metrics", help="comma-separated report metrics (default: the primary metric)")
    parser.add_argument("--json")
    args = parser.parse_args()
    path = Path(args.compare_dir) / "report.json"
    if not path.is_file():
        raise SystemExit(f"{path} does not exist: give the --output_dir of a finished grail compare.")
    report = json.loads(path.read_text())
    pairs = [p.split(":") for p in args.pairs.split(",")]
    if any(len(p) != 2 for p in pairs):
        raise SystemExit(f"--pairs {args.pairs!r}: give each pair as a:b (e.g. grail:random).")
    metrics = args.metrics.split(",") if args.metrics else [report["primary_metric"]]
    try:
        rows = with_holm([paired_arms(report, a, b, m) for m in metrics for a, b in pairs])
    except ValueError as err:
        raise SystemExit(str(err)) from None
    print(markdown(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
