"""How much of a comparison's seed-to-seed spread is its evaluation's own sampling, and how many seeds a target
interval would need with more samples per problem: for planning the next comparison, never for stopping this one.

A sampled accuracy acc@n is the mean over P held-out problems of the mean over n samples, so it varies even for
fixed trained models. For the paired difference d_s = a_s − b_s of two arms at seed s, take per problem i and sample
j the difference δ_ij = x_ij − y_ij of the two arms' correctness (0/1), samples paired by index. Given the trained
models, the evaluation's variance of d_s is (1/P²) Σ_i var_j(δ_ij) / n, estimated without bias by the sample
variance over j. This holds whether or not the arms' sampling is coupled: `grail compare` seeds the evaluation of
every arm at seed s alike, so same-seed arms often draw the same completion, and the estimate assuming independent
sampling, (1/P²) Σ_i [a_i (1 − a_i) + b_i (1 − b_i)] / (n − 1) with a_i, b_i the per-problem accuracies, is shown
beside it (larger when the coupling helps). Over seeds,

    var(d) = T + E,   E = the mean over seeds of the evaluation's variance,   T = the rest (training, model × problem)

(the problems are the same for every run, so which problems were drawn is not in var(d)). With m samples per
problem E becomes E · n / m, the sd of the differences √(T + E · n / m), and the seeds a ±w half-width needs follow
(grail.analysis.compare.stats.seeds_needed). Greedy acc@1 has no sampling: E = 0.

    grail compare --resume ~/runs/cmp --eval-noise grail:none,random:none [--metrics sampled/synthetic/acc@4] \
        [--only-seeds 0-5] [--samples 4,8,16,32] [--half-width 2.5] [--run-seconds R --sampled-seconds E]

Reads the finished runs' eval/final/<evaluation>/samples.jsonl (an archive keeps them); `--only-seeds` keeps the
analysis to seeds already read (e.g. the first part of a comparison still running).

Cost. More samples per problem cost sampling time in proportion: a run of R seconds whose sampled evaluation took E
costs R + E · (m / n − 1) at m samples, and an arm seeds(m) times that. R and E are the medians over the finished
runs of `wall_seconds` and of `eval_phase_seconds[<evaluation>]` in compare_result.json (runs of grail-rl since
2026-11-27 record the split; clocks that cover only part of a resumed run are left out), or `--run-seconds` /
`--sampled-seconds` where the runs do not say. The cheapest m for the target is marked.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from grail.analysis.compare.plan import PLAN_FILE
from grail.analysis.compare.stats import seeds_needed
from grail.analysis.compare.summary import FINAL_EVAL_DIR, clock_complete, load_runs, trained_here

__all__ = ["add_costs", "decompose", "independent_sampling_variance", "load_samples", "noise_markdown",
           "paired_sampling_variance", "run_costs", "seed_set"]

Samples = dict[str, list[float]]  # problem id → correctness (0/1) of samples 0..n−1


def paired_sampling_variance(first: Samples, second: Samples) -> float:
    """The evaluation's variance of mean(first) − mean(second), samples paired by index, given the models:
    (1/P²) Σ_i var_j(x_ij − y_ij) / n (sample variance, n − 1)."""
    if set(first) != set(second):
        raise ValueError("the two runs were evaluated on different problems; they cannot be paired.")
    total = 0.0
    for pid, x in first.items():
        y = second[pid]
        if len(x) != len(y) or len(x) < 2:
            raise ValueError(f"problem {pid}: {len(x)} and {len(y)} samples; pairing needs the same n ≥ 2 "
                             f"(greedy has no sampling).")
        total += statistics.variance([a - b for a, b in zip(x, y, strict=True)]) / len(x)
    return total / len(first) ** 2


def independent_sampling_variance(first: Samples, second: Samples) -> float:
    """The same, were the two arms' samples independent: (1/P²) Σ_i [a_i (1 − a_i) + b_i (1 − b_i)] / (n − 1)."""
    total = 0.0
    for runs in (first, second):
        for x in runs.values():
            a = sum(x) / len(x)
            total += a * (1.0 - a) / (len(x) - 1)
    return total / len(first) ** 2


def _mean(samples: Samples) -> float:
    return sum(sum(x) / len(x) for x in samples.values()) / len(samples)


def decompose(first: dict[int, Samples], second: dict[int, Samples], samples: tuple[int, ...] = (4, 8, 16, 32),
              half_width: float = 0.025) -> dict:
    """The paired difference first − second over the seeds both have ({seed: samples}; fractions): its variance over
    seeds, the evaluation's part E (and E had the sampling been independent), the rest T, and per m in `samples`
    the projected sd and the seeds for ±half_width."""
    seeds = sorted(set(first) & set(second))
    if len(seeds) < 2:
        raise ValueError(f"{len(seeds)} paired seed(s): the variance over seeds needs at least 2.")
    n = len(next(iter(first[seeds[0]].values())))
    total = statistics.variance([_mean(first[s]) - _mean(second[s]) for s in seeds])
    evaluation = statistics.fmean(paired_sampling_variance(first[s], second[s]) for s in seeds)
    independent = statistics.fmean(independent_sampling_variance(first[s], second[s]) for s in seeds)
    rest = max(total - evaluation, 0.0)
    projected = {}
    for m in samples:
        sd = math.sqrt(rest + evaluation * n / m)
        projected[m] = {"sd": sd, "seeds": seeds_needed(sd, half_width)}
    return {"seeds": seeds, "n": n, "var": total, "eval_var": evaluation, "eval_var_independent": independent,
            "rest_var": rest, "eval_share": evaluation / total if total > 0 else None, "sd": math.sqrt(total),
            "projected": projected}


