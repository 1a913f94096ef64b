"""`grail demo`: the main job on the embedded default, end to end on a CPU in a few minutes.

Builds (or reuses) the warm-started tiny model, measures held-out accuracy, trains one short run per method
(`--method`, default `none,grail`: GRPO and GRAIL) from the same start with the same seeds and the `tiny-cpu`
preset, measures each on the same held-out problems, and prints a table with each method's difference from
the first one and its paired bootstrap confidence interval over the held-out problems.
"""

from __future__ import annotations

import time
import typing
from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer

from grail.config import SYNTHETIC_DATASET, GRAILConfig
from grail.data import synthetic_rows
from grail.evaluate import EvalResult, evaluate, paired_bootstrap_ci
from grail.overrides import build_config
from grail.rewards import exact_int_reward
from grail.train import Log, resolve_model_path, train
from grail.weighting import Method

SAMPLES_PER_PROBLEM = 4  # sampled accuracy: acc@4 at the training temperature
DEFAULT_METHODS = ("none", "grail")
LABELS = {"none": "GRPO", "grail": "GRAIL", "oar_g": "OAR-G", "oar_p": "OAR-P", "random": "random",
          "entropy": "entropy"}


def parse_methods(text: str) -> tuple[str, ...]:
    """`grail,oar_g` → ("grail", "oar_g"); every name must be a `token_weighting` choice."""
    methods = tuple(m.strip() for m in text.split(",") if m.strip())
    allowed = typing.get_args(Method)
    bad = [m for m in methods if m not in allowed]
    if bad or not methods:
        raise ValueError(f"--method {text!r}: give one or more of {', '.join(allowed)}, comma-separated "
                         f"(e.g. --method none,grail).")
    if len(set(methods)) != len(methods):
        raise ValueError(f"--method {text!r} names a method twice.")
    return methods


def heldout_accuracy(model_path: str, cfg: GRAILConfig) -> dict[str, EvalResult | int]:
    """Greedy accuracy and sampled acc@4 (at cfg.temperature) on the synthetic held-out split."""
    rows = synthetic_rows(cfg, "heldout")
    prompts, answers = [r["prompt"] for r in rows], [r["answer"] for r in rows]
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path)
    common = dict(max_new_tokens=cfg.max_completion_length, seed=cfg.seed)
    greedy = evaluate(model, tokenizer, prompts, answers, exact_int_reward, n=1, temperature=0.0, **common)
    sampled = evaluate(model, tokenizer, prompts, answers, exact_int_reward, n=SAMPLES_PER_PROBLEM,
                       temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k, **common)
    return {"greedy": greedy, "sampled": sampled, "problems": len(rows)}


def run_demo(cfg: GRAILConfig, overrides: dict, log: Log = print, methods: tuple[str, ...] = DEFAULT_METHODS
             ) -> dict:
    """Train and evaluate each method from the same warm-started model; `cfg.output_dir` holds one run each."""
    if cfg.dataset != SYNTHETIC_DATASET:
        raise ValueError(f"grail demo runs on the embedded synthetic task, not dataset={cfg.dataset!r}; "
                         f"use `grail train` for other datasets.")
    start = time.perf_counter()
    base_path = resolve_model_path(cfg, log)
    log(f"evaluating the warm-started model on {cfg.task_num_heldout} held-out problems ...")
    before = heldout_accuracy(base_path, cfg)
    runs = {}
    for method in methods:
        run_cfg = build_config({**overrides, "token_weighting": method,
                                "output_dir": str(Path(cfg.output_dir) / method)})
        result = train(run_cfg, {**overrides, "token_weighting": method}, log, model_path=base_path)
        log(f"evaluating the {LABELS[method]} model on the same held-out problems ...")
        runs[method] = {"result": result, "after": heldout_accuracy(str(result.final_dir), cfg)}
    summary = {"before": before, "runs": runs, "wall_seconds": time.perf_counter() - start,
               "run_dir": cfg.output_dir}
    log(format_table(summary, cfg))
    return summary


def format_table(s: dict, cfg: GRAILConfig) -> str:
    before, runs = s["before"], s["runs"]
    methods = list(runs)
    width = 14
    header = f"{'':34}{'before RL':>{width}}" + "".join(f"{LABELS[m]:>{width}}" for m in methods)
    lines = ["", header]

    def row(name, first, values):
        return f"{name:34}{first:>{width}}" + "".join(f"{v:>{width}}" for v in values)

    lines.append(row("held-out problems", str(before["problems"]), [""] * len(methods)))
    lines.append(row("greedy accuracy", f"{before['greedy'].acc_at_n:.1%}",
                     [f"{runs[m]['after']['greedy'].acc_at_n:.1%}" for m in methods]))
    lines.append(row(f"sampled acc@{SAMPLES_PER_PROBLEM} (T={cfg.temperature:g})",
                     f"{before['sampled'].acc_at_n:.1%}",
                     [f"{runs[m]['after']['sampled'].acc_at_n:.1%}" for m in methods]))
    lines.append(row("steps", "", [str(runs[m]["result"].steps) for m in methods]))
    lines.append(row("seconds per step (median)", "", [f"{runs[m]['result'].seconds_per_step:.2f}"
                                                       for m in methods]))
    lines.append(row("training wall time (s)", "", [f"{runs[m]['result'].train_seconds:.1f}" for m in methods]))
    base = methods[0]
    for m in methods[1:]:
        a, b = runs[base]["after"]["sampled"], runs[m]["after"]["sampled"]
        diff, low, high = paired_bootstrap_ci(a.correct_P, b.correct_P, SAMPLES_PER_PROBLEM)
        lines.append(f"{LABELS[m]} − {LABELS[base]}, sampled acc: {diff * 100:+.1f} points "
                     f"(95% CI {low * 100:+.1f} to {high * 100:+.1f}, paired bootstrap over the held-out "
                     f"problems; one training seed, so seed-to-seed variation is not in this interval)")
    lines.append(f"demo wall time: {s['wall_seconds']:.1f} s; run directories under {s['run_dir']}/")
    return "\n".join(lines)
