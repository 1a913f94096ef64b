"""`grail demo`: the main job on the embedded default, end to end on a CPU in a few minutes.

Builds (or reuses) the warm-started tiny model, measures held-out accuracy, trains one short run per method
(`--method`, default `none,grail`: GRPO and GRAIL) from the same start with the same seeds and the `tiny-cpu`
preset, measures each on the same held-out problems, and prints a table with each method's difference from
the first one and its paired bootstrap confidence interval over the held-out problems.

Held-out accuracy is measured by the evaluation harness (`grail.training.heldout`, which calls
`grail.evaluation.harness.run_evaluation` as `grail eval` and training's checkpoint evaluation do): the synthetic
benchmark with the run's task settings, prompts rendered in the run's prompt format (as training renders them),
completions graded by `grail.evaluation.grader`, acc@n and the paired difference from `grail.evaluation.scores`.
Each evaluation is one harness output directory inside the demo's:

    <output_dir>/eval/before/{greedy,sampled}/      the warm-started model
    <output_dir>/<method>/                          the method's training run (grail.training.run)
    <output_dir>/<method>/eval/{greedy,sampled}/    its final model
"""

from __future__ import annotations

import time
from pathlib import Path

from transformers import AutoTokenizer

from grail.evaluation.scores import paired_difference
from grail.methods.table import METHODS, scoped_values
from grail.options.fields import SYNTHETIC_DATASET
from grail.training.config import GRAILConfig
from grail.training.heldout import SAMPLES_PER_PROBLEM, eval_device, eval_specs, heldout_accuracy
from grail.training.overrides import build_config
from grail.training.run import Log, resolve_model_path, train

__all__ = ["DEFAULT_METHODS", "format_table", "run_demo"]

DEFAULT_METHODS = ("none", "grail")


def run_demo(cfg: GRAILConfig, overrides: dict, log: Log = print, methods: tuple[str, ...] = DEFAULT_METHODS
             ) -> dict:
    """Train and evaluate each method from the same warm-started model; `cfg.output_dir` holds one run each."""
    if cfg.dataset != SYNTHETIC_DATASET:
        raise ValueError(f"grail demo runs on the embedded synthetic task, not dataset={cfg.dataset!r}; "
                         f"use `grail train` for other datasets.")
    start = time.perf_counter()
    specs = eval_specs(cfg)
    eval_dirs = {"before": Path(cfg.output_dir) / "eval" / "before",
                 **{method: Path(cfg.output_dir) / method / "eval" for method in methods}}
    taken = [str(d / name) for d in eval_dirs.values() for name in specs if (d / name).exists()]
    if taken:  # the harness would resume those samples, which are another model's
        raise ValueError(f"{taken[0]} holds an earlier demo's evaluation; choose a new --output_dir.")
    (heldout,) = specs["greedy"].load_benchmarks(synthetic_set=cfg.synthetic_set())  # the run's; both specs' problems
    base_path = resolve_model_path(cfg, log)
    specs = eval_specs(cfg, AutoTokenizer.from_pretrained(base_path))  # the prompt format training resolves for it
    log(f"evaluating the warm-started model on {len(heldout.problems)} held-out problems ...")
    before = heldout_accuracy(base_path, specs, heldout, eval_dirs["before"], log, shared_prompt=cfg.shared_prompt,
                              device=eval_device(cfg))
    runs = {}
    for method in methods:
        own = {**scoped_values(overrides, METHODS[method]), "token_weighting": method}  # options it reads
        run_cfg = build_config({**own, "output_dir": str(Path(cfg.output_dir) / method)})
        result = train(run_cfg, own, log, model_path=base_path)
        log(f"evaluating the {METHODS[method].label} model on the same held-out problems ...")
        runs[method] = {"result": result,
                        "after": heldout_accuracy(str(result.final_dir), specs, heldout, eval_dirs[method], log,
                                                  shared_prompt=cfg.shared_prompt, device=eval_device(cfg))}
    base = methods[0]
    differences = {m: paired_difference(runs[base]["after"]["sampled"], runs[m]["after"]["sampled"])
                   for m in methods[1:]}
    summary = {"problems": len(heldout.problems), "before": before, "runs": runs, "differences": differences,
               "wall_seconds": time.perf_counter() - start, "run_dir": cfg.output_dir}
    log(format_table(summary, cfg))
    return summary


def format_table(s: dict, cfg: GRAILConfig) -> str:
    before, runs = s["before"], s["runs"]
    methods = list(runs)
    width = 14
    header = f"{'':34}{'before RL':>{width}}" + "".join(f"{METHODS[m].label:>{width}}" for m in methods)
    lines = ["", header]

    def row(name, first, values):
        return f"{name:34}{first:>{width}}" + "".join(f"{v:>{width}}" for v in values)

    lines.append(row("held-out problems", str(s["problems"]), [""] * len(methods)))
    for name, label in (("greedy", "greedy accuracy"),
                        ("sampled", f"sampled acc@{SAMPLES_PER_PROBLEM} (T={cfg.temperature:g})")):
        lines.append(row(label, f"{before[name].acc_at_n.value:.1%}",
                         [f"{runs[m]['after'][name].acc_at_n.value:.1%}" for m in methods]))
    lines.append(row("steps", "", [str(runs[m]["result"].steps) for m in methods]))
    lines.append(row("seconds per step (median)", "", [f"{runs[m]['result'].seconds_per_step:.2f}"
                                                       for m in methods]))
    lines.append(row("training wall time (s)", "", [f"{runs[m]['result'].train_seconds:.1f}" for m in methods]))
    base = methods[0]
    for m, d in s["differences"].items():
        lines.append(f"{METHODS[m].label} − {METHODS[base].label}, sampled acc: {d.value * 100:+.1f} points "
                     f"(95% CI {d.low * 100:+.1f} to {d.high * 100:+.1f}, paired bootstrap over the held-out "
                     f"problems; one training seed, so seed-to-seed variation is not in this interval)")
    lines.append(f"demo wall time: {s['wall_seconds']:.1f} s; run directories under {s['run_dir']}/")
    return "\n".join(lines)