def load_samples(out_dir: str | Path, metric: str, keep: set[int] | None = None) -> dict[str, dict[int, Samples]]:
    """{arm label: {seed: samples}} of the finished runs in out_dir, for `metric` = <evaluation>/<benchmark>/acc@n."""
    out_dir = Path(out_dir)
    plan_path = out_dir / PLAN_FILE
    if not plan_path.is_file():
        raise ValueError(f"{out_dir}: no {PLAN_FILE}; give the --output_dir of a grail compare (or its archive).")
    evaluation, benchmark, stat = (metric.split("/") + ["", ""])[:3]
    if not stat.startswith("acc@") or not benchmark:
        raise ValueError(f"--metrics {metric}: give a sampled accuracy, <evaluation>/<benchmark>/acc@n.")
    table: dict[str, dict[int, Samples]] = {}
    for run in load_runs(out_dir, json.loads(plan_path.read_text())):
        if run.result is None or (keep is not None and run.seed not in keep):
            continue
        path = run.path / FINAL_EVAL_DIR / evaluation / "samples.jsonl"
        if not path.is_file():
            raise ValueError(f"{path} does not exist: name an evaluation the runs sampled (e.g. "
                             f"sampled/synthetic/acc@4).")
        rows: dict[str, dict[int, float]] = {}
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if row.get("benchmark") == benchmark:
                rows.setdefault(str(row["problem_id"]), {})[int(row["sample_index"])] = float(bool(row["correct"]))
        if not rows:
            raise ValueError(f"{path}: no samples of benchmark {benchmark!r}; name one the runs evaluated.")
        table.setdefault(run.arm, {})[run.seed] = {pid: [x[j] for j in sorted(x)] for pid, x in rows.items()}
    return table


def run_costs(out_dir: str | Path, evaluation: str, keep: set[int] | None = None) -> tuple[float | None, float | None]:
    """(R, E): the medians over the finished runs of their wall seconds and of their `evaluation`'s sampling and
    grading seconds (compare_result.json's `eval_phase_seconds`); None where no run records it. A clock that covers
    only part of the run is left out: R leaves out runs resumed in training or in evaluation (summary.clock_complete),
    E only those resumed in evaluation (summary.trained_here: a run resumed in training was evaluated in one go)."""
    out_dir = Path(out_dir)
    walls, sampled = [], []
    for run in load_runs(out_dir, json.loads((out_dir / PLAN_FILE).read_text())):
        if run.result is None or (keep is not None and run.seed not in keep):
            continue
        if clock_complete(run.result) and isinstance(run.result.get("wall_seconds"), int | float):
            walls.append(run.result["wall_seconds"])
        phase = (run.result.get("eval_phase_seconds") or {}).get(evaluation)
        if trained_here(run.result) and isinstance(phase, int | float):
            sampled.append(phase)
    return (statistics.median(walls) if walls else None, statistics.median(sampled) if sampled else None)


def add_costs(row: dict, run_seconds: float, sampled_seconds: float) -> dict:
    """`row` (decompose's) with, per m, the seconds of one run at m samples and of an arm's seeds(m) runs."""
    if sampled_seconds > run_seconds:
        raise ValueError(f"the sampled evaluation ({sampled_seconds:g} s) cannot take longer than the whole run "
                         f"({run_seconds:g} s): check --run-seconds and --sampled-seconds.")
    n, out = row["n"], {**row, "projected": {}}
    for m, p in row["projected"].items():
        per_run = run_seconds + sampled_seconds * (m / n - 1)
        out["projected"][m] = {**p, "seconds_per_run": per_run,
                               "seconds_per_arm": None if p["seeds"] is None else p["seeds"] * per_run}
    return out


def seed_set(text: str | None) -> set[int] | None:
    """"0-5" or "0,2,4" (or both, comma-separated) → those seeds; None for no text (every seed)."""
    if not text:
        return None
    out: set[int] = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        if not low.isdigit() or not (high or low).isdigit():
            raise ValueError(f"--only-seeds {text!r}: give seeds as 0-5 or 0,2,4 (non-negative integers).")
        out.update(range(int(low), int(high or low) + 1))
    return out


def noise_markdown(rows: list[dict], samples: tuple[int, ...], half_width: float) -> str:
    cost = ", hours per arm" if rows and "seconds_per_arm" in rows[0]["projected"][samples[0]] else ""
    head = ("| pair | seeds | sd of differences | evaluation share | evaluation share, were arms independent | "
            + " | ".join(f"sd, seeds for ±{100 * half_width:g}{cost} at n={m}" for m in samples) + " |")
    lines = [head, "|---|---:|---:|---:|---:|" + "---:|" * len(samples)]
    for r in rows:
        share = "–" if r["eval_share"] is None else f"{100 * r['eval_share']:.0f}%"
        independent = "–" if not r["var"] else f"{100 * r['eval_var_independent'] / r['var']:.0f}%"
        costs = [r["projected"][m].get("seconds_per_arm") for m in samples]
        cheapest = min((c for c in costs if c is not None), default=None)
        cells = [f"{100 * r['projected'][m]['sd']:.2f}, {r['projected'][m]['seeds'] or '> 10000'}"
                 + ("" if c is None else f", {c / 3600:.1f} h" + (" (cheapest)" if c == cheapest else ""))
                 for m, c in zip(samples, costs, strict=True)]
        lines.append(f"| {r['pair']} | {len(r['seeds'])} | {100 * r['sd']:.2f} | {share} | {independent} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)
