"""How much of a comparison's seed-to-seed spread is its evaluation's own sampling, and how many seeds a target
interval would need with more samples per problem: for planning the next comparison, never for stopping this one.

A sampled accuracy acc@n is the mean over P held-out problems of the mean over n samples. Given the trained model,
its sampling variance is (1/P²) Σ_i p_i (1 − p_i) / n, with p_i problem i's accuracy; a_i (1 − a_i) · n / (n − 1),
from the observed a_i = k_i / n, estimates p_i (1 − p_i) without bias. The per-seed paired difference d_s = a_s − b_s
of two arms evaluated independently has evaluation variance V_s = V(a_s) + V(b_s). Over seeds,

    var(d) = T + E,   E = mean_s V_s (the evaluation's sampling),   T = the rest (training, and model × problem)

(the problems are the same for every run, so which problems were drawn is not in var(d)). With m samples per
problem E becomes E · n / m, so the sd of the differences is √(T + E · n / m), and the seeds a ±w half-width needs
follow (grail.analysis.compare.stats.seeds_needed). Greedy acc@1 has no sampling: E = 0.

    python perf/eval_noise.py ~/runs/cmp --pairs grail:none,random:none [--metric sampled/synthetic/acc@4] \
        [--seeds 0-5] [--samples 4,8,16,32] [--half-width 2.5] [--json out.json]

Reads the runs' compare_result.json (grail compare); `--seeds` keeps the analysis to seeds already read (e.g. the
first part of a comparison still running). More samples per problem cost evaluation time roughly in proportion.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from grail.analysis.compare.plan import PLAN_FILE
from grail.analysis.compare.stats import seeds_needed
from grail.analysis.compare.summary import load_runs, problem_values


def sampling_variance(per_problem: list[float], n: int) -> float:
    """Unbiased estimate of the sampling variance of the mean over problems of `per_problem` (each a mean of n
    Bernoulli samples, a_i = k_i / n), given the model: (1/P²) Σ_i a_i (1 − a_i) / (n − 1)."""
    if n < 2:
        raise ValueError(f"{n} sample(s) per problem: the sampling variance needs at least 2 (greedy has none).")
    return sum(a * (1.0 - a) for a in per_problem) / ((n - 1) * len(per_problem) ** 2)


def decompose(first: dict[int, list[float]], second: dict[int, list[float]], n: int,
              samples: tuple[int, ...] = (4, 8, 16, 32), half_width: float = 0.025) -> dict:
    """The paired difference first − second over the seeds both have ({seed: per-problem accuracies}, fractions):
    its variance over seeds, the evaluation's share E, the rest T, and per m in `samples` the projected sd and the
    seeds for ±half_width."""
    seeds = sorted(set(first) & set(second))
    if len(seeds) < 2:
        raise ValueError(f"{len(seeds)} paired seed(s): the variance over seeds needs at least 2.")
    d = [sum(first[s]) / len(first[s]) - sum(second[s]) / len(second[s]) for s in seeds]
    mean = sum(d) / len(d)
    total = sum((x - mean) ** 2 for x in d) / (len(d) - 1)
    evaluation = sum(sampling_variance(first[s], n) + sampling_variance(second[s], n) for s in seeds) / len(seeds)
    rest = max(total - evaluation, 0.0)
    projected = {}
    for m in samples:
        sd = math.sqrt(rest + evaluation * n / m)
        projected[m] = {"sd": sd, "seeds": seeds_needed(sd, half_width)}
    return {"seeds": seeds, "n": n, "var": total, "eval_var": evaluation, "rest_var": rest,
            "eval_share": evaluation / total if total > 0 else None, "sd": math.sqrt(total), "projected": projected}


def per_problem(out_dir: str | Path, metric: str, keep: set[int] | None = None) -> tuple[dict, int]:
    """{arm label: {seed: per-problem accuracies}} of the finished runs in out_dir, and n (samples per problem)."""
    out_dir = Path(out_dir)
    plan_path = out_dir / PLAN_FILE
    if not plan_path.is_file():
        raise ValueError(f"{out_dir}: no {PLAN_FILE}; give the --output_dir of a grail compare (or its archive).")
    stat = metric.rpartition("/")[2]
    if not stat.startswith("acc@") or not stat.removeprefix("acc@").isdigit():
        raise ValueError(f"--metric {metric}: give a sampled accuracy, <evaluation>/<benchmark>/acc@n.")
    n = int(stat.removeprefix("acc@"))
    table: dict[str, dict[int, list[float]]] = {}
    for run in load_runs(out_dir, json.loads(plan_path.read_text())):
        if run.result is None or (keep is not None and run.seed not in keep):
            continue
        values = problem_values(run.result.get("evaluations") or {}, metric)
        if values is None:
            raise ValueError(f"{run.path}: no per-problem values of {metric} in its compare_result.json; name a "
                             f"metric the runs evaluated (e.g. sampled/synthetic/acc@4).")
        table.setdefault(run.arm, {})[run.seed] = list(values.values())
    return table, n


def _seed_set(text: str | None) -> set[int] | None:
    if not text:
        return None
    out: set[int] = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        out.update(range(int(low), int(high or low) + 1))
    return out


def markdown(rows: list[dict], samples: tuple[int, ...], half_width: float) -> str:
    head = ("| pair | seeds | sd of differences | evaluation share | "
            + " | ".join(f"sd, seeds for ±{100 * half_width:g} at n={m}" for m in samples) + " |")
    lines = [head, "|---|---:|---:|---:|" + "---:|" * len(samples)]
    for r in rows:
        share = "–" if r["eval_share"] is None else f"{100 * r['eval_share']:.0f}%"
        cells = [f"{100 * r['projected'][m]['sd']:.2f}, {r['projected'][m]['seeds'] or '> 10000'}" for m in samples]
        lines.append(f"| {r['pair']} | {len(r['seeds'])} | {100 * r['sd']:.2f} | {share} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("comparison", help="a grail compare --output_dir (or its archive)")
    parser.add_argument("--pairs", default="grail:none", help="comma-separated a:b (a − b), arm labels")
    parser.add_argument("--metric", default="sampled/synthetic/acc@4")
    parser.add_argument("--seeds", help="only these seeds, e.g. 0-5 or 0,2,4 (default: every finished one)")
    parser.add_argument("--samples", default="4,8,16,32", help="samples per problem to project to")
    parser.add_argument("--half-width", type=float, default=2.5, help="target 95%% half-width, points")
    parser.add_argument("--json")
    args = parser.parse_args()
    samples = tuple(int(m) for m in args.samples.split(","))
    try:
        table, n = per_problem(args.comparison, args.metric, _seed_set(args.seeds))
        rows = []
        for pair in args.pairs.split(","):
            a, _, b = pair.partition(":")
            missing = [arm for arm in (a, b) if arm not in table]
            if missing:
                raise ValueError(f"--pairs {pair}: no finished run of {missing[0]!r} (arms: {', '.join(table)}).")
            rows.append({"pair": f"{a} − {b}", **decompose(table[a], table[b], n, samples, args.half_width / 100)})
    except ValueError as err:
        raise SystemExit(f"eval_noise: {err}") from None
    print(f"{args.metric}, n = {n} samples per problem; points:\n")
    print(markdown(rows, samples, args.half_width / 100))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
