r"""The GRAIL release's evaluation scoring, as an opt-in (`grail eval --scoring release`).

grail's own scoring (grail.evaluation.grader, the default) reads every reference correctly. This module reproduces
instead what the release's evaluation scripts do (declare-lab/grail, src/eval/), rule for rule, so that grail-rl's
figures can be put next to the paper's table:

1. Extraction (`extract_boxed_inner` in run_eval.py and eval_results_base.py). Find `\boxed{` markers from left to
   right; from each, count every `{` and `}` (a backslash escapes nothing) until the depth is back to 0: the text
   between the braces is a box, and the search resumes after it, so a box inside a box is part of its content.
   At the first marker whose braces never close, the search stops. The answer is the last box found; None if
   there is none: `grail.tasks.boxed.release_boxes`. (grail's own finder skips escaped braces, and an unclosed box
   does not hide the complete boxes that follow it.)
2. Reference (`main` in eval_results_base.py, `ans_key` in run_eval.py): Python's `str()` of the row's answer
   field, `""` if the field is missing. The field is `answer`, except MinervaMath (`solution`, reduced by rule 1;
   a solution without a box gives "None") and OlympiadBench (`final_answer`, a list: `["$2n$"]` becomes the text
   `['$2n$']`, each backslash doubled by the list's repr). AMC23's float 27.0 becomes "27.0". The loaders read it
   (`grail.evaluation.benchmarks.release_reference`) into `Problem.release_answer`.
3. Comparison (`verify_ans` in eval_results_base.py). No answer: incorrect. Otherwise each side is parsed by
   math-verify as `parse("$" + text + "$")` with its default extraction settings, and `verify(gold, answer)`
   decides; any error or timeout counts as incorrect. Neither side is normalised
   (grail.evaluation.reference_text.gold_latex is not applied), so "$['$2n$']$" is compared as it stands: its math is
   "['" and "']", and it cannot match a model's `2n`; from such text math-verify extracts whatever fragment it finds (a
   number, or "['1,3']" as the interval [1, 3]).
4. Mean completion tokens (`main` in eval_results_base.py): pooled over the samples that have a box by rule 1,
   0 when none has (`release_mean_tokens`). The other metrics are grail's: acc@n and pass@n equal the release's
   acc@3 and pass@3 when every completion is non-empty (the release drops empty completions from a problem's
   denominator; grail counts them as incorrect samples).

Bounds: grading runs through grail.evaluation.grader's machinery (RELEASE_SCORING is a
`grail.evaluation.grader.Scoring`): math-verify's alarms at TIMEOUT_S per parse and per comparison (5 s, the release's
defaults), on a main thread or in worker processes that also bound each item's wall time. Reasons follow
grail.evaluation.grader: "no_box", "ok" (the comparison ran), "bad_reference" (the reference parsed to nothing),
"parse_error" (the answer did), "timeout".
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from math_verify import parse
from math_verify.errors import TimeoutException

from grail.evaluation.grader import ALL_BOXES_SCORING, GRAIL_SCORING, GradeResult, Scoring, _alarm_seconds, verify_pairs
from grail.tasks.boxed import release_last_box

__all__ = ["grade_release_content", "release_mean_tokens", "RELEASE_SCORING", "scoring_reference", "SCORINGS"]


@functools.lru_cache(maxsize=4096)
def _parse_reference(text: str, seconds: int) -> tuple:
    """The release's parse of a reference, cached (each is graded against several samples). A timeout raises."""
    return _parse(text, seconds)


def _parse(text: str, seconds: int) -> tuple:
    try:
        return tuple(parse("$" + text + "$", parsing_timeout=seconds, raise_on_error=True))
    except TimeoutException:
        raise
    except Exception:  # the release's parse returns [] on any error
        return ()


def grade_release_content(content: str | None, reference: Any, timeout_s: float) -> GradeResult:
    """Rule 3 on an extracted answer (None: no box) in this thread, which must be a main thread."""
    if content is None:
        return GradeResult(False, None, "no_box")
    seconds = _alarm_seconds(timeout_s)
    try:
        gold = _parse_reference(str(reference), seconds)
        pred = _parse(content, seconds) if gold else ()
    except TimeoutException:  # a BaseException
        return GradeResult(False, content, "timeout")
    if not gold:
        return GradeResult(False, content, "bad_reference")
    if not pred:
        return GradeResult(False, content, "parse_error")
    matched, timed_out = verify_pairs(gold, pred, seconds)
    if matched:
        return GradeResult(True, content, "ok")
    return GradeResult(False, content, "timeout" if timed_out else "ok")


RELEASE_SCORING = Scoring("release", release_last_box, grade_release_content,
                          "release (grail.evaluation.release_scoring: the GRAIL release's extraction and "
                          "un-normalised $...$ parse, OlympiadBench graded against the text of its answer list, "
                          "mean tokens over samples with a box)")
# the scorings `grail eval --scoring` offers
SCORINGS = {"grail": GRAIL_SCORING, "grail_all_boxes": ALL_BOXES_SCORING, "release": RELEASE_SCORING}


def scoring_reference(problem, scoring: str) -> str:
    """The reference a grail.evaluation.benchmarks.Problem is graded against: its `answer` under "grail" and
    "grail_all_boxes", its `release_answer` (rule 2) under "release". ValueError for a problem no loader built (no
    release_answer)."""
    if scoring != "release":
        return problem.answer
    if problem.release_answer is None:
        raise ValueError(f"{problem.source} problem {problem.id!r} has no release_answer (it was not built by a "
                         f"grail.evaluation.benchmarks loader); scoring 'release' needs the raw row's reference.")
    return problem.release_answer


def release_mean_tokens(tokens_PN: Sequence[Sequence[int]], extracted_PN: Sequence[Sequence[str | None]]) -> float:
    """Rule 4: the mean of the token counts of the samples with a box (extracted is not None); 0.0 if none has.

    Args:
        tokens_PN: (P, N) completion lengths. extracted_PN: (P, N) the extracted answers, same shape.
    """
    boxed = [t for tokens_N, extracted_N in zip(tokens_PN, extracted_PN, strict=True)
             for t, e in zip(tokens_N, extracted_N, strict=True) if e is not None]
    return sum(boxed) / len(boxed) if boxed else 0.0
