r"""Box contents too large to grade, told from their text before math-verify parses them (grail.evaluation.grader's
docstring, "too_long"): brackets nested deeper than MAX_NESTING, or a power, factorial or binomial coefficient of
literal numbers whose exact value has more than MAX_DIGITS digits.

Why before the parse: sympy evaluates `9^{9^{9^{9}}}` (13 characters) to a 370-million-digit integer, `1000000!` to
5.5 million digits, and compares `{{{{{{{{{{{{{{{{1}}}}}}}}}}}}}}}}` (nested sets) in time that doubles with each level;
each only ends at the grader's alarm, so every such answer costs a full timeout. No reference answer comes near the
bounds: over the six benchmarks' 4,335 references the deepest nesting is 5, and the largest size estimated below is
526 digits (`\left(1+\frac{0.025}{12}\right)^{12 \cdot 10}`; then `36^{216}`, `2^{1009}`, `100!`).

How: one pass pairs the brackets (`{}` with each other; `(`, `[`, `\{`, with or without `\left`, with any of `)`,
`]`, `\}`, so that `[0,1)` pairs) and measures their nesting (a bracket never closed counts as open to the end of its
group); then a small recursive-descent reading estimates, for every subexpression of literal numbers
(digits, `+ - * / \cdot \times \div`, groups, `^`, `!`, `\frac`, `\sqrt`, `\binom`, `\choose`), an upper bound on
log10 of the size of the numbers sympy computes exactly (numerator and denominator alike: `\frac{1}{2}^{n}` costs
what `2^{n}` costs). A symbol anywhere in a subexpression makes it symbolic (`x^{10^{9}}` stays cheap), but its
exponents, arguments and groups are still read (`x^{9^{9^{9}}}` computes 9^(9^9)). Reading follows math-verify's
parser: `9^99` is 9**99, `2^{3}!` is (2^3)!, `3!!` is (3!)!.
"""

from __future__ import annotations

import math
import re

__all__ = ["MAX_BINOMIAL_DIGITS", "MAX_DIGITS", "MAX_NESTING", "oversize"]

MAX_NESTING = 10  # nested sets: 10 levels 0.6 s, 12 levels 1.5 s, 16 levels past a 3 s alarm (2 cores)
MAX_DIGITS = 100_000  # a power or factorial this large is computed in ~0.01 s; 10^6 digits downstream (1/x) time out
MAX_BINOMIAL_DIGITS = 10_000  # sympy's binomial is slower: 18,000 digits 0.2 s, 90,000 digits past a 5 s alarm

_TOKEN = re.compile(r"""
    (?P<open>\\left\s*(?:[(\[]|\\\{)|[{(\[]|\\\{)
  | (?P<close>\\right\s*(?:[)\]]|\\\})|[})\]]|\\\})
  | (?P<skip>\s+|~|\\[,;:!\ ]|\\q?quad(?![a-zA-Z])|\\left\s*\.|\\right\s*\.|\\left(?![a-zA-Z])|\\right(?![a-zA-Z]))
  | (?P<num>[0-9]+(?:\.[0-9]+)?)
  | (?P<cmd>\\[a-zA-Z]+)
  | (?P<char>\\?.)
""", re.VERBOSE | re.DOTALL)
_PRODUCT = {"*", "/", "\\cdot", "\\times", "\\div"}
_FRACTIONS = {"\\frac", "\\dfrac", "\\tfrac", "\\cfrac"}
_BINOMIALS = {"\\binom", "\\dbinom", "\\tbinom"}
_LN10 = math.log(10)


class _TooBig(Exception):
    """Raised with a description of the first subexpression over a bound."""


def oversize(text: str) -> str | None:
    """Why `text` (a box content) is too large to grade: "brackets nested 50 deep (MAX_NESTING = 10)", "a power of
    about 3.7e+08 digits (MAX_DIGITS = 100000)", ...; None when it is not (module docstring)."""
    tokens, depth = _tokens(text)
    if depth > MAX_NESTING:
        return f"brackets nested {depth} deep (MAX_NESTING = {MAX_NESTING})"
    try:
        _Reader(tokens).sequence(0, len(tokens))
    except _TooBig as err:
        return str(err)
    return None


def _tokens(text: str) -> tuple[list[list], int]:
    """([kind, text, partner] per token, spacing dropped; the nesting depth). partner: the index of a bracket's pair
    (an unpaired bracket reads as text, kind "char"). The depth counts the brackets open at each point, paired or not
    (an unclosed "(" stays open to the end of its group: 500 of them take math-verify past a 2 s alarm)."""
    tokens = [[m.lastgroup, m.group(), None] for m in _TOKEN.finditer(text) if m.lastgroup != "skip"]
    stack: list[int] = []
    depth = 0
    for k, (kind, value, _) in enumerate(tokens):
        if kind == "open":
            stack.append(k)
            depth = max(depth, len(stack))
        elif kind == "close":
            brace = value == "}"
            while stack and brace and tokens[stack[-1]][1] != "{":  # a "}" closes its "{": brackets inside stay open
                stack.pop()
            if stack and brace == (tokens[stack[-1]][1] == "{"):
                opener = stack.pop()
                tokens[opener][2], tokens[k][2] = k, opener
    for token in tokens:
        if token[0] in ("open", "close") and token[2] is None:
            token[0] = "char"
    return tokens, depth


