"""Does the GRAIL release's position claim hold on a real model? The release reports a U-shaped profile of GRAIL's
mean weight over the normalised position within the reasoning (10 bins of the text before `\\boxed{`), split by
correct and wrong rollouts. This script computes that profile with grail's own pipeline (`grail explain`'s outcome
profiles: the weights exactly as training computes them, `rollout_symmetry=both` so that correct rows are weighted
too), for two kinds of rollout:

  teacher-forced: rows of the multi-step label set (grail.analysis.saliency.label_sets), each with its reference
      solution (correct) and the same solution with a wrong boxed answer (wrong), graded by the run's reward;
  sampled: completions sampled from the model on the preset's own training prompts, `--samples` per prompt, graded,
      with GRPO's group advantages.

    python perf/experiments/position_claim.py --model smollm2-135m --preset smollm-words [--rows 16] [--samples 8]
        [--methods grail,position] [--json out.json] [--plot out.png]

"U-shape" is read as: both end bins (first and last tenth) above the mean of the four middle bins (3-6); the script
prints each profile, its token counts, that verdict and its depth (the lower end bin minus the middle: how deep the U
is, in units of the mean weight 1), per method, outcome and kind of rollout. A verdict with a depth of a few hundredths
is a tilt, not the release's U.
"""

import argparse
import json

from grail.analysis.explain.compute import ExplainRow, explain
from grail.analysis.saliency.label_sets import multi_step_filler_rows
from grail.analysis.saliency.token_labels import char_labels, corrupted_solution
from grail.models.warmstart import load_inference_model
from grail.options.prompts import PromptFormat
from grail.options.sampling import SamplingParams
from grail.training.data import load_prompts
from grail.training.overrides import build_config, merge
from grail.training.run import quiet_libraries, resolve_model_path, reward_function


def u_shape(profile: list[float], counts: list[int]) -> dict:
    """The verdict on one profile: ends vs the middle (bins 3-6); None where a bin is empty."""
    if min(counts) == 0:
        return {"u_shape": None, "why": "an empty bin"}
    middle = sum(profile[3:7]) / 4
    return {"u_shape": profile[0] > middle and profile[-1] > middle, "first": profile[0], "middle": middle,
            "last": profile[-1], "depth": min(profile[0], profile[-1]) - middle}


def teacher_forced_rows(fmt: PromptFormat, tokenizer, n: int, seed: int) -> list[ExplainRow]:
    rows = []
    for i, row in enumerate(multi_step_filler_rows(n, seed)):
        labels = char_labels(len(row["solution"]), row["critical_spans"], row["filler_spans"])
        wrong, _ = corrupted_solution(row["solution"], labels, seed=f"{seed}-{i}")
        rows.append(ExplainRow(fmt.render(tokenizer, row["prompt"]), str(row["answer"]), (row["solution"], wrong),
                               f"label set row {i}"))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--preset", required=True, help="the model's word-problem preset (smollm-words, gemma-words)")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--methods", default="grail,position")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json")
    parser.add_argument("--plot")
    args = parser.parse_args()
    quiet_libraries()
    from transformers import AutoTokenizer

    cfg = build_config(merge(None, {"preset": args.preset, "model_name_or_path": args.model,
                                    "output_dir": "/tmp/position-claim", "rollout_symmetry": "both",
                                    "token_weighting": "grail"}))
    path = resolve_model_path(cfg)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = load_inference_model(path)
    fmt = PromptFormat.from_config(cfg, tokenizer, messages=True)
    raw = load_prompts(cfg).select(range(args.rows))
    sampled_rows = [ExplainRow(fmt.render(tokenizer, r["prompt"]), r["answer"], None, f"prompt {i}")
                    for i, r in enumerate(raw)]
    sampling = SamplingParams(n=args.samples, temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k or 0,
                              max_new_tokens=cfg.max_completion_length)
    methods = [m.strip() for m in args.methods.split(",")]
    reward = reward_function(cfg)
    out = {"model": args.model, "preset": args.preset, "prompt": fmt.describe(), "rows": args.rows, "kinds": {}}
    for kind, rows in (("teacher_forced", teacher_forced_rows(fmt, tokenizer, args.rows, args.seed)),
                       ("sampled", sampled_rows)):
        ex = explain(model, tokenizer, rows, methods, cfg.weighting_options(), sampling=sampling, seed=args.seed,
                     reward_fn=reward, scale_rewards=cfg.scale_rewards)
        rewards = [c.reward for c in ex.completions() if c.reward is not None]
        out["kinds"][kind] = {
            "completions": len(ex.completions()), "mean_reward": sum(rewards) / max(len(rewards), 1),
            "methods": {m: {o: {"mean_weight": list(ex.outcome_profiles[m][o]), "tokens": list(ex.outcome_counts[m][o]),
                                **u_shape(list(ex.outcome_profiles[m][o]), list(ex.outcome_counts[m][o]))}
                            for o in ex.outcome_profiles[m]} for m in methods}}
        for m in methods:
            for o, p in out["kinds"][kind]["methods"][m].items():
                depth = f"{p['depth']:+.2f}" if p["u_shape"] is not None else "n/a"
                print(f"{kind:15} {m:9} {o:8} u_shape={p['u_shape']} depth {depth} mean weight by tenth: "
                      + " ".join(f"{w:.2f}" for w in p["mean_weight"]) + f"  tokens {sum(p['tokens'])}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    if args.plot:
        _plot(out, args.plot)


def _plot(out: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = list(out["kinds"])
    methods = list(out["kinds"][kinds[0]]["methods"])
    fig, axes = plt.subplots(len(methods), len(kinds), figsize=(4.2 * len(kinds), 2.8 * len(methods)), squeeze=False)
    centres = [(b + 0.5) / 10 for b in range(10)]
    for i, m in enumerate(methods):
        for j, kind in enumerate(kinds):
            ax = axes[i][j]
            for o, colour in (("correct", "tab:blue"), ("wrong", "tab:red")):
                p = out["kinds"][kind]["methods"][m].get(o)
                if p and sum(p["tokens"]):
                    ax.plot(centres, p["mean_weight"], marker="o", color=colour, label=f"{o} ({sum(p['tokens'])} tok)")
            ax.axhline(1.0, color="grey", linestyle="--", linewidth=0.8)
            ax.set_title(f"{out['model']}: {m}, {kind.replace('_', '-')}", fontsize=9)
            ax.set_xlabel("position within the reasoning (0 = start, 1 = the box)", fontsize=8)
            ax.set_ylabel("mean weight", fontsize=8)
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
