r"""Grader fuzz throughput: adversarial and generated answers, built deterministically (seeded), graded through the
evaluation path and the training reward's grading call, in an empty temporary directory.

Items (`fuzz_items(n, seed)`, from random.Random(seed), the same on every machine; `items_digest` identifies the set):
a completion of one to four fragments (`NASTY` strings: power towers, huge factorials, deep nesting, control and
look-alike characters, TeX that would run commands; random text of up to 30 characters; integers up to 10⁶), boxed
in a sentence, bare, or over two boxes, against one of eight `REFERENCES`. tests/test_grader_fuzz.py draws its
hypothesis examples from the same fragments and references.
Paths:
- `eval`: `GradingPool(--workers).grade_many(..., timeout_s=2, item_deadline_s=8)`, the test's call, timed as a
  whole (items/s over the mix; an item that hits its deadline is `timeout` or `worker_died`).
- `reward`: `grader.grade_many([item], workers=1, timeout_s=TIMEOUT_S)`, the call `math_verify_reward` makes (main
  thread, in this process, the grader's alarms), one item per call, each timed; the reward is its `correct`.
Both run in a fresh temporary directory, listed (recursively) before and after: `files_written` names what appeared.

Run: `python perf/benchmarks/grader_fuzz.py [--n 10000] [--seed 0] [--paths eval,reward]`; `--smoke` grades 100
items (under 30 s). Prints one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

TARGET_ITEMS_PER_S = 50  # the target of the evaluation path on this mix, 2 grading processes
NASTY = [
    "9^{9^{9^{9}}}", "1000000!", "10^{10^{10^{10}}}", "(10^{100})!", "\\frac{1}{0}", "0^0", "\\infty-\\infty",
    "{" * 200 + "1" + "}" * 200, "{" * 50, "}" * 50, "\\boxed{", "\\boxed{1", "\\boxed{}", "\\boxed{\\boxed{2}}",
    "\x08oxed{3}", "\x00", "\x1b[2J", "\u202e1", "１２３", "х", "ⅹ", "∞", "𝟙", "1\u200b0",
    "\\def\\a{\\a\\a}\\a", "\\newcommand{\\x}{\\x}\\x", "\\input{/etc/passwd}", "\\include{x}",
    "\\write18{touch pwned}",
    "__import__('os').system('touch pwned')", "eval('1+1')", "lambda: 0", "$$1$$", "\\begin{pmatrix}1&2\\end{pmatrix}",
    "x=y=z=1", "1,000,000", "1,5", "\\sqrt[3]{-8}", "e^{i\\pi}", "\\sum_{n=1}^{\\infty} n", "\\int_0^1 x\\,dx",
    "a" * 5000, "\\left(", "\\right)", "^^^^", "\\\\\\\\", "%comment", "#", "&", "~",
]
REFERENCES = ["3", "\\frac{1}{2}", "x=2", "1 - \\frac{1}{e}", "(1, 2)", "\\sqrt{2}", "12", "-7"]
# random text: printable ASCII (TeX's specials among it) and, one character in four, any code point of the first
# two planes that is not a surrogate
PRINTABLE = "".join(chr(c) for c in range(32, 127))


def _text(rng: random.Random) -> str:
    chars = []
    for _ in range(rng.randint(0, 30)):
        if rng.random() < 0.75:
            chars.append(rng.choice(PRINTABLE))
        else:
            code = rng.randrange(0x1_0000 * 2 - 0x800)
            chars.append(chr(code + 0x800 if code >= 0xD800 else code))  # skip the surrogates D800..DFFF
    return "".join(chars)


def _answer(rng: random.Random) -> str:
    kinds = (lambda: rng.choice(NASTY), lambda: _text(rng), lambda: str(rng.randint(-10**6, 10**6)))
    return "".join(rng.choice(kinds)() for _ in range(rng.randint(1, 4)))


def fuzz_items(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """n (completion, reference) pairs from random.Random(seed) (module docstring)."""
    rng = random.Random(seed)
    items = []
    for _ in range(n):
        form = rng.randrange(3)
        if form == 0:
            completion = f"so the answer is \\boxed{{{_answer(rng)}}}."
        elif form == 1:
            completion = _answer(rng)
        else:
            completion = f"\\boxed{{{_answer(rng)}}} then \\boxed{{{_answer(rng)}}}"
        items.append((completion, rng.choice(REFERENCES)))
    return items


def _listing(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")}


def grade_eval(items: list[tuple[str, str]], workers: int, timeout_s: float, item_deadline_s: float) -> dict:
    """The evaluation path, timed as a whole (module docstring)."""
    from grail.evaluation.grader import GradingPool

    started = time.perf_counter()
    with GradingPool(workers) as pool:
        results = pool.grade_many([c for c, _ in items], [r for _, r in items], timeout_s=timeout_s,
                                  item_deadline_s=item_deadline_s)
    total = time.perf_counter() - started
    return {"seconds": round(total, 3), "items_per_s": round(len(items) / total, 2),
            "reasons": dict(Counter(r.reason for r in results).most_common()),
            "correct": sum(r.correct for r in results), "workers": workers}


def grade_reward(items: list[tuple[str, str]]) -> dict:
    """The training reward's grading call, one item per call on this main thread, each timed."""
    from grail.evaluation import grader
    from grail.evaluation.rewards import TIMEOUT_S

    results, seconds = [], []
    started = time.perf_counter()
    for completion, reference in items:
        begun = time.perf_counter()
        results += grader.grade_many([completion], [reference], workers=1, timeout_s=TIMEOUT_S)
        seconds.append(time.perf_counter() - begun)
    total = time.perf_counter() - started
    k = max(range(len(seconds)), key=seconds.__getitem__)
    return {"seconds": round(total, 3), "items_per_s": round(len(items) / total, 2),
            "reasons": dict(Counter(r.reason for r in results).most_common()),
            "correct": sum(r.correct for r in results), "timeout_s": TIMEOUT_S,
            "slowest": {"seconds": round(seconds[k], 3), "completion": items[k][0][:200], "reference": items[k][1],
                        "reason": results[k].reason}}


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
