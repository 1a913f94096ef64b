"""Saliency AUROC (critical vs filler tokens) of every method with a probe on the synthetic task: 64 held-out
problems with filler words at rate 0.6, teacher-forced (grail.analysis.saliency.quality), on the warm-started tiny
model or a real model.

    python perf/experiments/saliency_auroc.py [--warm-start-filler-rate 0.6] [--rows 64] [--pairs within_trace|all]
    python perf/experiments/saliency_auroc.py --model smollm2-135m --task-style words [--rows 64]
    python perf/experiments/saliency_auroc.py --model smollm2-135m --label-set multi_step_filler|natural_contrast
        [--rows 32] [--json out.json] [--plot profile.png]
    python perf/experiments/saliency_auroc.py --model smollm2-135m \
        --label-set counterbalanced_filler|counterbalanced_format [--rows 8] [--words 14]
    python perf/experiments/saliency_auroc.py --model runs/chains-sft --label-set chain_rollouts [--rows 16]
        [--samples 8] [--fixed-group row|all]

--warm-start-filler-rate: the filler rate of the tiny model's warm start's own training traces (default 0, the
embedded default: the model has never seen a filler word; 0.6 warm-starts, or reuses from the cache, a model trained
with filler). --model: a real model's name (`grail models fetch` it first) or a checkpoint directory; its prompts are
rendered as training renders them (grail.options.prompts.resolve_prompt_format: the chat template when the tokenizer has
one, no suffix on the synthetic task). --task-style words: the word-problem style (grail.tasks.word_problems).
--label-set: rows of grail.analysis.saliency.label_sets instead of the task's held-out problems (multi-step stories
with filler at every gap, or critical vs the solution's own format words; seed --seed); their chat messages are
rendered by grail.analysis.saliency.quality (the chat template, or plain text for a model without one).
--label-set counterbalanced_filler|counterbalanced_format: grail.analysis.saliency.counterbalanced, --rows GROUPS of
k*words+1 rows each (one problem in several layouts of one length; --words: the moved block). --label-set
chain_rollouts: the model samples --samples completions (temperature 1, top-p 1, top-k 0, --max-new-tokens) of each of
--rows prompts of the chain task's train split (grail.tasks.chains.ChainSet, seed --seed), labelled by
grail.analysis.saliency.rollout_labels (skips counted and printed); each reference trace carries its group advantage
(reward minus the prompt's mean, exact answer on the last box), group = the prompt (--fixed-group all: one group).
Each row of the table: the pooled AUROC, the position-matched one (grail.analysis.saliency.position) and the
fixed-position one (grail.analysis.saliency.fixed_position, with the shares of labelled critical / contrast tokens
that entered it). --read-at-token grail: GRAIL's saliency also read at each token's own position (OAR's), as the row
grail@token (its signal only); by default it is read at the position that predicts the token.
--bf16: every probe under CPU bf16 autocast over the fp32 weights, as a bf16 training run on a CPU computes it, and
the methods of grail.models.precision.FP32_PROBES without it, as such a run keeps them (the rollouts are sampled in
fp32 either way); the JSON records the precision.
--json: the full results (as_json: matched AUROC and position profile included); --plot: the profile figure.
"""

import argparse
import contextlib
import json
from collections import Counter
from dataclasses import replace

import torch
from transformers import AutoTokenizer

from grail.analysis.saliency.counterbalanced import COUNTERBALANCED_SETS
from grail.analysis.saliency.label_sets import LABEL_SETS, label_set_rows
from grail.analysis.saliency.quality import SaliencyQualityOptions, as_json, model_dir_saliency_auroc, saliency_auroc
from grail.analysis.saliency.token_labels import synthetic_rows
from grail.methods.table import method_names
from grail.models.precision import FP32_PROBES
from grail.models.warmstart import load_inference_model, resolve_model
from grail.options.choices import WarmStartConfig
from grail.options.fields import TINY_MODEL
from grail.options.prompts import resolve_prompt_format
from grail.tasks.arithmetic import TaskConfig
from grail.tasks.word_problems import WORDS_TASK


def _cell(result) -> str:
    text = f"{result.auroc:.3f} [{result.ci_low:.3f}, {result.ci_high:.3f}]"
    if result.labelled_critical and result.labelled_filler:
        text += f" ({result.n_critical}/{result.labelled_critical}, {result.n_filler}/{result.labelled_filler})"
    return text


def chain_rollout_rows(model, tokenizer, prompts: int, samples: int, seed: int, max_new_tokens: int):
    """(rows, skipped): `samples` completions of each of the first `prompts` train-split chain problems, labelled by
    grail.analysis.saliency.rollout_labels, each row with its group advantage (GRPO's, unscaled).

    A model without a chat template (a base model, Gemma 3) samples after training's plain prompt, which ends in
    "Answer:" (its completions start with a space, as in training); the teacher-forced scoring renders the prompt with
    that space at its end (`quality.render_messages`), so each row's solution is the completion without it."""
    from grail.analysis.explain.compute import sample_completions
    from grail.analysis.saliency.quality import render_messages, sampling_prompt
    from grail.analysis.saliency.rollout_labels import rollout_row
    from grail.evaluation.rewards import exact_int_reward
    from grail.options.sampling import SamplingParams
    from grail.tasks.chains import ChainSet

    params = SamplingParams(n=samples, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=max_new_tokens)
    rows, skipped = [], Counter()
    for i, problem in enumerate(ChainSet(num_train=max(prompts, 1), seed=seed).rows("train")[:prompts]):
        scored = render_messages(tokenizer, problem["prompt"])
        sampled = sampling_prompt(tokenizer, problem["prompt"])
        ids = sample_completions(model, tokenizer, sampled, params, seed + i)
        texts = [tokenizer.decode(x, skip_special_tokens=True) for x in ids]
        texts = [t.removeprefix(scored.removeprefix(sampled)) for t in texts]  # the space the scored prompt holds
        rewards = exact_int_reward(texts, [problem["answer"]] * len(texts))
        mean = sum(rewards) / len(rewards)
        for text, reward in zip(texts, rewards, strict=True):
            out = rollout_row(problem["prompt"], text, group=i, answer=problem["answer"])
            if isinstance(out, str):
                skipped[out] += 1
            else:
                rows.append({**out, "advantage": reward - mean})
    return rows, skipped


