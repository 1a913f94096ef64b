"""Saliency quality in `grail compare`: the AUROC of critical vs filler tokens (grail.analysis.saliency.quality) of a
run's final model, and of the warm start it began from. Rows, by the plan's auroc_set: "task" (the default, synthetic
task only, any style: the chain task's examples carry roles too): `synthetic_rows` of the run's task settings (the
chain task's own held-out examples for task_style chains), with filler_rate 0.6 where the run's is 0 (no filler, no
AUROC), the first `rows` held-out problems (seed: the run's task_seed); or a label set of
grail.analysis.saliency.label_sets (`multi_step_filler`, `natural_contrast`: teacher-forced stories whose critical and
filler or format tokens occur at every distance from the answer), its first `rows` rows of seed 0, for any run. Methods
(AurocPlan.methods, `--auroc-methods`): by default those of the table marked for it (`method_names(auroc=True)`: every
method with a probe except the slow ones, OAR-P and span masking), plus the arm's own method if it has a probe and is
not among them; each gives `auroc/<method>/signal` and `auroc/<method>/weights` (within-trace pairs, the default of
`saliency_auroc`), with the run's weighting options, and `auroc/<method>/signal_matched`, the signal's AUROC with
position matched (tokens compared only at the same distance from the answer: grail.analysis.saliency.position; a
signal of position alone can score away from 0.5 there, docs/guides/position-fixed.md). On a counterbalanced set
(grail.analysis.saliency.counterbalanced: `counterbalanced_filler`, `counterbalanced_format`; `rows` counts its groups,
each a problem told in layouts of equal length that put critical and contrast tokens at every position) also
`auroc/<method>/signal_fixed`, the position-fixed AUROC (grail.analysis.saliency.fixed_position: exactly 0.5 for any
signal of position alone). And for every model, on the same rows, where its probability mass sits: `logp/critical` and
`logp/contrast`, the mean log-probability of the reference solutions' critical and contrast tokens
(grail.analysis.saliency.label_logprobs); a final model's minus its start's is where training moved it. The "task" rows
exist only for the synthetic task: other data carries no character roles (use a label set, or
`grail.analysis.saliency.quality` on your own labelled rows)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

from grail.analysis.saliency.counterbalanced import COUNTERBALANCED_SETS
from grail.analysis.saliency.label_logprobs import label_logprobs
from grail.analysis.saliency.label_sets import LABEL_SETS, label_set_rows
from grail.analysis.saliency.quality import SaliencyQualityOptions, load_model_dir, saliency_auroc
from grail.analysis.saliency.token_labels import saliency_row, synthetic_rows
from grail.methods.table import METHODS, method_names
from grail.options.fields import SYNTHETIC_DATASET
from grail.tasks.chains import ChainSet

__all__ = ["AUROC_SETS", "AurocPlan", "auroc_rows", "default_rows", "TASK_SET", "run_auroc"]

TASK_SET = "task"
AUROC_SETS = (TASK_SET, *LABEL_SETS, *COUNTERBALANCED_SETS)
KINDS = ("signal", "weights", "signal_matched", "signal_fixed")
LOGP_NAMES = ("logp/critical", "logp/contrast")  # label_logprobs: per model, not per method


def default_rows(label_set: str | None) -> int:
    """`--auroc-rows`' default for `label_set`: 64 rows, or 2 groups of a counterbalanced set (about 90 rows)."""
    return 2 if label_set in COUNTERBALANCED_SETS else 64


