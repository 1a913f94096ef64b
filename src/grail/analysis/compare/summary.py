"""The summary of `grail compare`: statistics over seeds from the finished runs' files (report.json's content;
grail.analysis.compare.report writes it with report.md and the plots).

Reads, for each (arm, seed) run directory `runs/<arm-slug>/seed<s>/`:
    compare_result.json     the finished marker: the held-out metrics (fractions), per-problem results, timings
    metrics.jsonl           the training log: `reward` per step (learning curves) and the `weights/*` diagnostics
    extra_metrics.json      optional {name: number}: any further per-run evaluation (the final model's saliency
                            AUROC, or any other); tabulated per arm with the same intervals, and paired
    auroc_checkpoints.json  optional {"N": {name: number}}: the saliency AUROC at checkpoint N (AUROC over training)
    code.jsonl              one line per start and resume (grail.training.provenance): the commits and library
                            versions that trained the finished runs
and, in the comparison's directory, the starting model's measurements (`load_start`, the one reader of both):
    before_rl.json          each start's evaluation before RL, by the same protocol (grail.analysis.compare.start)
    auroc_warmstart.json    {arm label: {name: number}}: the start's saliency AUROC, step 0 of the AUROC curve

Statistics (the unit of replication is the training seed, not the problem; grail.analysis.compare.stats):
    per arm    mean over seeds ± t_{0.975, S−1} · sd / √S   (Student t-interval over the S per-seed values)
    paired     d_s = arm_s − reference_s for each seed s both have; the same t-interval over the d_s. The reference
               is the first arm, or with --sweep the first arm at the same swept value (grail.analysis.compare.sweep)
    seeds      half-width(S) = t_{0.975, S−1} · sd_d / √S; the S that brings it under d points, and the S that
               gives 80% power at a true difference d: (t_{0.975, S−1} + t_{0.80, S−1}) · sd_d / √S ≤ d
    before RL  the start is evaluated once (no seeds): its value carries a t-interval over the held-out problems.
               Each arm's change from it: paired over problems, d_p = mean over the arm's seeds of its accuracy on
               problem p − the start's on p, t-interval over the P problems (what one evaluation of the start
               supports); and over seeds, the t-interval of arm_s − before, which treats the before value as exact
With one seed there is no interval (the seed-to-seed spread is unknown); two seeds give one with t = 12.7.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from grail.analysis.compare.plots import POSITION_KEYS, WEIGHT_KEYS
from grail.analysis.compare.stats import (
    LEVEL,
    POWER,
    bootstrap_interval,
    holm,
    paired_interval,
    seeds_needed,
    sign_flip_p,
    t_interval,
    t_p,
    t_quantile,
)
from grail.analysis.compare.sweep import Layout, layout
from grail.analysis.compare.timing import step_ratios, step_seconds, weights_share
from grail.training.provenance import CODE_FILE, VERSION_KEYS

__all__ = ["BEFORE_RL_DIR", "BEFORE_RL_FILE", "CHECKPOINT_AUROC_FILE", "EXTRA_METRICS_FILE", "FINAL_EVAL_DIR",
           "RESULT_FILE", "WARMSTART_AUROC_FILE", "RunData", "StartData", "arm_stats", "clock_complete", "load_runs",
           "load_start", "paired_stats", "problem_values", "read_jsonl", "run_path", "start_eval_dir", "summarize",
           "trained_here"]

RESULT_FILE = "compare_result.json"  # written last by a run: its presence means finished
EXTRA_METRICS_FILE = "extra_metrics.json"
CHECKPOINT_AUROC_FILE = "auroc_checkpoints.json"  # per run: {"N": {name: value}} (grail.analysis.compare.run)
# per comparison: {arm label: {name: value}} (grail.analysis.compare.plan)
WARMSTART_AUROC_FILE = "auroc_warmstart.json"
FINAL_EVAL_DIR = Path("eval", "final")  # in a run directory: its final model's evaluation, one folder per evaluation
BEFORE_RL_FILE = "before_rl.json"  # per comparison: the starts' evaluation before RL (grail.analysis.compare.start)
BEFORE_RL_DIR = "before_rl"  # per comparison: before_rl/<start id>/eval/ holds that evaluation's harness files
RESOLVE_POINTS = (1.0, 2.0, 5.0)  # differences (points) the seeds-needed table is given for
SEED_COUNTS = (2, 3, 5, 10, 20, 50)
# TRL's logged completion statistics; `entropy` (the policy's mean token entropy on its completions) falls as
# sampling sharpens, the thing to read beside a gain in sampled accuracy
COMPLETION_KEYS = ("completions/mean_length", "completions/clipped_ratio", "entropy")
LAST_STEPS = 10


def plan_seeds(plan: dict) -> range:
    """The plan's training seeds: first_seed .. first_seed + seeds − 1 (first_seed 0 unless the plan sets it)."""
    first = plan.get("first_seed", 0)
    return range(first, first + plan["seeds"])