def in_precision(score, methods: list[str], bf16: bool, options: SaliencyQualityOptions) -> dict:
    """`score(methods, options)` ({name: result}, where a name may add '@token' to a method) in fp32, or with --bf16
    as a bf16 CPU run computes each method's probe: under bf16 autocast, the FP32_PROBES methods without it, each
    group scored with the `read_at_token` methods it holds (`quality.saliency_auroc` refuses one it does not). The
    results keep `methods`' order."""
    if not bf16:
        return score(methods, options)
    results = {}
    for cast in (True, False):
        names = [m for m in methods if (m not in FP32_PROBES) == cast]
        if names:
            own = replace(options, read_at_token=tuple(m for m in options.read_at_token if m in names))
            with torch.autocast("cpu", dtype=torch.bfloat16) if cast else contextlib.nullcontext():
                results.update(score(names, own))
    return dict(sorted(results.items(), key=lambda item: methods.index(item[0].split("@")[0])))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=TINY_MODEL)
    parser.add_argument("--task-style", default="symbolic", choices=("symbolic", "words"))
    parser.add_argument("--warm-start-filler-rate", type=float, default=0.0)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--pairs", default="within_trace", choices=("within_trace", "all"))
    parser.add_argument("--methods", default=",".join(method_names(probed=True)))
    parser.add_argument("--label-set", choices=("task", *LABEL_SETS, *COUNTERBALANCED_SETS, "chain_rollouts"),
                        default="task")
    parser.add_argument("--words", type=int, default=14, help="counterbalanced sets: the moved block's words")
    parser.add_argument("--samples", type=int, default=8, help="chain_rollouts: completions per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="chain_rollouts: sampling limit")
    parser.add_argument("--read-at-token", default="", help="comma-separated methods whose signal is GRAIL's saliency "
                        "(grail) to report also read at the token's own position, as '<method>@token'")
    parser.add_argument("--fixed-group", default="row", choices=("row", "all"),
                        help="the fixed AUROC's group: the rows' own (a counterbalanced group, a prompt) or one")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bf16", action="store_true", help="probes under CPU bf16 autocast, as a bf16 run has them")
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
    elif args.label_set in COUNTERBALANCED_SETS:
        rows = COUNTERBALANCED_SETS[args.label_set](args.rows, args.seed, words=args.words)
        what = f"{args.rows} groups ({len(rows)} rows) of label set {args.label_set} (seed {args.seed})"
    elif args.label_set == "chain_rollouts":
        model = load_inference_model(path, "cpu")
        rows, skipped = chain_rollout_rows(model, tokenizer, args.rows, args.samples, args.seed, args.max_new_tokens)
        what = (f"{args.rows} prompts x {args.samples} samples ({len(rows)} labelled; skipped {dict(skipped)}) of "
                f"label set chain_rollouts (seed {args.seed})")
        if not rows:
            raise SystemExit(f"no completion could be labelled ({what}); is the model warm-started on the chain task?")
    else:
        rows = label_set_rows(args.label_set, args.rows, args.seed)
        what = f"{args.rows} rows of label set {args.label_set} (seed {args.seed})"
    methods = [m.strip() for m in args.methods.split(",")]
    at_token = tuple(m.strip() for m in args.read_at_token.split(",") if m.strip())
    options = SaliencyQualityOptions(pairs=args.pairs, fixed_group=args.fixed_group, read_at_token=at_token,
                                     traces="reference" if args.label_set == "chain_rollouts" else "both")
    if args.label_set == "chain_rollouts":  # the model is loaded already; its own completions, their own advantages
        results = in_precision(lambda names, own: saliency_auroc(model, tokenizer, rows, names, own), methods,
                               args.bf16, options)
    else:
        results = in_precision(lambda names, own: model_dir_saliency_auroc(path, rows, names, options=own,
                                                                           device="cpu"), methods, args.bf16, options)
    precision = "bf16" if args.bf16 else "fp32"
    print(f"model {path}; {what}, pairs={args.pairs}, probes in {precision}; AUROC [95% CI], pooled / "
          f"position-matched / fixed (tokens "
          f"entered / labelled: critical, contrast)")
    print("| method | signal | signal, matched | signal, fixed | weights | weights, matched | weights, fixed |\n"
          "|---|---|---|---|---|---|---|")
    for method, parts in results.items():
        cells = [f"{_cell(r)} | {_cell(r.matched)} | {_cell(r.fixed)}" for r in parts.values()]
        print(f"| {method} | " + " | ".join(cells + ["- | - | -"] * (2 - len(cells))) + " |")  # @token: signal only
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": str(path), "rows": what, "precision": precision, "results": as_json(results)}, f,
                      indent=1)
    if args.plot:
        from grail.analysis.saliency.plots import plot_position_profiles

        contrast = "filler" if args.label_set in ("task", "multi_step_filler", "counterbalanced_filler") else "format"
        print(f"profile: {plot_position_profiles(results, args.model, args.plot, contrast=contrast)}")


if __name__ == "__main__":
    main()
