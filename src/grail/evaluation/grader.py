r"""The math grader: the content of the LAST complete `\boxed{}` of a completion against a reference answer.

The one home of the grading logic (docs/methods/none.md, docs/guides/evaluation.md): the training reward
(`grail.evaluation.rewards.math_verify_reward`) and evaluation both call `grade` / `grade_many`.

What is compared
1. The prediction is the content of the last complete box (`grail.tasks.boxed`). No complete box: "no_box". An empty
   box (`\boxed{}`, or only spaces inside): "empty_box", a wrong answer. A content longer than MAX_ANSWER_CHARS is
   not parsed: "too_long" (no reference answer is that long); nor is one too large to grade, told from its text
   (`grail.evaluation.oversize`): brackets nested deeper than 10, or a power, factorial or binomial coefficient of
   literal numbers with more than 100,000 digits (`9^{9^{9^{9}}}`, `1000000!`), which sympy would compute until
   the alarm rang.
2. Both sides go through `gold_latex`, so the reference and the prediction take the same path through
   math-verify's parser: one pair of math delimiters around the whole text ($..$, $$..$$, \(..\), \[..\]) and
   one final full stop are removed, a number written in spaced groups of three digits ("1\,000") is joined,
   and the rest is wrapped in `\boxed{...}`. The wrapping matters: unwrapped, a plain reference "10-4 n" has
   no LaTeX environment for math-verify's LaTeX extractor to find, and its expression extractor reads "10-4".
3. `parse` with (LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()), then
   `verify(gold, prediction)`, gold first (verify is not symmetric). math-verify's own normalisation applies
   to both sides: `\text{}` units are dropped ("5 \text{ cm}" = 5), `\left`/`\right` and LaTeX spacing are
   ignored, "50\%" = 0.5, "1,000" = 1000, floats compare after rounding to 6 decimals.

Guards (grail's layer over math-verify: a wrong answer accepted costs more than a right one rejected). A pair that
`verify` accepts is rejected when
a. the match is text only (math-verify compares the extracted text, which for a partial parse is only the start of
   each side: "1 - \frac{1}{" of "1 - \frac{1}{\mathrm{x}}") and the two `gold_latex` texts differ;
b. the prediction is an equation, the reference is not, and the equation's left side is not a name: math-verify
   compares the prediction's last right-hand side, so that "x = 3" is 3, but "x^2-2x+10=0" is not 0;
c. both are equations whose sides do not match (side by side, swapped, or as differences) and the reference has no
   solution sympy finds: math-verify's last resort zips the two solution lists, and two empty ones count as equal.

Reasons (`GradeResult.reason`): "ok" = compared (`correct` holds the verdict: True, or both sides parsed as
mathematics and differ); "no_box"; "empty_box"; "too_long" (1.); "parse_error" = the box content did not parse as
mathematics (math-verify extracted nothing, or only text, which differs from the reference's); "bad_reference" =
the same for the reference; "timeout" = a parse or comparison hit its TIMEOUT_S alarm, or the item overran its
wall-clock bound in a worker process and the worker was killed; "worker_died" = the worker process grading it
exited (killed from outside, out of memory). Only "ok" comes with correct=True.

Timeouts and where the work runs
- math-verify bounds each parse and each comparison with signal.alarm (whole seconds, so a timeout below 1 s
  counts as 1 s). Signals work only on a main thread, and only a signal (CPython checks for them inside long
  integer arithmetic) or a process boundary stops sympy in `\boxed{9^{9^{9^{9}}}}`: 13 characters that raise 9
  to a 370-million-digit power inside one C call that holds the GIL. A thread-level deadline cannot.
- On the main thread, `grade` and `grade_many(workers=1)` grade in this process, bounded by the alarms only
  (a C call that ignores signals would hang the caller: use workers >= 2 where that must not happen).
- Off the main thread, they hand the items to one shared worker process (spawned on first use, then reused),
  which grades them on ITS main thread, alarms included: the same results either way. Calls from several
  threads take turns.
- `grade_many` with several workers starts up to `workers` spawned processes for the call and feeds them items
  as they finish. The number of processes is capped by the work: a worker process is started only while the items
  waiting for one outnumber the workers already started and free (2 items: at most 2 processes, whatever
  `workers` says), and the default (`workers=None`) is `default_workers()` = min(CPU cores, MAX_WORKERS = 8):
  on a 96-core node an evaluation does not start 96 sympy processes. Give `workers` to use more.
  Every item in a worker process also has a wall-clock bound, item_deadline_s (default
  4 * timeout_s: three alarmed math-verify calls at most, plus one more for the Python around them). A worker
  that overruns it (a C call that ignores signals) is killed, its item is "timeout", and a new worker takes
  over the remaining items: one stuck item never hangs the evaluation.
Worker processes are spawned, so a script that calls these off the main thread or with workers > 1 must keep
its entry point under `if __name__ == "__main__":`, as for any multiprocessing use.

Other scorings. `Scoring` pairs an extraction with a content grader; `grade_many(..., scoring=...)` and
`GradingPool.grade_many` run any such pair under the same bounds (grail.evaluation.release_scoring is the release's).
GRAIL_SCORING, the default, is everything above.
"""

