"""The number of seeds a pilot comparison implies, by a rule fixed before the pilot ran (docs/results/does-it-pay.md):
the smallest S with t_{0.975, S−1} · sd / √S ≤ the target half-width, and at least `--min-seeds`, where sd is the
standard deviation of the pilot's per-seed paired differences (arm − reference) of the headline metric, in points;
and whether the scale-matched arm joins, when the arm's mean `weights/adv_scale_ratio` in the pilot exceeds
`--scale-threshold`.

    python perf/pilot_seeds.py ~/runs/does-it-pay-pilot [--arm grail] [--half-width 2.5] [--min-seeds 6]
        [--scale-threshold 1.1] [--json out.json]

Reads the pilot's report.json (grail compare); refuses a pilot whose report lacks the arm or has fewer than two
paired seeds (no sd)."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from grail.analysis.compare.stats import LEVEL, seeds_needed, t_quantile


def pilot_seeds(report: dict, arm: str = "grail", half_width: float = 2.5, min_seeds: int = 6,
                scale_threshold: float = 1.1) -> dict:
    """The rule's inputs and outcome from a `grail compare` report.json (a dict)."""
    primary = report["primary_metric"]
    paired = report["metrics"][primary]["paired"]
    if arm not in paired:
        raise ValueError(f"the pilot's report has no paired difference for arm {arm!r} (arms: "
                         f"{', '.join(paired) or 'none paired'}); give --arm one of them.")
    d = paired[arm]
    if d["sd"] is None or d["n"] < 2:
        raise ValueError(f"arm {arm!r}: {d['n']} paired seed(s) in the pilot, so no sd; finish at least two seeds of "
                         f"both arms (grail compare --resume DIR).")
    sd = 100 * d["sd"]  # fractions → points
    needed = seeds_needed(sd, half_width)
    if needed is None:
        raise ValueError(f"arm {arm!r}: sd {sd:.2f} points needs more than 10,000 seeds for ±{half_width:g}.")
    seeds = max(min_seeds, needed)
    scale = report["weights"]["weights/adv_scale_ratio"][arm]["mean"]
    return {"metric": primary, "arm": arm, "reference": d.get("reference"), "pilot_seeds": d["n"],
            "pilot_differences_points": [100 * v for v in d["values"]], "sd_points": sd,
            "half_width_target": half_width, "seeds_for_target": needed, "min_seeds": min_seeds, "seeds": seeds,
            "expected_half_width_points": t_quantile((1 + LEVEL) / 2, seeds - 1) * sd / math.sqrt(seeds),
            "adv_scale_ratio": scale, "scale_threshold": scale_threshold,
            "add_scale_matched_arm": scale is not None and scale > scale_threshold}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pilot", help="the pilot's grail compare --output_dir")
    parser.add_argument("--arm", default="grail")
    parser.add_argument("--half-width", type=float, default=2.5, help="target 95%% half-width, points")
    parser.add_argument("--min-seeds", type=int, default=6)
    parser.add_argument("--scale-threshold", type=float, default=1.1)
    parser.add_argument("--json")
    args = parser.parse_args()
    path = Path(args.pilot) / "report.json"
    if not path.is_file():
        raise SystemExit(f"{path} does not exist: give the --output_dir of a finished grail compare (or run "
                         f"grail compare --resume {args.pilot} to finish it).")
    out = pilot_seeds(json.loads(path.read_text()), args.arm, args.half_width, args.min_seeds, args.scale_threshold)
    print(f"{out['arm']} − {out['reference']} on {out['metric']} over {out['pilot_seeds']} pilot seeds: differences "
          f"{', '.join(f'{v:+.1f}' for v in out['pilot_differences_points'])} points, sd {out['sd_points']:.2f}")
    print(f"seeds for ±{out['half_width_target']:g}: {out['seeds_for_target']}; with at least {out['min_seeds']}: "
          f"S = {out['seeds']} (expected half-width {out['expected_half_width_points']:.2f} points at this sd)")
    print(f"adv_scale_ratio {out['adv_scale_ratio']:.3f}: the scale-matched arm "
          f"{'joins' if out['add_scale_matched_arm'] else 'does not join'} (threshold {out['scale_threshold']:g})")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
