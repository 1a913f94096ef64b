"""Saliency quality in `grail compare`: the AUROC of critical vs filler tokens (grail.analysis.saliency.quality) of a
run's final model, and of the warm start it began from, on the synthetic task's held-out problems. Rows:
`synthetic_rows` of the run's task settings, with filler_rate 0.6 where the run's is 0 (no filler, no AUROC), the
first `rows` held-out problems (seed: the run's task_seed). Methods: those of the table marked for it
(`method_names(auroc=True)`: every method with a probe except the slow ones, OAR-P and span masking), plus the arm's
own method if it has a probe and is not among them; each gives `auroc/<method>/signal` and `auroc/<method>/weights`
(within-trace pairs, the default of `saliency_auroc`), with the run's weighting options. Only for the synthetic task:
other data carries no character roles (use `grail.analysis.saliency.quality` on rows with critical/filler spans)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

from grail.analysis.saliency.quality import SaliencyQualityOptions, model_dir_saliency_auroc
from grail.analysis.saliency.token_labels import synthetic_rows
from grail.methods.table import METHODS, method_names
from grail.options.fields import SYNTHETIC_DATASET

__all__ = ["auroc_methods", "run_auroc"]


def auroc_methods(cfg) -> list[str]:
    """`method_names(auroc=True)`, plus the run's own method when it has a probe and is not among them."""
    own, default = cfg.token_weighting, method_names(auroc=True)
    return [*default, *([own] if METHODS[own].probe is not None and own not in default else [])]


def run_auroc(model_dir: str | Path, cfg, rows: int) -> dict[str, float]:
    """{"auroc/<method>/<signal|weights>": AUROC} of the model in `model_dir`; {} when cfg is not the synthetic task
    or rows is 0. `cfg`: the run's GRAILConfig (task and weighting fields)."""
    if rows <= 0 or cfg.dataset != SYNTHETIC_DATASET:
        return {}
    task = cfg.synthetic_set().task
    if task.filler_rate == 0:
        task = replace(task, filler_rate=0.6)
    methods = auroc_methods(cfg)
    options = SaliencyQualityOptions(weighting=cfg.weighting_options())
    results = model_dir_saliency_auroc(model_dir, synthetic_rows(task, rows, "heldout", cfg.task_seed), methods,
                                       options)
    return {f"auroc/{method}/{kind}": value.auroc for method, kinds in results.items()
            for kind, value in kinds.items() if not math.isnan(value.auroc)}
