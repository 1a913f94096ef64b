"""`grail compare`: the command line of grail.analysis.compare (arms × seeds, resumable, a report over seeds).

`add_parser(sub)` registers the subcommand without importing torch or TRL (so `grail compare --help` is light);
`run(args, rest)` imports the training layer, validates everything, then trains, evaluates and reports.

`python -m grail.analysis.compare.cli OUT_DIR ARM_SLUG SEED THREADS PARENT_PID` is the worker process of `--jobs N > 1`
(one run of the plan, grail.analysis.compare.schedule.run_worker). It watches its parent from its first moment,
before the training layer's imports (seconds), so a comparison killed while its workers start leaves none behind.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

from grail.analysis.compare import analyse
from grail.options.presets import PRESETS, TINY_CPU

__all__ = ["add_parser", "run"]

DESCRIPTION = """\
Train several arms (token_weighting methods, or methods with config fields) for several training seeds each,
every run from the same starting model (the tiny model's warm start, or the pretrained model as given), evaluate
every run and, once, the starting model before RL the same way, and report per arm the mean and a 95% t-interval
over seeds, the change from before RL, paired differences from the first arm, learning curves and weight
diagnostics.

arms:   METHOD or METHOD@field=value@field=value, comma-separated, e.g.
        --arms none,grail,grail@weights_from=rollout_policy,grail@saliency_leaf=middle@weight_std=1.0
seeds:  seed s = 0..S-1 (N..N+S-1 with --first-seed N) sets seed and data_seed (and dataset_shuffle_seed when
        the base sets one) for every arm, so arms are paired by seed.
base:   the tiny-cpu preset unless --preset or --config is given; --FIELD VALUE flags win. Evaluation
        settings come from the base config (default: the synthetic held-out split, greedy acc@1 and sampled
        acc@4, as `grail demo`; with --eval_benchmarks: those benchmarks, as checkpoint evaluation).
resume: `grail compare --resume DIR` (or the same command again with --output_dir DIR) takes the plan stored in
        DIR/compare.json: finished runs and the before-RL evaluation are reused, the others resume, and the report
        is written again. Only checkpointing may change on resume (--save_steps, --save_total_limit,
        --drop-checkpoints: they decide what a kill costs, never a number); the change is recorded in the plan
        and the report, and applies to the runs not finished yet. `--resume DIR --seeds N` with N more than the
        comparison has adds seeds to every arm; the report records when, and the paired intervals it showed
        before (extend by a rule fixed in advance, e.g. on the interval's width, never on its sign).
archive: `grail compare --resume DIR --archive DEST` copies the comparison without its weights (final/ and
        checkpoints) and without its unfinished runs into DEST, and trains nothing: a few MB to keep in a repository
        or carry to another machine. `grail compare --resume DEST` renders the same report from it, computing nothing,
        or trains the runs it lacks; archiving into the same DEST again adds the runs finished since.
        `--archive-each DEST` beside a comparison that trains does this as it goes: after each run finishes; the
        comparison keeps DEST, so its resumes go on archiving there (`--no-archive-each` stops it).
        DEST may be a compressed file, NAME.tar.xz (about a tenth of the folder), written whole each time. A .tar.xz
        is read-only: `--resume NAME.tar.xz --check-report` reads it as it is; to re-render or train from it, unpack
        it into a folder first with `--resume NAME.tar.xz --archive DIR`.
stop: SIGUSR1 or SIGTERM to `grail compare` makes each run that trains save a checkpoint at the end of its step and
        stop; the comparison starts no further run and exits with code 75; `--resume DIR` goes on from there.
check: `grail compare --resume DIR --check-report` renders the report again from the runs, elsewhere, and says whether
        DIR's report.json (its floats to rounding) and report.md are the same (exit 1 and the differences if not).
report: `grail compare --resume DIR --report-only` writes the report from the runs finished so far and trains
        nothing, also while the comparison runs (to check its health: learning curves, clipping, wall time). A
        partial report says so first; deciding to stop or extend on its intervals is peeking.
analysis: `grail compare --resume DIR --pairs grail:random` (and --eval-noise, --pilot-seeds, --phase-times,
        --greedy-flips) prints what the runs say beyond the report (see "analysis of a comparison" below); trains
        nothing.
"""


def add_parser(sub) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "compare", help="arms × seeds from one starting model, resumable, with a report over seeds",
        description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False,
        usage="grail compare --arms A,B,... [--seeds S] [--jobs N] [--sweep FIELD=v1,v2] [--preset NAME | "
              "--config FILE] [--output_dir DIR] [--FIELD VALUE ...]\n       grail compare --resume DIR [--jobs N] "
              "[--seeds MORE] [--save_steps N] [--save_total_limit N] [--drop-checkpoints]\n"
              "         [--archive-each DEST | --no-archive-each]\n"
              "       grail compare --resume DIR|NAME.tar.xz --archive DEST|DEST.tar.xz\n"
              "       grail compare --resume DIR --report-only\n"
              "       grail compare --resume DIR|NAME.tar.xz --check-report")
    parser.add_argument("--arms",
                        help="comma-separated arms: METHOD[@field=value...] (the first arm is the reference of "
                             "the paired differences); required unless --resume")
    parser.add_argument("--resume", metavar="DIR",
                        help="resume, or only re-render, the comparison in DIR with the plan in DIR/compare.json "
                             "(no other plan arguments but checkpointing: --save_steps, --save_total_limit, "
                             "--drop-checkpoints; and --seeds to add seeds): nothing finished is trained or "
                             "evaluated again")
    parser.add_argument("--archive", metavar="DEST",
                        help="with --resume DIR: copy its results without weights or unfinished runs into DEST (new, "
                             "empty, or an earlier archive of it) and stop; `--resume DEST` re-renders the report. "
                             "DEST.tar.xz: the same, compressed; from --resume NAME.tar.xz into a folder: unpacks it")
    parser.add_argument("--archive-each", metavar="DEST",
                        help="while the comparison runs: archive it into DEST as --archive does, once its plan is "
                             "written, after each run finishes and with the report (for a machine that may not "
                             "outlive it: keep DEST on lasting storage); kept with the comparison, so that "
                             "--resume goes on archiving there")
    parser.add_argument("--no-archive-each", action="store_true",
                        help="with --resume DIR: stop archiving as the runs finish, which an earlier --archive-each "
                             "asked")
    parser.add_argument("--report-only", action="store_true",
                        help="with --resume DIR: write the report from the runs finished so far and train nothing "
                             "(also while the comparison runs); a partial report says which runs it leaves out")
    parser.add_argument("--check-report", action="store_true",
                        help="with --resume DIR: render the report again from the runs into a temporary directory and "
                             "say whether DIR's report.json and report.md are the same (exit 1 if not); trains and "
                             "changes nothing")
    parser.add_argument("--seeds", type=int, default=None,
                        help="training seeds per arm: 0..S-1 (default 5); with --resume, more seeds for every arm")
    parser.add_argument("--first-seed", type=int, default=None,
                        help="start the seeds here: N..N+S-1 (default 0), e.g. a pilot on other seeds")
    parser.add_argument("--auroc-rows", type=int, default=None,
                        help="the saliency AUROC of critical vs filler tokens (grail.analysis.compare.auroc) of each "
                        "final model and of the starting model, and their log-probabilities, on this many rows of "
                        "--auroc-set (default 64; of a counterbalanced set, its groups: default 2, about 90 rows; "
                        "0 off)")
    parser.add_argument("--auroc-set", default=None,
                        help="the AUROC's rows: task (the default: the synthetic task's held-out problems) or a label "
                             "set for any model and data (multi_step_filler, natural_contrast; counterbalanced_filler "
                             "and counterbalanced_format also give the position-fixed AUROC)")
    parser.add_argument("--auroc-methods", default=None,
                        help="comma-separated methods the AUROC measures (default: every probed one but the slow)")
    parser.add_argument("--drop-checkpoints", action="store_true",
                        help="delete a run's checkpoint-N folders once it has finished (final/ stays)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="runs at a time (default 1: one after another in this process; N > 1: N worker "
                             "processes with cpu_count // N threads each, one GPU each where several are visible)")
    parser.add_argument("--sweep", action="append", default=[], metavar="FIELD=v1,v2,...",
                        help="cross every arm with every value of FIELD (repeat for a grid); labels show the value; "
                             "each arm is paired with the first arm at the same value, and the report adds a table "
                             "and sweep.png of the headline metric against the last swept field")
    parser.add_argument("--config", help="YAML file of field: value (a `preset: NAME` key is allowed)")
    parser.add_argument("--preset", choices=sorted(PRESETS), help="base values (default tiny-cpu; file and flags win)")
    analyse.add_arguments(parser)
    return parser


def _resumed_plan(args, rest: list[str], unpacked: Path | None = None) -> tuple[dict, Path]:
    """The plan stored in `--resume DIR` (refusing plan arguments beside it: the stored plan decides); `unpacked`:
    the folder that DIR, a .tar.xz archive, was unpacked into (--check-report), else DIR must be a folder."""
    import json

    from grail.analysis.compare.packed import is_packed
    from grail.analysis.compare.plan import PLAN_FILE, amend_plan
    from grail.training.overrides import parse_flags

    given = [flag for flag, value in (("--arms", args.arms), ("--first-seed", args.first_seed),
                                      ("--auroc-rows", args.auroc_rows), ("--auroc-set", args.auroc_set),
                                      ("--auroc-methods", args.auroc_methods),
                                      ("--sweep", args.sweep), ("--config", args.config), ("--preset", args.preset))
             if value not in (None, [])]
    if given:
        raise ValueError(f"--resume takes the plan from its directory's {PLAN_FILE}; drop {', '.join(given)} (to "
                         f"change the plan, start a new comparison with another --output_dir).")
    if unpacked is None and is_packed(args.resume, "--resume"):
        raise ValueError(f"--resume {args.resume}: a compressed archive is read as it is only by --check-report and "
                         "the analysis flags (--pairs, --eval-noise, --pilot-seeds, --phase-times, --greedy-flips); to "
                         f"re-render, report or train, unpack it into a folder: grail compare --resume {args.resume} "
                         f"--archive DIR, then grail compare --resume DIR.")
    out_dir = Path(args.resume) if unpacked is None else unpacked
    path = out_dir / PLAN_FILE
    if not path.is_file():
        raise ValueError(f"--resume {args.resume}: no {PLAN_FILE} there; give the --output_dir of an earlier grail "
                         f"compare, or start one with --arms.")
    fields = parse_flags(rest)
    if fields or args.drop_checkpoints or args.seeds is not None:  # checkpointing or more seeds; amend_plan refuses
        return amend_plan(out_dir, fields, args.drop_checkpoints, args.seeds), out_dir  # any other field
    return json.loads(path.read_text()), out_dir


def _base_source(args, flags: dict) -> str:
    """Where the base config came from, in words, for the report's first lines."""
    parts = [f"preset {args.preset}"] if args.preset else []
    if args.config:
        parts.append(f"config file {args.config}")
    if not parts:
        parts.append("the tiny-cpu preset (the default)")
    shown = sorted(k for k in flags if k not in ("preset", "output_dir"))
    return ", ".join(parts) + (f"; set on the command line: {', '.join(shown)}" if shown else "")


def run(args, rest: list[str]) -> int:
    from grail.analysis.compare.auroc import default_rows
    from grail.analysis.compare.plan import check_plan, make_plan, parse_arms
    from grail.analysis.compare.schedule import run_comparison
    from grail.training.overrides import merge, parse_flags

    if args.jobs < 1:
        raise ValueError(f"--jobs {args.jobs}: give 1 or more runs at a time.")
    if analyse.requested(args):
        return _analyse(args, rest)
    stops = [flag for flag, given in (("--archive", args.archive), ("--report-only", args.report_only),
                                      ("--check-report", args.check_report)) if given]
    each = [flag for flag, given in (("--archive-each", args.archive_each), ("--no-archive-each", args.no_archive_each))
            if given]
    if len(each) > 1:
        raise ValueError("--archive-each DEST and --no-archive-each: give one.")
    if len(stops) > 1 or (stops and each):
        raise ValueError(f"{stops[0]} trains nothing; drop {(stops[1:] or each)[0]} beside it (one of --archive, "
                         f"--report-only, --check-report at a time; {each[0] if each else '--archive-each'} goes with "
                         "training).")
    if args.check_report:
        return _check_report(args, rest)
    if args.archive:
        return _archive(args, rest)
    if args.report_only:
        return _report_only(args, rest)
    if args.resume:
        plan, out_dir = _resumed_plan(args, rest)
        return _run(run_comparison, plan, out_dir, args.jobs, _archive_each(args, out_dir))
    if not args.arms:
        raise ValueError("--arms is required: give the arms to compare (e.g. --arms none,grail), or --resume DIR to "
                         "resume an earlier comparison.")
    flags = parse_flags(rest)
    given = [k for k in ("seed", "data_seed") if k in flags]
    if given:
        raise ValueError(f"--{given[0]}: grail compare sets it per run (seeds 0..S-1); choose S with --seeds.")
    arms = parse_arms(args.arms, args.sweep)
    source = _base_source(args, flags)
    if args.preset:
        flags["preset"] = args.preset
    values = merge(args.config, flags, base=None if args.preset or args.config else TINY_CPU)
    values.setdefault("disable_tqdm", True)
    out_dir = values.pop("output_dir", None)
    if out_dir is None:
        out_dir = os.path.join("runs", f"compare-{time.strftime('%Y%m%d-%H%M%S')}")
        print(f"compare: output in {out_dir}; to resume after a stop: grail compare --resume {out_dir}")
    plan = make_plan(arms, 5 if args.seeds is None else args.seeds, values, out_dir,
                     auroc_rows=default_rows(args.auroc_set) if args.auroc_rows is None else args.auroc_rows,
                     sweeps=args.sweep,
                     base_source=source, first_seed=args.first_seed or 0, auroc_set=args.auroc_set,
                     drop_checkpoints=args.drop_checkpoints,
                     auroc_methods=None if args.auroc_methods is None else
                     [m.strip() for m in args.auroc_methods.split(",") if m.strip()])
    check_plan(plan, out_dir)  # before anything is written or trained
    return _run(run_comparison, plan, out_dir, args.jobs, _archive_each(args, out_dir))


def _archive_each(args, out_dir) -> str | None:
    """Where to archive as the runs finish: --archive-each DEST; else the DEST an earlier command gave for this
    comparison (said in the log), unless --no-archive-each, which forgets it."""
    from grail.analysis.compare.archive import forget_destination, remembered_destination

    if args.no_archive_each:
        forget_destination(out_dir)
        return None
    if args.archive_each:
        return args.archive_each
    dest = remembered_destination(out_dir)
    if dest is not None:
        print(f"compare: archiving into {dest} as each run finishes, as --archive-each asked when this comparison "
              "ran before (--no-archive-each stops it)")
    return dest


def _as_it_is(args, rest: list[str], flag: str, verb: str, missing: str, refuse_jobs: bool) -> None:
    """Refuse, for `flag` (which works on an existing comparison as it is and trains nothing), a missing --resume DIR
    (`missing`: the message's middle) and the flags beside it that would train or change the plan."""
    if not args.resume:
        raise ValueError(f"{missing}: give it with --resume DIR.")
    extra = _plan_flags(args, rest) + (["--jobs"] if refuse_jobs and args.jobs != 1 else [])
    if extra:
        raise ValueError(f"{flag} {verb} the comparison as it is and trains nothing; drop {', '.join(extra)}.")


def _report_only(args, rest: list[str]) -> int:
    from grail.analysis.compare.schedule import report_only

    _as_it_is(args, rest, "--report-only", "reports", "--report-only renders an existing comparison", False)
    plan, out_dir = _resumed_plan(args, rest)  # nothing to amend: the flags that would are refused above
    report_only(plan, out_dir, jobs=args.jobs)
    return 0


def _check_report(args, rest: list[str]) -> int:
    from grail.analysis.compare.check import check_report
    from grail.analysis.compare.packed import opened
    from grail.analysis.compare.schedule import reported_jobs

    _as_it_is(args, rest, "--check-report", "renders", "--check-report checks an existing comparison's report", True)
    with opened(args.resume) as folder:  # a .tar.xz archive: unpacked into a temporary folder for the check
        plan, out_dir = _resumed_plan(args, rest, folder)
        packed = None if out_dir == Path(args.resume) else args.resume
        return 0 if check_report(plan, out_dir, reported_jobs(out_dir, 1), packed=packed) else 1


def _analyse(args, rest: list[str]) -> int:
    flag = analyse.requested(args)[0]
    _as_it_is(args, rest, flag, "reads", f"{flag} analyses an existing comparison", True)
    others = [f for f, given in (("--archive", args.archive), ("--archive-each", args.archive_each),
                                 ("--no-archive-each", args.no_archive_each),
                                 ("--report-only", args.report_only), ("--check-report", args.check_report)) if given]
    if others:
        raise ValueError(f"{flag} reads the comparison as it is; drop {others[0]} beside it (run it on its own).")
    from grail.analysis.compare.packed import opened

    with opened(args.resume) as folder:  # a folder as it is, or a .tar.xz unpacked for the time of the analysis
        return analyse.run_analysis(folder, args)


def _plan_flags(args, rest: list[str]) -> list[str]:
    """The flags given beside --resume DIR that would train or change the plan (refused by --archive, --report-only
    and --check-report; --jobs only by --archive and --check-report)."""
    return [flag for flag, given in (("--arms", args.arms), ("--seeds", args.seeds is not None),
                                      ("--first-seed", args.first_seed is not None),
                                      ("--auroc-rows", args.auroc_rows is not None), ("--auroc-set", args.auroc_set),
                                      ("--auroc-methods", args.auroc_methods),
                                      ("--drop-checkpoints", args.drop_checkpoints), ("--sweep", args.sweep),
                                      ("--config", args.config), ("--preset", args.preset), (" ".join(rest), rest))
            if given]


def _archive(args, rest: list[str]) -> int:
    from grail.analysis.compare.archive import archive_comparison

    _as_it_is(args, rest, "--archive", "copies", "--archive DEST copies an existing comparison", True)
    archive_comparison(args.resume, args.archive)
    return 0


def _run(run_comparison, plan: dict, out_dir, jobs: int, archive_to: str | None = None) -> int:
    from grail.analysis.compare.schedule import ComparisonStopped
    from grail.training.stop import STOPPED_EXIT_CODE

    try:
        run_comparison(plan, out_dir, jobs=jobs, archive_to=archive_to)
    except ComparisonStopped as stopped:  # SIGUSR1 / SIGTERM: checkpoints saved, `--resume` goes on
        print(f"grail: {stopped}", file=sys.stderr)
        return STOPPED_EXIT_CODE
    except RuntimeError as err:  # a run failed: the others are kept, a rerun resumes
        print(f"grail: error: {err}", file=sys.stderr)
        return 1
    return 0


def _exit_with_parent(parent: int) -> None:
    """End this worker when the comparison that started it (pid `parent`) is gone: no orphan keeps training."""
    def watch():
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(3)

    threading.Thread(target=watch, daemon=True).start()


def _worker(argv: list[str]) -> int:
    out_dir, slug, seed, threads, parent = argv
    _exit_with_parent(int(parent))
    from grail.analysis.compare.schedule import run_worker

    return run_worker(Path(out_dir), slug, int(seed), int(threads))


if __name__ == "__main__":
    sys.exit(_worker(sys.argv[1:]))
