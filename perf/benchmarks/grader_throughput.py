r"""Grader throughput: verifications per second of `grail.evaluation.grader.grade_many` with 1 worker and with
cpu_count.

What is graded (`--mix`):
- `math500_solutions` (default): each MATH500 worked solution (a realistic completion: prose, LaTeX, [asy] code,
  the answer boxed at the end) against its answer field, `--repeats` times over (default 3, as evaluation's
  3 samples per problem; each reference is parsed once per process and cached, as in evaluation).
- `round_trip`: every reference answer of the six benchmarks boxed and graded against itself (dominated by
  CollegeMath's 2818 long, symbolic answers).
How: one untimed warm-up (math-verify imported, its regexes compiled, 20 items graded in this process), then
`grade_many(..., workers=1)` (in this process, on the main thread) and `grade_many(..., workers=cpu_count)`
(a fresh pool of spawned processes, whose start-up is part of the timed call, as it is for every evaluation),
`--rounds` times each, interleaved; the median wall time is reported. Before each call the grader's reference
cache and sympy's cache are cleared, so the in-process calls do not profit from the earlier ones. The pool's
start-up alone is measured separately (grading `workers` trivial items), so the steady-state rate can be told
apart.

Run: `python perf/benchmarks/grader_throughput.py [--data-dir DIR --mix math500_solutions]`.
Prints one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "benchmarks"


def items(mix: str, data_dir: Path, repeats: int) -> tuple[list[str], list[str]]:
    """(completions, references) of the chosen mix."""
    if mix == "math500_solutions":
        with (data_dir / "math500" / "test.jsonl").open(encoding="utf-8") as lines:
            rows = [json.loads(line) for line in lines if line.strip()]
        return [r["solution"] for r in rows] * repeats, [r["answer"] for r in rows] * repeats
    from grail.evaluation.benchmarks import BENCHMARK_NAMES, load_benchmark

    problems = [p for name in BENCHMARK_NAMES for p in load_benchmark(name, data_dir=data_dir, size=None).problems]
    return ["\\boxed{" + p.answer + "}" for p in problems] * repeats, [p.answer for p in problems] * repeats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="grader_throughput", description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA, help="the six benchmark folders")
    parser.add_argument("--mix", choices=("math500_solutions", "round_trip"), default="math500_solutions")
    parser.add_argument("--repeats", type=int, default=None, help="passes over the items (default 3 for "
                        "math500_solutions, 1 for round_trip)")
    parser.add_argument("--rounds", type=int, default=3, help="timed calls per worker count (median reported)")
    parser.add_argument("--workers", type=int, default=os.cpu_count(), help="the parallel worker count")
    args = parser.parse_args(argv)

    from sympy.core.cache import clear_cache

    from grail.evaluation.grader import TIMEOUT_S, _parse_reference, grade_many

    repeats = args.repeats or (3 if args.mix == "math500_solutions" else 1)
    completions, references = items(args.mix, args.data_dir, repeats)
    warm = grade_many(completions[:20], references[:20], workers=1)
    counts = tuple(dict.fromkeys((1, args.workers)))
    seconds: dict[int, list[float]] = {w: [] for w in counts}
    correct: dict[int, int] = {}
    for _ in range(args.rounds):
        for workers in counts:
            _parse_reference.cache_clear()  # each call starts as cold as a fresh worker's caches
            clear_cache()
            start = time.perf_counter()
            results = grade_many(completions, references, workers=workers)
            seconds[workers].append(time.perf_counter() - start)
            correct[workers] = sum(r.correct for r in results)
    start_up = []
    for _ in range(args.rounds):
        start = time.perf_counter()
        grade_many(["\\boxed{1}"] * args.workers, ["1"] * args.workers, workers=args.workers)
        start_up.append(time.perf_counter() - start)
    pool_start = statistics.median(start_up) if args.workers > 1 else 0.0

    per_count = {}
    for workers in counts:
        wall = statistics.median(seconds[workers])
        per_count[str(workers)] = {
            "median_s": round(wall, 3),
            "seconds": [round(s, 3) for s in seconds[workers]],
            "verifications_per_s": round(len(completions) / wall, 1),
            "verifications_per_s_after_start": round(len(completions) / max(wall - pool_start, 1e-9), 1)
            if workers > 1 else None,
            "correct": correct[workers],
        }
    result = {
        "mix": args.mix,
        "items": len(completions),
        "repeats": repeats,
        "warm_up_items": len(warm),
        "timeout_s": TIMEOUT_S,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "pool_start_s": round(pool_start, 3),
        "workers": per_count,
        "speedup": round(statistics.median(seconds[1]) / statistics.median(seconds[args.workers]), 2),
    }
    print(json.dumps(result, indent=2), file=sys.stdout, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
