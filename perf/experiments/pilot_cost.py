"""What a comparison's arms would cost a step, from a `step_overhead.py --reward coin --rows G` pilot's round lines.

The pilot times one micro-batch (one prompt's group of G rows) per method and round; with coin rewards every group
is mixed, so each method does its full work. A run's step is `--micro-batches` such micro-batches with only a share
`--mixed` of its groups mixed (the validity table's share), and a measured GRPO step of `--run-step` seconds. The
weights' seconds a method adds to a step are then estimated two ways:

  per probe pass  (GRAIL-like: one backward for the whole micro-batch, whatever the number of probed rows)
                  median weights seconds of the rounds that probed any row × micro-batches × mixed
  per probed row  (OAR-G, OAR-P: one probe per row)
                  median weights seconds per probed row × rows a step × mixed

and as `absolute` (those seconds added to the run's step) and `scaled` (multiplied first by the run's seconds per
micro-batch over the pilot's GRPO micro-batch: if the pilot ran everything slower than a run, its probes too).

    grep '^round' pilot.log > rounds.txt
    python perf/experiments/pilot_cost.py rounds.txt --run-step 108.8 --mixed 0.625 --micro-batches 8 --rows 8
"""

import argparse
import json
import re
import statistics

ROUND = re.compile(r"round \d+/\d+ (\S+): ([\d.]+) s, rollout [\d.]+ s, weights ([\d.]+) s, probed rows ([\d.]+)")
PER_ROW = ("oar_g", "oar_p")  # methods whose probe runs once per row


def estimate(lines: list[str], run_step: float, mixed: float, micro_batches: int, rows: int) -> dict:
    rounds: dict[str, list[tuple[float, float, float]]] = {}
    for line in lines:
        if m := ROUND.match(line.strip()):
            rounds.setdefault(m[1], []).append((float(m[2]), float(m[3]), float(m[4])))
    if "none" not in rounds:
        raise SystemExit("no `round ... none:` line: the pilot must time GRPO (none) beside the methods")
    grpo = statistics.median(step for step, _, _ in rounds["none"])
    scale = run_step / micro_batches / grpo
    out = {"grpo_micro_batch_s": grpo, "scale": scale, "methods": {}}
    for method, r in rounds.items():
        probing = [(weights, probed) for _, weights, probed in r if probed > 0]
        if method == "none" or not probing:
            added = 0.0
        elif method.split("@")[0] in PER_ROW:
            added = statistics.median(w / (p * rows) for w, p in probing) * rows * micro_batches * mixed
        else:
            added = statistics.median(w for w, _ in probing) * micro_batches * mixed
        out["methods"][method] = {"rounds": len(r), "rounds_probing": len(probing),
                                  "micro_batch_s": statistics.median(step for step, _, _ in r),
                                  "absolute_ratio": (run_step + added) / run_step,
                                  "scaled_ratio": (run_step + added * scale) / run_step}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rounds", help="a file of the pilot's `round ...` lines")
    parser.add_argument("--run-step", type=float, required=True, help="a run's measured GRPO step (s)")
    parser.add_argument("--mixed", type=float, required=True, help="share of a run's groups with mixed rewards")
    parser.add_argument("--micro-batches", type=int, default=8, help="micro-batches a step (default 8)")
    parser.add_argument("--rows", type=int, default=8, help="rows a micro-batch, the pilot's --rows (default 8)")
    args = parser.parse_args()
    with open(args.rounds) as handle:
        result = estimate(handle.readlines(), args.run_step, args.mixed, args.micro_batches, args.rows)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
