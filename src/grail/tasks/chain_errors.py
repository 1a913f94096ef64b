r"""Where a chain solution first goes wrong: a completion's steps read against the reference solution's, in order.

A chain solution (`grail.tasks.chain_problems`) is one sentence a step, "{name} has {left} {op} {right} = {result}
{objects}.", then ``\boxed{answer}``. Each step of a completion is compared with the reference's step at the same
place; the first that differs names the completion's first error (`FIRST_ERRORS`):

    none        every step and the boxed answer are the reference's
    arithmetic  the step's left number, operator and right number are the reference's (for + and *, in either order:
                "15 + 23" sets up what "23 + 15" does), its result is not: a correct set-up computed wrongly
    setup       its left number, operator or right number is not the reference's: which quantities are combined,
                and how (a question number copied wrongly, a previous result not carried, the wrong operation or the
                wrong earlier person of a total); this is the reasoning the task asks for
    steps       every step it wrote is the reference's, but it wrote fewer or more of them
    answer      every step is the reference's; the boxed answer is missing or is not the reference's
    unparsed    no step could be read

Only the first error counts. An arithmetic slip in step 1 carries a wrong number into step 2, whose numbers then
differ from the reference's: that is the slip's consequence, not a second error. The classes do not consult the
grader: a completion that boxes the right answer after a wrong step (a lucky slip) is counted by its step, so
"none" can differ slightly from accuracy.

A step is read as ``LEFT OP RIGHT = RESULT`` with whole numbers (``+``, ``-``, ``*`` or ``×``; the result may be
negative). The reference solution is read the same way, so any text the generator writes around the steps (names,
objects, filler words) is ignored on both sides.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from grail.tasks.boxed import last_boxed_content

__all__ = ["ChainStep", "FIRST_ERRORS", "chain_steps", "first_error", "first_error_counts"]

FIRST_ERRORS = ("none", "arithmetic", "setup", "steps", "answer", "unparsed")

_STEP_RE = re.compile(r"(?<![\d.])(\d+)\s*([-+*×])\s*(\d+)\s*=\s*(-?\d+)(?!\.?\d)")


@dataclass(frozen=True)
class ChainStep:
    """One step as written: ``left op right = result`` (op one of "+", "-", "*")."""

    left: int
    op: str
    right: int
    result: int

    def same_setup(self, other: ChainStep) -> bool:
        """The same operation on the same numbers (either order for the commutative + and *)."""
        if self.op != other.op:
            return False
        pairs = {(self.left, self.right)} | ({(self.right, self.left)} if self.op in "+*" else set())
        return (other.left, other.right) in pairs


def chain_steps(text: str) -> list[ChainStep]:
    """The steps of a chain solution, in order (``×`` read as ``*``)."""
    return [ChainStep(int(a), "*" if op == "×" else op, int(b), int(c)) for a, op, b, c in _STEP_RE.findall(text)]


def first_error(reference: str, answer: str, completion: str) -> str:
    """The first error of `completion` against the reference solution `reference` (whose boxed answer is `answer`):
    one of `FIRST_ERRORS` (module docstring)."""
    expected, written = chain_steps(reference), chain_steps(completion)
    if not expected:
        raise ValueError(f"the reference solution has no step of the form 'LEFT OP RIGHT = RESULT': {reference!r}; "
                         "first errors are defined for the chain task's solutions (task_style chains).")
    if not written:
        return "unparsed"
    for mine, theirs in zip(written, expected, strict=False):  # the shorter's steps; lengths next
        if not mine.same_setup(theirs):
            return "setup"
        if mine.result != theirs.result:
            return "arithmetic"
    if len(written) != len(expected):
        return "steps"
    boxed = last_boxed_content(completion)
    return "none" if boxed is not None and boxed.strip() == answer.strip() else "answer"


def first_error_counts(rows: Iterable[tuple[str, str, str]]) -> Counter[str]:
    """How many of the (reference, answer, completion) rows have each first error (every class of FIRST_ERRORS is
    a key, zero where none)."""
    counts = Counter(dict.fromkeys(FIRST_ERRORS, 0))
    counts.update(first_error(*row) for row in rows)
    return counts
