"""`grail compare --resume DIR` with an analysis flag: what a finished (or partly finished) comparison says beyond its
report, printed, computing and training nothing, the report left as it is:

    --pairs a:b,...        any two arms paired by seed, Holm over the pairs (grail.analysis.compare.pairs)
    --eval-noise a:b,...   the evaluation's share of the seed-to-seed spread, and the seeds and hours a target needs
                           with more samples per problem (grail.analysis.compare.noise)
    --pilot-seeds ARM      the seeds a pilot implies by the rule fixed in advance (grail.analysis.compare.planning)
    --phase-times          where the runs spent their time, from their files' times (grail.analysis.compare.planning)
    --greedy-flips         greedy decoding's gains and losses by the start's sampled record on each problem
                           (grail.analysis.compare.flips)

`add_arguments(parser)` adds the flags (argparse only: `grail compare --help` stays light); `run_analysis` prints.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

__all__ = ["add_arguments", "requested", "run_analysis"]

FLAGS = ("--pairs", "--eval-noise", "--pilot-seeds", "--phase-times", "--greedy-flips")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "analysis of a comparison", "with --resume DIR: print what its runs say beyond the report; trains nothing "
        "and leaves the report as it is (any of these together)")
    group.add_argument("--pairs", metavar="A:B,...", help="paired differences a − b over the seeds both finished, "
                       "with the report's statistics and Holm's adjustment of the sign-flip p over the pairs")
    group.add_argument("--metrics", metavar="M1,...", help="the metrics of --pairs (default: the primary metric); "
                       "the first is --eval-noise's (a sampled accuracy, <evaluation>/<benchmark>/acc@n)")
    group.add_argument("--eval-noise", metavar="A:B,...", help="split each pair's variance over seeds into its "
                       "evaluation's sampling and the rest, and project the seeds for ±--half-width at --samples")
    group.add_argument("--samples", default="4,8,16,32", metavar="M,...", help="samples per problem to project to")
    group.add_argument("--only-seeds", metavar="0-5", help="--eval-noise on these seeds only (default: every finished)")
    group.add_argument("--run-seconds", type=float, help="a run's wall seconds for --eval-noise's cost (default: "
                       "the runs' median)")
    group.add_argument("--sampled-seconds", type=float, help="its sampled evaluation's seconds (default: the runs' "
                       "median, where they record it; --phase-times tells it for runs that do not)")
    group.add_argument("--pilot-seeds", metavar="ARM", help="read DIR as a pilot: the seeds S its sd implies for "
                       "±--half-width (at least --min-seeds), and whether the scale-matched arm joins")
    group.add_argument("--half-width", type=float, default=2.5, help="target 95%% half-width, points")
    group.add_argument("--min-seeds", type=int, default=6, help="--pilot-seeds' least S")
    group.add_argument("--scale-threshold", type=float, default=1.1,
                       help="--pilot-seeds: the scale-matched arm joins above this mean weights/adv_scale_ratio")
    group.add_argument("--phase-times", action="store_true", help="per phase (greedy, sampled, the rest; the run, "
                       "training) the median [min, max] seconds over runs, from the file times where they ran")
    group.add_argument("--greedy-flips", action="store_true", help="per arm, the problems greedy decoding gained "
                       "and lost (mean per seed), split by how many of the start's samples were right on each")
    group.add_argument("--analysis-json", metavar="FILE", help="also write what is printed as JSON")


def requested(args: argparse.Namespace) -> list[str]:
    """The analysis flags given."""
    return [flag for flag in FLAGS if getattr(args, flag[2:].replace("-", "_"))]


def _report(out_dir: Path) -> dict:
    path = out_dir / "report.json"
    if not path.is_file():
        raise ValueError(f"{path} does not exist: write the report first (grail compare --resume {out_dir} "
                         f"--report-only).")
    return json.loads(path.read_text())


def _plan(out_dir: Path) -> dict:
    from grail.analysis.compare.plan import PLAN_FILE

    path = out_dir / PLAN_FILE
    if not path.is_file():
        raise ValueError(f"{out_dir}: no {PLAN_FILE}; give the --output_dir of a grail compare (or its archive).")
    return json.loads(path.read_text())


def _eval_noise(out_dir: Path, args, metric: str) -> tuple[list[dict], str]:
    from grail.analysis.compare import noise
    from grail.analysis.compare.pairs import parse_pairs

    if not all(m.strip().isdigit() and int(m) >= 1 for m in args.samples.split(",")):
        raise ValueError(f"--samples {args.samples!r}: give samples per problem as positive integers, e.g. 4,8,16.")
    samples = tuple(int(m) for m in args.samples.split(","))
    keep = noise.seed_set(args.only_seeds)
    table = noise.load_samples(out_dir, metric, keep)
    recorded = noise.run_costs(out_dir, metric.split("/")[0], keep)
    run_s = args.run_seconds if args.run_seconds is not None else recorded[0]
    sampled_s = args.sampled_seconds if args.sampled_seconds is not None else recorded[1]
    rows = []
    for a, b in parse_pairs(args.eval_noise, "--eval-noise"):
        missing = [arm for arm in (a, b) if arm not in table]
        if missing:
            raise ValueError(f"--eval-noise {a}:{b}: no finished run of {missing[0]!r} (arms: {', '.join(table)}).")
        row = {"pair": f"{a} − {b}", **noise.decompose(table[a], table[b], samples, args.half_width / 100)}
        rows.append(row if run_s is None or sampled_s is None else noise.add_costs(row, run_s, sampled_s))
    text = [f"{metric}; points:", "", noise.noise_markdown(rows, samples, args.half_width / 100), ""]
    if run_s is None or sampled_s is None:
        text.append("No cost column: the runs do not record their sampled evaluation's time (grail-rl before "
                    "2026-11-27); give --run-seconds and --sampled-seconds (--phase-times tells them).")
    else:
        def source(given):
            return "given" if given is not None else "the runs' median"
        text.append(f"Cost per arm at m samples: seeds × (R + E · (m / n − 1)), R = {run_s:.0f} s a run "
                    f"({source(args.run_seconds)}), E = {sampled_s:.0f} s of sampled evaluation "
                    f"({source(args.sampled_seconds)}).")
    return rows, "\n".join(text)


def run_analysis(out_dir: str | Path, args: argparse.Namespace, log=print) -> int:
    """Print each analysis asked for (module docstring), one section each; 0 when all of them ran."""
    from grail.analysis.compare.pairs import paired_arms, pairs_markdown, parse_pairs, with_holm
    from grail.analysis.compare.planning import phase_times, phase_times_text, pilot_seeds, pilot_text

    out_dir = Path(out_dir)
    metrics = [m for m in (args.metrics or "").split(",") if m]
    out, sections = {}, []
    if args.pairs:
        report = _report(out_dir)
        chosen = metrics or [report["primary_metric"]]
        out["pairs"] = with_holm([paired_arms(report, a, b, m) for m in chosen
                                  for a, b in parse_pairs(args.pairs, "--pairs")])
        sections.append(("Paired arms (points)", pairs_markdown(out["pairs"])))
    if args.eval_noise:
        metric = metrics[0] if metrics else _plan(out_dir)["protocol"]["primary"]
        out["eval_noise"], text = _eval_noise(out_dir, args, metric)
        sections.append(("The evaluation's share of the spread", text))
    if args.pilot_seeds:
        out["pilot_seeds"] = pilot_seeds(_report(out_dir), args.pilot_seeds, args.half_width, args.min_seeds,
                                         args.scale_threshold)
        sections.append(("Seeds the pilot implies", pilot_text(out["pilot_seeds"])))
    if args.phase_times:
        out["phase_times"] = phase_times(out_dir)
        sections.append(("Phase times (from the runs' file times)", phase_times_text(out["phase_times"])))
    if args.greedy_flips:
        from grail.analysis.compare.flips import flips_text, greedy_flips

        out["greedy_flips"] = greedy_flips(out_dir, _plan(out_dir))
        sections.append(("Greedy answers gained and lost, by the start's samples", flips_text(out["greedy_flips"])))
    log("\n\n".join(f"## {title}\n\n{text}" for title, text in sections))
    if args.analysis_json:
        Path(args.analysis_json).write_text(json.dumps(out, indent=1) + "\n")
    return 0
