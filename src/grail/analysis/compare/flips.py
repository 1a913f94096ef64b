"""`grail compare --resume DIR --greedy-flips`: where greedy decoding's gains and losses lie, by how often the start's
samples were right on each problem.

Greedy accuracy's change is a difference of two larger counts, the problems greedy decoding newly solves (gained)
and those it no longer solves (lost) after RL (the report's "Sharpening or learning" section). This splits both by
the start's sampled record on each problem, k of its n samples right before RL (n = the sampled evaluation's
samples per problem):

    problems          held-out problems with k of n right at the start
    greedy solved     of those, how many the start's greedy answer solved
    gained, lost      per arm, the mean over its seeds of the problems greedy decoding gained and lost in that row
    gain rate         gained / the row's problems greedy decoding did not solve at the start
    loss rate         lost / those it solved

A row's net change follows its mix of solved and unsolved problems as much as the model: where most problems are
unsolved (small k), even a verdict that flips at random gains more than it loses. The rates do not have that mix in
them. Greedy decoding moving toward the start's sampled majority shows as a high gain rate at large k and a high
loss rate at small k; gains at k = 0 are problems on which the start's samples never found the answer.
Descriptive only: no interval, no rule.

Read from the per-problem accuracies that each run's result and each start's record keep for their evaluations
(grail.analysis.compare.summary.problem_values, through sharpening.problem_accuracy for the greedy verdicts), as
the sharpening section reads them.
"""

from __future__ import annotations

from pathlib import Path

from grail.analysis.compare.sharpening import GREEDY, SAMPLED, problem_accuracy
from grail.analysis.compare.summary import load_runs, load_start, problem_values

__all__ = ["flip_rows", "flips_text", "greedy_flips"]


def _right_counts(evaluations: dict) -> dict[str, tuple[int, int]]:
    """{benchmark/problem id: (right samples k, samples n)} of the sampled evaluation among `evaluations`."""
    counts = {}
    for entry in evaluations.get(SAMPLED) or []:  # as sharpening.problem_accuracy reads them, keeping each n
        n = int(entry["n"])
        values = problem_values(evaluations, f"{SAMPLED}/{entry['name']}/acc@{n}") or {}
        counts.update({f"{entry['name']}/{pid}": (round(acc * n), n) for pid, acc in values.items()})
    return counts


def _greedy(evaluations: dict) -> dict[str, bool]:
    """{benchmark/problem id: solved} of the greedy evaluation among `evaluations`."""
    return {problem: acc == 1.0 for problem, acc in problem_accuracy(evaluations, GREEDY).items()}


def _rate(count: float, of: int) -> float | None:
    return count / of if of else None


def flip_rows(start_evaluations: dict, runs_evaluations: list[dict]) -> list[dict]:
    """One row per k/n seen at the start (ordered by n, then k): the module docstring's columns, gained and lost as
    the mean over `runs_evaluations` (the runs of one arm from that start; each needs a greedy evaluation of the
    same problems)."""
    counts, before = _right_counts(start_evaluations), _greedy(start_evaluations)
    problems = [p for p in counts if p in before]
    afters = [_greedy(e) for e in runs_evaluations]
    rows = []
    for k, n in sorted({counts[p] for p in problems}, key=lambda kn: (kn[1], kn[0])):
        part = [p for p in problems if counts[p] == (k, n)]
        solved = sum(before[p] for p in part)
        gained = [sum(not before[p] and after.get(p, False) for p in part) for after in afters]
        lost = [sum(before[p] and not after.get(p, True) for p in part) for after in afters]
        mean_gained = sum(gained) / len(afters) if afters else 0.0
        mean_lost = sum(lost) / len(afters) if afters else 0.0
        rows.append({"right": f"{k}/{n}", "problems": len(part), "greedy_solved": solved,
                     "gained": mean_gained, "lost": mean_lost, "gained_by_seed": gained, "lost_by_seed": lost,
                     "gain_rate": _rate(mean_gained, len(part) - solved), "loss_rate": _rate(mean_lost, solved)})
    return rows


def greedy_flips(out_dir: str | Path, plan: dict) -> dict:
    """{arm: {"start": start id, "seeds": [...], "rows": flip_rows}} for each arm with a finished run whose result
    and start both hold greedy and sampled evaluations. ValueError naming what is missing when no arm has them."""
    arms = [a["label"] for a in plan["arms"]]
    start = load_start(out_dir, arms)
    runs = load_runs(out_dir, plan, start)
    out = {}
    for arm in arms:
        sid = start.arms.get(arm)
        record = start.starts.get(sid) or {}
        evaluations = record.get("evaluations") or {}
        if not (evaluations.get(GREEDY) and evaluations.get(SAMPLED)):
            continue
        finished = [r for r in runs if r.arm == arm and r.result is not None
                    and (r.result.get("evaluations") or {}).get(GREEDY)]
        if finished:
            finished.sort(key=lambda r: r.seed)
            out[arm] = {"start": sid, "seeds": [r.seed for r in finished],
                        "rows": flip_rows(evaluations, [r.result["evaluations"] for r in finished])}
    if not out:
        raise ValueError(f"--greedy-flips: {out_dir} has no finished run whose start was evaluated greedily and "
                         "sampled before RL (both are the default synthetic evaluation's; a comparison on "
                         "eval_benchmarks has no greedy evaluation).")
    return out


def _percent(rate: float | None) -> str:
    return "–" if rate is None else f"{rate:.0%}"


def flips_text(flips: dict) -> str:
    """The printed tables: one per arm, and the share of its gains on problems its start's samples never solved."""
    parts = []
    for arm, entry in flips.items():
        rows = entry["rows"]
        lines = [f"**{arm}** (from {entry['start']}; seeds {', '.join(map(str, entry['seeds']))}; gained and lost: "
                 "mean problems per seed)", "",
                 "| start's samples right | problems | greedy solved at start | gained | lost | net | gain rate "
                 "| loss rate |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for r in rows:
            lines.append(f"| {r['right']} | {r['problems']} | {r['greedy_solved']} | {r['gained']:.1f} | "
                         f"{r['lost']:.1f} | {r['gained'] - r['lost']:+.1f} | {_percent(r['gain_rate'])} | "
                         f"{_percent(r['loss_rate'])} |")
        gained = sum(r["gained"] for r in rows)
        never = sum(r["gained"] for r in rows if r["right"].startswith("0/"))
        lines += ["", f"Gained {gained:.1f}, lost {sum(r['lost'] for r in rows):.1f} a seed; "
                  + (f"{never / gained:.0%} of the gains on problems none of the start's samples solved."
                     if gained else "no gains.")]
        parts.append("\n".join(lines))
    return "\n\n".join(parts)
