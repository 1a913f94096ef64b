"""Can a signal of position alone move an AUROC that claims to hold position fixed? On the label sets, as a model's
tokenizer cuts them, every signal of `grail.analysis.saliency.fixed_position.position_only_signals` (increasing,
decreasing, towards the box, U over t/R, periodic, random per position, the share of critical tokens at each
position) is scored by the distance-matched AUROC (`position.matched_auroc_result`, the estimator of
docs/results/credit-lands.md's table) and by the position-fixed one (`fixed_position.fixed_position_auroc_result`),
with the share of labelled tokens each lets in (on the older sets, whose rows are not grouped, the position-fixed
strata pair rows of one reasoning length across the whole set). No model weights: the tokenizer only (the tiny one
built in code, or a model directory's).

    python perf/experiments/position_signals.py --tokenizer ~/.cache/grail-rl/models/smollm2-135m --rows 32

Prints one JSON object: per label set, per signal, each estimator's AUROC [95% CI], and the shares that entered.
"""

from __future__ import annotations

import argparse
import json

import torch

from grail.analysis.saliency.counterbalanced import COUNTERBALANCED_SETS, reasoning_tokens
from grail.analysis.saliency.fixed_position import fixed_position_auroc_result, position_only_signals
from grail.analysis.saliency.label_sets import LABEL_SETS
from grail.analysis.saliency.position import matched_auroc_result
from grail.analysis.saliency.token_labels import CRITICAL, FILLER

SETS = {**LABEL_SETS, **COUNTERBALANCED_SETS}


def _tokenizer(name: str):
    if name == "tiny":
        from grail.models.tiny import build_tokenizer

        return build_tokenizer()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name)


def _cell(result) -> dict:
    return {"auroc": round(result.auroc, 4), "ci": [round(result.ci_low, 4), round(result.ci_high, 4)],
            "critical_entered": f"{result.n_critical}/{result.labelled_critical}" if result.labelled_critical
            else result.n_critical, "contrast_entered": f"{result.n_filler}/{result.labelled_filler}"
            if result.labelled_filler else result.n_filler}


def measure(tokenizer, label_set: str, rows: int, seed: int, bootstrap: int) -> dict:
    """One label set: every position-only signal through both estimators."""
    x = reasoning_tokens(tokenizer, SETS[label_set](rows, seed))
    if label_set not in COUNTERBALANCED_SETS:  # one group: pairs across rows of one reasoning length, at one position
        x["group"] = torch.zeros_like(x["group"])
    length = torch.bincount(x["trace"])[x["trace"]]
    labelled_c, labelled_f = int((x["label"] == CRITICAL).sum()), int((x["label"] == FILLER).sum())
    out = {}
    for name, signal in position_only_signals(x["position"], length, x["label"], seed).items():
        matched = matched_auroc_result(signal, x["label"], x["trace"], length - x["position"], num_bootstrap=bootstrap,
                                       seed=seed)
        fixed = fixed_position_auroc_result(signal, x["label"], x["group"], x["trace"], x["position"],
                                            num_bootstrap=bootstrap, seed=seed)
        cell = _cell(matched)
        cell["critical_entered"] = f"{matched.n_critical}/{labelled_c}"
        cell["contrast_entered"] = f"{matched.n_filler}/{labelled_f}"
        out[name] = {"distance_matched": cell, "position_fixed": _cell(fixed)}
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokenizer", default="tiny", help="`tiny` (built in code) or a model directory with a tokenizer")
    p.add_argument("--label-sets", default=",".join(SETS), help=f"comma-separated, of {', '.join(SETS)}")
    p.add_argument("--rows", type=int, default=32, help="rows (for the counterbalanced sets: groups) per set")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples for the 95%% CI")
    p.add_argument("--json", help="also write the result here")
    args = p.parse_args(argv)
    names = [n for n in args.label_sets.split(",") if n]
    unknown = [n for n in names if n not in SETS]
    if unknown:
        p.error(f"unknown label sets {unknown}; choose from {', '.join(SETS)}")
    tokenizer = _tokenizer(args.tokenizer)
    result = {"tokenizer": args.tokenizer, "rows": args.rows, "seed": args.seed,
              "sets": {n: measure(tokenizer, n, args.rows, args.seed, args.bootstrap) for n in names}}
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as handle:
            handle.write(text + "\n")
    return result


if __name__ == "__main__":
    main()
