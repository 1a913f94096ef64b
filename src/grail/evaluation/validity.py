"""`grail validity`: is a model in a regime where RL credit can matter? The table from four evaluations.

Pure: reads the evaluation directories that `grail eval` wrote (samples.jsonl, results.json, run.json) and the
benchmark's reference answers; no model, no torch. The four evaluations (LEGS, one directory each under the
command's output directory):

    sampled              n samples per problem at T = 1, top-p 1, top-k 0 (GRPO's groups)
    greedy               one greedy sample per problem
    answer-only-greedy   the response prefilled with `\\boxed{` (`grail eval --response-prefix answer-only`), at most
    answer-only-sampled  ANSWER_ONLY_TOKENS new tokens: the answer without reasoning, greedy and sampled as above

The table (`validity_table`):
    accuracy            acc@n of each evaluation with the 95% interval results.json reports (one benchmark: its own;
                        several: the size-weighted average, i.e. over all their problems)
    mixed groups        share of problems whose n sampled answers are neither all right nor all wrong (0 < c < n):
                        GRPO's group-relative advantage is zero on the others, so only these carry any credit
    best constant       the largest share of problems sharing one reference answer (the exact text): what
                        answering that one value to every problem scores; counted on the whole split when the
                        evaluation took a subset (`split_references`: a subset can hold a repeated answer by chance),
                        the subset's own figure beside it
    completion lengths  tokens of the sampled and greedy completions: mean, median, 95th percentile (nearest rank:
                        the ⌈0.95·N⌉-th smallest); share with no box; share truncated (tokens = max_new_tokens: a
                        completion whose end-of-sequence token is the last one allowed counts too)

    first errors        chain problems only (`solutions` given): the share of the sampled and greedy completions
                        whose first step that differs from the reference solution is an arithmetic slip, a wrong
                        set-up, ... (grail.tasks.chain_errors): where the failures lie; descriptive, not a criterion

The criteria (`Thresholds`, their one home) and the regime qualifies when every one passes (bounds inclusive):
    sampled accuracy in [sampled_min, sampled_max]; mixed share ≥ mixed_min; best constant ≤ constant_max;
    answer-only accuracy ≤ answer_only_ratio_max × the accuracy with reasoning, greedy against greedy and sampled
    against sampled.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from grail.tasks.chain_errors import FIRST_ERRORS, first_error_counts

__all__ = [
    "ANSWER_ONLY_TOKENS", "best_constant", "first_error_shares", "format_markdown", "LEGS", "Leg", "LegResult",
    "leg_result",
    "length_stats", "mixed_share", "read_leg", "REASONING_LEGS", "Thresholds", "validity_table", "write_table"
]

REASONING_LEGS = ("sampled", "greedy")  # the legs that reason (their lengths and first errors are tabulated)
ANSWER_ONLY_TOKENS = 8  # new tokens after the prefilled `\boxed{`: room for an integer and the closing brace


@dataclass(frozen=True)
class Leg:
    """One evaluation of the table: its directory name and how it samples."""

    name: str
    greedy: bool
    answer_only: bool

    def eval_flags(self, samples: int, max_new_tokens: int) -> list[str]:
        """The `grail eval` flags that make this leg (the rest, model, benchmarks, seed..., are the command's).
        The sampled leg's are exactly `--samples N --temperature 1.0 --top-p 1.0 --top-k 0 --max-new-tokens M`,
        so a directory `grail eval` wrote with them can be moved into place and is reused."""
        flags = ["--samples", "1" if self.greedy else str(samples), "--temperature", "0" if self.greedy else "1.0",
                 "--top-p", "1.0", "--top-k", "0",
                 "--max-new-tokens", str(ANSWER_ONLY_TOKENS if self.answer_only else max_new_tokens)]
        return flags + (["--response-prefix", "answer-only"] if self.answer_only else [])


LEGS = (Leg("sampled", greedy=False, answer_only=False), Leg("greedy", greedy=True, answer_only=False),
        Leg("answer-only-greedy", greedy=True, answer_only=True),
        Leg("answer-only-sampled", greedy=False, answer_only=True))


@dataclass(frozen=True)
class Thresholds:
    """The criteria of a regime where RL credit can matter (module docstring); printed with every table."""

    sampled_min: float = 0.25  # below: few groups have a right answer to reinforce
    sampled_max: float = 0.60  # above: few groups have a wrong one
    mixed_min: float = 0.60  # share of problems whose group is mixed
    constant_max: float = 0.03  # the best constant answer's accuracy
    answer_only_ratio_max: float = 0.5  # answer-only accuracy / accuracy with reasoning


@dataclass(frozen=True)
class LegResult:
    """What the table reads from one evaluation: acc@n with its interval ({"value", "low", "high"}, from
    results.json), each problem's correct flags (P problems → (N,)), every completion's tokens, and the counts of
    completions without a box and of those that reached `max_new_tokens`; each problem's completions (P → (N,))."""

    accuracy: dict[str, float]
    correct_PN: dict[tuple[str, str], list[bool]]
    tokens: list[int]
    no_box: int
    truncated: int
    max_new_tokens: int
    completions_PN: dict[tuple[str, str], list[str]] = field(default_factory=dict)


def leg_result(records: Sequence[dict], results: dict, run: dict) -> LegResult:
    """A `LegResult` from an evaluation's sample records (samples.jsonl's lines), results.json and run.json."""
    names = [b["name"] for b in results["benchmarks"]]
    if len(names) == 1:
        accuracy = results["benchmarks"][0]["acc_at_n"]
    else:
        accuracy = next(a for a in results["averages"] if a["kind"] == "size_weighted")["acc_at_n"]
    correct_PN: dict[tuple[str, str], list[bool]] = defaultdict(list)
    completions_PN: dict[tuple[str, str], list[str]] = defaultdict(list)
    for r in sorted(records, key=lambda r: r["sample_index"]):
        correct_PN[r["benchmark"], r["problem_id"]].append(bool(r["correct"]))
        completions_PN[r["benchmark"], r["problem_id"]].append(str(r.get("completion", "")))
    max_new_tokens = run["sampling"]["max_new_tokens"]
    return LegResult(accuracy=dict(accuracy), correct_PN=dict(correct_PN), tokens=[r["tokens"] for r in records],
                     no_box=sum(r["reason"] == "no_box" for r in records),
                     truncated=sum(r["tokens"] >= max_new_tokens for r in records), max_new_tokens=max_new_tokens,
                     completions_PN=dict(completions_PN))


def read_leg(directory: str | Path) -> LegResult:
    """`leg_result` of an evaluation directory; an error naming the directory and the fix when it is unfinished."""
    directory = Path(directory)
    missing = [name for name in ("run.json", "samples.jsonl", "results.json") if not (directory / name).is_file()]
    if missing:
        raise ValueError(f"{directory} has no {', '.join(missing)}: it is not a finished evaluation; run grail "
                         f"validity with --model and --output-dir to make (or finish) it.")
    run = json.loads((directory / "run.json").read_text())
    results = json.loads((directory / "results.json").read_text())
    records = [json.loads(line) for line in (directory / "samples.jsonl").read_text().splitlines() if line]
    expected = sum(b["num_problems"] for b in results["benchmarks"]) * run["sampling"]["n"]
    if len(records) != expected:
        raise ValueError(f"{directory}/samples.jsonl holds {len(records)} samples, results.json {expected}: the "
                         f"evaluation is unfinished; rerun grail validity with the same arguments to finish it.")
    return leg_result(records, results, run)


def best_constant(references: Sequence[str]) -> tuple[str, float]:
    """(the most frequent reference answer, its share of the problems): the accuracy of answering it to all."""
    if not references:
        raise ValueError("best_constant: no reference answers.")
    answer, count = Counter(a.strip() for a in references).most_common(1)[0]
    return answer, count / len(references)


def mixed_share(correct_PN: Mapping[object, Sequence[bool]]) -> float:
    """The share of problems with 0 < c < n correct of their n samples."""
    if not correct_PN:
        raise ValueError("mixed_share: no problems.")
    return sum(0 < sum(c_N) < len(c_N) for c_N in correct_PN.values()) / len(correct_PN)


def length_stats(leg: LegResult) -> dict[str, float]:
    """Completion tokens: mean, median, p95 (nearest rank), and the shares with no box and truncated."""
    ordered = sorted(leg.tokens)
    count = len(ordered)
    return {"mean": statistics.fmean(ordered), "median": statistics.median(ordered),
            "p95": ordered[max(math.ceil(0.95 * count), 1) - 1], "no_box": leg.no_box / count,
            "truncated": leg.truncated / count, "max_new_tokens": leg.max_new_tokens}


def _criterion(name: str, value: float, low: float | None, high: float | None, bound: str) -> dict:
    passed = (low is None or value >= low) and (high is None or value <= high)
    return {"criterion": name, "value": value, "threshold": bound, "low": low, "high": high, "pass": passed}


def validity_table(legs: Mapping[str, LegResult], references: Mapping[tuple[str, str], str],
                   thresholds: Thresholds = Thresholds(),
                   split_references: Sequence[str] | None = None,
                   solutions: Mapping[tuple[str, str], tuple[str, str]] | None = None) -> dict:
    """The table as JSON-ready data: each leg's accuracy, the mixed share, the best constant, the completion lengths
    of the reasoning legs, each criterion (value, threshold, pass) and whether the regime qualifies.

    Args:
        legs: a LegResult for each of LEGS' names; all on the same problems.
        references: each problem's reference answer, by (benchmark, problem id).
        split_references: every reference answer of the whole split the problems were drawn from, when the
            evaluation took a subset: the best constant is counted on them (None: on `references`).
        solutions: chain problems' reference solutions and answers, by (benchmark, problem id): the first errors of
            the sampled and greedy completions of the problems it holds (None: no first errors).
    """
    missing = [leg.name for leg in LEGS if leg.name not in legs]
    if missing:
        raise ValueError(f"validity_table: no result for {', '.join(missing)}; it needs all of "
                         f"{', '.join(leg.name for leg in LEGS)}.")
    problems = set(legs["sampled"].correct_PN)
    other = [leg.name for leg in LEGS if set(legs[leg.name].correct_PN) != problems]
    if other or set(references) != problems:
        which = ", ".join(other) or "the reference answers"
        raise ValueError(f"validity_table: the evaluations are not on the same problems ({which} differ from "
                         f"sampled's {len(problems)}); evaluate every leg with the same --benchmarks, --size and "
                         f"subset.")
    acc = {leg.name: legs[leg.name].accuracy["value"] for leg in LEGS}
    mixed = mixed_share(legs["sampled"].correct_PN)
    evaluated_answer, evaluated = best_constant(list(references.values()))
    whole = list(split_references) if split_references is not None else list(references.values())
    constant_answer, constant = best_constant(whole)
    t = thresholds
    ratio = t.answer_only_ratio_max
    criteria = [
        _criterion("sampled accuracy", acc["sampled"], t.sampled_min, t.sampled_max,
                   f"{t.sampled_min:.0%} to {t.sampled_max:.0%}"),
        _criterion("mixed groups", mixed, t.mixed_min, None, f"≥ {t.mixed_min:.0%}"),
        _criterion("best constant", constant, None, t.constant_max, f"≤ {t.constant_max:.0%}"),
        _criterion("answer-only greedy accuracy", acc["answer-only-greedy"], None, ratio * acc["greedy"],
                   f"≤ {ratio:g} × greedy = {ratio * acc['greedy']:.1%}"),
        _criterion("answer-only sampled accuracy", acc["answer-only-sampled"], None, ratio * acc["sampled"],
                   f"≤ {ratio:g} × sampled = {ratio * acc['sampled']:.1%}"),
    ]
    return {"problems": len(problems), "samples": len(next(iter(legs["sampled"].correct_PN.values()))),
            "accuracy": {leg.name: legs[leg.name].accuracy for leg in LEGS}, "mixed_share": mixed,
            "best_constant": {"answer": constant_answer, "accuracy": constant, "problems": len(whole),
                              "evaluated": {"answer": evaluated_answer, "accuracy": evaluated}},
            "lengths": {name: length_stats(legs[name]) for name in REASONING_LEGS},
            "thresholds": asdict(thresholds), "criteria": criteria,
            "qualifies": all(c["pass"] for c in criteria),
            **({"first_errors": first_error_shares(legs, solutions)} if solutions else {})}


def first_error_shares(legs: Mapping[str, LegResult], solutions: Mapping[tuple[str, str], tuple[str, str]]
                       ) -> dict[str, dict[str, float]]:
    """{leg: {first error: share of its completions}} of the sampled and greedy legs, over the problems `solutions`
    holds (grail.tasks.chain_errors)."""
    shares = {}
    for name in REASONING_LEGS:
        counts = first_error_counts((*solutions[key], text) for key, texts in legs[name].completions_PN.items()
                                    if key in solutions for text in texts)
        total = sum(counts.values())
        if total:
            shares[name] = {error: counts[error] / total for error in FIRST_ERRORS}
    return shares


def _percent(estimate: Mapping[str, float]) -> str:
    return f"{estimate['value']:.1%} [{estimate['low']:.1%}, {estimate['high']:.1%}]"


def format_markdown(table: dict) -> str:
    """The table as markdown: accuracies with their 95% intervals, completion lengths, the criteria, then (chain
    problems) the first errors."""
    lines = [f"Validity on {table['problems']} problems ({table['samples']} samples per problem when sampled).", "",
             "| evaluation | accuracy [95% interval] |", "|---|---|"]
    lines += [f"| {name} | {_percent(estimate)} |" for name, estimate in table["accuracy"].items()]
    lines += ["", "| completions | mean tokens | median | p95 | no box | truncated (max tokens) |",
              "|---|---|---|---|---|---|"]
    lines += [f"| {name} | {s['mean']:.1f} | {s['median']:g} | {s['p95']} | {s['no_box']:.1%} | "
              f"{s['truncated']:.1%} ({s['max_new_tokens']}) |" for name, s in table["lengths"].items()]
    lines += ["", "| criterion | value | threshold | result |", "|---|---|---|---|"]
    lines += [f"| {c['criterion']} | {c['value']:.1%} | {c['threshold']} | {'pass' if c['pass'] else 'FAIL'} |"
              for c in table["criteria"]]
    constant = table["best_constant"]
    subset = constant["evaluated"]
    on = (f" (on the whole split of {constant['problems']} problems; on the {table['problems']} evaluated: "
          f"{subset['answer']}, {subset['accuracy']:.1%})" if constant["problems"] != table["problems"] else "")
    lines += ["", f"Best constant answer: {constant['answer']}{on}. The regime "
              + ("qualifies: every criterion passes." if table["qualifies"] else "does NOT qualify.")]
    if table.get("first_errors"):
        lines += ["", "| first error (chain task) | " + " | ".join(FIRST_ERRORS) + " |",
                  "|---|" + "---|" * len(FIRST_ERRORS)]
        lines += [f"| {name} | " + " | ".join(f"{shares[e]:.1%}" for e in FIRST_ERRORS) + " |"
                  for name, shares in table["first_errors"].items()]
    return "\n".join(lines)


def write_table(directory: str | Path, table: dict) -> str:
    """Write validity.json and validity.md into `directory`; returns the markdown."""
    directory = Path(directory)
    markdown = format_markdown(table)
    (directory / "validity.json").write_text(json.dumps(table, indent=2) + "\n")
    (directory / "validity.md").write_text(markdown + "\n")
    return markdown
