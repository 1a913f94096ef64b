"""False accepts of the grader with and without grail's guards: `grail grader-check --neighbour` on every benchmark
twice, once with `grail.evaluation.grader.accepted` replaced by "accept every pair math-verify accepts" (math-verify
alone).

    python perf/experiments/neighbour_guards.py --data-dir DIR  # DIR/<name>/test.jsonl, docs/guides/evaluation.md

Grades in this process (one worker: the replacement must be seen where the grading runs); about 25 minutes per pass
on 2 cores. Prints, per benchmark, the neighbour pairs accepted, and each accepted pair.
"""

import argparse

import grail.evaluation.grader as grader
from grail.evaluation.grader_check import grader_check


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", required=True)
    args = parser.parse_args()
    guarded = grader.accepted
    for label, accept in (("without the guards", lambda gold, pred, same_text, seconds: True), ("with the guards",
                                                                                                 guarded)):
        grader.accepted = accept
        try:
            result = grader_check(args.data_dir, workers=1, neighbour=True)
        finally:
            grader.accepted = guarded
        print(f"## {label}")
        for name, entry in result["benchmarks"].items():
            pairs = entry["neighbour"]
            print(f"{name}: {pairs['n'] - pairs['agree']} of {pairs['n']} neighbour pairs accepted")
            for d in pairs["disagreements"]:
                print(f"    reference {d['reference'][:70]!r} accepted {d['extracted'][:70]!r}")


if __name__ == "__main__":
    main()
