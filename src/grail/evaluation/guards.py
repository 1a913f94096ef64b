"""grail's guards against math-verify's false accepts (grail.evaluation.grader's docstring, "Guards"): a pair
math-verify accepts stays accepted only if it passes `accepted` (`grail.evaluation.grader.verify_pairs(...,
accept=...)`). A wrong answer accepted costs more than a right one rejected: a policy learns to exploit the first.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

from math_verify import verify
from math_verify.errors import TimeoutException
from sympy import And, Eq, Symbol, solve
from sympy.core.function import AppliedUndef

__all__ = ["accepted"]


def _alarmed(seconds: int, func: Callable, *args: Any) -> Any:
    """func(*args) under a SIGALRM of `seconds` (main thread only), raising TimeoutException when it rings."""
    def ring(signum, frame):
        raise TimeoutException("grader guard timed out")

    previous = signal.signal(signal.SIGALRM, ring)
    signal.alarm(seconds)
    try:
        return func(*args)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _relations(expr: Any) -> list[Eq] | None:
    """The links of an equation ("x = 3" -> [x = 3]; "x = y = 3", an And, -> [x = y, y = 3]); None if not one."""
    if isinstance(expr, Eq):
        return [expr]
    if isinstance(expr, And) and expr._unsorted_args and all(isinstance(a, Eq) for a in expr._unsorted_args):
        return list(expr._unsorted_args)
    return None


def _is_name(expr: Any) -> bool:
    """A single symbol ("x", "\\mathbf{y}", "x_1") or an unknown function of symbols ("y(t)", "f(x)")."""
    return isinstance(expr, Symbol) or (isinstance(expr, AppliedUndef)
                                        and all(isinstance(a, Symbol) for a in expr.args))


def _same_equation(gold: Eq, pred: Eq, seconds: int) -> bool:
    """Whether math-verify's acceptance of two equations stands: they are the same equation, their sides compare
    equal under math-verify side by side (or swapped: "2x+1=y" is "y=2x+1"), so do the differences of their sides
    (or one is the other's negative), or the reference's solution set is not empty. math-verify's last resort
    solves both and zips the two solution lists: two equations sympy cannot solve ("|M|=4", a vector-valued side)
    give two empty lists, which it counts equal."""
    if gold == pred:
        return True
    for left, right in ((pred.lhs, pred.rhs), (pred.rhs, pred.lhs)):
        if verify(gold.lhs, left, timeout_seconds=seconds) and verify(gold.rhs, right, timeout_seconds=seconds):
            return True
    difference = gold.lhs - gold.rhs
    for other in (pred.lhs - pred.rhs, pred.rhs - pred.lhs):
        if verify(difference, other, timeout_seconds=seconds):
            return True
    return bool(_alarmed(seconds, solve, gold, gold.free_symbols))


def accepted(gold: Any, pred: Any, same_text: bool, seconds: int) -> bool:
    """Whether a pair math-verify accepted stays accepted (module docstring, "Guards")."""
    # a text-only match: math-verify compares extracted text, which may be the cut-off start of each side
    # ("1 - \\frac{1}{" of "1 - \\frac{1}{\\mathrm{x}}")
    if isinstance(gold, str) or isinstance(pred, str):
        return same_text
    gold_links, pred_links = _relations(gold), _relations(pred)
    if pred_links is None:
        return True
    if gold_links is None:  # math-verify compares the prediction's last right-hand side: only "x = 3" means 3
        return _is_name(pred_links[0].lhs)
    if _is_name(gold_links[0].lhs) and _is_name(pred_links[0].lhs):  # assignment chains compare first = last
        gold_links = [Eq(gold_links[0].lhs, gold_links[-1].rhs, evaluate=False)]
        pred_links = [Eq(pred_links[0].lhs, pred_links[-1].rhs, evaluate=False)]
    return len(gold_links) == len(pred_links) and all(
        _same_equation(g, p, seconds) for g, p in zip(gold_links, pred_links, strict=True))
