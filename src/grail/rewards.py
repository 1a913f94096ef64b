r"""Reward functions with TRL's reward-function contract.

TRL's GRPOTrainer calls `func(prompts=..., completions=..., completion_ids=..., **kwargs)`, where
kwargs holds every dataset column as a list (here `answer`) plus `trainer_state`, `log_extra` and
`log_metric`, and logs the mean as `rewards/<func.__name__>/mean`. A completion is a string
(standard prompts) or a list of message dicts (conversational prompts). Both functions read only
the content of the LAST complete `\boxed{...}` (`grail.boxed`), return one float per completion,
and give 0.0 to a completion without a complete box.

Timeouts. math-verify bounds its sympy work with signal.alarm (TIMEOUT_S per parse and per
comparison), which only works on the main thread; CPython also checks for signals inside long
integer arithmetic, which nothing else interrupts. So off the main thread math_verify_reward does
not disable the timeouts (as TRL's accuracy_reward does) but hands the batch to a worker process,
where the same code runs on that process's main thread: the same rewards and the same bound either
way. Neither a length cap nor a thread-level deadline would do: `\boxed{9^{9^{9^{9}}}}` (13
characters) makes sympy raise 9 to a 370-million-digit power inside one C call that holds the GIL.
The worker is spawned, so a script that calls the reward off the main thread must keep its entry
point under `if __name__ == "__main__":`, as for any multiprocessing use.
"""

from __future__ import annotations

import logging
import multiprocessing
import re
import threading
from collections.abc import Sequence
from multiprocessing.pool import Pool
from typing import Any

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
from math_verify.errors import TimeoutException

from grail.boxed import last_boxed_content

TIMEOUT_S = 5  # METHODS.md section 1
WORKER_START_S = 60  # slack for spawning the worker process and importing math-verify in it
MAX_ANSWER_CHARS = 1000  # longer box contents score 0.0 unparsed: no reference answer is this long
_EXTRACTION = (LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig())
_NOT_COLUMNS = {"prompts", "completion_ids", "trainer_state", "log_extra", "log_metric", "environments"}
_INT_RE = re.compile(r"\s*-?[0-9]+\s*")
logger = logging.getLogger(__name__)