def run_path(out_dir: str | Path, slug: str, seed: int) -> Path:
    """The run directory of one (arm, seed)."""
    return Path(out_dir) / "runs" / slug / f"seed{seed}"


def start_eval_dir(out_dir: str | Path, start_id: str) -> Path:
    """Where the evaluation before RL of one start keeps its harness files (one folder per evaluation)."""
    return Path(out_dir) / BEFORE_RL_DIR / start_id / "eval"


# ---- reading the runs ----------------------------------------------------------------------------------------

@dataclass
class RunData:
    arm: str
    seed: int
    path: Path
    result: dict | None  # compare_result.json, None while unfinished
    log: list[dict]  # metrics.jsonl lines
    extra: dict[str, float]
    auroc_steps: dict[int, dict[str, float]] = field(default_factory=dict)  # step → name → AUROC (0: warm start)
    code: list[dict] = field(default_factory=list)  # code.jsonl: one line per start and resume of the run


def read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    lines = []
    for line in path.read_text().splitlines():
        try:
            lines.append(json.loads(line))
        except ValueError:
            continue  # a torn last line of a killed run
    return lines


def _numbers(path: Path, data) -> dict[str, float]:
    bad = [k for k, v in data.items() if not isinstance(v, int | float) or isinstance(v, bool)]
    if bad:
        raise ValueError(f"{path}: {bad[0]!r} is not a number; the file must map names to numbers. Delete the file "
                         f"and rerun the command to recompute it.")
    return data


def _warm_auroc(out_dir: Path, arms: list[str]) -> dict[str, dict[str, float]]:
    """auroc_warmstart.json as {arm label: {name: value}}; the flat {name: value} of earlier versions (one warm start
    for every arm) applies to every arm."""
    path = out_dir / WARMSTART_AUROC_FILE
    data = json.loads(path.read_text()) if path.is_file() else {}
    if data and not any(isinstance(v, dict) for v in data.values()):
        data = {arm: data for arm in arms}
    return {arm: _numbers(path, v) for arm, v in data.items() if arm in arms and isinstance(v, dict)}


@dataclass
class StartData:
    """What the comparison measured on its starting model(s), before any training."""

    arms: dict[str, str]  # arm label → start id (before_rl.json; empty before it exists)
    starts: dict[str, dict]  # start id → {"model_path", "seed", "metrics", "evaluations", "eval_seconds"}
    auroc: dict[str, dict[str, float]]  # arm label → the start's saliency AUROC under the arm's options


def load_start(out_dir: str | Path, arms: list[str]) -> StartData:
    """before_rl.json and auroc_warmstart.json of a comparison, for the given arms (either file may be missing)."""
    out_dir = Path(out_dir)
    path = out_dir / BEFORE_RL_FILE
    before = json.loads(path.read_text()) if path.is_file() else {}
    starts = before.get("starts") or {}
    return StartData({a: sid for a, sid in (before.get("arms") or {}).items() if a in arms and sid in starts}, starts,
                     _warm_auroc(out_dir, arms))


def load_runs(out_dir: str | Path, plan: dict, start: StartData | None = None) -> list[RunData]:
    """Every (arm, seed) of the plan with whatever its directory holds (step 0 of the AUROC curve from `start`)."""
    out_dir = Path(out_dir)
    warm = (start or load_start(out_dir, [a["label"] for a in plan["arms"]])).auroc
    runs = []
    for arm in plan["arms"]:
        for seed in plan_seeds(plan):
            path = run_path(out_dir, arm["slug"], seed)
            result_file, extra_file = path / RESULT_FILE, path / EXTRA_METRICS_FILE
            result = json.loads(result_file.read_text()) if result_file.is_file() else None
            extra = _numbers(extra_file, json.loads(extra_file.read_text())) if extra_file.is_file() else {}
            steps_file = path / CHECKPOINT_AUROC_FILE
            steps = {int(k): _numbers(steps_file, v) for k, v in
                     (json.loads(steps_file.read_text()) if steps_file.is_file() else {}).items()}
            if steps and arm["label"] in warm:
                steps[0] = warm[arm["label"]]
            runs.append(RunData(arm["label"], seed, path, result, read_jsonl(path / "metrics.jsonl"), extra,
                                dict(sorted(steps.items())), read_jsonl(path / CODE_FILE)))
    return runs


