"""Saliency AUROC (critical vs filler tokens) of the five methods on the synthetic task: 64 held-out problems with
filler words at rate 0.6, teacher-forced, on the warm-started tiny model (grail.saliency_quality).

    python perf/saliency_auroc.py [--warm-start-filler-rate 0.6] [--rows 64] [--pairs within_trace|all]

--warm-start-filler-rate: the filler rate of the warm start's own training traces (default 0, the embedded default:
the model has never seen a filler word; 0.6 warm-starts, or reuses from the cache, a model trained with filler).
"""

import argparse

from grail.options import WarmStartConfig
from grail.saliency_quality import SaliencyQualityOptions, model_dir_saliency_auroc
from grail.tasks import TaskConfig
from grail.token_labels import synthetic_rows
from grail.warmstart import resolve_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--warm-start-filler-rate", type=float, default=0.0)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--pairs", default="within_trace", choices=("within_trace", "all"))
    args = parser.parse_args()
    path = resolve_model("tiny", WarmStartConfig(task=TaskConfig(filler_rate=args.warm_start_filler_rate)))
    rows = synthetic_rows(TaskConfig(filler_rate=0.6), n=args.rows, split="heldout", seed=0)
    results = model_dir_saliency_auroc(path, rows, options=SaliencyQualityOptions(pairs=args.pairs), device="cpu")
    print(f"model {path}; {args.rows} held-out problems, filler rate 0.6, pairs={args.pairs}; AUROC [95% CI]")
    print("| method | signal | weights |\n|---|---|---|")
    for method, parts in results.items():
        print(f"| {method} | " + " | ".join(f"{r.auroc:.3f} [{r.ci_low:.3f}, {r.ci_high:.3f}]" for r in parts.values())
              + " |")


if __name__ == "__main__":
    main()
