"""Sharpening or learning: where an arm's gain in sampled accuracy came from, in `grail compare`'s report.

RL can raise sampled accuracy without the model learning to solve anything new, by concentrating its samples on the
answer that greedy decoding already gives. To tell the two apart, the held-out problems are split by the start's
greedy answer before RL: `solved` (right) and `unsolved` (wrong). For each run:

    sampled change, solved      mean over the solved problems of (sampled accuracy after − before), in points
    sampled change, unsolved    the same over the unsolved problems
    greedy gained               unsolved problems that greedy decoding solves after RL
    greedy lost                 solved problems that it no longer solves (greedy accuracy's change is gained − lost)

then per arm over seeds and paired with the reference arm, as every statistic of the report. A gain on the solved
problems alone is sharpening; a gain on the unsolved ones is the model sampling right answers that its greedy
decoding missed before. Greedy decoding flips many problems both ways in a run, so gained and lost say more than
their difference.

Read from the per-problem accuracies that each run's result and each start's record keep for their evaluations
(grail.analysis.compare.summary.problem_values), so nothing is read again from disk. Only where the start and the
runs have both evaluations; otherwise the report has no such section.
"""

from __future__ import annotations

from grail.analysis.compare.summary import RunData, StartData, arm_stats, problem_values
from grail.analysis.compare.sweep import layout
from grail.analysis.compare.tables import stat_tables

__all__ = ["problem_accuracy", "sharpening_lines", "sharpening_summary"]

GREEDY, SAMPLED = "greedy", "sampled"
CHANGES = ("sampled change, solved", "sampled change, unsolved")
FLIPS = ("greedy gained", "greedy lost")


def problem_accuracy(evaluations: dict, name: str) -> dict[str, float]:
    """{benchmark/problem id: accuracy} of the evaluation `name` among a run's or a start's recorded `evaluations`
    (each benchmark's acc@n per problem); empty where it has none."""
    accuracy = {}
    for entry in evaluations.get(name) or []:
        values = problem_values(evaluations, f"{name}/{entry['name']}/acc@{entry['n']}") or {}
        accuracy.update({f"{entry['name']}/{pid}": value for pid, value in values.items()})
    return accuracy


def _run_values(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]) -> dict[str, float] | None:
    """One run's four values (module docstring) from the start's and the run's per-problem accuracies."""
    problems = [p for p in before[GREEDY] if p in before[SAMPLED] and p in after[GREEDY] and p in after[SAMPLED]]
    solved = [p for p in problems if before[GREEDY][p] == 1.0]
    unsolved = [p for p in problems if before[GREEDY][p] == 0.0]
    if not solved or not unsolved:
        return None

    def change(part: list[str]) -> float:
        return sum(after[SAMPLED][p] - before[SAMPLED][p] for p in part) / len(part)

    return {CHANGES[0]: change(solved), CHANGES[1]: change(unsolved),
            FLIPS[0]: float(sum(after[GREEDY][p] == 1.0 for p in unsolved)),
            FLIPS[1]: float(sum(after[GREEDY][p] == 0.0 for p in solved))}


def sharpening_summary(plan: dict, runs: list[RunData], start: StartData) -> dict:
    """{"stats": {quantity: per-arm and paired statistics}, "split": {start id: {"solved": n, "unsolved": n}}};
    empty where no start and run have both evaluations."""
    arms = [a["label"] for a in plan["arms"]]
    befores = {sid: {name: problem_accuracy(record.get("evaluations") or {}, name) for name in (GREEDY, SAMPLED)}
               for sid, record in start.starts.items()}
    table: dict[str, dict[str, dict[int, float]]] = {q: {arm: {} for arm in arms} for q in (*CHANGES, *FLIPS)}
    split = {}
    for run in runs:
        before = befores.get(start.arms.get(run.arm, ""))
        if run.result is None or before is None or not all(before.values()):
            continue
        after = {name: problem_accuracy(run.result.get("evaluations") or {}, name) for name in (GREEDY, SAMPLED)}
        values = all(after.values()) and _run_values(before, after)
        if not values:
            continue
        for quantity, value in values.items():
            table[quantity][run.arm][run.seed] = value
        greedy = before[GREEDY]
        split[start.arms[run.arm]] = {"solved": sum(v == 1.0 for v in greedy.values()),
                                      "unsolved": sum(v == 0.0 for v in greedy.values())}
    if not split:
        return {}
    lay = layout(plan)
    return {"stats": {q: arm_stats(table[q], arms, lay) for q in table}, "split": split}


def sharpening_lines(s: dict) -> list[str]:
    """The report.md section of report.json's `sharpening` (none where it is absent)."""
    sharp = s.get("sharpening") or {}
    if not sharp:
        return []
    parts = "; ".join(f"{sid}: {n['solved']} solved, {n['unsolved']} unsolved" for sid, n in sharp["split"].items())
    lines = ["## Sharpening or learning", "",
             "The held-out problems split by the start's greedy answer before RL, solved or unsolved "
             f"({parts}). A gain in sampled accuracy on the solved problems alone is sharpening (samples "
             "concentrating on the answer greedy decoding already gave); a gain on the unsolved ones is sampling "
             "right answers that greedy decoding missed. Greedy gained and lost count the problems greedy decoding "
             "newly solves and no longer solves after RL: greedy accuracy's change is their difference.", ""]
    stats = sharp["stats"]
    lines += stat_tables("Sampled accuracy's change by the start's greedy answer (points)",
                         {q: stats[q] for q in CHANGES}, s["arms"], 100.0, 1, "points")
    lines += stat_tables("Greedy answers gained and lost (problems)", {q: stats[q] for q in FLIPS},
                                s["arms"], 1.0, 1, "problems")
    return lines