def _code(finished: list[RunData]) -> dict:
    """Which code trained the finished runs, from their code.jsonl (grail.training.provenance): attempts (a start or
    a resume) per commit, in the order met, and each library's versions seen."""
    attempts = [line for r in finished for line in r.code]
    commits: dict[str, int] = {}
    for line in attempts:
        key = ("not a git checkout" if line.get("commit") is None
               else line["commit"][:12] + (" with uncommitted changes" if line.get("dirty") else ""))
        commits[key] = commits.get(key, 0) + 1
    return {"runs": len(finished), "runs_without_record": sum(not r.code for r in finished),
            "attempts": len(attempts), "commits": commits,
            "versions": {name: sorted({str(line.get(name)) for line in attempts}) for name in VERSION_KEYS}}


def trained_here(result: dict) -> bool:
    """Whether the process that evaluated a finished run also trained it (in full, or from a checkpoint), so that its
    evaluation ran in one go: not when an earlier process trained it and this one only evaluated it
    (`trained_earlier`: the evaluation resumed its samples). A result written before `trained_earlier` was recorded
    shows that case as less wall time before its evaluation than its training took, which cannot happen in one
    process (the training's clock runs inside the run's)."""
    if "trained_earlier" in result:
        return not result["trained_earlier"]
    wall, evaluation, train = (result.get(k) for k in ("wall_seconds", "eval_seconds", "train_seconds"))
    return None in (wall, evaluation, train) or wall - evaluation >= train


def clock_complete(result: dict) -> bool:
    """Whether a finished run's `wall_seconds` (and its training and evaluation seconds) cover all of it: not when its
    training resumed from a checkpoint (`resumed`), nor when it was not trained by the process that evaluated it
    (trained_here)."""
    return not result.get("resumed") and trained_here(result)


def _key_mean(log: list[dict], key: str, last: int | None = None) -> float | None:
    """Mean of `key` over the log lines that hold it (the last `last` of them, if given)."""
    values = [line[key] for line in log if isinstance(line.get(key), int | float)]
    values = values[-last:] if last else values
    return sum(values) / len(values) if values else None


# ---- statistics ----------------------------------------------------------------------------------------------

def _per_arm(runs: list[RunData], arms: list[str], value_of) -> dict[str, dict[int, float]]:
    """arm → {seed: value} over the runs where value_of(run) is a number."""
    table: dict[str, dict[int, float]] = {arm: {} for arm in arms}
    for run in runs:
        value = value_of(run)
        if value is not None:
            table[run.arm][run.seed] = float(value)
    return table


def _per_arm_stats(table: dict[str, dict[int, float]], arms: list[str]) -> dict:
    """Each arm's t-interval over its seeds, with the seeds, JSON-ready (no paired differences: the diagnostics)."""
    return {arm: {**asdict(t_interval(list(table[arm].values()))), "seeds": sorted(table[arm])} for arm in arms}


def arm_stats(table: dict[str, dict[int, float]], arms: list[str], lay: Layout) -> dict:
    """Per-arm intervals and paired differences against each arm's reference, JSON-ready."""
    paired = {arm: paired_stats(table[lay.baseline[arm]], table[arm], lay.baseline[arm]) for arm in lay.paired}
    tested = [arm for arm in paired if paired[arm]["sign_flip_p"] is not None]
    for arm, p in zip(tested, holm([paired[arm]["sign_flip_p"] for arm in tested]), strict=True):
        paired[arm]["holm_p"] = p  # over this metric's arms compared with their references (stats.holm)
    t_tested = [arm for arm in paired if paired[arm]["t_p"] is not None]
    for arm, p in zip(t_tested, holm([paired[arm]["t_p"] for arm in t_tested]), strict=True):
        paired[arm]["t_holm_p"] = p  # the paired t-test's p, adjusted the same way
    return {"per_arm": _per_arm_stats(table, arms), "paired": paired}


