"""Cost curves from gpu_check.py's kept cases: each method's loss step against GRPO's as the completion grows.

    python perf/benchmarks/gpu_check.py --shapes smollm2-135m,gemma3-270m --lengths 256,512,1024,2048,4096 \\
        --checkpointing off --jsonl cases.jsonl          # on a CUDA machine; one JSON line per (shape, T)
    python perf/benchmarks/gpu_curves.py cases.jsonl [more.jsonl ...] [--json curves.json] [--plot-dir DIR]

Each gpu_check case times every variant of a method (fused or separate where that applies) side by side on one
synthetic micro-batch, GRPO (`none`) among them, so a ratio is only ever taken inside one case: a file that measures
OAR-P with its own `none` at other lengths (OAR-P is the slow one) merges with the others by (shape, checkpointing,
T). Per shape and checkpointing, per variant and T: the loss step's time ratio to GRPO, its peak-memory ratio
(`max_memory_allocated`), and the extra seconds per completion, (median step - GRPO's) / rows, whose growth exponent in
T is fitted by harness.growth_exponent. The goals (harness.GOALS) are printed against the methods' default paths
(`grail` and `entropy`, fused): these are loss steps, generation excluded, so a whole step's ratio is closer to 1 by
the share generation takes of it. One PNG per shape and checkpointing goes to --plot-dir.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from harness import GOALS, goal_entry, growth_exponent, plot_curves

# gpu_check's names before it shared harness.METHODS (its files from 2026-11-26 use them), and the names now
RENAMED = {"grail_fused": "grail", "entropy_fused": "entropy"}


def read_cases(paths: list[str]) -> list[dict]:
    cases = []
    for path in paths:
        for number, line in enumerate(Path(path).read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                case = json.loads(line)
                case["methods"]["none"], case["shape"], case["length"], case["rows"]  # noqa: B018 (the fields used)
            except (ValueError, KeyError, TypeError) as exc:
                raise SystemExit(f"{path}:{number}: not a gpu_check case with a GRPO baseline ({exc}); "
                                 "give the --jsonl files of gpu_check.py.") from None
            case["methods"] = {RENAMED.get(name, name): result for name, result in case["methods"].items()}
            cases.append(case)
    if not cases:
        raise SystemExit(f"no gpu_check cases in {', '.join(paths)}.")
    return cases


def assemble(cases: list[dict]) -> dict:
    """{"curves": {"<shape> checkpointing <c>": {variant: {"points": [...], "growth_exponent": x}}}, "goals": ...}"""
    groups: dict[str, dict[str, dict[int, dict]]] = {}
    for case in cases:
        key = f"{case['shape']} checkpointing {case['checkpointing']}"
        base = case["methods"]["none"]
        for variant, result in case["methods"].items():
            points = groups.setdefault(key, {}).setdefault(variant, {})
            if case["length"] in points and variant != "none":
                raise SystemExit(f"{key}: {variant} at T = {case['length']} is in two cases; keep one.")
            points[case["length"]] = {
                "tokens": case["length"], "rows": case["rows"], "median_step_s": result["median_step_s"],
                "grpo_step_s": base["median_step_s"], "time_ratio_to_grpo": result["time_ratio_to_grpo"],
                "peak_mem_gb": result["peak_mem_gb"], "mem_ratio_to_grpo": result["mem_ratio_to_grpo"],
                "extra_s_per_completion": (result["median_step_s"] - base["median_step_s"]) / case["rows"]}
    curves = {}
    for key, variants in groups.items():
        curves[key] = {}
        for variant, by_t in variants.items():
            points = [by_t[t] for t in sorted(by_t)]
            exponent = None if variant == "none" else growth_exponent(
                [p["tokens"] for p in points], [p["extra_s_per_completion"] for p in points])
            curves[key][variant] = {"points": points, "growth_exponent": exponent}
    devices = sorted({case.get("device", "unrecorded") for case in cases})
    return {"benchmark": "gpu_curves", "measures": "loss step (GRAILTrainer._compute_loss + backward), generation "
            "excluded; random-initialised bf16 models", "devices": devices, "curves": curves,
            "goals": {key: goals(variants) for key, variants in curves.items()}}


def goals(variants: dict) -> list[dict]:
    out = []

    def goal(name: str, limit: float, measured: list[tuple[int, float | None]]):
        out.append(goal_entry(name, limit, measured))

    grail = variants.get("grail")  # its default path, fused
    if grail:
        goal("grail (fused) loss step / GRPO's, every T", GOALS["grail_time"],
             [(p["tokens"], p["time_ratio_to_grpo"]) for p in grail["points"]])
    if "oar_p" in variants:
        goal("oar_p loss step / GRPO's at T = 1024", GOALS["oar_p_time"],
             [(p["tokens"], p["time_ratio_to_grpo"]) for p in variants["oar_p"]["points"] if p["tokens"] == 1024])
    for variant, curve in variants.items():
        if variant != "none":
            goal(f"{variant} peak memory / GRPO's, every T", GOALS["memory"],
                 [(p["tokens"], p["mem_ratio_to_grpo"]) for p in curve["points"]])
    return out


def plot(key: str, variants: dict, devices: list[str], path: Path) -> None:
    plot_curves(variants, path, f"{key}: loss step by completion length ({', '.join(devices)}; "
                               "generation excluded)", "peak memory / GRPO's", log_time=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu_curves", description=__doc__.split("\n")[0])
    parser.add_argument("jsonl", nargs="+", help="gpu_check.py --jsonl files")
    parser.add_argument("--json", help="write the curves here too (they always go to stdout)")
    parser.add_argument("--plot-dir", help="one PNG per shape and checkpointing here")
    args = parser.parse_args(argv)
    result = assemble(read_cases(args.jsonl))
    if args.plot_dir:
        Path(args.plot_dir).mkdir(parents=True, exist_ok=True)
        for key, variants in result["curves"].items():
            plot(key, variants, result["devices"], Path(args.plot_dir) / f"{key.replace(' ', '-')}.png")
    for key, listed in result["goals"].items():
        for g in listed:
            verdict = {True: "met", False: "NOT met", None: "not measured"}[g["met"]]
            print(f"{key}: goal {g['goal']} <= {g['at_most']}: {verdict} {g['measured']}", file=sys.stderr)
    text = json.dumps(result, indent=2)
    if args.json:
        Path(args.json).write_text(text)
    print(text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
