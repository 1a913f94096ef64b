r"""How each benchmark's rows become problems: (id, problem, reference answer), and the reference the release's
scoring reads. grail.evaluation.benchmarks reads the rows (benchmark_sources) and selects among the problems.

The schemas differ; each row is normalised to a ``Problem`` as follows (field names of the local copies):

| name | id | problem | reference answer |
|---|---|---|---|
| math500 | ``unique_id`` | ``problem`` | ``answer`` |
| aime24 | ``id`` | ``problem`` | ``answer`` (kept as written: seven are zero-padded, e.g. "025") |
| amc23 | ``id`` | ``problem`` | ``answer``, a float: integral ones lose the ".0" (27.0 → "27") |
| minerva_math | ``idx`` | ``problem`` | content of the LAST complete ``\boxed{}`` of ``solution`` (grail.tasks.boxed) |
| olympiadbench | ``id`` | ``question`` (after ``context`` if set) | ``final_answer``, see strip_math_delimiters |
| college_math | ``data_source/question_number`` | ``question`` | ``answer``, see strip_math_delimiters |
| synthetic | row index | the task's own prompt | the task's answer |

1. A row whose id field is missing gets its 0-based line (Hub: row) index as id. CollegeMath's
   ``question_number`` alone repeats across its nine source books (2091 distinct of 2818), hence the prefix.
   Ids must be unique within a benchmark (ValueError otherwise): results are keyed by them.
2. Rows with no usable problem or reference answer (missing, empty, a MinervaMath solution without a complete
   box) are never dropped silently: they are listed in ``LoadedBenchmark.skipped`` with the reason.
3. OlympiadBench's ``final_answer`` is a list; each element is stripped of its ``$`` wrappers and the elements
   are joined with ", " (in the local copy every list has ONE element; multi-part answers such as
   "$69$,$84$" sit inside that one string, and come out as "69, 84").
   Its ``unit`` field (set on 8 rows) is not appended to the answer.
4. Each Problem also carries ``release_answer``, the reference as the release's scoring reads the raw row
   (`release_reference`), used only by ``grail eval --scoring release``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from grail.tasks.boxed import last_boxed_content, release_last_box

__all__ = [
    "BENCHMARK_NAMES", "LOADABLE_NAMES", "normalise", "Problem", "RELEASE_ANSWER_FIELDS", "release_reference",
    "row_id", "strip_math_delimiters", "SYNTHETIC", "SYNTHETIC_CHAINS", "SYNTHETIC_NAMES", "SYNTHETIC_WORDS"
]

BENCHMARK_NAMES = ("math500", "aime24", "amc23", "minerva_math", "college_math", "olympiadbench")
SYNTHETIC = "synthetic"
SYNTHETIC_WORDS = "synthetic_words"  # the word-problem style of the synthetic task (grail.tasks.word_problems)
SYNTHETIC_CHAINS = "synthetic_chains"  # the chain task's held-out split (grail.tasks.chains)
SYNTHETIC_NAMES = (SYNTHETIC, SYNTHETIC_WORDS, SYNTHETIC_CHAINS)
LOADABLE_NAMES = (*BENCHMARK_NAMES, *SYNTHETIC_NAMES)


@dataclass(frozen=True)
class Problem:
    """One evaluation problem. ``id`` is unique within ``source`` (the benchmark name) and stable across runs.
    ``release_answer``: the reference as the release's scoring reads it (module docstring, 4); None when the
    problem was not built by a loader."""

    id: str
    problem: str | list[dict]  # chat messages only for the synthetic task's words style
    answer: str
    source: str
    release_answer: str | None = None



_MATH = r"(?:[^$\\]|\\.)+"  # non-empty text without an unescaped "$" (so "\$" stays inside)
_DISPLAY_RE = re.compile(rf"\$\$({_MATH})\$\$\.?", re.S)
_INLINE_LIST_RE = re.compile(rf"\$({_MATH})\$(?:\s*,\s*\${_MATH}\$)*\.?", re.S)
_INLINE_RE = re.compile(rf"\$({_MATH})\$", re.S)


def strip_math_delimiters(text: str) -> str:
    r"""Remove the ``$`` wrappers around a whole answer; leave answers that mix math and prose as they are.

    - "$10-4 n$" → "10-4 n"; "$\$ 3040$" → "\$ 3040" (an escaped dollar is content); "$h=4$." → "h=4"
      (a period after the closing "$" is punctuation); "$$x$$" → "x".
    - A comma-separated list of wrapped parts becomes the parts joined by ", ": "$69$,$84$" → "69, 84".
    - Anything else keeps its dollars: "$4 \frac{4}{9}$ days", "$x=-1, x=0$ or $x=1$", and the malformed
      "$221,$8$" (OlympiadBench id 2349, meant as 221, 8) are returned stripped of outer whitespace only.
    Idempotent: applying it twice gives the same text.
    """
    text = text.strip()
    if match := _DISPLAY_RE.fullmatch(text):
        return match.group(1).strip()
    if _INLINE_LIST_RE.fullmatch(text):
        return ", ".join(part.strip() for part in _INLINE_RE.findall(text))
    return text


class _Unusable(Exception):
    """A row with no usable problem or reference answer; the message is the reason recorded in ``skipped``."""


def _text(row: dict, field: str) -> str:
    value = row.get(field)
    if value is None:
        raise _Unusable(f"no {field!r} field")
    if not isinstance(value, str):
        raise _Unusable(f"{field!r} is a {type(value).__name__}, not a string")
    if not value.strip():
        raise _Unusable(f"empty {field!r}")
    return value


def _messages_or_text(row: dict, field: str) -> str | list[dict]:
    """The synthetic task's prompt: a string, or chat messages (the words style: worked examples as earlier turns)."""
    value = row.get(field)
    if isinstance(value, list) and value and all(isinstance(m, dict) and isinstance(m.get("content"), str)
                                                 and m.get("role") for m in value):
        return value
    return _text(row, field)