def paired_stats(base: dict[int, float], other: dict[int, float], reference: str) -> dict:
    """The paired t-interval over seeds and the two checks that do not assume normality (compare.stats)."""
    seeds = sorted(set(base) & set(other))
    differences = [other[s] - base[s] for s in seeds]
    return {**asdict(paired_interval(base, other)), "seeds": seeds, "reference": reference, "t_p": t_p(differences),
            "sign_flip_p": sign_flip_p(differences), "bootstrap": bootstrap_interval(differences)}


def _auroc_training(runs: list[RunData], arms: list[str]) -> dict:
    """name → arm → step → {n, mean, min, max} over the seeds that have the AUROC at that step."""
    out: dict = {}
    for run in runs:
        for step, values in run.auroc_steps.items():
            for name, value in values.items():
                out.setdefault(name, {arm: {} for arm in arms})[run.arm].setdefault(str(step), []).append(value)
    return {name: {arm: {step: {"n": len(v), "mean": sum(v) / len(v), "min": min(v), "max": max(v)}
                         for step, v in sorted(steps.items(), key=lambda item: int(item[0]))}
                   for arm, steps in by_arm.items()} for name, by_arm in out.items()}


def problem_values(evaluations: dict, metric: str) -> dict[str, float] | None:
    """{problem id: value} of `metric` (`<evaluation>/<benchmark>/acc@n` or `.../pass@k`, as run.py flattens them)
    from a run's or a start's per-problem results; None where there are none (the benchmark averages)."""
    prefix, _, rest = metric.partition("/")
    name, _, stat = rest.rpartition("/")
    for entry in evaluations.get(prefix) or []:
        if entry["name"] != name:
            continue
        if stat == f"acc@{entry['n']}":
            values = entry["per_problem_acc"]
        elif stat.startswith("pass@") and stat.removeprefix("pass@") in entry["per_problem_pass"]:
            values = entry["per_problem_pass"][stat.removeprefix("pass@")]
        else:
            return None
        return dict(zip(map(str, entry["problem_ids"]), values, strict=True))
    return None


def _before_rl(start: StartData, finished: list[RunData], arms: list[str], metric_names: list[str]) -> dict:
    """Each start's values before RL (with a t-interval over problems) and each arm's change from its start: paired
    over problems and over seeds (module docstring)."""
    starts = {}
    for sid, record in start.starts.items():
        members = [arm for arm in arms if start.arms.get(arm) == sid]
        if not members:
            continue
        over_problems = {}
        for m in metric_names:
            values = problem_values(record["evaluations"], m)
            over_problems[m] = asdict(t_interval(list(values.values()))) if values else None
        starts[sid] = {"arms": members, "seed": record.get("seed"), "metrics": record["metrics"],
                       "over_problems": over_problems, "eval_seconds": record.get("eval_seconds")}
    change: dict = {}
    for m in metric_names:
        for arm in arms:
            sid = start.arms.get(arm)
            if sid not in starts or m not in starts[sid]["metrics"]:
                continue
            before = starts[sid]["metrics"][m]
            mine = [r for r in finished if r.arm == arm and m in r.result["metrics"]]
            seeds = t_interval([r.result["metrics"][m] - before for r in mine])
            by_problem = problem_values(start.starts[sid]["evaluations"], m)
            after = [problem_values(r.result.get("evaluations") or {}, m) for r in mine]
            problems = None
            if by_problem and after and all(after):
                common = [p for p in by_problem if all(p in a for a in after)]
                problems = asdict(t_interval([sum(a[p] for a in after) / len(after) - by_problem[p] for p in common]))
            change.setdefault(m, {})[arm] = {"start": sid, "before": before, "over_seeds": asdict(seeds),
                                             "over_problems": problems, "seeds": sorted(r.seed for r in mine)}
    return {"starts": starts, "change": change}