from __future__ import annotations

import functools
import itertools
import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
from math_verify.errors import TimeoutException
from sympy import Basic, MatrixBase

from grail.evaluation.grading_workers import (
    MAX_WORKERS,
    WORKER_START_S,
    GradeResult,
    Scoring,
    _Pool,
    default_workers,
)
from grail.evaluation.guards import accepted
from grail.evaluation.oversize import oversize
from grail.evaluation.reference_text import first_answer, gold_latex
from grail.tasks.boxed import all_boxed_content, last_boxed_content

__all__ = [
    "ALL_BOXES_SCORING", "default_workers", "grade", "grade_many", "GradeResult", "GradingPool", "GRAIL_SCORING",
    "MAX_ANSWER_CHARS", "MAX_WORKERS", "PARSE_KINDS", "reference_parse", "Scoring", "TIMEOUT_S", "verify_pairs",
    "WORKER_START_S"
]

TIMEOUT_S = 5  # per math-verify parse and per comparison (docs/methods/none.md)
MAX_ANSWER_CHARS = 1000  # longer box contents are not parsed: no reference answer is this long
_EXTRACTION = (LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig())


# ---- grading in this process (main thread: the alarms need it) ----------------------------------------------
def _alarm_seconds(timeout_s: float) -> int:
    return max(1, math.ceil(timeout_s))  # signal.alarm takes whole seconds


@functools.lru_cache(maxsize=4096)
def _parse_reference(latex: str, seconds: int) -> tuple:
    """math-verify's parse of a reference, cached (a reference is graded against many samples). A timeout raises
    TimeoutException and is not cached; any other failure gives ()."""
    try:
        return tuple(parse(latex, extraction_config=_EXTRACTION, parsing_timeout=seconds, raise_on_error=True))
    except Exception:
        return ()



def _same_text(a: str, b: str) -> bool:
    """Two `gold_latex` texts that are the same, whitespace runs aside."""
    return " ".join(a.split()) == " ".join(b.split())


def verify_pairs(gold: Sequence, pred: Sequence, seconds,
                 accept: Callable[[Any, Any], bool] | None = None) -> tuple[bool, bool]:
    """(any pair equal, some pair timed out). math-verify's verify(gold_list, pred_list) is `any` over the pairs,
    a pair that raises counting as unequal; this runs the same loop one pair at a time, to tell a timeout apart
    from a plain mismatch. `accept(gold, pred)`: a further test a pair math-verify accepted must pass (grail's
    guards, `grail.evaluation.guards.accepted`); a timeout inside it counts as a timeout."""
    timed_out = False
    for g, p in itertools.product(gold, pred):
        try:
            if verify(g, p, timeout_seconds=seconds, raise_on_error=True) and (accept is None or accept(g, p)):
                return True, timed_out
        except TimeoutException:
            timed_out = True
        except Exception:
            pass
    return False, timed_out


