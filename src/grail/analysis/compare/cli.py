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

from grail.options.presets import PRESETS, TINY_CPU

__all__ = ["add_parser", "run"]

DESCRIPTION = """\
Train several arms (token_weighting methods, or methods with config fields) for several training seeds each,
every run from the same warm-started model, evaluate every run the same way, and report per arm the mean and a
95% t-interval over seeds, paired differences from the first arm, learning curves and weight diagnostics.

arms:   METHOD or METHOD@field=value@field=value, comma-separated, e.g.
        --arms none,grail,grail@weights_from=rollout_policy,grail@saliency_leaf=middle@weight_std=1.0
seeds:  seed s = 0..S-1 sets seed and data_seed (and dataset_shuffle_seed when the base sets one) for every
        arm, so arms are paired by seed.
base:   the tiny-cpu preset unless --preset or --config is given; --FIELD VALUE flags win. Evaluation
        settings come from the base config (default: the synthetic held-out split, greedy acc@1 and sampled
        acc@4, as `grail demo`; with --eval_benchmarks: those benchmarks, as checkpoint evaluation).
resume: rerun the same command with the same --output_dir; finished runs are kept, the others resume.
"""


def add_parser(sub) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "compare", help="arms × seeds from one warm start, resumable, with a report over seeds",
        description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False,
        usage="grail compare --arms A,B,... [--seeds S] [--jobs N] [--sweep FIELD=v1,v2] [--preset NAME | "
              "--config FILE] [--output_dir DIR] [--FIELD VALUE ...]")
    parser.add_argument("--arms", required=True,
                        help="comma-separated arms: METHOD[@field=value...] (the first arm is the reference of "
                             "the paired differences)")
    parser.add_argument("--seeds", type=int, default=5, help="training seeds per arm: 0..S-1 (default 5)")
    parser.add_argument("--auroc-rows", type=int, default=64,
                        help="synthetic task only: the saliency AUROC of critical vs filler tokens "
                        "(grail.analysis.compare.auroc) of each final model and of the warm start, on this many "
                        "held-out problems (default 64; 0 off)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="runs at a time (default 1: one after another in this process; N > 1: N worker "
                             "processes with cpu_count // N threads each, one GPU each where several are visible)")
    parser.add_argument("--sweep", action="append", default=[], metavar="FIELD=v1,v2,...",
                        help="cross every arm with every value of FIELD (repeat for a grid); labels show the value; "
                             "each arm is paired with the first arm at the same value, and the report adds a table "
                             "and sweep.png of the headline metric against the last swept field")
    parser.add_argument("--config", help="YAML file of field: value (a `preset: NAME` key is allowed)")
    parser.add_argument("--preset", choices=sorted(PRESETS), help="base values (default tiny-cpu; file and flags win)")
    return parser


def run(args, rest: list[str]) -> int:
    from grail.analysis.compare.plan import check_plan, make_plan, parse_arms
    from grail.analysis.compare.schedule import run_comparison
    from grail.training.overrides import merge, parse_flags

    flags = parse_flags(rest)
    given = [k for k in ("seed", "data_seed") if k in flags]
    if given:
        raise ValueError(f"--{given[0]}: grail compare sets it per run (seeds 0..S-1); choose S with --seeds.")
    if args.jobs < 1:
        raise ValueError(f"--jobs {args.jobs}: give 1 or more runs at a time.")
    arms = parse_arms(args.arms, args.sweep)
    if args.preset:
        flags["preset"] = args.preset
    values = merge(args.config, flags, base=None if args.preset or args.config else TINY_CPU)
    values.setdefault("disable_tqdm", True)
    out_dir = values.pop("output_dir", None)
    if out_dir is None:
        out_dir = os.path.join("runs", f"compare-{time.strftime('%Y%m%d-%H%M%S')}")
        print(f"compare: output in {out_dir}; to resume after a stop, rerun with --output_dir {out_dir}")
    plan = make_plan(arms, args.seeds, values, out_dir, auroc_rows=args.auroc_rows, sweeps=args.sweep)
    check_plan(plan, out_dir)  # before anything is written or trained
    try:
        run_comparison(plan, out_dir, jobs=args.jobs)
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
