"""What a step costs as the completion grows: step_overhead.py at several completion lengths T, one fresh process
per T (so one T's memory does not sit under the next), and the curves assembled from its JSON.

    python perf/benchmarks/cost_curves.py --model smollm2-135m --set task_style=words --out ~/curves/smollm2 \\
        [--tokens 128,256,512,1024] [--rows 8,8,4,2] [--methods M1,M2,...] \\
        [--warmup 1] [--rounds 2] [--json curves.json] [--plot curves.png]

Each T runs step_overhead with `--reward coin` (every group mixed with the same probability whatever the model
writes, so every method does its full work at every T; step_overhead's docstring says why), with `--malloc`
(default: `default`, glibc as a user's run has it, so the times are a user's; step_overhead's glibc tuning, which
memory needs, slows generation more than the rest and pulls the ratios towards 1) and its `--rows` from
the list (fewer rows at larger T keeps a point affordable; completions per prompt are min(4, rows)). Its JSON goes
to `--out/T<T>.json` and its log to `--out/T<T>.err`; a T whose JSON is already there is read, not run again, so an
interrupted curve resumes where it stopped (a changed --rows, --methods, --model or --set for a T already
measured is refused: delete that file to measure it again; another --cache-dir is not a change).

Per method and T: the step-time ratio to GRPO and, with `--malloc tuned` only, the per-step memory-increase ratio
(both measured side by side in that T's process, medians over its rounds; with the default allocator freed pages
stay resident from step to step, so the memory ratio is `null`: step_memory.py measures a step's memory), and
the extra time per completion, (median step - GRPO's median step) / rows. Its growth exponent in T is the
least-squares slope of log(extra per completion) on log(T) over the T where the extra is positive (`null` with
fewer than two). GRAIL's probe is also set against its floor (an
input-only backward of the probed rows: harness.input_only_backward). The goals, printed with whether each is met (not
timed tests): GRAIL's step at most 1.15x GRPO's and its probe at most 1.1x its floor at every T, OAR-P at most 3x
at T = 1024, every method's memory at most 1.05x GRPO's at every T (measured with `--malloc tuned` only).
`--smoke`: the tiny model, T in {16, 32}, 4 rows, none and grail, 0 warm-up steps, 1 round.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from harness import GOALS, builtin_methods, goal_entry, growth_exponent, plot_curves

STEP_OVERHEAD = Path(__file__).resolve().parent / "step_overhead.py"
SMOKE = {"tokens": "16,32", "rows": "4", "methods": "none,grail", "warmup": 0, "rounds": 1}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="cost_curves", description=__doc__.split("\n")[0],
                                     epilog="See the module docstring for what is measured and how.")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--out", required=True, help="directory of the per-T JSON files (kept: a rerun resumes)")
    parser.add_argument("--tokens", help="completion lengths T, comma-separated (default 128,256,512,1024)")
    parser.add_argument("--rows", help="completions per step, one per T or one for all (default 8,8,4,2)")
    parser.add_argument("--methods", help="step_overhead's --methods (default: the built-in methods, "
                        "grail.methods.builtin.BUILTIN)")
    parser.add_argument("--warmup", type=int, help="untimed steps per method at each T (default 1)")
    parser.add_argument("--rounds", type=int, help="timed rounds at each T (default 2)")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="passed to step_overhead")
    parser.add_argument("--malloc", choices=("default", "tuned"), default="default",
                        help="step_overhead's --malloc: default for times (default), tuned for memory ratios too")
    parser.add_argument("--cache-dir", help="warm-start and model cache, passed to step_overhead")
    parser.add_argument("--warmstart-steps", type=int, help="the tiny model's warm start, passed to step_overhead")
    parser.add_argument("--json", help="write the assembled curves here too (they always go to stdout)")
    parser.add_argument("--plot", help="a PNG of the curves")
    parser.add_argument("--smoke", action="store_true", help="tiny settings to test the script (module docstring)")
    args = parser.parse_args(argv)
    defaults = SMOKE if args.smoke else {"tokens": "128,256,512,1024", "rows": "8,8,4,2",
                                         "methods": ",".join(builtin_methods()), "warmup": 1, "rounds": 2}
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.smoke and args.model == "smollm2-135m":
        args.model = "tiny"
    try:
        args.tokens = [int(t) for t in args.tokens.split(",")]
        rows = [int(r) for r in args.rows.split(",")]
    except ValueError:
        parser.error("--tokens and --rows take comma-separated integers, e.g. --tokens 128,256 --rows 8,4")
    if len(rows) == 1:
        rows = rows * len(args.tokens)
    if len(rows) != len(args.tokens):
        parser.error(f"--rows gives {len(rows)} values for {len(args.tokens)} --tokens: give one per T, or one.")
    args.rows = dict(zip(args.tokens, rows, strict=True))
    if "none" not in args.methods.split(","):
        args.methods = "none," + args.methods
    return args


def step_overhead_argv(args: argparse.Namespace, tokens: int) -> list[str]:
    rows = args.rows[tokens]
    argv = ["--model", args.model, "--reward", "coin", "--completion-tokens", str(tokens), "--rows", str(rows),
            "--generations", str(min(4, rows)), "--methods", args.methods, "--warmup", str(args.warmup),
            "--rounds", str(args.rounds), "--malloc", args.malloc]
    for item in args.set:
        argv += ["--set", item]
    if args.cache_dir:
        argv += ["--cache-dir", args.cache_dir]
    if args.warmstart_steps is not None:
        argv += ["--warmstart-steps", str(args.warmstart_steps)]
    return argv + (["--smoke"] if args.smoke else [])


def _settings(argv: list[str]) -> list[str]:
    """What a point measured: step_overhead's arguments less --cache-dir (where a model is kept changes nothing)."""
    if "--cache-dir" not in argv:
        return argv
    at = argv.index("--cache-dir")
    return argv[:at] + argv[at + 2:]