def _scalar_answer(row: dict) -> str:
    """``answer`` as text; a float that is integral loses its ".0" (AMC23 stores 27.0 for 27)."""
    value = row.get("answer")
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return _text(row, "answer").strip()


def _last_box_answer(row: dict) -> str:
    content = last_boxed_content(_text(row, "solution"))
    if content is None:
        raise _Unusable("'solution' has no complete \\boxed{...}")
    return content.strip()


def _list_answer(row: dict) -> str:
    value = row.get("final_answer")
    if value is None:
        raise _Unusable("no 'final_answer' field")
    parts = [value] if isinstance(value, str) else list(value)
    return ", ".join(p for p in (strip_math_delimiters(str(part)) for part in parts) if p)


def _delimited_answer(row: dict) -> str:
    return strip_math_delimiters(_text(row, "answer"))


def _field_id(field: str) -> Callable[[dict, int], str]:
    return lambda row, index: str(index) if row.get(field) is None else str(row[field])


def _college_math_id(row: dict, index: int) -> str:
    source, number = row.get("data_source"), row.get("question_number")
    return str(index) if source is None or number is None else f"{source}/{number}"


@dataclass(frozen=True)
class _Schema:
    problem_field: str
    answer: Callable[[dict], str]
    row_id: Callable[[dict, int], str]


_SCHEMAS = {
    "math500": _Schema("problem", _scalar_answer, _field_id("unique_id")),
    "aime24": _Schema("problem", _scalar_answer, _field_id("id")),
    "amc23": _Schema("problem", _scalar_answer, _field_id("id")),
    "minerva_math": _Schema("problem", _last_box_answer, _field_id("idx")),
    "college_math": _Schema("question", _delimited_answer, _college_math_id),
    "olympiadbench": _Schema("question", _list_answer, _field_id("id")),
    SYNTHETIC: _Schema("prompt", _scalar_answer, lambda row, index: str(index)),
    SYNTHETIC_WORDS: _Schema("prompt", _scalar_answer, lambda row, index: str(index)),
    SYNTHETIC_CHAINS: _Schema("prompt", _scalar_answer, lambda row, index: str(index)),
}


def row_id(name: str, row: dict, index: int) -> str:
    """The id of `row`, the `index`-th (0-based) of benchmark `name`, as a Problem made from it has it."""
    return _SCHEMAS[name].row_id(row, index)


def normalise(name: str, rows: list[tuple[int, dict]]) -> tuple[list[Problem], list[tuple[str, str]]]:
    """(usable problems, (id, reason) of the others), in row order; ValueError on a repeated id."""
    schema, problems, skipped, seen = _SCHEMAS[name], [], [], {}
    for index, row in rows:
        row_id = schema.row_id(row, index)
        if row_id in seen:
            raise ValueError(f"{name}: rows {seen[row_id]} and {index} (0-based) share the id {row_id!r}; ids "
                             f"must be unique within a benchmark. Fix or remove one of the rows.")
        seen[row_id] = index
        try:
            problem = _messages_or_text(row, schema.problem_field) if name in SYNTHETIC_NAMES else _text(
                row, schema.problem_field)
            if row.get("context"):  # OlympiadBench: shared context of a multi-question problem
                problem = f"{row['context']}\n{problem}"
            answer = schema.answer(row)
            if not answer:
                raise _Unusable("empty reference answer after normalisation")
        except _Unusable as why:
            skipped.append((row_id, str(why)))
            continue
        problems.append(Problem(id=row_id, problem=problem, answer=answer, source=name,
                                release_answer=release_reference(name, row)))
    return problems, skipped


# the field the release's evaluation reads the reference from (run_eval.py `ans_key`); elsewhere "answer"
RELEASE_ANSWER_FIELDS = {"minerva_math": "solution", "olympiadbench": "final_answer"}  # elsewhere: "answer"


def release_reference(benchmark: str, row: dict) -> str:
    """The reference text the release grades `row` of `benchmark` against (grail.evaluation.release_scoring, rule 2):
    `str()` of its answer field, "" if missing; MinervaMath's solution reduced to its last box (release_last_box)."""
    text = str(row.get(RELEASE_ANSWER_FIELDS.get(benchmark, "answer"), ""))
    return str(release_last_box(text)) if benchmark == "minerva_math" else text