def _grade_content(content: str | None, reference: Any, timeout_s: float, boxes: str = "last") -> GradeResult:
    """`grade` of a box content (None: no box) in this thread, which must be a main thread. `boxes`: how a
    reference holding several boxes reads (`gold_latex`)."""
    if content is None:
        return GradeResult(False, None, "no_box")
    if not content.strip():
        return GradeResult(False, content, "empty_box")
    if len(content) > MAX_ANSWER_CHARS:
        return GradeResult(False, content, "too_long")
    gold_text, pred_text = gold_latex(reference, boxes), gold_latex(content, boxes)
    if oversize(pred_text[len("\\boxed{"):-1]):  # would only end at the alarm
        return GradeResult(False, content, "too_long")
    seconds = _alarm_seconds(timeout_s)
    try:
        gold = _parse_reference(gold_text, seconds)
    except TimeoutException:
        return GradeResult(False, content, "timeout")
    if not gold:
        return GradeResult(False, content, "bad_reference")
    try:
        pred = parse(pred_text, extraction_config=_EXTRACTION, parsing_timeout=seconds, raise_on_error=True)
    except TimeoutException:  # a BaseException
        return GradeResult(False, content, "timeout")
    except Exception:
        return GradeResult(False, content, "parse_error")
    if not pred:
        return GradeResult(False, content, "parse_error")
    same_text = _same_text(gold_text, pred_text)
    matched, timed_out = verify_pairs(gold, pred, seconds, accept=lambda g, p: accepted(g, p, same_text, seconds))
    if matched:
        return GradeResult(True, content, "ok")
    if timed_out:
        return GradeResult(False, content, "timeout")
    if not any(isinstance(g, Basic | MatrixBase) for g in gold):  # text only, and the texts differ
        return GradeResult(False, content, "bad_reference")
    if not any(isinstance(p, Basic | MatrixBase) for p in pred):
        return GradeResult(False, content, "parse_error")
    return GradeResult(False, content, "ok")


PARSE_KINDS = ("math", "partial", "text", "none")


def reference_parse(reference: Any, *, normalise: bool = True, timeout_s: float = TIMEOUT_S) -> tuple[str, str | None]:
    r"""How math-verify reads a reference: (kind, the text it extracted).

    kind: "math" (a mathematical value: a sympy expression, set, interval, matrix ...); "partial" (text only, and
    only the start of the answer, a strict prefix of it, spaces aside: math-verify stopped parsing, e.g.
    "1 - \frac{1}{" of "1 - \frac{1}{\mathrm{e}}", so every answer that starts the same way would match it as
    text); "text" (text only, the whole answer: compared as text); "none" (nothing extracted, or a timeout).
    normalise: read `gold_latex(reference)`, as the grader does; False reads "\boxed{" + reference + "}", as it would be
    without grail's normalisation (`grail grader-check` counts both). The alarm is used on a main thread only;
    elsewhere the parse is unbounded (references are data, not model output).
    """
    text = gold_latex(reference) if normalise else "\\boxed{" + str(first_answer(reference)).strip() + "}"
    main = threading.current_thread() is threading.main_thread()
    try:
        parsed = parse(text, extraction_config=_EXTRACTION, parsing_timeout=_alarm_seconds(timeout_s) if main else None,
                       raise_on_error=True)
    except BaseException as err:  # TimeoutException is a BaseException; a KeyboardInterrupt must still stop us
        if isinstance(err, KeyboardInterrupt):
            raise
        return "none", None
    if not parsed:
        return "none", None
    extracted = next((p for p in parsed if isinstance(p, str)), None)
    if any(isinstance(p, Basic | MatrixBase) for p in parsed):
        return "math", extracted
    kept, whole = ("".join(t.split()) for t in (extracted or "", last_boxed_content(text) or ""))
    return ("partial" if len(kept) < len(whole) and whole.startswith(kept) else "text"), extracted


GRAIL_SCORING = Scoring("grail", last_boxed_content, _grade_content,
                        "grail (grail.evaluation.grader: the last complete box against the normalised reference, "
                        "both sides normalised alike; mean tokens over all samples)")


def _grade_all_boxes(content: str | None, reference: Any, timeout_s: float) -> GradeResult:
    return _grade_content(content, reference, timeout_s, boxes="all")


ALL_BOXES_SCORING = Scoring("grail_all_boxes", all_boxed_content, _grade_all_boxes,
                            "grail_all_boxes (grail.evaluation.grader with the opt-in all-boxes rule: every complete "
                            "box of the completion, and of the reference, joined as one list; mean tokens over all "
                            "samples)")


_off_main: _Pool | None = None  # the shared worker for calls made off the main thread
_off_main_lock = threading.Lock()


# ---- the API --------------------------------------------------------------------------------------------------
def grade(completion: str, reference: Any, *, timeout_s: float = TIMEOUT_S) -> GradeResult:
    r"""Grade the last complete `\boxed{}` of `completion` against `reference` with math-verify.

    reference: a string ("27", "\frac{1}{2}", "$10-4 n$", "(45,2),(-10,-9)"); a number or a list of accepted
    forms (the first is used) also works. Never raises for a bad answer or reference: see GradeResult.reason.
    Works on any thread (module docstring): here on the main thread, in the shared worker process otherwise.
    """
    return grade_many([completion], [reference], workers=1, timeout_s=timeout_s)[0]