def measure(args: argparse.Namespace, tokens: int) -> dict:
    """T's step_overhead result: read from --out when there, else run (and kept there)."""
    out = Path(args.out)
    path, log_path = out / f"T{tokens}.json", out / f"T{tokens}.err"
    argv = step_overhead_argv(args, tokens)
    if path.exists():
        try:
            result = json.loads(path.read_text())
            recorded = result["cost_curves_argv"]
        except (ValueError, KeyError) as exc:
            raise SystemExit(f"{path}: not a cost_curves point ({exc}); delete it to measure T = {tokens} "
                             f"again.") from None
        if _settings(recorded) != _settings(argv):
            raise SystemExit(f"{path} was measured with other settings ({' '.join(recorded)}); delete it to measure "
                             f"T = {tokens} with these, or give the same settings.")
        print(f"T = {tokens}: reusing {path}", file=sys.stderr)
        return result
    out.mkdir(parents=True, exist_ok=True)
    print(f"T = {tokens}: running step_overhead ({args.rows[tokens]} rows), log in {log_path}", file=sys.stderr)
    with open(log_path, "w") as log:
        done = subprocess.run([sys.executable, str(STEP_OVERHEAD), *argv], stdout=subprocess.PIPE, stderr=log,
                              text=True)
    if done.returncode:
        raise SystemExit(f"step_overhead failed at T = {tokens} (exit {done.returncode}); see {log_path}. The points "
                         f"already measured are kept in {out}.")
    result = {**json.loads(done.stdout), "cost_curves_argv": argv}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2))
    tmp.replace(path)  # a point is there whole or not at all
    return result


def assemble(args: argparse.Namespace, points: dict[int, dict]) -> dict:
    tokens = sorted(points)
    methods = points[tokens[0]]["config"]["methods"]
    curves = {}
    for method in methods:
        rows = []
        for t in tokens:
            result, rows_t = points[t]["methods"][method], points[t]["config"]["rows"]
            own_memory = points[t].get("malloc_tuning") is not None
            base = points[t]["methods"]["none"]["median_step_s"]
            rows.append({"tokens": t, "rows": rows_t, "median_step_s": result["median_step_s"],
                         "step_s": result["step_s"], "time_ratio_to_grpo": result["time_ratio_to_grpo"],
                         "mem_ratio_to_grpo": result["mem_ratio_to_grpo"] if own_memory else None,
                         "peak_mem_increase_mb_median": result["peak_mem_increase_mb_median"] if own_memory else None,
                         "extra_s_per_completion": (result["median_step_s"] - base) / rows_t,
                         "weights_seconds_median": result["weights_seconds_median"],
                         "probe_floor_s_median": result.get("probe_floor_s_median"),
                         "probe_to_floor": result.get("probe_to_floor"),
                         "probed_rows_frac": result["probed_rows_frac"]})
        exponent = None if method == "none" else growth_exponent(tokens, [r["extra_s_per_completion"] for r in rows])
        curves[method] = {"points": rows, "growth_exponent": exponent}
    return {"benchmark": "cost_curves", "model": args.model, "tokens": tokens,
            "rows": {str(t): points[t]["config"]["rows"] for t in tokens}, "warmup": args.warmup,
            "rounds": args.rounds, "fields": args.set, "malloc": args.malloc,
            "device": points[tokens[0]]["config"]["device"],
            "curves": curves, "goals": goals(curves)}


def goals(curves: dict) -> list[dict]:
    out = []

    def goal(name: str, limit: float, measured: list[tuple[int, float | None]]):
        out.append(goal_entry(name, limit, measured))

    if "grail" in curves:
        points = curves["grail"]["points"]
        goal("grail step / GRPO step, every T", GOALS["grail_time"],
             [(p["tokens"], p["time_ratio_to_grpo"]) for p in points])
        goal("grail probe / its floor, every T", GOALS["grail_probe_to_floor"],
             [(p["tokens"], p["probe_to_floor"]) for p in points])
    if "oar_p" in curves:
        goal("oar_p step / GRPO step at T = 1024", GOALS["oar_p_time"],
             [(p["tokens"], p["time_ratio_to_grpo"]) for p in curves["oar_p"]["points"] if p["tokens"] == 1024])
    for method, curve in curves.items():
        if method != "none":
            goal(f"{method} memory / GRPO memory, every T", GOALS["memory"],
                 [(p["tokens"], p["mem_ratio_to_grpo"]) for p in curve["points"]])
    return out


def plot(result: dict, path: str) -> None:
    memory_title = ("step's memory increase / GRPO's" if result["malloc"] == "tuned" else
                    "memory: not measured here (--malloc default)")
    rows = ", ".join(f"{t}: {r}" for t, r in result["rows"].items())
    plot_curves(result["curves"], path, f"{result['model']}: cost of a step by completion length (rows per step "
                f"{rows}; {result['device']})", memory_title)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    points = {t: measure(args, t) for t in args.tokens}
    result = assemble(args, points)
    text = json.dumps(result, indent=2)
    if args.json:
        Path(args.json).write_text(text)
    if args.plot:
        plot(result, args.plot)
    for g in result["goals"]:
        verdict = {True: "met", False: "NOT met", None: "not measured"}[g["met"]]
        print(f"goal {g['goal']} <= {g['at_most']}: {verdict} {g['measured']}", file=sys.stderr)
    print(text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