def summarize(plan: dict, runs: list[RunData], start: StartData | None = None) -> dict:
    """The content of report.json (see the module docstring for the statistics); `start`: load_start's (none: no
    before-RL row)."""
    arms = [a["label"] for a in plan["arms"]]
    lay = layout(plan)
    finished = [r for r in runs if r.result is not None]
    metric_names = list(dict.fromkeys(k for r in finished for k in r.result["metrics"]))
    extra_names = list(dict.fromkeys(k for r in finished for k in r.extra))
    metrics = {m: arm_stats(_per_arm(finished, arms, lambda r, m=m: r.result["metrics"].get(m)), arms, lay)
               for m in metric_names}
    extra = {m: arm_stats(_per_arm(finished, arms, lambda r, m=m: r.extra.get(m)), arms, lay)
             for m in extra_names}
    weights = {k: _per_arm_stats(_per_arm(finished, arms, lambda r, k=k: _key_mean(r.log, k)), arms)
               for k in (*WEIGHT_KEYS, *POSITION_KEYS)}
    completions = {f"{k}{suffix}": _per_arm_stats(_per_arm(finished, arms,
                                                           lambda r, k=k, n=n: _key_mean(r.log, k, n)), arms)
                   for k in COMPLETION_KEYS for suffix, n in (("", None), (f" (last {LAST_STEPS} steps)", LAST_STEPS))}
    untimed = [r for r in finished if clock_complete(r.result)]  # a resumed run's clock covers its last part
    timing = {k: _per_arm_stats(_per_arm(untimed, arms, lambda r, k=k: r.result.get(k)), arms)
              for k in ("train_seconds", "seconds_per_step", "eval_seconds")}
    phases = list(dict.fromkeys(k for r in untimed for k in r.result.get("eval_phase_seconds") or {}))
    if phases:  # where the evaluation's time went (runs of grail-rl before 2026-11-27 do not say)
        timing["eval_phase_seconds"] = {
            k: _per_arm_stats(_per_arm(untimed, arms, lambda r, k=k: (r.result.get("eval_phase_seconds") or {}).get(k)),
                              arms) for k in phases}
    timing["step_seconds"] = _per_arm_stats(_per_arm(finished, arms, lambda r: step_seconds(r.log)), arms)
    timing["step_ratio"] = step_ratios(_per_arm(finished, arms, lambda r: step_seconds(r.log)), lay)
    timing["weights_share"] = _per_arm_stats(_per_arm(finished, arms, lambda r: weights_share(r.log)), arms)
    timing["total"] = {
        "runs": len(finished), "resumed": len(finished) - len(untimed),  # in training or in evaluation
        "step_seconds": sum(step_seconds(r.log) or 0.0 for r in finished),
        "eval_seconds": sum(r.result.get("eval_seconds") or 0.0 for r in finished)
        + sum(s.get("eval_seconds") or 0.0 for s in (start.starts.values() if start else ())),
    }
    primary = plan["protocol"]["primary"]
    resolution = {}
    if primary in metrics:
        for arm, d in metrics[primary]["paired"].items():
            if d["sd"] is None:
                continue
            sd_points = 100 * d["sd"]
            resolution[arm] = {
                "sd_of_differences_points": sd_points,
                "half_width_points": {str(s): t_quantile((1 + LEVEL) / 2, s - 1) * sd_points / math.sqrt(s)
                                      for s in SEED_COUNTS},
                "seeds_for_half_width": {f"{p:g}": seeds_needed(sd_points, p) for p in RESOLVE_POINTS},
                "seeds_for_80pct_power": {f"{p:g}": seeds_needed(sd_points, p, power=POWER) for p in RESOLVE_POINTS},
                # the smallest true difference these n seeds detect with 80% power (the scale a null result speaks to)
                "detectable_80pct_power_points": sd_points / math.sqrt(d["n"])
                * (t_quantile((1 + LEVEL) / 2, d["n"] - 1) + t_quantile(POWER, d["n"] - 1)),
            }
    return {
        "arms": arms, "seeds": plan["seeds"], "first_seed": plan.get("first_seed", 0), "level": LEVEL,
        "auroc_rows": plan.get("auroc_rows", 0), "auroc_set": plan.get("auroc_set"),
        "auroc_methods": plan.get("auroc_methods"),
        "interval": "Student t over seeds: mean ± t_{0.975, S-1} · sd / sqrt(S); paired: the same over per-seed "
                    "differences from each arm's reference (the first arm; with --sweep, the first arm at the same "
                    "swept value)",
        "protocol": plan["protocol"], "seed_fields": plan.get("seed_fields", []),
        "runs": [{"arm": r.arm, "seed": r.seed, "run_dir": str(r.path), "finished": r.result is not None}
                 for r in runs],
        "metrics": metrics, "extra_metrics": extra, "weights": weights, "completions": completions, "timing": timing,
        "primary_metric": primary, "resolution": resolution, "reference": lay.baseline,
        "sweep": None if lay.field is None else {"field": lay.field, "values": list(lay.values),
                                                 "series": lay.series},
        "auroc_training": _auroc_training(runs, arms),
        "before_rl": _before_rl(start or StartData({}, {}, {}), finished, arms, metric_names),
        "auroc_warmstart": start.auroc if start else {},
        "code": _code(finished),
    }
