"""Saliency AUROC (critical vs filler tokens) of every method with a probe on the synthetic task: 64 held-out
problems with filler words at rate 0.6, teacher-forced (grail.analysis.saliency.quality), on the warm-started tiny
model or a real model.

    python perf/experiments/saliency_auroc.py [--warm-start-filler-rate 0.6] [--rows 64] [--pairs within_trace|all]
    python perf/experiments/saliency_auroc.py --model smollm2-135m --task-style words [--rows 64]
    python perf/experiments/saliency_auroc.py --model smollm2-135m --label-set multi_step_filler|natural_contrast
        [--rows 32] [--json out.json] [--plot profile.png]

--warm-start-filler-rate: the filler rate of the tiny model's warm start's own training traces (default 0, the
embedded default: the model has never seen a filler word; 0.6 warm-starts, or reuses from the cache, a model trained
with filler). --model: a real model's name (`grail models fetch` it first) or a checkpoint directory; its prompts are
rendered as training renders them (grail.options.prompts.resolve_prompt_format: the chat template when the tokenizer has
one, no suffix on the synthetic task). --task-style words: the word-problem style (grail.tasks.word_problems).
--label-set: rows of grail.analysis.saliency.label_sets instead of the task's held-out problems (multi-step stories
with filler at every gap, or critical vs the solution's own format words; seed --seed); their chat messages are
rendered by grail.analysis.saliency.quality (the chat template, or plain text for a model without one).
Each row of the table: the pooled AUROC and the position-matched one (grail.analysis.saliency.position).
--json: the full results (as_json: matched AUROC and position profile included); --plot: the profile figure.
"""

import argparse
import json
from dataclasses import replace

from transformers import AutoTokenizer

from grail.analysis.saliency.label_sets import LABEL_SETS, label_set_rows
from grail.analysis.saliency.quality import SaliencyQualityOptions, as_json, model_dir_saliency_auroc
from grail.analysis.saliency.token_labels import synthetic_rows
from grail.methods.table import method_names
from grail.models.warmstart import resolve_model
from grail.options.choices import WarmStartConfig
from grail.options.fields import TINY_MODEL
from grail.options.prompts import resolve_prompt_format
from grail.tasks.arithmetic import TaskConfig
from grail.tasks.word_problems import WORDS_TASK


def _cell(result) -> str:
    return f"{result.auroc:.3f} [{result.ci_low:.3f}, {result.ci_high:.3f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=TINY_MODEL)
    parser.add_argument("--task-style", default="symbolic", choices=("symbolic", "words"))
    parser.add_argument("--warm-start-filler-rate", type=float, default=0.0)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--pairs", default="within_trace", choices=("within_trace", "all"))
    parser.add_argument("--methods", default=",".join(method_names(probed=True)))
    parser.add_argument("--label-set", choices=("task", *LABEL_SETS), default="task")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json")
    parser.add_argument("--plot")
    args = parser.parse_args()
    words = args.task_style == "words"
    task = WORDS_TASK if words else TaskConfig()  # each style's default difficulty (word_problems.WORDS_TASK)
    if args.model == TINY_MODEL:
        path = resolve_model(TINY_MODEL, WarmStartConfig(task=replace(task, filler_rate=args.warm_start_filler_rate)))
    else:
        path = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    fmt = resolve_prompt_format(tokenizer, synthetic=True, messages=words)  # word prompts are chat messages
    if args.label_set == "task":
        rows = [{**r, "prompt": fmt.render(tokenizer, r["prompt"])}
                for r in synthetic_rows(replace(task, filler_rate=0.6), n=args.rows, split="heldout", seed=args.seed)]
        what = f"{args.rows} held-out problems ({args.task_style}), filler rate 0.6, prompt {fmt.describe()}"
    else:
        rows = label_set_rows(args.label_set, args.rows, args.seed)
        what = f"{args.rows} rows of label set {args.label_set} (seed {args.seed})"
    methods = [m.strip() for m in args.methods.split(",")]
    results = model_dir_saliency_auroc(path, rows, methods, options=SaliencyQualityOptions(pairs=args.pairs),
                                       device="cpu")
    print(f"model {path}; {what}, pairs={args.pairs}; AUROC [95% CI], pooled / position-matched")
    print("| method | signal | signal, matched | weights | weights, matched |\n|---|---|---|---|---|")
    for method, parts in results.items():
        print(f"| {method} | " + " | ".join(f"{_cell(r)} | {_cell(r.matched)}" for r in parts.values()) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": str(path), "rows": what, "results": as_json(results)}, f, indent=1)
    if args.plot:
        from grail.analysis.saliency.plots import plot_position_profiles

        contrast = "format" if args.label_set == "natural_contrast" else "filler"
        print(f"profile: {plot_position_profiles(results, args.model, args.plot, contrast=contrast)}")


if __name__ == "__main__":
    main()
