"""`grail demo`: the main job on the embedded default, end to end on a CPU in a few minutes.

Builds (or reuses) the warm-started tiny model, measures held-out accuracy, trains a short GRPO run with
the `tiny-cpu` preset, measures again on the same held-out problems, and prints a table.
"""

from __future__ import annotations

import time

from transformers import AutoModelForCausalLM, AutoTokenizer

from grail.config import SYNTHETIC_DATASET, GRAILConfig
from grail.data import synthetic_rows
from grail.evaluate import evaluate
from grail.rewards import exact_int_reward
from grail.train import Log, resolve_model_path, train

SAMPLES_PER_PROBLEM = 4  # sampled accuracy: acc@4 at the training temperature


def heldout_accuracy(model_path: str, cfg: GRAILConfig) -> dict[str, float]:
    """Greedy accuracy and sampled acc@4 (at cfg.temperature) on the synthetic held-out split."""
    rows = synthetic_rows(cfg, "heldout")
    prompts, answers = [r["prompt"] for r in rows], [r["answer"] for r in rows]
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path)
    common = dict(max_new_tokens=cfg.max_completion_length, seed=cfg.seed)
    greedy = evaluate(model, tokenizer, prompts, answers, exact_int_reward, n=1, temperature=0.0, **common)
    sampled = evaluate(model, tokenizer, prompts, answers, exact_int_reward, n=SAMPLES_PER_PROBLEM,
                       temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k, **common)
    return {"greedy": greedy.acc_at_n, "sampled": sampled.acc_at_n, "problems": len(rows)}


def run_demo(cfg: GRAILConfig, overrides: dict, log: Log = print) -> dict:
    if cfg.dataset != SYNTHETIC_DATASET:
        raise ValueError(f"grail demo runs on the embedded synthetic task, not dataset={cfg.dataset!r}; "
                         f"use `grail train` for other datasets.")
    start = time.perf_counter()
    base_path = resolve_model_path(cfg, log)
    log(f"evaluating the warm-started model on {cfg.task_num_heldout} held-out problems ...")
    before = heldout_accuracy(base_path, cfg)
    result = train(cfg, overrides, log, model_path=base_path)
    log("evaluating the trained model on the same held-out problems ...")
    after = heldout_accuracy(str(result.final_dir), cfg)
    summary = {"before": before, "after": after, "steps": result.steps, "train_seconds": result.train_seconds,
               "seconds_per_step": result.seconds_per_step, "wall_seconds": time.perf_counter() - start,
               "run_dir": str(result.run_dir)}
    log(format_table(summary, cfg))
    return summary


def format_table(s: dict, cfg: GRAILConfig) -> str:
    b, a = s["before"], s["after"]
    rows = [
        ("held-out problems", f"{b['problems']}", ""),
        ("greedy accuracy", f"{b['greedy']:.1%}", f"{a['greedy']:.1%}"),
        (f"sampled acc@{SAMPLES_PER_PROBLEM} (T={cfg.temperature:g})", f"{b['sampled']:.1%}",
         f"{a['sampled']:.1%}"),
    ]
    lines = ["", f"{'':32}{'before RL':>12}{'after RL':>12}"]
    lines += [f"{name:32}{x:>12}{y:>12}" for name, x, y in rows]
    lines += [
        f"{'GRPO steps':32}{s['steps']:>24}",
        f"{'seconds per step (median)':32}{s['seconds_per_step']:>24.2f}",
        f"{'training wall time (s)':32}{s['train_seconds']:>24.1f}",
        f"{'demo wall time (s)':32}{s['wall_seconds']:>24.1f}",
        f"run directory: {s['run_dir']}",
    ]
    return "\n".join(lines)
