"""Where a comparison's runs spent their time, from the file times of their outputs, for runs of grail-rl that did not
record the split themselves (`eval_phase_seconds` in compare_result.json, since 2026-11-27):

    python perf/phase_times.py ~/runs/does-it-pay [--json out.json]

Per finished run, the gaps between the times its files were last written: greedy evaluation (compare_trained.json →
eval/final/greedy/results.json), sampled evaluation (→ eval/final/sampled/results.json), and the rest (→
compare_result.json: the saliency AUROC and any extra evaluation); and the run's `wall_seconds` and `train_seconds`.
Prints the median [min, max] over runs of each. The evaluation's gaps count only runs that the evaluating process also
trained (grail.analysis.compare.summary.trained_here: otherwise a gap may hold the interruption); the wall and
training times only runs whose clock covers all of them (clock_complete).

The file times are those of the run directory where the comparison ran: a copy keeps them only if the copying did
(`grail compare --archive` does; a git checkout of an archive does not, and then the gaps mean nothing)."""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from grail.analysis.compare.plan import PLAN_FILE
from grail.analysis.compare.summary import RESULT_FILE, clock_complete, load_runs, trained_here

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
    for name in [p[0] for p in PHASES] + [t[0] for t in TOTALS]:
        values = [row[name] for row in rows if row[name] is not None]
        summary[name] = ({"n": len(values), "median": statistics.median(values), "min": min(values),
                          "max": max(values)} if values else {"n": 0, "median": None, "min": None, "max": None})
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("comparison", help="a grail compare --output_dir, where its runs ran")
    parser.add_argument("--json")
    args = parser.parse_args()
    try:
        summary = phase_times(args.comparison)
    except ValueError as err:
        raise SystemExit(f"phase_times: {err}") from None
    for name, s in summary.items():
        print(f"{name}: " + ("no run to tell" if not s["n"] else
                             f"median {s['median']:.0f} s [{s['min']:.0f}, {s['max']:.0f}] over {s['n']} runs"))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