def _number(text: str) -> float:
    """log10 of the larger of numerator and denominator of a decimal literal ("0.125" = 125/1000: 3)."""
    whole, _, fraction = text.partition(".")
    digits = (whole + fraction).lstrip("0")
    size = math.log10(int(digits[:15])) + max(0, len(digits) - 15) if digits else 0.0
    return max(size, float(len(fraction)))


def _power(base: float | None, exponent: float | None) -> float | None:
    if base is None or exponent is None:
        return None
    if base == 0:  # 0, 1, -1 to any power
        return 0.0
    digits = base * (10.0 ** exponent if exponent < 300 else math.inf)
    if digits > MAX_DIGITS:
        raise _TooBig(f"a power of about {digits:.2g} digits (MAX_DIGITS = {MAX_DIGITS})")
    return digits


def _factorial(size: float | None) -> float | None:
    if size is None:
        return None
    digits = math.lgamma(10.0 ** size + 1) / _LN10 if size < 15 else math.inf
    if digits > MAX_DIGITS:
        raise _TooBig(f"a factorial of about {digits:.2g} digits (MAX_DIGITS = {MAX_DIGITS})")
    return digits


def _binomial(top: float | None, bottom: float | None) -> float | None:
    if top is None or bottom is None:
        return None
    n = 10.0 ** min(top, 300)
    k = min(10.0 ** min(bottom, 300), n / 2)
    if n < 1e15:
        digits = (math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)) / _LN10
    else:  # C(n, k) <= n^k
        digits = k * top
    if digits > MAX_BINOMIAL_DIGITS:
        raise _TooBig(f"a binomial coefficient of about {digits:.2g} digits (MAX_BINOMIAL_DIGITS = "
                      f"{MAX_BINOMIAL_DIGITS})")
    return digits


class _Reader:
    """Recursive descent over the tokens; each method returns log10 of an upper bound on the size of the exact
    numbers the span computes (None: symbolic) and raises _TooBig. It recurses into bracket pairs (at most
    MAX_NESTING deep, checked before reading) and command arguments (at most MAX_NESTING deep, counted here)."""

    def __init__(self, tokens: list[list]) -> None:
        self.tokens = tokens
        self.commands = 0  # commands whose arguments are being read: "\\sqrt\\sqrt\\sqrt2" nests without brackets

    def sequence(self, start: int, end: int) -> float | None:
        """Terms joined by + and -, each a product of units (juxtaposed, or joined by * / \\cdot \\times \\div);
        `{n \\choose k}`: the part before \\choose over the part after."""
        top: float | None | str = "none"  # the part before a \choose, once there is one
        terms: list[float] = []
        factors: list[float] = []
        numeric = True
        k = start
        while k < end:
            kind, value, _ = self.tokens[k]
            if kind == "char" and value in "+-":
                terms += [sum(factors)] if factors else []
                factors = []
                k += 1
            elif value in _PRODUCT:
                k += 1
            elif value == "\\choose":
                part = _sum(terms + [sum(factors)] if factors else terms) if numeric else None
                top = part if top == "none" else _binomial(top, part)
                terms, factors, numeric = [], [], True
                k += 1
            else:
                size, k = self.unit(k, end)
                if size is None:
                    numeric = False
                else:
                    factors.append(size)
        part = _sum(terms + [sum(factors)] if factors else terms) if numeric else None
        return part if top == "none" else _binomial(top, part)

    def unit(self, k: int, end: int) -> tuple[float | None, int]:
        """A primary and its postfixes: ^ (power), _ (subscript: symbolic), ! (factorial)."""
        size, k = self.primary(k, end)
        while k < end:
            value = self.tokens[k][1]
            if value in ("^", "_") and k + 1 < end:
                operand, k = self.primary(k + 1, end)
                size = _power(size, operand) if value == "^" else None
            elif value == "!":
                size, k = _factorial(size), k + 1
            else:
                break
        return size, k

    def primary(self, k: int, end: int) -> tuple[float | None, int]:
        """A number, a bracket pair, a command with the arguments it takes, or one symbol."""
        kind, value, partner = self.tokens[k]
        if kind == "num":
            return _number(value), k + 1
        if kind == "open" and partner is not None and partner < end:
            return self.sequence(k + 1, partner), partner + 1
        if value in _FRACTIONS or value in _BINOMIALS or value == "\\sqrt":
            self.commands += 1
            if self.commands > MAX_NESTING:
                raise _TooBig(f"commands nested over {MAX_NESTING} deep without brackets")
            size, k = self.command(value, k + 1, end)
            self.commands -= 1
            return size, k
        return None, k + 1

    def command(self, name: str, k: int, end: int) -> tuple[float | None, int]:
        """\\frac, \\binom and \\sqrt with their arguments, from the token after the name."""
        if name == "\\sqrt":
            if k < end and self.tokens[k][1] == "[" and self.tokens[k][2] is not None:  # \sqrt[n]{x}
                self.sequence(k + 1, self.tokens[k][2])
                k = self.tokens[k][2] + 1
            return self.argument(k, end)
        first, k = self.argument(k, end)
        second, k = self.argument(k, end)
        if name in _BINOMIALS:
            return _binomial(first, second), k
        return (first + second if first is not None and second is not None else None), k

    def argument(self, k: int, end: int) -> tuple[float | None, int]:
        """A command's argument: a group, or one token."""
        if k >= end:
            return None, k
        return self.primary(k, end)


def _sum(terms: list[float]) -> float:
    """log10 bound of a sum of terms of log10 sizes `terms`."""
    return max(terms) + math.log10(len(terms)) if terms else 0.0
