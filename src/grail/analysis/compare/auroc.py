"""Saliency quality in `grail compare`: the AUROC of critical vs filler tokens (grail.analysis.saliency.quality) of a
run's final model, and of the warm start it began from. Rows, by the plan's auroc_set: "task" (the default, synthetic
task only): `synthetic_rows` of the run's task settings, with filler_rate 0.6 where the run's is 0 (no filler, no
AUROC), the first `rows` held-out problems (seed: the run's task_seed); or a label set of
grail.analysis.saliency.label_sets (`multi_step_filler`, `natural_contrast`: teacher-forced stories whose critical and
filler or format tokens occur at every distance from the answer), its first `rows` rows of seed 0, for any run.
Methods: those of the table marked for it (`method_names(auroc=True)`: every method with a probe except the slow ones,
OAR-P and span masking), plus the arm's own method if it has a probe and is not among them; each gives
`auroc/<method>/signal` and `auroc/<method>/weights` (within-trace pairs, the default of `saliency_auroc`), with the
run's weighting options, and `auroc/<method>/signal_matched`, the signal's AUROC with position held fixed (tokens
compared only at the same distance from the answer: grail.analysis.saliency.position). The "task" rows exist only for
the synthetic task: other data carries no character roles (use a label set, or `grail.analysis.saliency.quality` on
your own labelled rows)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

from grail.analysis.saliency.label_sets import LABEL_SETS, label_set_rows
from grail.analysis.saliency.quality import SaliencyQualityOptions, model_dir_saliency_auroc
from grail.analysis.saliency.token_labels import synthetic_rows
from grail.methods.table import METHODS, method_names
from grail.options.fields import SYNTHETIC_DATASET

__all__ = ["AUROC_SETS", "TASK_SET", "auroc_methods", "auroc_names", "describe_rows", "run_auroc"]

TASK_SET = "task"
AUROC_SETS = (TASK_SET, *LABEL_SETS)
KINDS = ("signal", "weights", "signal_matched")


def auroc_methods(cfg) -> list[str]:
    """`method_names(auroc=True)`, plus the run's own method when it has a probe and is not among them."""
    own, default = cfg.token_weighting, method_names(auroc=True)
    return [*default, *([own] if METHODS[own].probe is not None and own not in default else [])]


def auroc_names(cfg) -> set[str]:
    """Every name run_auroc can return for this config."""
    return {f"auroc/{method}/{kind}" for method in auroc_methods(cfg) for kind in KINDS}


def describe_rows(rows: int, label_set: str = TASK_SET) -> str:
    """The AUROC's rows in words, for logs and the report."""
    if label_set == TASK_SET:
        return f"{rows} held-out synthetic problems"
    return f"{rows} rows of the label set {label_set} (seed 0)"


def run_auroc(model_dir: str | Path, cfg, rows: int, label_set: str = TASK_SET) -> dict[str, float]:
    """{"auroc/<method>/<signal|weights|signal_matched>": AUROC} of the model in `model_dir` on `rows` rows of
    `label_set` (module docstring); {} when rows is 0, or for the task's rows when cfg is not the synthetic task.
    `cfg`: the run's GRAILConfig (task and weighting fields)."""
    if label_set not in AUROC_SETS:
        raise ValueError(f"AUROC rows {label_set!r}: give one of {', '.join(AUROC_SETS)}.")
    if rows <= 0:
        return {}
    if label_set == TASK_SET:
        if cfg.dataset != SYNTHETIC_DATASET:
            return {}
        task = cfg.synthetic_set().task
        if task.filler_rate == 0:
            task = replace(task, filler_rate=0.6)
        labelled = synthetic_rows(task, rows, "heldout", cfg.task_seed)
    else:
        labelled = label_set_rows(label_set, rows, 0)
    options = SaliencyQualityOptions(weighting=cfg.weighting_options())
    results = model_dir_saliency_auroc(model_dir, labelled, auroc_methods(cfg), options)
    values = {}
    for method, kinds in results.items():
        for kind, value in kinds.items():
            values[f"auroc/{method}/{kind}"] = value.auroc
        values[f"auroc/{method}/signal_matched"] = kinds["signal"].matched.auroc
    return {name: v for name, v in values.items() if not math.isnan(v)}
