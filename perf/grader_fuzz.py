r"""Grader fuzz throughput: the adversarial and generated items of tests/test_grader_fuzz.py, built deterministically
(seeded), graded through the evaluation path and the training reward, in an empty temporary directory.

Items: the fuzz test's hypothesis strategy (`item`: NASTY fragments, random text and integers, boxed, bare or over
two boxes, against eight references), drawn the way its slow test draws them (`item.example()`: @given runs of 10
examples) but with @seed(seed * 1000003 + run) for each run of 10, so the same `--seed` gives the same items on
every machine. One departure: hypothesis also draws "local constants", the literals of every module loaded from this
checkout (the grader's own strings among them), so the items would change with any edit to the code under test;
this script draws without them (a private hook of hypothesis), and `items_digest` identifies the item set.
Paths:
- `eval`: `GradingPool(--workers).grade_many(..., timeout_s=2, item_deadline_s=8)`, the test's call. An item's
  seconds here are the parent's view (sent to a worker until its result came back; a killed item: its deadline);
  `worker_starts` counts the worker processes started, the two at the start included.
- `reward`: `math_verify_reward` (main thread, in this process, the grader's TIMEOUT_S alarms), one item per call,
  each timed. Reasons come from the grader call the reward makes.
Both run in a fresh temporary directory, listed (recursively) before and after: `files_written` names what appeared.

Run: `python perf/grader_fuzz.py [--n 10000] [--seed 0] [--paths eval,reward]`; `--smoke` grades 100 items (under
30 s). Prints one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import platform
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

FUZZ_TEST = Path(__file__).resolve().parents[1] / "tests" / "test_grader_fuzz.py"
TARGET_ITEMS_PER_S = 50  # issue 21: the evaluation path on this mix, 2 grading processes
RUN = 10  # examples per @given run: what `strategy.example()` draws at a time


def fuzz_items(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """n (completion, reference) pairs of the fuzz test's `item` strategy, the same for the same seed whatever the
    code around them (module docstring)."""
    from hypothesis.internal.conjecture import providers

    spec = importlib.util.spec_from_file_location("grader_fuzz_items", FUZZ_TEST)
    fuzz = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fuzz)
    local_constants = providers._get_local_constants
    providers._get_local_constants = providers.Constants  # none: an empty set of constants
    providers.CONSTANTS_CACHE.cache.clear()
    items: list[tuple[str, str]] = []
    run = 0
    try:
        while len(items) < n:
            items += _run_of_examples(fuzz.item, seed * 1_000_003 + run)
            run += 1
    finally:
        providers._get_local_constants = local_constants
        providers.CONSTANTS_CACHE.cache.clear()
    return items[:n]


def _run_of_examples(strategy, run_seed: int) -> list:
    """RUN examples of `strategy` as `strategy.example()` draws them (one @given run, shuffled), seeded."""
    from hypothesis import HealthCheck, Phase, Verbosity, given, settings
    from hypothesis import seed as hypothesis_seed

    drawn: list = []

    @hypothesis_seed(run_seed)
    @settings(database=None, max_examples=RUN, deadline=None, verbosity=Verbosity.quiet, phases=(Phase.generate,),
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def draw(example):
        drawn.append(example)

    draw()
    random.Random(run_seed).shuffle(drawn)
    return drawn


def _listing(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")}


def _slowest(seconds: list[float], items: list[tuple[str, str]], results: list) -> dict:
    k = max(range(len(seconds)), key=seconds.__getitem__)
    return {"seconds": round(seconds[k], 3), "completion": items[k][0][:200], "reference": items[k][1],
            "reason": results[k].reason}


def _summary(seconds_total: float, seconds: list[float], items: list[tuple[str, str]], results: list) -> dict:
    return {"seconds": round(seconds_total, 3), "items_per_s": round(len(items) / seconds_total, 2),
            "reasons": dict(Counter(r.reason for r in results).most_common()),
            "correct": sum(r.correct for r in results), "slowest": _slowest(seconds, items, results)}


def grade_eval(items: list[tuple[str, str]], workers: int, timeout_s: float, item_deadline_s: float) -> dict:
    """The evaluation path, timed per item from the parent's side (module docstring)."""
    from grail.evaluation import grading_workers
    from grail.evaluation.grader import GradingPool

    took: dict[int, float] = {}
    starts = []
    receive, start_worker = grading_workers._Pool._receive, grading_workers._Worker.__init__

    def timed_receive(pool, worker, contents, results):
        index = worker.index
        receive(pool, worker, contents, results)
        if index is not None:  # a result (or a death) for an item sent at its deadline less item_deadline_s
            took[index] = time.monotonic() - (worker.deadline - item_deadline_s)

    def counted_start(worker):
        starts.append(time.monotonic())
        start_worker(worker)

    grading_workers._Pool._receive, grading_workers._Worker.__init__ = timed_receive, counted_start
    try:
        started = time.perf_counter()
        with GradingPool(workers) as pool:
            results = pool.grade_many([c for c, _ in items], [r for _, r in items], timeout_s=timeout_s,
                                      item_deadline_s=item_deadline_s)
        total = time.perf_counter() - started
    finally:
        grading_workers._Pool._receive, grading_workers._Worker.__init__ = receive, start_worker
    seconds = [took.get(k, item_deadline_s) for k in range(len(items))]  # not received: killed at its deadline
    return {**_summary(total, seconds, items, results), "workers": workers, "worker_starts": len(starts),
            "killed": len(items) - len(took)}