@dataclass(frozen=True)
class AurocPlan:
    """What a comparison measures the saliency AUROC on: `rows` rows (0: off; groups of a counterbalanced set) of
    `label_set` (AUROC_SETS), for `methods` (None: `method_names(auroc=True)`), plus each run's own method when it
    has a probe."""

    rows: int = 0
    label_set: str = TASK_SET
    methods: tuple[str, ...] | None = None

    @classmethod
    def of(cls, plan: dict) -> AurocPlan:
        """The AUROC settings of a plan (compare.json) or of a report (report.json); absent or null keys are the
        defaults."""
        methods = plan.get("auroc_methods")
        return cls(plan.get("auroc_rows") or 0, plan.get("auroc_set") or TASK_SET, tuple(methods) if methods else None)

    def check(self) -> None:
        """ValueError naming the bad setting and the choices."""
        if self.rows < 0:
            raise ValueError(f"--auroc-rows {self.rows}: give 0 (off) or a number of rows.")
        if self.label_set not in AUROC_SETS:
            raise ValueError(f"--auroc-set {self.label_set!r}: give one of {', '.join(AUROC_SETS)}.")
        if not self.rows and (self.label_set != TASK_SET or self.methods):
            raise ValueError("--auroc-set and --auroc-methods with --auroc-rows 0 compute no AUROC: give --auroc-rows "
                             "N (32 is the size of the published label-set tables), or drop them.")
        probed = method_names(probed=True)
        bad = [m for m in self.methods or () if m not in probed]
        if bad or self.methods == ():
            raise ValueError(f"--auroc-methods: {', '.join(bad) or 'none given'}; give methods with a per-token "
                             f"signal, from {', '.join(probed)}.")

    def methods_for(self, cfg) -> list[str]:
        """The methods measured for a run of config `cfg`: the plan's, plus the run's own when it has a probe."""
        own, chosen = cfg.token_weighting, list(self.methods or method_names(auroc=True))
        return [*chosen, *([own] if METHODS[own].probe is not None and own not in chosen else [])]

    def names(self, cfg) -> set[str]:
        """Every name run_auroc can return for a run of config `cfg`."""
        return {f"auroc/{method}/{kind}" for method in self.methods_for(cfg) for kind in KINDS} | set(LOGP_NAMES)

    def describe(self) -> str:
        """The rows in words, for logs and the report."""
        if self.label_set == TASK_SET:
            return f"{self.rows} held-out synthetic problems"
        if self.label_set in COUNTERBALANCED_SETS:
            groups = "group" if self.rows == 1 else "groups"
            return f"{self.rows} {groups} of the counterbalanced label set {self.label_set} (seed 0)"
        return f"{self.rows} rows of the label set {self.label_set} (seed 0)"


def auroc_rows(cfg, auroc: AurocPlan) -> list[dict]:
    """The labelled rows `run_auroc` measures for a run of config `cfg` (module docstring); [] when its rows are 0, or
    for the task's rows when cfg is not the synthetic task."""
    auroc.check()
    if not auroc.rows:
        return []
    if auroc.label_set == TASK_SET:
        if cfg.dataset != SYNTHETIC_DATASET:
            return []
        task_set = cfg.synthetic_set()
        task = task_set.task if task_set.task.filler_rate else replace(task_set.task, filler_rate=0.6)
        if isinstance(task_set, ChainSet):  # chain examples carry roles as the arithmetic ones do
            chains = replace(task_set, task=task, num_heldout=auroc.rows)
            return [saliency_row(example) for example in chains.examples("heldout")]
        return synthetic_rows(task, auroc.rows, "heldout", cfg.task_seed)
    if auroc.label_set in COUNTERBALANCED_SETS:
        return COUNTERBALANCED_SETS[auroc.label_set](auroc.rows, 0)
    return label_set_rows(auroc.label_set, auroc.rows, 0)


def run_auroc(model_dir: str | Path, cfg, auroc: AurocPlan) -> dict[str, float]:
    """{"auroc/<method>/<kind>": AUROC for each kind of KINDS that is defined, "logp/critical": ...,
    "logp/contrast": ...} of the model in `model_dir` on `auroc_rows(cfg, auroc)` (module docstring); {} when there
    are none. `cfg`: the run's GRAILConfig (task and weighting fields)."""
    labelled = auroc_rows(cfg, auroc)
    if not labelled:
        return {}
    options = SaliencyQualityOptions(weighting=cfg.weighting_options())
    model, tokenizer = load_model_dir(model_dir)
    results = saliency_auroc(model, tokenizer, labelled, auroc.methods_for(cfg), options)
    values = {}
    for method, kinds in results.items():
        for kind, value in kinds.items():
            values[f"auroc/{method}/{kind}"] = value.auroc
        values[f"auroc/{method}/signal_matched"] = kinds["signal"].matched.auroc
        if auroc.label_set in COUNTERBALANCED_SETS:  # elsewhere a row's traces share no layout: no pair at all
            values[f"auroc/{method}/signal_fixed"] = kinds["signal"].fixed.auroc
    values.update(label_logprobs(model, tokenizer, labelled, options).as_metrics())
    return {name: v for name, v in values.items() if not math.isnan(v)}
