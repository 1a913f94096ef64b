r"""Reward functions with TRL's reward-function contract.

TRL's GRPOTrainer calls `func(prompts=..., completions=..., completion_ids=..., **kwargs)`, where
kwargs holds every dataset column as a list (here `answer`) plus `trainer_state`, `log_extra` and
`log_metric`, and logs the mean as `rewards/<func.__name__>/mean`. A completion is a string
(standard prompts) or a list of message dicts (conversational prompts). Both functions read only
the content of the LAST complete `\boxed{...}` (`grail.tasks.boxed`), return one float per completion,
and give 0.0 to a completion without a complete box or with an empty one (`\boxed{}`: the grader's reason
"empty_box", a wrong answer, never handed to math-verify).

Grading. math_verify_reward is a TRL wrapper around `grail.evaluation.grader`, the one home of the grading logic: the
reference and box normalisation (`gold_latex`), math-verify's configuration, the TIMEOUT_S alarms and where the
work runs. On the main thread it grades in this process; off it (TRL's async reward path, a thread pool) the
batch goes to the grader's shared worker process, where the same code runs on that process's main thread:
the same rewards and the same bound either way (grail.evaluation.grader's docstring says why only a process boundary
bounds `\boxed{9^{9^{9^{9}}}}`). The worker is spawned, so a script that calls the reward off the main thread
must keep its entry point under `if __name__ == "__main__":`, as for any multiprocessing use.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from grail.evaluation import grader
from grail.evaluation.grader import TIMEOUT_S
from grail.evaluation.reference_text import first_answer
from grail.tasks.boxed import last_boxed_content

__all__ = ["completion_text", "exact_int_reward", "math_verify_all_boxes_reward", "math_verify_reward", "reward_named",
           "REWARDS"]

_NOT_COLUMNS = {"prompts", "completion_ids", "trainer_state", "log_extra", "log_metric", "environments"}
_INT_RE = re.compile(r"\s*-?[0-9]+\s*")


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


def math_verify_reward(
    completions: Sequence[Any], answer: Sequence[Any] | None = None, **kwargs: Any
) -> list[float]:
    r"""1.0 iff the last complete `\boxed{...}` of the completion equals the reference under math-verify.

    Equivalence is `grail.evaluation.grader.grade`: math-verify's `verify(parse(gold), parse(pred))` on
    `gold_latex(answer)` and the box content wrapped the same way, e.g. "1/2" = "\frac{1}{2}" = "0.5",
    "x=3" = "3", "27" = "27.0", "[0,1)" != "(0,1]". 0.0 when there is no complete box, the content is
    longer than MAX_ANSWER_CHARS, the reference does not parse, or math-verify raises or times out: it
    never crashes training. Off the main thread the work runs in a worker process (module docstring).
    Raises ValueError if the `answer` column is missing or its length differs from `completions`.
    """
    answers = _answer_column(answer, completions, "math_verify_reward", kwargs)
    texts = [completion_text(c) for c in completions]
    results = grader.grade_many(texts, answers, workers=1, timeout_s=TIMEOUT_S)
    return [1.0 if r.correct else 0.0 for r in results]


def math_verify_all_boxes_reward(
    completions: Sequence[Any], answer: Sequence[Any] | None = None, **kwargs: Any
) -> list[float]:
    r"""`math_verify_reward` under the opt-in all-boxes rule (`grail.evaluation.grader.ALL_BOXES_SCORING`): the contents
    of every complete box of the completion, joined by ", ", against the reference's (all its boxes, if it has
    several), so `\boxed{1}, \boxed{2}, \boxed{3}` matches "1, 2, 3" (as a set, in any order). A completion
    that also boxes an intermediate result is then graded on the list, and loses the point."""
    answers = _answer_column(answer, completions, "math_verify_all_boxes_reward", kwargs)
    texts = [completion_text(c) for c in completions]
    results = grader.grade_many(texts, answers, workers=1, timeout_s=TIMEOUT_S, scoring=grader.ALL_BOXES_SCORING)
    return [1.0 if r.correct else 0.0 for r in results]


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
        gold = first_answer(gold)
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


REWARDS = {"exact_int": exact_int_reward, "math_verify": math_verify_reward,
           "math_verify_all_boxes": math_verify_all_boxes_reward}  # grail.options.choices.RewardName, less auto


def reward_named(name: str, *, synthetic: bool) -> Callable[..., list[float]]:
    """The reward function called `name`; `auto` = exact_int on the synthetic task, math_verify elsewhere."""
    if name == "auto":
        name = "exact_int" if synthetic else "math_verify"
    if name not in REWARDS:
        raise ValueError(f"reward={name!r}: choose auto or one of {', '.join(REWARDS)}.")
    return REWARDS[name]
