"""One run of `grail compare`: its config, its training (or resumption), its evaluation and its per-run metrics,
in the run directory `runs/<arm-slug>/seed<s>/` (grail.analysis.compare.summary.run_path). grail.analysis.compare.plan
plans the runs and schedules them, in this process or in worker processes; each calls `run_one`.

What a run writes besides the training run's own files (grail.training.run), in this order:
    compare_trained.json    after training's final save: a rerun evaluates, it does not retrain
    eval/final/<name>/      the evaluation (grail.evaluation.harness: samples.jsonl, results.json)
    extra_metrics.json      the EXTRA_EVALUATIONS' scalars and, with the plan's auroc_rows, the final model's
                            saliency AUROC (grail.analysis.compare.auroc)
    auroc_checkpoints.json  with auroc_rows: the same AUROC for every checkpoint-N still on disk, {"N": {name: v}};
                            the last checkpoint (final/'s weights) takes the final model's, computed once
    compare_result.json     the finished marker, written last: metrics, per-problem results, timings
With the plan's drop_checkpoints, the run's checkpoint-N folders (kept only to resume a killed run) are deleted once
the marker is written; final/ (the model evaluated) stays.

Hook for more per-run evaluations: append a function `(final_dir: Path, cfg: GRAILConfig, log) -> dict[str, float]`
to EXTRA_EVALUATIONS (also reachable as grail.analysis.compare.plan.EXTRA_EVALUATIONS); after the run's evaluation its
results are merged into extra_metrics.json, which the report tabulates per arm."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path

from grail.analysis.compare.auroc import AurocPlan, run_auroc
from grail.analysis.compare.summary import (
    CHECKPOINT_AUROC_FILE,
    EXTRA_METRICS_FILE,
    FINAL_EVAL_DIR,
    RESULT_FILE,
    run_path,
)
from grail.methods.table import METHODS, scoped_values
from grail.options.checkpoint_dirs import checkpoint_dirs
from grail.options.choices import WEIGHTING_FIELDS, WeightingOptions
from grail.options.fields import GRAILFields
from grail.training.config import GRAILConfig
from grail.training.overrides import build_config
from grail.training.resume import RUN_FILES, complete_checkpoints

__all__ = ["ArmConfig", "EXTRA_EVALUATIONS", "LOG_FILE", "Log", "TRAINED_FILE", "arm_config", "arm_record",
           "checkpoint_auroc", "drop_checkpoints", "evaluate_model", "lock", "run_one", "run_values", "write_json"]

Log = Callable[[str], None]
TRAINED_FILE = "compare_trained.json"
LOG_FILE = "compare.log"
EXTRA_EVALUATIONS: list[Callable[[Path, GRAILConfig, Log], dict[str, float]]] = []


def run_values(plan: dict, arm: dict | None, seed: int, out_dir: str | Path) -> dict:
    """The config values of one run: base (less the option fields its method does not read) < the arm's fields and
    method < the seed fields; `arm=None`: the base values with the seed (the evaluation's config)."""
    base = dict(plan["base"])
    method = arm["method"] if arm is not None else base.get("token_weighting", "none")
    values = scoped_values(base, METHODS[method])  # each arm gets the shared options its method reads
    if arm is not None:
        values.update(arm["fields"], token_weighting=arm["method"])
    values.update({name: seed for name in plan["seed_fields"]})
    values["output_dir"] = str(run_path(out_dir, arm["slug"], seed) if arm is not None else Path(out_dir))
    return values


@dataclass
class ArmConfig(GRAILFields):
    """One arm's configuration as its runs resolve it, less the seed fields: grail's fields (the token-weighting ones
    as they run: OAR's variant values, the method's own options with their defaults) and the TRL fields the comparison
    reads of an arm besides training. The plan records it for each arm (compare.json's arms[i]["resolved"], written
    by `make_plan`); the comparison's starts, data, steps and saliency AUROC read it there (`arm_config`), while
    training and evaluation build each run's whole config (`run_values`)."""

    temperature: float = 1.0
    max_steps: int = -1

    def weighting_options(self) -> WeightingOptions:
        """The arm's token-weighting options, as its runs' configs resolve them."""
        return WeightingOptions(**{name: getattr(self, name) for name in WEIGHTING_FIELDS},
                                temperature=self.temperature, method_options=dict(self.method_options or {}))


def arm_record(cfg: GRAILConfig, seed_fields) -> dict:
    """The plan's record of an arm (`ArmConfig`'s fields, less `seed_fields`) from one of its runs' configs."""
    values = cfg.to_dict()  # the weighting fields as they run
    return json.loads(json.dumps({f.name: values[f.name] for f in fields(ArmConfig) if f.name not in seed_fields}))


def arm_config(plan: dict, arm: dict, out_dir: str | Path) -> ArmConfig:
    """An arm's configuration as its runs resolve it: the plan's record, or, for a plan written before plans recorded
    it, the same record made now from the arm's config at its first seed."""
    record = arm.get("resolved")
    if record is None:
        cfg = build_config(run_values(plan, arm, plan.get("first_seed", 0), out_dir))
        record = arm_record(cfg, plan["seed_fields"])
    return ArmConfig(**record)


def write_json(path: Path, data: dict) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(temporary, path)


@contextlib.contextmanager
def lock(path: Path, wait: bool):
    """An exclusive lock on `path` (released when the process dies); `wait=False` raises if it is held."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no locking
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            raise ValueError(f"another grail compare is running in {path.parent}; wait for it to end, or give "
                             f"another --output_dir.") from None
        yield


# ---- one run ---------------------------------------------------------------------------------------------------

def _has_run_files(run_dir: Path) -> bool:
    return any((run_dir / name).exists() for name in RUN_FILES) or any(run_dir.glob("checkpoint-*"))


def _flat_metrics(prefix: str, scores) -> dict[str, float]:
    metrics = {}
    for s in scores:
        metrics[f"{prefix}/{s.name}/acc@{s.n}"] = s.acc_at_n.value
        metrics.update({f"{prefix}/{s.name}/pass@{k}": e.value for k, e in s.pass_at_k.items() if k > 1})
    return metrics


def _per_problem(scores, loaded) -> list[dict]:
    ids = {b.name: [p.id for p in b.problems] for b in loaded}
    return [{"name": s.name, "n": s.n, "problem_ids": ids[s.name], "per_problem_acc": list(s.per_problem_acc),
             "per_problem_pass": {str(k): list(v) for k, v in s.per_problem_pass.items()}} for s in scores]


def evaluate_model(plan: dict, out_dir: Path, seed: int, model_dir: Path, eval_dir: Path, log: Log,
                   grading_workers: int | None) -> tuple[dict, dict]:
    """The plan's evaluation (its protocol, with the evaluation config of `seed`) of the model in `model_dir`, a run's
    final model or the starting model (grail.analysis.compare.start): (flat metrics, per-problem results by
    evaluation name)."""
    from grail.models.warmstart import load_inference_model
    from grail.training.heldout import eval_device, eval_specs, heldout_accuracy

    cfg = build_config(run_values(plan, None, seed, out_dir))
    if plan["protocol"]["kind"] == "benchmarks":
        from transformers import AutoTokenizer

        from grail.evaluation.harness import run_evaluation
        from grail.options.prompts import PromptFormat
        from grail.options.sampling import HFSampler
        from grail.training.data import load_prompts
        from grail.training.run import CheckpointEval, resolve_prompt_fields
        from grail.training.shared_prompt import shared_prefill

        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        # the prompt format the model was trained with; a model grail did not train (the start) gets the one its
        # training would resolve for this tokenizer and data
        prompt = PromptFormat.load(model_dir) or resolve_prompt_fields(cfg, tokenizer, load_prompts(cfg))
        checkpoint_eval = CheckpointEval(cfg, eval_dir, log, prompt=prompt)  # its spec and problems
        model = load_inference_model(model_dir, eval_device(cfg))
        sampler = HFSampler(model, tokenizer, batch_size=checkpoint_eval.spec.batch_size,
                            generate=shared_prefill(model, model.generate) if cfg.shared_prompt else None)
        report = run_evaluation(sampler, tokenizer, checkpoint_eval.spec, eval_dir / "benchmarks",
                                workers=grading_workers, log=log, progress=False, loaded=checkpoint_eval.loaded)
        metrics = _flat_metrics("benchmarks", report.scores)
        if len(report.scores) > 1:
            metrics.update({f"benchmarks/{a['kind']}/acc@n": a["acc_at_n"]["value"]
                            for a in report.results["averages"]})
        return metrics, {"benchmarks": _per_problem(report.scores, checkpoint_eval.loaded)}
    from transformers import AutoTokenizer

    specs = eval_specs(cfg, AutoTokenizer.from_pretrained(model_dir))  # the prompt format training resolves for it
    (heldout,) = specs["greedy"].load_benchmarks(synthetic_set=cfg.synthetic_set())
    scores = heldout_accuracy(str(model_dir), specs, heldout, eval_dir, log, shared_prompt=cfg.shared_prompt,
                              device=eval_device(cfg))
    metrics = {k: v for name, score in scores.items() for k, v in _flat_metrics(name, [score]).items()}
    return metrics, {name: _per_problem([score], [heldout]) for name, score in scores.items()}


def run_one(plan: dict, out_dir: str | Path, slug: str, seed: int, log: Log = print,
            grading_workers: int | None = 1) -> dict:
    """Train (or resume) and evaluate one (arm, seed); returns its compare_result.json content. A finished run is
    returned as it is, without any work."""
    from grail.training.run import train

    out_dir = Path(out_dir)
    arm = next(a for a in plan["arms"] if a["slug"] == slug)
    run_dir = run_path(out_dir, slug, seed)
    if (run_dir / RESULT_FILE).is_file():
        return json.loads((run_dir / RESULT_FILE).read_text())
    start = time.perf_counter()
    with lock(run_dir / ".compare.lock", wait=True):  # a dying worker of a killed comparison may still hold it
        values = run_values(plan, arm, seed, out_dir)
        trained_earlier = (run_dir / TRAINED_FILE).is_file()  # then this clock covers only the evaluation
        if trained_earlier:
            trained = json.loads((run_dir / TRAINED_FILE).read_text())
            log(f"{arm['label']}/seed{seed}: trained earlier; evaluating")
        else:
            resume = bool(complete_checkpoints(run_dir))
            how = ({"resume_from_checkpoint": "true"} if resume
                   else {"overwrite_output_dir": True} if _has_run_files(run_dir) else {})
            log(f"{arm['label']}/seed{seed}: " + ("resuming from the last complete checkpoint" if resume else
                                                   "starting over (no complete checkpoint)" if how else "training"))
            result = train(build_config({**values, **how}), values, log)
            trained = {"steps": result.steps, "train_seconds": result.train_seconds,
                       "seconds_per_step": result.seconds_per_step, "resumed": resume}
            write_json(run_dir / TRAINED_FILE, trained)
        eval_start = time.perf_counter()
        final_dir = run_dir / "final"
        metrics, per_problem = evaluate_model(plan, out_dir, seed, final_dir, run_dir / FINAL_EVAL_DIR, log,
                                              grading_workers)
        extra_start = time.perf_counter()
        evaluations = list(EXTRA_EVALUATIONS)
        if plan.get("auroc_rows"):  # saliency quality of the final model (grail.analysis.compare.auroc)
            evaluations.append(lambda model_dir, cfg, log: run_auroc(model_dir, cfg, AurocPlan.of(plan)))
        if evaluations:
            extra_path = run_dir / EXTRA_METRICS_FILE
            extra = json.loads(extra_path.read_text()) if extra_path.is_file() else {}
            run_cfg = build_config(values)
            for evaluation in evaluations:
                extra.update(evaluation(final_dir, run_cfg, log))
            write_json(extra_path, extra)
        if plan.get("auroc_rows"):
            checkpoint_auroc(plan, out_dir, slug, seed, log)
        end = time.perf_counter()
        result = {"arm": arm["label"], "seed": seed, **trained, "trained_earlier": trained_earlier,
                  "eval_seconds": end - eval_start,
                  "eval_phase_seconds": eval_phases(run_dir / FINAL_EVAL_DIR, extra_start - eval_start,
                                                    end - extra_start),
                  "wall_seconds": end - start, "metrics": metrics, "evaluations": per_problem}
        write_json(run_dir / RESULT_FILE, result)  # last: the finished marker
    if plan.get("drop_checkpoints"):
        drop_checkpoints(run_dir, log)
    return result


def eval_phases(eval_dir: Path, accuracy_seconds: float, other_seconds: float) -> dict[str, float]:
    """Where a run's evaluation time went: each accuracy evaluation's sampling and grading (its harness's
    results.json "timing", by evaluation name: greedy and sampled, or benchmarks), the rest of the accuracy part
    (loading the model, writing), and the evaluations after it (the saliency AUROC and any extra evaluation). The
    parts add up to the accuracy and other seconds given. An evaluation resumed after a kill counts only the work
    done by this call."""
    phases = {}
    for results in sorted(eval_dir.glob("*/results.json")):
        timing = json.loads(results.read_text()).get("timing")
        if timing is not None:
            phases[results.parent.name] = timing["seconds"]
    phases["loading and writing"] = max(0.0, accuracy_seconds - sum(phases.values()))
    phases["auroc and extra evaluations"] = other_seconds
    return phases


def drop_checkpoints(run_dir: Path, log: Log = print) -> int:
    """Delete the checkpoint-N folders of a finished run (its compare_result.json exists; else nothing is deleted);
    returns how many. final/ is not a checkpoint and stays."""
    import shutil

    if not (run_dir / RESULT_FILE).is_file():
        return 0
    dropped = checkpoint_dirs(run_dir)
    for _, folder in dropped:
        shutil.rmtree(folder)
    if dropped:
        log(f"{run_dir}: finished; dropped {len(dropped)} checkpoint folder(s) (final/ kept)")
    return len(dropped)


def checkpoint_auroc(plan: dict, out_dir: str | Path, slug: str, seed: int, log: Log = print) -> dict[str, dict]:
    """The saliency AUROC (grail.analysis.compare.auroc, the plan's auroc_rows) of every complete checkpoint-N of one
    run, as {"N": {name: value}}, written to its auroc_checkpoints.json; checkpoints already there are not
    recomputed, so a run that finished before this file existed gets it on the comparison's next rerun. Only the
    checkpoints still on disk: with save_total_limit, the earlier ones were deleted during training."""
    arm = next(a for a in plan["arms"] if a["slug"] == slug)
    run_dir = run_path(out_dir, slug, seed)
    path = run_dir / CHECKPOINT_AUROC_FILE
    found = json.loads(path.read_text()) if path.is_file() else {}
    complete = set(complete_checkpoints(run_dir))
    missing = [(step, c) for step, c in checkpoint_dirs(run_dir) if c in complete and str(step) not in found]
    if not missing:
        return found
    cfg = arm_config(plan, arm, out_dir)
    auroc = AurocPlan.of(plan)
    final_step, final = _final_auroc(run_dir, cfg, auroc)
    for step, checkpoint in missing:
        if step == final_step and final:  # the last checkpoint holds final/'s weights: its AUROC, not a second pass
            found[str(step)] = final
            continue
        found[str(step)] = run_auroc(checkpoint, cfg, auroc)
        log(f"{arm['label']}/seed{seed}: saliency AUROC of {checkpoint.name} on {auroc.describe()}")
    write_json(path, dict(sorted(found.items(), key=lambda item: int(item[0]))))
    return found


def _final_auroc(run_dir: Path, cfg: ArmConfig, auroc: AurocPlan) -> tuple[int | None, dict[str, float]]:
    """(the step training ended at, the final model's run_auroc values from extra_metrics.json), or (None, {}) while
    either file is missing. Training saves final/ after its last step, so checkpoint-<that step> has the same
    weights."""
    trained_path, extra_path = run_dir / TRAINED_FILE, run_dir / EXTRA_METRICS_FILE
    if not trained_path.is_file() or not extra_path.is_file():
        return None, {}
    extra = json.loads(extra_path.read_text())
    names = auroc.names(cfg)
    return json.loads(trained_path.read_text()).get("steps"), {k: v for k, v in extra.items() if k in names}
