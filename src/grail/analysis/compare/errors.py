"""What changed, beside how much: the chain task's first errors in `grail compare`'s report.

For each held-out evaluation the runs recorded (greedy, sampled), the share of completions whose first error is each
class of `grail.tasks.chain_errors` (none, arithmetic, setup, steps, answer, unparsed): per arm over seeds, paired
with the reference arm, and for the start before RL. The accuracy table says how much an arm moved; this says
whether it moved the reasoning (setup errors: which quantities combine, and how) or the arithmetic (a right set-up
computed wrongly).

Read from the evaluations' samples, `runs/<arm>/seed<s>/eval/final/<evaluation>/samples.jsonl` and the start's
`before_rl/<id>/eval/<evaluation>/samples.jsonl` (an archive keeps both), against the reference solutions of the
held-out problems that each arm's task settings give. So a comparison finished before this table existed renders it
too. Only for comparisons on the synthetic chain task (task_style chains, the synthetic held-out protocol); for any
other the report has no such section.

Statistics as the accuracy table's (grail.analysis.compare.summary): a run's share is one value per seed (mean and
t-interval over seeds, paired differences from the reference arm); the start's, evaluated once, carries a t-interval
over problems (each problem's share of its samples).
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from grail.analysis.compare.stats import t_interval
from grail.analysis.compare.summary import (
    FINAL_EVAL_DIR,
    RunData,
    StartData,
    arm_stats,
    read_jsonl,
    start_eval_dir,
)
from grail.analysis.compare.sweep import layout
from grail.analysis.compare.tables import change_table, stat_tables
from grail.tasks.chain_errors import FIRST_ERRORS, first_error

__all__ = ["first_error_lines", "first_error_summary", "problem_shares"]

SAMPLES_FILE = "samples.jsonl"

References = dict[str, tuple[str, str]]  # problem id → (reference solution, answer)


def _references(plan: dict, arm: dict, out_dir: Path) -> References | None:
    """The held-out reference solutions of `arm`'s task, by problem id; None unless it trains on the chain task."""
    from grail.analysis.compare.run import arm_config
    from grail.evaluation.benchmark_sources import chain_solutions
    from grail.options.fields import SYNTHETIC_DATASET
    from grail.tasks.chain_problems import ChainConfig

    cfg = arm_config(plan, arm, out_dir)
    if cfg.dataset != SYNTHETIC_DATASET or cfg.task_style != ChainConfig.style:
        return None
    return chain_solutions(cfg.synthetic_set())


def problem_shares(path: Path, references: References) -> dict[str, dict[str, float]] | None:
    """{first error: {problem id: the share of that problem's samples in `path` with it}}; None if `path` is missing
    or holds no sample of the references' problems."""
    per_problem: dict[str, list[str]] = {}
    for row in read_jsonl(path):
        reference = references.get(str(row.get("problem_id")))
        if reference is not None and isinstance(row.get("completion"), str):
            per_problem.setdefault(str(row["problem_id"]), []).append(first_error(*reference, row["completion"]))
    if not per_problem:
        return None
    return {name: {pid: errors.count(name) / len(errors) for pid, errors in per_problem.items()}
            for name in FIRST_ERRORS}


def _mean(values: dict[str, float]) -> float:
    return sum(values.values()) / len(values)


def _change(before: dict[str, float], after: list[dict[str, float]], start_id: str, seeds: list[int]) -> dict:
    """One class's change from before RL for one arm, as summary's accuracy change: paired over problems (each
    problem's share averaged over the arm's seeds, minus its share before) and over seeds (each run's share minus the
    start's)."""
    common = [p for p in before if all(p in a for a in after)]
    return {"start": start_id, "before": _mean(before), "seeds": seeds,
            "over_seeds": asdict(t_interval([_mean(a) - _mean(before) for a in after])),
            "over_problems": asdict(t_interval([sum(a[p] for a in after) / len(after) - before[p] for p in common]))}


def first_error_summary(plan: dict, out_dir: str | Path, runs: list[RunData], start: StartData) -> dict:
    """{evaluation: {"stats": {first error: per-arm and paired statistics}, "before": the starts' shares (the
    accuracy table's `before_rl` shape), "change": {first error: {arm: its change from before RL}}}}; empty unless
    the comparison is on the chain task."""
    if plan["protocol"].get("kind") == "benchmarks":
        return {}
    out_dir = Path(out_dir)
    arms = [a["label"] for a in plan["arms"]]
    references = {a["label"]: _references(plan, a, out_dir) for a in plan["arms"]}
    if not any(references.values()):
        return {}
    lay = layout(plan)
    evaluations = dict.fromkeys(name for record in [*(r.result for r in runs if r.result), *start.starts.values()]
                                for name in record.get("evaluations") or {})  # as the runs recorded them
    summary = {}
    for evaluation in evaluations:
        shares = {(run.arm, run.seed): problem_shares(run.path / FINAL_EVAL_DIR / evaluation / SAMPLES_FILE,
                                                      references[run.arm])
                  for run in runs if run.result is not None and references.get(run.arm)}
        shares = {key: value for key, value in shares.items() if value}
        table = {name: {arm: {seed: _mean(value[name]) for (a, seed), value in shares.items() if a == arm}
                        for arm in arms} for name in FIRST_ERRORS}
        starts, change = {}, {}
        for sid, record in start.starts.items():
            members = [arm for arm in arms if start.arms.get(arm) == sid and references.get(arm)]
            before = members and problem_shares(start_eval_dir(out_dir, sid) / evaluation / SAMPLES_FILE,
                                                references[members[0]])
            if not before:
                continue
            starts[sid] = {"arms": members, "seed": record.get("seed"),
                           "over_problems": {name: asdict(t_interval(list(v.values()))) for name, v in before.items()}}
            for arm in members:
                mine = sorted((seed, value) for (a, seed), value in shares.items() if a == arm)
                for name in FIRST_ERRORS if mine else ():
                    change.setdefault(name, {})[arm] = _change(before[name], [v[name] for _, v in mine], sid,
                                                               [seed for seed, _ in mine])
        if shares or starts:
            summary[evaluation] = {"stats": {name: arm_stats(table[name], arms, lay) for name in FIRST_ERRORS},
                                   "before": {"starts": starts}, "change": change}
    return summary


def first_error_lines(s: dict) -> list[str]:
    """The report.md section of report.json's `first_errors` (none where the comparison is not on the chain task)."""
    errors = s.get("first_errors") or {}
    if not errors:
        return []
    lines = ["## First errors (chain task)", "",
             "Each completion's first step that differs from the reference solution's, read from the evaluations' "
             "samples (grail.tasks.chain_errors): `arithmetic`, the step's numbers and operator are right and its "
             "result is not; `setup`, a number or the operator is not the reference's (which quantities combine, and "
             "how: the reasoning); `steps`, right steps but too few or too many; `answer`, right steps and a wrong or "
             "missing box; `none`, no error. Later steps are not counted: a slip's consequences are not a second "
             "error. Shares of all completions, so `none` is close to accuracy.", ""]
    for evaluation, e in errors.items():
        lines += stat_tables(f"First errors, {evaluation} (percent of completions)", e["stats"], s["arms"], 100.0,
                             1, "percent; differences in points", before=e["before"])
        moved = {name: c for name, c in (e.get("change") or {}).items()  # the classes that occur
                 if any(c[arm]["before"] or e["stats"][name]["per_arm"][arm]["mean"] for arm in c)}
        lines += change_table(f"First errors, {evaluation}: change from before RL",
                              "share of completions with that first error", moved, e["stats"], s["arms"])
    return lines
