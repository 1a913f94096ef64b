"""`grail compare`'s plan: arms × training seeds, each an ordinary grail training run from one start, every run
evaluated by the same protocol, resumable after a kill, then a report over seeds (grail.analysis.compare.report).

An arm is a `token_weighting` method, optionally with config fields: `grail@saliency_leaf=middle@weight_std=1.0`
(fields after `@`, each `field=value`; arms are comma-separated on the command line). A sweep `field=v1,v2` crosses
every arm with every value (`grail@learning_rate=5e-05`). Every arm's config is built (validated) before any
training. Seed s (0..S−1) sets `seed` (TRL: model init, sampling, the prompt sampler, the random control's
permutation) and `data_seed` for every arm, and `dataset_shuffle_seed` too when the base config sets one, so arms
are paired by seed. Everything else is the base config: evaluation settings come from it, not from an arm's fields,
so every arm is measured the same way.

Comparison directory (`--output_dir`):
    compare.json                the plan (arms, each with its configuration as its runs resolve it, seeds, base config
                                and where it came from, seed fields, sweeps, evaluation); a rerun with other arguments
                                is refused; `--resume DIR` reruns it
    before_rl.json, before_rl/  the starting model's evaluation before RL, once (grail.analysis.compare.start)
    auroc_warmstart.json        with auroc_rows: the saliency AUROC of each arm's start, {arm label: {...}}
    runs/<arm-slug>/seed<s>/    one `grail train` run directory (grail.training.run), plus compare.log (its training and
                                evaluation log) and the files of grail.analysis.compare.run (compare_trained.json,
                                eval/, extra_metrics.json, auroc_checkpoints.json, compare_result.json: the finished
                                marker); with drop_checkpoints, its checkpoint-N folders go once it has finished
    report.md, report.json, *.png   grail.analysis.compare.report

A sweep `--sweep FIELD=v1,v2` pairs each arm with the first arm at the same value (grail.analysis.compare.sweep), not
across values; the report adds a table and a plot of the headline metric against the swept value.

Running the plan: grail.analysis.compare.schedule.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from grail.analysis.compare.auroc import TASK_SET, AurocPlan
from grail.analysis.compare.run import (
    EXTRA_EVALUATIONS,
    arm_record,
    lock,
    run_one,
    run_values,
    write_json,
)
from grail.methods.table import METHODS, refuse_unread
from grail.options.fields import SYNTHETIC_DATASET
from grail.training.config import GRAILConfig
from grail.training.overrides import build_config, coerce

__all__ = ["amend_plan", "Arm", "check_plan", "EXTRA_EVALUATIONS", "make_plan", "parse_arms", "parse_sweep",
           "PLAN_FILE", "RESUME_FIELDS", "run_one", "run_values"]

PLAN_FILE = "compare.json"
SEED_FIELDS = ("seed", "data_seed")  # plus dataset_shuffle_seed when the base config sets it
RESERVED = ("token_weighting", "output_dir", "resume_from_checkpoint", "overwrite_output_dir", *SEED_FIELDS,
            "dataset_shuffle_seed")
STATUS_EVERY_S = 30.0
# what `--resume DIR` may change: checkpointing only, which decides what a kill costs and never a number a run reports
# (saving reads no random state and changes no step; resume from a checkpoint is exact, tests/test_resume.py)
RESUME_FIELDS = ("save_steps", "save_total_limit")
_FIELD_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# ---- arms and the plan -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Arm:
    label: str  # as written: method@field=value@...
    method: str
    fields: dict  # typed values

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9._@=+-]", "_", self.label)


def _arm(text: str) -> Arm:
    method, *parts = text.split("@")
    methods = list(METHODS)
    if method not in methods:
        raise ValueError(f"--arms: arm {text!r} starts with {method!r}, not a method; an arm is METHOD or "
                         f"METHOD@field=value@... with METHOD one of {', '.join(methods)}.")
    fields, labels = {}, [method]
    for part in parts:
        key, eq, value = part.partition("=")
        if not eq or not _FIELD_RE.match(key) or value == "":
            raise ValueError(f"--arms: {part!r} in arm {text!r} is not field=value (e.g. grail@saliency_leaf=middle"
                             f"@weight_std=1.0).")
        if key in RESERVED:
            raise ValueError(f"--arms: arm {text!r} sets {key}, which grail compare sets itself (the method comes "
                             f"first; seeds are --seeds; directories follow --output_dir).")
        if key in fields:
            raise ValueError(f"--arms: arm {text!r} sets {key} twice.")
        fields[key] = coerce(key, value, f"arm {text}")
        labels.append(f"{key}={value}")
    return Arm("@".join(labels), method, fields)


def parse_sweep(text: str) -> tuple[str, list[str]]:
    """`learning_rate=2.5e-5,5e-5` → ("learning_rate", ["2.5e-5", "5e-5"])."""
    key, eq, values = text.partition("=")
    raw = [v.strip() for v in values.split(",") if v.strip()]
    if not eq or not _FIELD_RE.match(key.strip()) or not raw:
        raise ValueError(f"--sweep {text!r}: give FIELD=v1,v2,... (e.g. --sweep learning_rate=2.5e-5,5e-5,1e-4).")
    if key.strip() in RESERVED:
        raise ValueError(f"--sweep {text!r}: grail compare sets {key.strip()} itself; sweep another field.")
    return key.strip(), raw


def parse_arms(text: str, sweeps: list[str] | tuple[str, ...] = ()) -> list[Arm]:
    """The arms of `--arms A,B,...`, crossed with every `--sweep FIELD=v1,v2` (labels show the values)."""
    parts = [part.strip() for part in text.split(",")]
    if not all(parts):
        raise ValueError(f"--arms {text!r}: give one or more arms, comma-separated, none empty (e.g. --arms "
                         f"none,grail).")
    arms = [_arm(part) for part in parts]
    for sweep in sweeps:
        key, values = parse_sweep(sweep)
        clash = [a.label for a in arms if key in a.fields]
        if clash:
            raise ValueError(f"--sweep {sweep!r}: arm {clash[0]!r} already sets {key}; sweep it or set it, not both.")
        arms = [Arm(f"{a.label}@{key}={v}", a.method, {**a.fields, key: coerce(key, v, f"--sweep {sweep}")})
                for a in arms for v in values]
    for attr in ("label", "slug"):
        names = [getattr(a, attr) for a in arms]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"--arms: two arms have the {attr} {repeated[0]!r}; every arm must differ.")
    return arms


def _protocol(cfg: GRAILConfig) -> dict:
    from grail.training.heldout import SAMPLES_PER_PROBLEM

    if cfg.eval_benchmarks:
        from grail.evaluation.benchmarks import parse_benchmark_list

        names = parse_benchmark_list(cfg.eval_benchmarks)
        primary = "benchmarks/unweighted/acc@n" if len(names) > 1 else f"benchmarks/{names[0]}/acc@{cfg.eval_samples}"
        return {"kind": "benchmarks", "primary": primary,
                "description": f"{', '.join(names)} as training's checkpoint evaluation (eval_size={cfg.eval_size}, "
                               f"eval_samples={cfg.eval_samples}, eval_data_dir={cfg.eval_data_dir})"}
    if cfg.dataset != SYNTHETIC_DATASET:
        raise ValueError(f"grail compare evaluates on the synthetic task's held-out split by default, which needs "
                         f"dataset=synthetic (not {cfg.dataset!r}); for another dataset set --eval_benchmarks (and "
                         f"--eval_data_dir for local files).")
    return {"kind": "synthetic held-out", "primary": f"sampled/synthetic/acc@{SAMPLES_PER_PROBLEM}",
            "description": f"the {cfg.synthetic_set().num_heldout} held-out synthetic problems, greedy acc@1 and "
                           f"sampled acc@{SAMPLES_PER_PROBLEM} at temperature {cfg.temperature:g} (as `grail demo`)"}


def _jsonable(values: dict) -> dict:
    return json.loads(json.dumps(values))


def make_plan(arms: list[Arm], seeds: int, base: dict, out_dir: str | Path, auroc_rows: int = 0,
              sweeps: list[str] | tuple[str, ...] = (), base_source: str | None = None, first_seed: int = 0,
              auroc_set: str | None = None, drop_checkpoints: bool = False,
              auroc_methods: list[str] | None = None) -> dict:
    """The plan (compare.json), after building every arm's config: a bad field stops here, before any training.
    `sweeps`: the `--sweep FIELD=v1,v2` texts the arms were crossed with (parse_arms), recorded as
    [{"field": F, "values": [text, ...]}] for the report's sweep table and plot (grail.analysis.compare.sweep).
    `base_source`: where the base values came from, in words (preset, file, flags), for the report's first lines.
    `first_seed`: the seeds are first_seed .. first_seed + seeds − 1 (recorded only when not 0), so that a pilot and
    the comparison it sizes train on different seeds. `auroc_set`: the rows of the saliency AUROC
    (grail.analysis.compare.auroc.AUROC_SETS; None: "task"; recorded only when not "task"); `auroc_methods`: the methods
    measured (None: the default set; recorded when given). `drop_checkpoints`: delete a run's checkpoint-N folders
    once it has finished (grail.analysis.compare.run.drop_checkpoints; recorded when true). `bf16` left unset is
    resolved here, once, as a run on this machine would resolve it (grail.models.precision), and written into the
    base values with the reason (`precision`): a comparison resumed on another machine keeps its precision."""
    if seeds < 1:
        raise ValueError(f"--seeds {seeds}: give 1 or more (seeds 0..S-1; 3 or more for an interval worth having).")
    if first_seed < 0:
        raise ValueError(f"--first-seed {first_seed}: give 0 or more.")
    base = _jsonable({k: v for k, v in base.items() if k != "output_dir"})
    seed_fields = [*SEED_FIELDS, *(["dataset_shuffle_seed"] if base.get("dataset_shuffle_seed") is not None else [])]
    auroc_set = auroc_set or TASK_SET
    AurocPlan(auroc_rows, auroc_set, None if auroc_methods is None else tuple(auroc_methods)).check()
    plan = {"version": 1, "seeds": seeds, "seed_fields": seed_fields, "base": base, "auroc_rows": auroc_rows,
            "base_source": base_source,
            "sweeps": [dict(zip(("field", "values"), parse_sweep(text), strict=True)) for text in sweeps],
            "arms": [{"label": a.label, "slug": a.slug, "method": a.method, "fields": _jsonable(a.fields)}
                     for a in arms], **({"first_seed": first_seed} if first_seed else {}),
            **({"auroc_set": auroc_set} if auroc_set != TASK_SET else {}),
            **({"auroc_methods": list(auroc_methods)} if auroc_methods is not None else {}),
            **({"drop_checkpoints": True} if drop_checkpoints else {})}
    if base.get("bf16") is None:  # one precision for every run, whichever machine starts or resumes it
        probe = build_config(run_values(plan, None, first_seed, out_dir))
        base["bf16"] = bool(probe.bf16)  # the plan holds this dict as its base
        plan["precision"] = probe.__dict__.get("precision_reason", f"bf16={probe.bf16} as the device resolves it")
    # shared options go to the arms that read them; one that no arm reads would do nothing
    refuse_unread(base, [METHODS[a.method] for a in arms], "the arms' methods",
                  "set it on an arm that reads it (METHOD@{key}=VALUE)")
    for arm in plan["arms"]:  # each arm's configuration, resolved once and recorded: the comparison reads it there
        try:
            arm["resolved"] = arm_record(build_config(run_values(plan, arm, first_seed, out_dir)), seed_fields)
        except ValueError as err:
            raise ValueError(f"arm {arm['label']!r}: {err}") from err
    plan["protocol"] = _protocol(build_config(run_values(plan, None, first_seed, out_dir)))
    return plan


def _as_given(arm: dict) -> dict:
    """An arm of the plan without its record of what it resolves to (`run.arm_record`)."""
    return {k: v for k, v in arm.items() if k != "resolved"}


def check_plan(plan: dict, out_dir: str | Path) -> None:
    """Check that the compare.json in out_dir, if any, is this plan (naming the first difference)."""
    path = Path(out_dir) / PLAN_FILE
    if not path.is_file():
        return
    stored = json.loads(path.read_text())
    for key in ("seeds", "first_seed", "arms", "seed_fields", "protocol", "base", "auroc_rows", "auroc_set",
                "auroc_methods", "drop_checkpoints"):
        old, new = stored.get(key), plan.get(key)
        if old == new:
            continue
        if key == "base":
            name = sorted(k for k in set(old) | set(new) if old.get(k, "<unset>") != new.get(k, "<unset>"))[0]
            key, old, new = f"config field {name}", old.get(name, "<unset>"), new.get(name, "<unset>")
        elif key == "arms":
            if not any("resolved" in a for a in old) and old == [_as_given(a) for a in new]:
                continue  # a plan of an earlier grail-rl, which did not record what its arms resolve to
            old, new = [a["label"] for a in old], [a["label"] for a in new]
            if old == new:
                key, old, new = "arm fields", stored["arms"], plan["arms"]
        amendments = stored.get("amendments", [])
        amended = {f"config field {f}" for a in amendments for f in a["fields"]} | {
            "drop_checkpoints" for a in amendments if a.get("drop_checkpoints")} | {
            "seeds" for a in amendments if a.get("seeds")}
        how = (f"It was changed on resume: continue with grail compare --resume {out_dir}" if key in amended else
               "Rerun with the same arguments to resume it")
        raise ValueError(f"{path} holds a comparison with other arguments: {key} is {old!r} there and {new!r} now. "
                         f"{how}, or give a new --output_dir.")


def amend_plan(out_dir: str | Path, fields: dict[str, str], drop_checkpoints: bool = False,
               seeds: int | None = None) -> dict:
    """Change the checkpointing of the comparison in out_dir (`grail compare --resume DIR --save_steps N ...`), or
    extend its seeds (`--seeds N`, more than it has): `fields` are RESUME_FIELDS as raw strings, `drop_checkpoints`
    turns the plan's on. Runs not finished yet (re)start with them; finished runs are untouched; an extension adds
    the seeds after the last one for every arm. Every arm's config is built first (a bad value changes nothing), the
    change is recorded in the plan's "amendments" (the report lists them; an extension with the headline paired
    intervals of the report as it stood, so that the width that led to it stays on record), and compare.json is
    written under the comparison's lock. Returns the plan."""
    import time

    other = sorted(set(fields) - set(RESUME_FIELDS))
    if other:
        raise ValueError(f"--resume takes the plan from its directory's {PLAN_FILE}; beside it only checkpointing "
                         f"may change ({', '.join('--' + f for f in RESUME_FIELDS)}, --drop-checkpoints); drop "
                         f"{', '.join('--' + f for f in other)} (to change the plan, start a new comparison with "
                         f"another --output_dir).")
    out_dir = Path(out_dir)
    path = out_dir / PLAN_FILE
    with lock(out_dir / ".compare.lock", wait=False):
        plan = json.loads(path.read_text())
        typed = {key: coerce(key, value, "--resume") for key, value in fields.items()}
        change = {k: v for k, v in typed.items() if plan["base"].get(k) != v}
        turn_on = drop_checkpoints and not plan.get("drop_checkpoints")
        if seeds is not None and seeds < plan["seeds"]:
            raise ValueError(f"--resume {out_dir} --seeds {seeds}: the comparison has {plan['seeds']} seeds; seeds "
                             f"can be added (--seeds more than {plan['seeds']}), never taken away.")
        extend = seeds is not None and seeds > plan["seeds"]
        if not change and not turn_on and not extend:
            return plan
        amended = {**plan, "base": {**plan["base"], **_jsonable(change)}}
        if turn_on:
            amended["drop_checkpoints"] = True
        if extend:
            amended["seeds"] = seeds
        for arm in amended["arms"]:
            try:
                build_config(run_values(amended, arm, plan.get("first_seed", 0), out_dir))
            except ValueError as err:
                raise ValueError(f"--resume: arm {arm['label']!r}: {err}") from err
        record = {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "fields": _jsonable(change),
                  **({"drop_checkpoints": True} if turn_on else {}),
                  **({"seeds": {"from": plan["seeds"], "to": seeds, "before": _headline_paired(out_dir)}}
                     if extend else {})}
        amended["amendments"] = [*plan.get("amendments", []), record]
        write_json(path, amended)
    return amended


def _headline_paired(out_dir: Path) -> dict | None:
    """The report's headline metric and its paired differences over seeds as they stand ({"metric", "paired": {arm:
    {n, mean, half_width, low, high, sign_flip_p}}}), or None without a report."""
    path = out_dir / "report.json"
    if not path.is_file():
        return None
    report = json.loads(path.read_text())
    metric = report.get("primary_metric")
    paired = ((report.get("metrics") or {}).get(metric) or {}).get("paired") or {}
    keys = ("n", "mean", "half_width", "low", "high", "sign_flip_p")
    return {"metric": metric, "paired": {arm: {k: d.get(k) for k in keys} for arm, d in paired.items()}}
