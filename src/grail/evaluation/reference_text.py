"""Answer text as the grader reads it: the first of a list of references (`first_answer`) and the normalisation
both sides of a comparison go through (`gold_latex`; grail.evaluation.grader's docstring lists what it changes and why).
Pure string functions, no math-verify.
"""

from __future__ import annotations

import re
from typing import Any

from grail.tasks.boxed import all_boxed_content, last_boxed_content

__all__ = ["first_answer", "gold_latex"]

_DELIMITERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))
# a whole number written in groups of three digits separated by spacing: "1\,000", "12 345", "1~000~000"
_SPACE = r"(?:\s|~|\\[,:; ])+"
_SPACED_NUMBER_RE = re.compile(rf"(?<![\w.^_])\d{{1,3}}(?:{_SPACE}\d{{3}})+(?!\d)")
_SPACE_RE = re.compile(_SPACE)
# upright e, i and d (Euler's number, the imaginary unit, the differential: the ISO 80000-2 style of "\mathrm{e}^{x}"):
# math-verify reads \mathrm{...} as a unit or text, and stops parsing at "\frac{1}{\mathrm{e}}" (it keeps
# "\frac{1}{"); written plainly they parse. Other \mathrm contents stay: "5\,\mathrm{m}" is 5 metres, not 5m.
_UPRIGHT_RE = re.compile(r"\\mathrm\s*\{\s*([edi])\s*\}")
# \operatorname{f} for the functions math-verify reads as \f and not as \operatorname{f} (which it keeps as text);
# not coth, sech, csch: math-verify reads "\coth(x)" as cot(h(x))
_OPERATOR_NAMES = ("arcsin", "arccos", "arctan", "arccot", "arcsec", "arccsc", "sinh", "cosh", "tanh", "sin", "cos",
                   "tan", "cot", "sec", "csc", "ln", "log", "exp", "max", "min", "gcd", "lcm")
_OPERATORNAME_RE = re.compile(r"\\operatorname\s*\{\s*(" + "|".join(_OPERATOR_NAMES) + r")\s*\}")


def first_answer(answer: Any) -> Any:
    """A reference given as a list or tuple of accepted forms: the first one ("" if empty)."""
    if isinstance(answer, list | tuple):
        return answer[0] if answer else ""
    return answer


def gold_latex(answer: Any, boxes: str = "last") -> str:
    r"""A reference answer, or a box content, as the `\boxed{...}` string math-verify parses.

    Accepts "27.0", 27, "$\frac{1}{2}$", "\boxed{5}" (its last box is used, see `boxes`) or a list of such (the first is
    used). One pair of math delimiters ($$..$$, $..$, \(..\), \[..\]) around the whole answer is removed, unless
    the inside holds a "$" ("$1$ and $2$" is two formulas, not one); so is one final full stop, inside or
    outside the delimiters ("104." is 104, "$x+1$." is x+1; math-verify parses neither with the stop); and
    the spacing in a whole number written in groups of three digits, a thousands separator ("1\,000",
    "12 345", "1~000~000"; math-verify reads "1\,000" as the product 1*000 = 0). Upright "\mathrm{e}",
    "\mathrm{i}", "\mathrm{d}" become "e", "i", "d", and "\operatorname{arcsin}" (a function in _OPERATOR_NAMES)
    "\arcsin": math-verify parses "1 - \frac{1}{\mathrm{e}}" only as far as "1 - \frac{1}{". Idempotent.

    A comma is never a decimal comma. Between digits it separates the items of a list ("1,22" is the two
    answers 1 and 22, "1.22" does not match it), except in math-verify's thousands grouping, groups of exactly
    three digits ("1,224" is 1224). That is how the six benchmarks write it: every reference of the form
    "<digits>,<1-2 or 4+ digits>" in them (52: 39 CollegeMath, 12 OlympiadBench, 1 MATH-500) is a list of
    answers ("Solve sqrt(6x-5) = x": "1,5"). A model that writes a decimal comma is graded wrong.

    boxes: "last" (the release's rule: an answer holding several boxes stands for its last box) or "all" (the
    opt-in rule: their contents joined by ", ", so "\boxed{1}, \boxed{2}" is the list "1, 2").
    """
    if boxes not in ("last", "all"):
        raise ValueError(f"boxes={boxes!r}: choose 'last' (the release's rule) or 'all'.")
    text = str(first_answer(answer)).strip()
    boxed = (last_boxed_content if boxes == "last" else all_boxed_content)(text)
    if boxed is not None:
        text = boxed.strip()
    text = _without_full_stop(text)
    for left, right in _DELIMITERS:
        if len(text) >= len(left) + len(right) and text.startswith(left) and text.endswith(right):
            inner = text[len(left) : len(text) - len(right)]
            if "$" not in inner:
                text = inner.strip()
            break
    text = _SPACED_NUMBER_RE.sub(lambda m: _SPACE_RE.sub("", m.group()), _without_full_stop(text))
    text = _OPERATORNAME_RE.sub(lambda m: _as_token(m, "\\" + m.group(1)), text)
    text = _UPRIGHT_RE.sub(lambda m: _as_token(m, m.group(1)), text)
    return "\\boxed{" + text + "}"


def _as_token(match: re.Match, replacement: str) -> str:
    """`replacement` for `match`, with a space on a side where it would otherwise run into a letter ("\\cdot" + "e"
    must not become the command "\\cdote"). Only there: math-verify stops at "\\frac{1}{ e }"."""
    before = match.string[match.start() - 1 : match.start()]
    after = match.string[match.end() : match.end() + 1]
    return (" " if before.isalpha() else "") + replacement + (" " if after.isalpha() else "")


def _without_full_stop(text: str) -> str:
    """`text` without one final "." that ends a sentence (not an ellipsis "..")."""
    return text[:-1].rstrip() if text.endswith(".") and not text.endswith("..") else text
