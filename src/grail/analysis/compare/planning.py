"""What the next comparison needs, from a finished one: the seeds a pilot implies (`--pilot-seeds ARM`) and where
the runs spent their time (`--phase-times`).

Seeds. By a rule fixed before the pilot ran (docs/results/does-it-pay-plan.md): the smallest S with
t_{0.975, S−1} · sd / √S ≤ the target half-width (`--half-width`, points), and at least `--min-seeds`, where sd is
the standard deviation of the pilot's per-seed paired differences (arm − reference) of the primary metric, in
points; and whether the scale-matched arm joins, when the arm's mean `weights/adv_scale_ratio` in the pilot exceeds
`--scale-threshold`. Read from report.json; a report without the arm, or with fewer than two paired seeds (no sd),
is refused.

Phase times. For runs of grail-rl that did not record the split themselves (`eval_phase_seconds` in
compare_result.json, since 2026-11-27), from the file times of their outputs: per finished run, the gaps between the
times its files were last written: greedy evaluation (compare_trained.json → eval/final/greedy/results.json),
sampled evaluation (→ eval/final/sampled/results.json), and the rest (→ compare_result.json: the saliency AUROC and
any extra evaluation); and the run's `wall_seconds` and `train_seconds`; the median [min, max] over runs of each.
The evaluation's gaps count only runs that the evaluating process also trained (summary.trained_here: otherwise a
gap may hold the interruption); the wall and training times only runs whose clock covers all of them
(summary.clock_complete). The file times are those of the directory where the comparison ran: a copy keeps them only
if the copying did (`grail compare --archive` does; a git checkout of an archive does not, and then the gaps mean
nothing)."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from grail.analysis.compare.plan import PLAN_FILE
from grail.analysis.compare.stats import LEVEL, seeds_needed, t_quantile
from grail.analysis.compare.summary import RESULT_FILE, clock_complete, load_runs, trained_here

__all__ = ["PHASES", "phase_times", "phase_times_text", "pilot_seeds", "pilot_text", "run_phases"]


def pilot_seeds(report: dict, arm: str = "grail", half_width: float = 2.5, min_seeds: int = 6,
                scale_threshold: float = 1.1) -> dict:
    """The rule's inputs and outcome from a `grail compare` report.json (a dict)."""
    primary = report["primary_metric"]
    paired = report["metrics"][primary]["paired"]
    if arm not in paired:
        raise ValueError(f"the pilot's report has no paired difference for arm {arm!r} (arms: "
                         f"{', '.join(paired) or 'none paired'}); give --pilot-seeds one of them.")
    d = paired[arm]
    if d["sd"] is None or d["n"] < 2:
        raise ValueError(f"arm {arm!r}: {d['n']} paired seed(s) in the pilot, so no sd; finish at least two seeds of "
                         f"both arms (grail compare --resume DIR).")
    sd = 100 * d["sd"]  # fractions → points
    needed = seeds_needed(sd, half_width)
    if needed is None:
        raise ValueError(f"arm {arm!r}: sd {sd:.2f} points needs more than 10,000 seeds for ±{half_width:g}.")
    seeds = max(min_seeds, needed)
    scale = report["weights"]["weights/adv_scale_ratio"][arm]["mean"]
    return {"metric": primary, "arm": arm, "reference": d.get("reference"), "pilot_seeds": d["n"],
            "pilot_differences_points": [100 * v for v in d["values"]], "sd_points": sd,
            "half_width_target": half_width, "seeds_for_target": needed, "min_seeds": min_seeds, "seeds": seeds,
            "expected_half_width_points": t_quantile((1 + LEVEL) / 2, seeds - 1) * sd / math.sqrt(seeds),
            "adv_scale_ratio": scale, "scale_threshold": scale_threshold,
            "add_scale_matched_arm": scale is not None and scale > scale_threshold}


def pilot_text(out: dict) -> str:
    scale = "no adv_scale_ratio" if out["adv_scale_ratio"] is None else f"adv_scale_ratio {out['adv_scale_ratio']:.3f}"
    return "\n".join([
        f"{out['arm']} − {out['reference']} on {out['metric']} over {out['pilot_seeds']} pilot seeds: differences "
        f"{', '.join(f'{v:+.1f}' for v in out['pilot_differences_points'])} points, sd {out['sd_points']:.2f}",
        f"seeds for ±{out['half_width_target']:g}: {out['seeds_for_target']}; with at least {out['min_seeds']}: "
        f"S = {out['seeds']} (expected half-width {out['expected_half_width_points']:.2f} points at this sd)",
        f"{scale}: the scale-matched arm {'joins' if out['add_scale_matched_arm'] else 'does not join'} "
        f"(threshold {out['scale_threshold']:g})"])


PHASES = (("greedy", "compare_trained.json", "eval/final/greedy/results.json"),
          ("sampled", "eval/final/greedy/results.json", "eval/final/sampled/results.json"),
          ("auroc and extra", "eval/final/sampled/results.json", RESULT_FILE))
TOTALS = (("run", "wall_seconds"), ("training", "train_seconds"))


def run_phases(run_dir: Path, result: dict) -> dict[str, float | None]:
    """One finished run's seconds per phase (None where it cannot be told, see the module docstring)."""
    times: dict[str, float | None] = {}
    for name, before, after in PHASES:
        paths = (run_dir / before, run_dir / after)
        times[name] = (paths[1].stat().st_mtime - paths[0].stat().st_mtime
                       if trained_here(result) and all(p.is_file() for p in paths) else None)
    for name, key in TOTALS:
        times[name] = result.get(key) if clock_complete(result) else None
    return times


def phase_times(out_dir: str | Path) -> dict[str, dict]:
    """{phase: {"n", "median", "min", "max"}} over the finished runs of the comparison in out_dir."""
    out_dir = Path(out_dir)
    if not (out_dir / PLAN_FILE).is_file():
        raise ValueError(f"{out_dir}: no {PLAN_FILE}; give the --output_dir of a grail compare.")
    plan = json.loads((out_dir / PLAN_FILE).read_text())
    rows = [run_phases(run.path, run.result) for run in load_runs(out_dir, plan) if run.result is not None]
    if not rows:
        raise ValueError(f"{out_dir}: no run has finished yet; nothing to time.")
    summary = {}
    file_timed = {p[0] for p in PHASES}
    for name in [p[0] for p in PHASES] + [t[0] for t in TOTALS]:
        values = [row[name] for row in rows if row[name] is not None]
        if name in file_timed and values and max(values) <= 0:
            # every file of the phase has its start's time: a copy that did not keep the runs' own file times (a git
            # checkout, or an archive made from one), not a phase that took no time
            summary[name] = {"n": 0, "median": None, "min": None, "max": None, "copied": len(values)}
            continue
        summary[name] = ({"n": len(values), "median": statistics.median(values), "min": min(values),
                          "max": max(values)} if values else {"n": 0, "median": None, "min": None, "max": None})
    return summary


def phase_times_text(summary: dict[str, dict]) -> str:
    return "\n".join(f"{name}: " + (f"not told: the {s['copied']} runs' files do not keep the times they were written "
                                    "(a copy: a git checkout, or an archive made from one)" if s.get("copied") else
                                    "no run to tell" if not s["n"] else
                                    f"median {s['median']:.0f} s [{s['min']:.0f}, {s['max']:.0f}] over {s['n']} runs")
                     for name, s in summary.items())
