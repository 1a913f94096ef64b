r"""`grail grader-check`: grade every benchmark's own references, a self-test of the loaders and the grader.

Per benchmark, with `grail.evaluation.grader.grade` (the function training and evaluation use):
  solution    a worked solution's last box against the answer field, where the data has worked solutions;
  round_trip  the reference answer put in a box, extracted and graded against itself;
  neighbour   (optional, slow) each answer in a box against the NEXT row's reference: should be rejected, so
              it catches a grader that accepts too much (the round trip cannot).
With scoring="release" the same checks run under the release's scoring (grail.evaluation.release_scoring): the
references are then `Problem.release_answer`, the text the release grades against, while the boxed answers stay the
same. On OlympiadBench that makes most of the round-trip failures the release's list-as-string reference causes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from grail.evaluation.benchmarks import BENCHMARK_NAMES, load_benchmark
from grail.evaluation.grader import PARSE_KINDS, grade_many, reference_parse
from grail.evaluation.reference_text import gold_latex
from grail.evaluation.release_scoring import SCORINGS, scoring_reference

__all__ = ["CHECKS", "format_grader_check", "grader_check", "SOLUTION_FIELDS", "SOLUTION_NOTES", "TARGETS"]

# ---- grader check on the benchmark data -----------------------------------------------------------------------
SOLUTION_FIELDS = {"math500": ("unique_id", "solution"), "aime24": ("id", "solution")}  # (id field, solution)
SOLUTION_NOTES = {
    "amc23": "no worked solution in the data",
    "minerva_math": "the reference IS the solution's last box: same as the round trip",
    "college_math": "no worked solution in the data",
    "olympiadbench": "its solutions hold no \\boxed{}",
}
TARGETS = {("math500", "solution"): 0.99, **{(name, "round_trip"): 0.995 for name in (
    "math500", "aime24", "amc23", "minerva_math", "college_math", "olympiadbench")}}  # the thresholds
CHECKS = ("solution", "round_trip", "neighbour")


def _solutions(data_dir: str | Path, name: str) -> dict[str, str]:
    """id -> worked solution, from the raw file (`grail.evaluation.benchmarks.Problem` carries no solution)."""
    id_field, solution_field = SOLUTION_FIELDS[name]
    with (Path(data_dir).expanduser() / name / "test.jsonl").open(encoding="utf-8") as lines:
        rows = [json.loads(line) for line in lines if line.strip()]
    return {str(row[id_field]): row[solution_field] for row in rows if isinstance(row.get(solution_field), str)}


def _same_reference(a: str, b: str, scoring: str) -> bool:
    """Two references that read the same (grail: after normalisation; release: as text) make no neighbour pair."""
    return gold_latex(a) == gold_latex(b) if scoring == "grail" else a == b


def grader_check(data_dir: str | Path, benchmarks: Sequence[str] | None = None, workers: int | None = None, *,
                 neighbour: bool = False, scoring: str = "grail") -> dict:
    r"""How far the grader agrees with the benchmark data itself, on every row (`grail grader-check`).

    References are the answers of `grail.evaluation.benchmarks.load_benchmark(name, data_dir=data_dir, size=None)`.
    Up to three checks per benchmark, each over its rows:
    - "solution" (math500, aime24 only): `grade(solution, answer)`, the worked solution's last box against the
      answer field; should be correct. None elsewhere, with the reason in "solution_note".
    - "round_trip": `grade("\boxed{" + answer + "}", answer)`; should be correct. Nearly a tautology when
      math-verify parses the answer (the same parse on both sides), so it catches references that do not parse,
      time out or do not equal themselves.
    - "neighbour" (only with neighbour=True): row i's answer boxed against row i+1's (cyclically), for the
      pairs whose `gold_latex` texts differ; should be incorrect ("timeout" counts as incorrect). It catches a
      lenient grader, except where two different texts are the same answer ("5" and "x=5"): read its
      disagreements before calling any of them a grader fault. Slow: sympy often times out comparing two
      unrelated equations (CollegeMath's ODE solutions), about 5 minutes for all six sets on 2 cores.
    scoring: "grail" (grail.evaluation.grader) or "release" (grail.evaluation.release_scoring, against
    Problem.release_answer). Returns {"data_dir", "scoring", "benchmarks": {name: {"n", "solution_note", "solution",
    "round_trip", "neighbour"}},
    "targets": [{"benchmark", "check", "threshold", "fraction", "met"}]}, a check being {"n", "agree",
    "fraction", "disagreements": [{"id", "reference", "extracted", "reason"}]} (or None when not run).
    """

    if scoring not in SCORINGS:
        raise ValueError(f"grader_check: scoring={scoring!r}; choose from {', '.join(map(repr, SCORINGS))}.")
    names = list(BENCHMARK_NAMES if benchmarks is None else benchmarks)
    jobs: list[tuple[str, str, str, str, str, bool]] = []  # (benchmark, check, id, completion, reference, expected)
    sizes = {}
    for name in names:
        problems = load_benchmark(name, data_dir=data_dir, size=None).problems
        sizes[name] = len(problems)
        solutions = _solutions(data_dir, name) if name in SOLUTION_FIELDS else {}
        for i, p in enumerate(problems):
            box, reference = "\\boxed{" + p.answer + "}", scoring_reference(p, scoring)
            if p.id in solutions:
                jobs.append((name, "solution", p.id, solutions[p.id], reference, True))
            jobs.append((name, "round_trip", p.id, box, reference, True))
            following = scoring_reference(problems[(i + 1) % len(problems)], scoring)
            if neighbour and not _same_reference(following, reference, scoring):
                jobs.append((name, "neighbour", p.id, box, following, False))
    results = grade_many([j[3] for j in jobs], [j[4] for j in jobs], workers=workers,
                         scoring=SCORINGS[scoring])
    parses = {name: reference_parses(load_benchmark(name, data_dir=data_dir, size=None).problems) for name in names}
    out: dict[str, Any] = {"data_dir": str(data_dir), "scoring": scoring, "benchmarks": {}, "targets": []}
    for name in names:
        entry: dict[str, Any] = {"n": sizes[name], "solution_note": SOLUTION_NOTES.get(name), "parse": parses[name]}
        for check in CHECKS:
            picked = [(j, r) for j, r in zip(jobs, results, strict=True) if j[0] == name and j[1] == check]
            disagreements = [{"id": j[2], "reference": j[4], "extracted": r.extracted, "reason": r.reason}
                             for j, r in picked if r.correct != j[5]]
            n = len(picked)
            entry[check] = {"n": n, "agree": n - len(disagreements), "fraction": 1 - len(disagreements) / n,
                            "disagreements": disagreements} if n else None
            threshold = TARGETS.get((name, check))
            if threshold is not None and entry[check] is not None:
                fraction = entry[check]["fraction"]
                out["targets"].append({"benchmark": name, "check": check, "threshold": threshold,
                                       "fraction": fraction, "met": fraction >= threshold})
        out["benchmarks"][name] = entry
    return out


def reference_parses(problems) -> dict:
    """How math-verify reads each problem's reference (`grail.evaluation.grader.reference_parse`), before grail's
    normalisation ("\\boxed{" + answer + "}") and after it (`gold_latex`, what the grader parses):
    {"before": {kind: count}, "after": {kind: count}, "listed": [{"id", "reference", "before", "after", "extracted"}]},
    listing every reference that is not "math" before or after (a text fallback or a partial parse; "extracted": the
    text math-verify kept, after normalisation)."""
    counts: dict[str, dict[str, int]] = {"before": dict.fromkeys(PARSE_KINDS, 0),
                                         "after": dict.fromkeys(PARSE_KINDS, 0)}
    listed = []
    for p in problems:
        before, _ = reference_parse(p.answer, normalise=False)
        after, extracted = reference_parse(p.answer)
        counts["before"][before] += 1
        counts["after"][after] += 1
        if before != "math" or after != "math":
            listed.append({"id": p.id, "reference": p.answer, "before": before, "after": after, "extracted": extracted})
    return {**counts, "listed": listed}


def _cell(check: dict | None, note: str | None = None) -> str:
    if check is None:
        return f"— ({note})" if note else "—"
    return f"{check['agree']}/{check['n']} ({100 * check['fraction']:.1f}%)"


def _short(text: str | None, limit: int = 70) -> str:
    if text is None:
        return "(none)"
    text = " ".join(text.split()).replace("|", "\\|")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def format_grader_check(result: dict, show: int | None = None) -> str:
    """`grader_check`'s result as markdown: the agreement table, the targets, then the disagreements of each
    check (the first `show` of them; None: all)."""
    lines = [f"Scoring: {result.get('scoring', 'grail')}", "",
             "| benchmark | n | solution vs answer | round trip | neighbour rejected |", "|---|---|---|---|---|"]
    for name, entry in result["benchmarks"].items():
        lines.append(f"| {name} | {entry['n']} | {_cell(entry['solution'], entry['solution_note'])} "
                     f"| {_cell(entry['round_trip'])} | {_cell(entry['neighbour'], 'not run')} |")
    lines += ["", "References math-verify does not read as mathematics (grail.evaluation.grader.reference_parse): "
              "partial = text only, cut off; text = text only, whole; none = nothing. Before = boxed as written, "
              "after = grail's "
              "normalisation (what the grader parses).", "",
              "| benchmark | partial before | partial after | text before | text after | none before | none after |",
              "|---|---|---|---|---|---|---|"]
    for name, entry in result["benchmarks"].items():
        before, after = entry["parse"]["before"], entry["parse"]["after"]
        cells = " | ".join(f"{before[k]} | {after[k]}" for k in ("partial", "text", "none"))
        lines.append(f"| {name} | {cells} |")
    lines.append("")
    for target in result["targets"]:
        lines.append(f"- {target['benchmark']} {target['check']}: {100 * target['fraction']:.2f}% "
                     f"(target >= {100 * target['threshold']:.1f}%): {'met' if target['met'] else 'NOT MET'}")
    for name, entry in result["benchmarks"].items():
        listed = entry["parse"]["listed"]
        if listed:
            lines += ["", f"{name}: {len(listed)} reference(s) not read as mathematics before or after", "",
                      "| id | reference | before | after | extracted (after) |", "|---|---|---|---|---|"]
            lines += [f"| {_short(d['id'], 50)} | {_short(d['reference'])} | {d['before']} | {d['after']} "
                      f"| {_short(d['extracted'])} |" for d in (listed if show is None else listed[:show])]
        for check in CHECKS:
            if entry[check] is None or not entry[check]["disagreements"]:
                continue
            disagreements = entry[check]["disagreements"]
            listed = disagreements if show is None else disagreements[:show]
            more = f" (first {len(listed)} listed)" if len(listed) < len(disagreements) else ""
            lines += ["", f"{name} {check}: {len(disagreements)} disagreement(s){more}", "",
                      "| id | reference | extracted | reason |", "|---|---|---|---|"]
            lines += [f"| {_short(d['id'], 50)} | {_short(d['reference'])} | {_short(d['extracted'])} | {d['reason']} |"
                      for d in listed]
    return "\n".join(lines)