def completion_text(completion: str | list[dict[str, Any]]) -> str:
    """The text of one completion: the string itself, or the message contents concatenated.

    A message's content is a string or a list of parts (`{"type": "text", "text": ...}`); other
    parts (images) are skipped. Raises TypeError for anything else (a contract violation, not a
    bad answer, so it is not turned into a 0.0 reward).
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and all(isinstance(m, dict) for m in completion):
        pieces = []
        for message in completion:
            content = message.get("content") or ""
            if isinstance(content, str):
                pieces.append(content)
            else:
                pieces.extend(p.get("text", "") for p in content if p.get("type") == "text")
        return "".join(pieces)
    raise TypeError(
        f"A completion must be a string or a list of message dicts, got {type(completion).__name__}."
    )


def _answer_column(answer: Sequence[Any] | None, completions: Sequence[Any], func: str, kwargs: dict) -> list:
    if answer is None:
        columns = sorted(k for k in kwargs if k not in _NOT_COLUMNS)
        raise ValueError(
            f"{func} reads the reference answers from a dataset column named `answer`, but the dataset "
            f"has none (columns passed to reward functions: {columns}). Add an `answer` column, e.g. "
            f"dataset = dataset.rename_column('solution', 'answer')."
        )
    if len(answer) != len(completions):
        raise ValueError(f"{func}: got {len(completions)} completions but {len(answer)} answers.")
    return list(answer)


def _first(answer: Any) -> Any:
    """A reference given as a list or tuple of accepted forms: the first one ("" if empty)."""
    if isinstance(answer, list | tuple):
        return answer[0] if answer else ""
    return answer


def _score(contents: Sequence[str | None], golds: Sequence[str]) -> list[float]:
    r"""math-verify scores of box contents against `gold_latex` strings. Must run on a main thread.

    Each distinct reference is parsed once. A content that is None (no complete box) or longer than
    MAX_ANSWER_CHARS scores 0.0 unparsed; one on which math-verify raises or times out scores 0.0.
    """
    gold_cache: dict[str, list] = {}
    rewards = []
    for content, gold in zip(contents, golds, strict=True):
        if content is None or len(content) > MAX_ANSWER_CHARS:
            rewards.append(0.0)
            continue
        try:
            if gold not in gold_cache:
                gold_cache[gold] = parse(gold, extraction_config=_EXTRACTION, parsing_timeout=TIMEOUT_S)
            pred = parse("\\boxed{" + content + "}", extraction_config=_EXTRACTION, parsing_timeout=TIMEOUT_S)
            correct = verify(gold_cache[gold], pred, timeout_seconds=TIMEOUT_S)  # gold first: not symmetric
        except (Exception, TimeoutException):  # TimeoutException is a BaseException
            logger.debug("math-verify failed on box content %r", content[:200], exc_info=True)
            correct = False
        rewards.append(1.0 if correct else 0.0)
    return rewards


_pool: Pool | None = None
_pool_lock = threading.Lock()


def _score_in_worker(contents: Sequence[str | None], golds: Sequence[str]) -> list[float]:
    """`_score` on the main thread of a worker process (spawned on first use, then reused).

    Calls from several threads are serialised. If the worker has not answered within the batch's
    worst case (2 · TIMEOUT_S per completion, + WORKER_START_S), it is killed, the next call starts
    a new one, and the batch scores 0.0 with a warning.
    """
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = multiprocessing.get_context("spawn").Pool(processes=1)
        pending = _pool.apply_async(_score, (list(contents), list(golds)))
        try:
            return pending.get(timeout=2 * TIMEOUT_S * len(contents) + WORKER_START_S)
        except multiprocessing.TimeoutError:
            _pool.terminate()
            _pool = None
            logger.warning("math-verify worker timed out on %d completions; they score 0.0", len(contents))
            return [0.0] * len(contents)


def gold_latex(answer: Any) -> str:
    r"""A reference answer as the `\boxed{...}` string math-verify parses.

    Accepts "27.0", 27, "$\frac{1}{2}$", "\boxed{5}" (its last box is used) or a list of such
    (the first is used). One pair of math delimiters ($$..$$, $..$, \(..\), \[..\]) around the
    whole answer is removed. Predictions get the same `\boxed{}` wrapping, so both sides take the
    same path through math-verify's parser.
    """
    text = str(_first(answer)).strip()
    boxed = last_boxed_content(text)
    if boxed is not None:
        text = boxed.strip()
    for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if len(text) >= len(left) + len(right) and text.startswith(left) and text.endswith(right):
            inner = text[len(left) : len(text) - len(right)]
            if "$" not in inner:  # not "$1$ and $2$"
                text = inner.strip()
            break
    return "\\boxed{" + text + "}"


def math_verify_reward(
    completions: Sequence[Any], answer: Sequence[Any] | None = None, **kwargs: Any
) -> list[float]:
    r"""1.0 iff the last complete `\boxed{...}` of the completion equals the reference under math-verify.

    Equivalence is math-verify's `verify(parse(gold), parse(pred))` on `gold_latex(answer)` and the
    box content wrapped the same way, e.g. "1/2" = "\frac{1}{2}" = "0.5", "x=3" = "3", "27" = "27.0",
    "[0,1)" != "(0,1]". 0.0 when there is no complete box, the content is longer than
    MAX_ANSWER_CHARS, the reference does not parse, or math-verify raises or times out: it never
    crashes training. Off the main thread the work runs in a worker process (module docstring).
    Raises ValueError if the `answer` column is missing or its length differs from `completions`.
    """
    answers = _answer_column(answer, completions, "math_verify_reward", kwargs)
    contents = [last_boxed_content(completion_text(c)) for c in completions]
    golds = [gold_latex(a) for a in answers]
    if threading.current_thread() is threading.main_thread():
        return _score(contents, golds)
    return _score_in_worker(contents, golds)


def exact_int_reward(
    completions: Sequence[Any], answer: Sequence[Any] | None = None, **kwargs: Any
) -> list[float]:
    r"""1.0 iff the last complete `\boxed{...}` holds exactly the integer int(answer).

    The box content must be optional spaces, an optional "-", ASCII digits, optional spaces:
    " 32 " and "-7" count, "32.0", "+32", "3 2" and "x=32" do not. A reference that int() cannot
    read is a dataset error and raises ValueError, as does a missing `answer` column.
    """
    answers = _answer_column(answer, completions, "exact_int_reward", kwargs)
    rewards = []
    for completion, gold in zip(completions, answers, strict=True):
        gold = _first(gold)
        try:
            target = int(gold.strip() if isinstance(gold, str) else gold)
        except (TypeError, ValueError) as err:
            raise ValueError(f"exact_int_reward: reference answer {gold!r} is not an integer.") from err
        content = last_boxed_content(completion_text(completion))
        correct = False
        if content is not None and _INT_RE.fullmatch(content):
            try:
                correct = int(content) == target
            except ValueError:  # more digits than int() reads (sys.get_int_max_str_digits)
                correct = False
        rewards.append(1.0 if correct else 0.0)
    return rewards