class GradingPool:
    """Grading processes kept across calls: `with GradingPool(workers) as pool: pool.grade_many(...)`.

    `grade_many(workers=N)` starts and stops N spawned processes per call (about a second each); an evaluation
    that grades batch after batch uses one pool for the whole run instead. workers=1 grades in this process
    (main thread) exactly like `grade_many(workers=1)`. `workers=None`: `default_workers()`. A process is started
    only when a call has more items waiting than started, free processes (module docstring). The per-item bounds
    are those of `grade_many`.
    """

    def __init__(self, workers: int | None = None):
        if workers is not None and workers < 1:
            raise ValueError(f"GradingPool: workers={workers}; use an int >= 1, or None for default_workers() "
                             f"(one per CPU core, at most {MAX_WORKERS}).")
        self.workers = workers or default_workers()
        self._pool = _Pool(self.workers) if self.workers > 1 else None

    def grade_many(self, completions: Sequence[str], references: Sequence[Any], *, timeout_s: float = TIMEOUT_S,
                   item_deadline_s: float | None = None, scoring: Scoring = GRAIL_SCORING) -> list[GradeResult]:
        if self._pool is None or len(completions) <= 1:
            return grade_many(completions, references, workers=1, timeout_s=timeout_s,
                              item_deadline_s=item_deadline_s, scoring=scoring)
        _check_inputs(completions, references)
        deadline = 4 * timeout_s if item_deadline_s is None else item_deadline_s
        return self._pool.grade([scoring.extract(c) for c in completions], references, timeout_s, deadline, scoring)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()

    def __enter__(self) -> GradingPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _check_inputs(completions: Sequence[str], references: Sequence[Any]) -> None:
    if len(completions) != len(references):
        raise ValueError(f"grade_many: {len(completions)} completions but {len(references)} references.")
    for completion in completions:
        if not isinstance(completion, str):
            raise TypeError(f"grade_many: a completion must be a string, got {type(completion).__name__}.")


def grade_many(completions: Sequence[str], references: Sequence[Any], *, workers: int | None = None,
               timeout_s: float = TIMEOUT_S, item_deadline_s: float | None = None,
               scoring: Scoring = GRAIL_SCORING) -> list[GradeResult]:
    """`grade` over pairs, in parallel over up to `workers` processes (default `default_workers()`: one per CPU
    core, at most MAX_WORKERS; never more than the items); results in input order.

    workers=1 (or a single item) grades one item after another: in this process on the main thread, in the
    shared worker process off it. With more workers, a pool of spawned processes is started for the call
    (about 0.6 s on 2 cores, in parallel) and shut down at the end: for a few thousand cheap items in a warm
    process, workers=1 can be as fast (perf/benchmarks/grader_throughput.py). timeout_s bounds each math-verify
    call; item_deadline_s (default 4 * timeout_s) bounds each item's wall time in a worker process (module
    docstring). scoring: what is extracted and how it is graded (default GRAIL_SCORING, this module's grader).
    """
    global _off_main
    if workers is not None and workers < 1:
        raise ValueError(f"grade_many: workers={workers}; use an int >= 1, or None for default_workers() (one per "
                         f"CPU core, at most {MAX_WORKERS}).")
    _check_inputs(completions, references)
    contents = [scoring.extract(c) for c in completions]  # here: the workers get only the box contents
    workers = min(workers or default_workers(), len(completions))
    deadline = 4 * timeout_s if item_deadline_s is None else item_deadline_s
    if workers <= 1:
        if threading.current_thread() is threading.main_thread():
            return [scoring.grade_content(c, r, timeout_s) for c, r in zip(contents, references, strict=True)]
        with _off_main_lock:
            if _off_main is None:
                _off_main = _Pool(1)
            try:
                return _off_main.grade(contents, references, timeout_s, deadline, scoring)
            except BaseException:  # its state is unknown: the next call starts afresh
                _off_main.close()
                _off_main = None
                raise
    pool = _Pool(workers)
    try:
        return pool.grade(contents, references, timeout_s, deadline, scoring)
    finally:
        pool.close()