def grade_reward(items: list[tuple[str, str]]) -> dict:
    """The training reward, one item per call on this main thread."""
    from grail.evaluation import grader
    from grail.evaluation.rewards import TIMEOUT_S, math_verify_reward

    graded: list = []
    grade_many = grader.grade_many

    def recorded(*args, **kwargs):
        results = grade_many(*args, **kwargs)
        graded.extend(results)
        return results

    grader.grade_many = recorded  # the reward calls grader.grade_many: its results give the reasons
    rewards, seconds = [], []
    try:
        started = time.perf_counter()
        for completion, reference in items:
            begun = time.perf_counter()
            rewards += math_verify_reward(completions=[completion], answer=[reference])
            seconds.append(time.perf_counter() - begun)
        total = time.perf_counter() - started
    finally:
        grader.grade_many = grade_many
    assert len(graded) == len(items) and [float(r.correct) for r in graded] == rewards
    return {**_summary(total, seconds, items, graded), "timeout_s": TIMEOUT_S}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="grader_fuzz", description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000, help="items (default 10000, the slow test's count)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help="100 items: the code path, in under 30 s")
    parser.add_argument("--paths", default="eval,reward", help="comma-separated: eval, reward")
    parser.add_argument("--workers", type=int, default=2, help="grading processes of the evaluation path")
    parser.add_argument("--timeout-s", type=float, default=2.0, help="the evaluation path's alarm (the test's)")
    parser.add_argument("--item-deadline-s", type=float, default=8.0, help="its wall bound per item (the test's)")
    args = parser.parse_args(argv)
    paths = [p for p in args.paths.split(",") if p]
    if not paths or set(paths) - {"eval", "reward"}:
        parser.error(f"--paths {args.paths!r}: choose from eval, reward (comma-separated)")
    n = 100 if args.smoke else args.n

    started = time.perf_counter()
    items = fuzz_items(n, args.seed)
    build_s = time.perf_counter() - started
    digest = hashlib.sha256(json.dumps(items).encode()).hexdigest()[:16]
    result: dict = {"items": n, "distinct_items": len(set(items)), "items_digest": digest, "seed": args.seed,
                    "smoke": args.smoke,
                    "build_s": round(build_s, 2), "cpu_count": os.cpu_count(), "python": platform.python_version()}
    here = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="grader-fuzz-") as tmp:
        root = Path(tmp)
        before = _listing(root)
        os.chdir(root)  # the grading processes start here, too
        try:
            if "eval" in paths:
                result["eval"] = grade_eval(items, args.workers, args.timeout_s, args.item_deadline_s)
                result["eval"] |= {"timeout_s": args.timeout_s, "item_deadline_s": args.item_deadline_s}
            if "reward" in paths:
                result["reward"] = grade_reward(items)
        finally:
            os.chdir(here)
        written = sorted(_listing(root) - before)
    result["files_written"] = written
    result["wrote_files"] = bool(written)
    if "eval" in result:
        result["target"] = {"eval_items_per_s": TARGET_ITEMS_PER_S,
                            "met": result["eval"]["items_per_s"] >= TARGET_ITEMS_PER_S}
    print(json.dumps(result, indent=2, ensure_ascii=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
