r"""Tests for grail.evaluation.grader: the last complete box against a reference with math-verify, on any thread and in
parallel (grader_check: tests/test_grader_check.py).

Each expected value in TRICKY is what the mathematics says (the comment gives the derivation), not what the
grader happened to print. Where math-verify disagrees, the mathematical expectation stays and the case is an
xfail(strict=True) naming the documented grader limit: if math-verify changes, the xfail turns into a failure
and the table gets updated on purpose.
"""

import os
import threading
import time

import pytest

from grail.evaluation import grader, grading_workers
from grail.evaluation.grader import GradeResult, GradingPool, grade, grade_many
from grail.evaluation.reference_text import gold_latex

POWER_TOWER = "\\boxed{9^{9^{9^{9}}}}"  # sympy would compute 9^(9^9): rejected from its text (evaluation.oversize)
# past that guard (it reads |-9| as a symbol), sympy computes |-9| = 9, then 9^(9^9): only a timeout stops it
SLOW = "\\boxed{|-9|^{9^{9}}}"


def run_in_thread(func, *args, **kwargs):
    out = {}
    thread = threading.Thread(target=lambda: out.setdefault("value", func(*args, **kwargs)))
    thread.start()
    thread.join(timeout=120)
    assert not thread.is_alive() and "value" in out
    return out["value"]


def limit(reason):
    return pytest.mark.xfail(strict=True, reason=f"grader limit: {reason}")


ROUNDING = "math-verify compares floats after rounding to 6 decimals (verify's float_rounding=6; its docstring: " \
           "verify(Rational(1, 3), 0.333333) is True), so a close decimal approximation counts as exact"

# (reference, box content, mathematically correct?)
TRICKY = [
    # fractions and decimals
    ("\\frac{1}{2}", "0.5", True),  # 1/2 = 5/10
    ("0.5", "\\frac{1}{2}", True),  # the same, reference and answer swapped
    ("\\frac12", "\\dfrac{1}{2}", True),  # \dfrac and brace-less \frac12 are display variants of 1/2
    ("\\frac{1}{3}", "0.333", False),  # 0.333 = 333/1000 != 1/3
    pytest.param("\\frac{1}{3}", "0.3333333", False, marks=limit(ROUNDING)),  # 3333333/10^7 != 1/3
    # nested and escaped braces inside the box
    ("\\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt{3}}{\\sqrt{4}}", True),  # sqrt(4) = 2
    ("\\{1,2\\}", "\\{2,1\\}", True),  # \{ \} are literal braces (a set), not box delimiters; sets are unordered
    # units: the number in the unit the question asked for is the answer (math-verify drops \text/\mathrm units)
    ("5", "5 \\text{ cm}", True),
    ("5", "5\\,\\mathrm{cm}", True),
    ("5", "6 \\text{ cm}", False),  # 6 != 5 whatever the unit
    ("90", "90^\\circ", True),  # the degree sign is the unit of an answer asked in degrees
    pytest.param("\\frac{\\pi}{2}", "90^\\circ", True,
                 marks=limit("the degree sign is dropped and 90 read as a number (latex2sympy convert_degrees=False), "
                             "so 90 degrees != pi/2 radians")),  # 90 * pi/180 = pi/2
    # intervals: endpoints and their brackets both matter
    ("[0,1]", "(0,1]", False),  # 0 is in [0,1] and not in (0,1]
    ("(0,1]", "(0, 1]", True),  # the same interval, spacing aside
    ("[0,1)", "(0,1]", False),  # 0 in the first only, 1 in the second only
    # thousands separators
    ("1000", "1,000", True),  # a comma between a digit and three digits groups thousands
    ("1000000", "1,000,000", True),
    ("1000", "1{,}000", True),  # {,} is the LaTeX way to write that comma without a space after it
    ("1000", "1\\,000", True),  # a thin space grouping thousands (SI style); gold_latex joins the groups
    ("12345", "12 345", True),  # in LaTeX math mode a plain space renders nothing: 12345
    ("0", "1\\,000", False),  # 1000 != 0 (math-verify alone reads 1\,000 as the product 1*000 = 0)
    ("1000", "(1,000)", False),  # parentheses around comma-separated parts make the pair (1, 0), not a number
    ("(1,0)", "(1,000)", True),  # ... which is the pair (1, 0): 000 = 0
    # LaTeX spacing and sizing commands change the rendering, not the value
    ("(3,\\frac{\\pi}{2})", "\\left( 3, \\frac{\\pi}{2} \\right)", True),
    ("1000", "1\\!000", True),  # \! is a negative thin space: 1000
    # negative numbers
    ("-7", "-7", True),
    ("-7", "7", False),  # 7 != -7
    ("-7", "- 7", True),  # spacing after the sign
    ("-7", "\u22127", True),  # U+2212 MINUS SIGN is the typographic minus
    ("7", "-(-7)", True),  # -(-7) = 7
    # sets, tuples, lists of answers
    ("\\{1,2,3\\}", "\\{3,2,1\\}", True),  # sets are unordered
    ("(1,2)", "(2,1)", False),  # ordered pairs: (1,2) != (2,1)
    ("\\{1,2\\}", "1, 2", True),  # a list of all the solutions is the solution set
    ("(1,2),(3,4)", "(3,4),(1,2)", True),  # a list of all the solution pairs, in another order: the same set
    # square roots
    ("\\sqrt{8}", "2\\sqrt{2}", True),  # sqrt(8) = sqrt(4 * 2) = 2 sqrt(2)
    ("\\frac{1}{\\sqrt{2}}", "\\frac{\\sqrt{2}}{2}", True),  # multiply by sqrt(2)/sqrt(2)
    ("\\sqrt{2}", "\\sqrt2", True),  # \sqrt2 is \sqrt{2}
    ("\\sqrt{2}", "1.414", False),  # 1.414^2 = 1.999396 != 2
    pytest.param("\\sqrt{2}", "1.41421356", False, marks=limit(ROUNDING)),  # irrational != any finite decimal
    # pi
    ("2\\pi", "\\pi \\cdot 2", True),
    ("\\pi", "3.14", False),  # pi is irrational: no finite decimal equals it
    pytest.param("\\pi", "3.14159265", False, marks=limit(ROUNDING)),
    # percent: p% = p/100
    ("0.5", "50\\%", True),  # 50% = 50/100 = 0.5
    ("50\\%", "0.5", True),
    ("5\\%", "50\\%", False),  # 0.05 != 0.5
    pytest.param("50", "50\\%", False,
                 marks=limit("math-verify accepts a percentage with or without its % sign (for questions that ask "
                             "for a percent), so 50% counts as 50 although 50% = 0.5")),  # 0.5 != 50
    # equations and inequalities
    ("3", "x=3", True),  # the assignment x = 3 gives the value 3
    ("3", "y(t)=3", True),  # ... and so does a named function's value
    # an equation whose left side is not a name is not a value (math-verify alone compares its right-hand side)
    ("0", "x^2-2x+10=0", False),  # an equation is not the number 0
    ("3", "2x=3", False),  # 2x = 3 gives x = 3/2, not 3
    ("x=3", "x=3", True),  # identical equations
    ("y=2x+1", "y=1+2x", True),  # addition commutes
    ("y=2x+1", "2x+1=y", True),  # the sides swapped: the same equation
    ("2x=4", "4=2x", True),  # the sides swapped
    ("2x=4", "x+x=4", True),  # x + x = 2x
    ("y=2x+1", "y=2x+2", False),  # different lines
    pytest.param("(1,2)", "1<x<2", True,
                 marks=limit("an inequality answer is not compared with an interval reference "
                             "(verify's allow_set_relation_comp=False); the reverse direction is")),  # {x: 1<x<2}
    ("1<x<2", "(1,2)", True),  # the interval (1,2) is the solution set of 1 < x < 2
    # two equations sympy cannot solve (|M| = d, a vector-valued side): math-verify alone zips their two empty
    # solution lists and accepts (all() of nothing is True); grail requires the sides to match
    ("\\left|\\begin{array}{rr}1 & 0 \\\\ 0 & 4\\end{array}\\right|=4",
     "\\left|\\begin{array}{rr}1 & 2 \\\\ 3 & 4\\end{array}\\right|=-2", False),  # |M| = 1*4 - 2*3 = -2, not 4
    ("\\mathbf{y}=\\left[\\begin{array}{l}3 \\\\ 4\\end{array}\\right] e^{t}",
     "\\mathbf{y}=\\left[\\begin{array}{l}1 \\\\ 2\\end{array}\\right] e^{t}", False),  # (1,2) != (3,4)
    ("\\mathbf{y}=\\left[\\begin{array}{l}3 \\\\ 4\\end{array}\\right] e^{t}",
     "\\mathbf{y}=\\left[\\begin{array}{l}3 \\\\ 4\\end{array}\\right] e^{t}", True),  # the same equation
    ("\\mathbf{y}=\\left[\\begin{array}{l}3 \\\\ 4\\end{array}\\right] e^{t}",
     "\\mathbf{y}=e^{t}\\left[\\begin{array}{l}3 \\\\ 4\\end{array}\\right]", True),  # a scalar times a vector commutes
    # upright e, i, d and \operatorname (ISO style): math-verify stops at "1 - \frac{1}{\mathrm{e}}" and keeps the
    # text "1 - \frac{1}{" of both sides, which used to match any answer that starts the same way
    ("1 - \\frac{1}{\\mathrm{e}}", "1 - \\frac{1}{e}", True),  # the same e
    ("1 - \\frac{1}{\\mathrm{e}}", "1 - \\frac{1}{\\mathrm{e}}", True),
    ("1 - \\frac{1}{\\mathrm{e}}", "1 - e^{-1}", True),  # 1/e = e^(-1)
    ("1 - \\frac{1}{\\mathrm{e}}", "1 - \\frac{1}{\\mathrm{e}^2}", False),  # 1/e^2 != 1/e
    ("1 - \\frac{1}{\\mathrm{e}}", "1 - \\frac{1}{\\mathrm{x}}", False),  # x is not e
    ("2\\mathrm{e}", "2", False),  # 2e, not 2 with a unit "e"
    ("\\mathrm{e}^{x}+1", "e^x+1", True),
    ("1+\\mathrm{i}", "1+i", True),
    ("\\operatorname{arcsin}(x)", "\\arcsin x", True),
    ("\\operatorname{arcsin}(x)", "\\arccos x", False),  # arcsin != arccos
    ("\\frac{5}{\\mathrm{m}}", "\\frac{5}{\\mathrm{s}}", False),  # 5 per metre != 5 per second; both cut to "\frac{5}{"
    ("\\frac{5}{\\mathrm{m}}", "\\frac{5}{\\mathrm{m}}", True),  # text only, and identical
    # text answers: the same word, with or without \text
    ("\\text{Evelyn}", "Evelyn", True),
    ("\\text{even}", "\\text{odd}", False),
    # a sentence's full stop is punctuation, not part of the number (gold_latex drops it)
    ("104", "104.", True),
    ("105", "104.", False),
    # other notations
    ("3+2i", "2i+3", True),  # addition commutes
    ("1500", "1.5 \\times 10^{3}", True),  # 1.5 * 1000
    ("x^2+2x+1", "(x+1)^2", True),  # expand the square
    ("\\frac{5}{2}", "2\\frac{1}{2}", True),  # the mixed-number convention of school mathematics (MATH): 2 + 1/2
]


@pytest.mark.parametrize(("reference", "box", "correct"), TRICKY)
def test_tricky_cases(reference, box, correct):
    result = grade(f"So the answer is \\boxed{{{box}}}.", reference)
    assert result.correct is correct
    assert result.extracted == box


# ---------------------------------------------------------------- what is read, and the reasons


@pytest.mark.parametrize(
    ("completion", "reference", "expected"),
    [
        ("\\boxed{3} no, \\boxed{4}", "4", GradeResult(True, "4", "ok")),  # the last box wins
        ("\\boxed{4} no, \\boxed{3}", "4", GradeResult(False, "3", "ok")),
        ("\\boxed{4} and then \\boxed{5", "4", GradeResult(True, "4", "ok")),  # an unclosed box is not a box
        ("\\boxed{\\frac{1}{\\sqrt{4}}}", "0.5", GradeResult(True, "\\frac{1}{\\sqrt{4}}", "ok")),  # nested braces
        ("\\boxed{$\\frac{1}{2}$}", "0.5", GradeResult(True, "$\\frac{1}{2}$", "ok")),  # $ inside the box
        ("The answer is 4.", "4", GradeResult(False, None, "no_box")),  # METHODS.md: only a box counts
        ("\\boxed{}", "1", GradeResult(False, "", "empty_box")),  # a wrong answer, not a parse failure
        ("so \\boxed{ } \\boxed{}", "", GradeResult(False, "", "empty_box")),  # even against a bad reference
        ("\\boxed{ }", "1", GradeResult(False, " ", "empty_box")),
        ("\\boxed{@@#%^&}", "1", GradeResult(False, "@@#%^&", "parse_error")),  # only text, and not the same
        ("\\boxed{1}", "", GradeResult(False, "1", "bad_reference")),
        ("\\boxed{1}", "\\frac{", GradeResult(False, "1", "bad_reference")),
        ("\\boxed{\\frac{1}{0}}", "1", GradeResult(False, "\\frac{1}{0}", "ok")),  # zoo != 1, no crash
    ],
)
def test_extraction_and_reasons(completion, reference, expected):
    assert grade(completion, reference) == expected


def test_too_long_is_not_parsed():
    content = "1" + " " * grader.MAX_ANSWER_CHARS  # equal to 1, but over the cap
    assert grade("\\boxed{" + content + "}", "1") == GradeResult(False, content, "too_long")


def test_too_large_is_not_parsed():
    """A power tower, a huge factorial, deep nesting: "too_long" at once, where sympy would run until the alarm."""
    started = time.perf_counter()
    for content in (POWER_TOWER[7:-1], "1000000!", "{" * 50 + "3" + "}" * 50):
        assert grade("\\boxed{" + content + "}", "3") == GradeResult(False, content, "too_long")
    assert time.perf_counter() - started < 1  # one 5 s alarm each without the guard


def test_reference_forms():
    """A reference in $...$, with a box, as a number or as a list of accepted forms (the first is used)."""
    for reference in ("$10-4 n$", "\\(10 - 4n\\)", "\\boxed{10-4n}", ["10-4n", "junk"], "$$10-4n$$"):
        assert grade("\\boxed{-4n+10}", reference).correct, reference
    assert grade("\\boxed{27}", 27.0).correct and grade("\\boxed{27}", "27.0").correct
    assert not grade("\\boxed{6}", "10-4 n").correct  # unwrapped, math-verify would read the reference as 10-4


def test_gold_latex_normalisation_is_idempotent():
    for text in ("$\\frac{1}{2}$", "104.", "$h=4$.", "1\\,000", "12 345 678", "1, 2, ...", "$1$ and $2$", "x_1 000",
                 "\\boxed{3}", "0.123\\,456", "2 3"):
        once = gold_latex(text)
        assert gold_latex(once) == once, text
    assert gold_latex("1, 2, ...") == "\\boxed{1, 2, ...}"  # an ellipsis is not a full stop
    assert gold_latex("x_1 000") == "\\boxed{x_1 000}"  # a subscript is not the head of a number
    assert gold_latex("2 3") == "\\boxed{2 3}"  # only groups of exactly three digits are joined
    assert gold_latex("-1~000~000") == "\\boxed{-1000000}"
    assert gold_latex("x\\cdot\\mathrm{e}") == "\\boxed{x\\cdot e}"  # not the unknown command \cdote
    assert gold_latex("\\operatorname{ln}x") == "\\boxed{\\ln x}"  # not \lnx
    assert gold_latex("5\\,\\mathrm{m}") == "\\boxed{5\\,\\mathrm{m}}"  # a unit stays a unit
    for text in ("x\\cdot\\mathrm{e}", "\\operatorname{ln}x", "1-\\frac{1}{\\mathrm{e}}"):
        assert gold_latex(gold_latex(text)) == gold_latex(text), text


@pytest.mark.parametrize(
    ("box", "reference"),
    [("104.", "1040"), ("104.", "10"), ("1\\,000", "1"), ("1\\,000", "0"), ("10\\,000", "1000"), ("1 000", "100"),
     ("12\\,345", "12"), ("12\\,345", "345")],
)
def test_normalisations_do_not_pass_wrong_answers(box, reference):
    assert not grade(f"\\boxed{{{box}}}", reference).correct


# ---------------------------------------------------------------- threads and processes

MIXED = [("\\boxed{\\frac{1}{2}}", "0.5"), ("\\boxed{0.3}", "0.5"), ("no box", "1"), ("\\boxed{x=3}", "3"),
         ("\\boxed{(0,1]}", "[0,1]"), ("\\boxed{1\\,000}", "1000"), ("\\boxed{}", "1"), ("\\boxed{1}", "")]


def test_off_the_main_thread_matches_main_thread(off_main_worker):
    on_main = [grade(c, r) for c, r in MIXED]
    assert [r.correct for r in on_main] == [True, False, False, True, False, True, False, False]
    assert run_in_thread(lambda: [grade(c, r) for c, r in MIXED]) == on_main
    assert off_main_worker() is not None  # it went through the worker process
    assert run_in_thread(grade_many, [c for c, _ in MIXED], [r for _, r in MIXED], workers=1) == on_main


def test_grade_many_keeps_the_order():
    completions = [f"\\boxed{{{i if i % 3 else i + 1}}}" for i in range(40)]
    references = [str(i) for i in range(40)]
    expected = [GradeResult(i % 3 != 0, str(i if i % 3 else i + 1), "ok") for i in range(40)]
    assert grade_many(completions, references, workers=1) == expected
    assert grade_many(completions, references, workers=2) == expected


def test_grade_many_validates_its_input():
    assert grade_many([], [], workers=2) == []
    with pytest.raises(ValueError, match="2 completions but 1 references"):
        grade_many(["a", "b"], ["1"])
    with pytest.raises(ValueError, match="workers=0"):
        grade_many(["a"], ["1"], workers=0)
    with pytest.raises(TypeError, match="must be a string"):
        grade_many([["not", "a", "string"]], ["1"])


def test_pathological_item_times_out_on_the_main_thread():
    started = time.perf_counter()
    assert grade(SLOW, "1", timeout_s=1) == GradeResult(False, SLOW[7:-1], "timeout")
    assert time.perf_counter() - started < 1.9  # without the alarm this runs for hours


def test_worker_over_its_wall_bound_is_killed_and_replaced():
    """The worker's own alarm is 60 s; the item's wall bound 0.5 s: the parent kills it, as it would a C call that
    ignores signals, and a fresh worker grades the items queued behind it. (The alarm is far from the bound so that
    a loaded machine's slow spawning cannot be mistaken for the alarm: seen at 5.2 s under load with a 5 s alarm.)"""
    completions = [SLOW, "\\boxed{2}", "\\boxed{3}", "\\boxed{5}"]
    started = time.perf_counter()
    results = grade_many(completions, ["1", "2", "3", "4"], workers=2, timeout_s=60, item_deadline_s=0.5)
    assert [(r.correct, r.reason) for r in results] == [(False, "timeout"), (True, "ok"), (True, "ok"), (False, "ok")]
    assert time.perf_counter() - started < 30  # spawning and the kill, never the 60 s alarm


def test_off_main_worker_that_dies_is_replaced(off_main_worker):
    assert run_in_thread(grade, "\\boxed{2}", "2").correct  # starts the shared worker
    process = off_main_worker()
    process.kill()  # killed while idle: the next call notices and starts another
    process.join()
    assert run_in_thread(grade, "\\boxed{2}", "2") == GradeResult(True, "2", "ok")
    assert off_main_worker().pid != process.pid

    def kill_soon():
        deadline = time.monotonic() + 30
        while grader._off_main.slots[0].index is None and time.monotonic() < deadline:  # not yet sent
            time.sleep(0.01)
        time.sleep(0.3)  # inside sympy on SLOW (its alarm: 5 s)
        off_main_worker().kill()

    killer = threading.Thread(target=kill_soon)
    killer.start()
    assert run_in_thread(grade, SLOW, "1") == GradeResult(False, SLOW[7:-1], "worker_died")
    killer.join()
    assert run_in_thread(grade, "\\boxed{3}", "3").correct


@pytest.mark.slow
def test_pathological_items_with_the_default_bounds_do_not_hang_the_pool():
    started = time.perf_counter()
    results = grade_many([SLOW, SLOW, "\\boxed{2}"], ["1", "1", "2"], workers=2)
    assert [(r.correct, r.reason) for r in results] == [(False, "timeout"), (False, "timeout"), (True, "ok")]
    assert time.perf_counter() - started < 4 * grader.TIMEOUT_S  # one alarm each, in parallel


def test_a_grading_pool_is_reused_across_calls_and_agrees_with_grade_many():
    completions = ["so \\boxed{\\frac{1}{2}}", "\\boxed{0.5}", "no box", "\\boxed{3}", "\\boxed{x+1}"]
    references = ["0.5", "\\frac{1}{2}", "1", "4", "1+x"]
    expected = grade_many(completions, references, workers=1)
    with GradingPool(2) as pool:
        first = pool.grade_many(completions, references)
        processes = [w.process.pid for w in pool._pool.slots if w is not None]
        second = pool.grade_many(completions[::-1], references[::-1])
        assert [w.process.pid for w in pool._pool.slots if w is not None] == processes  # the same workers
    assert first == expected and second == expected[::-1]
    assert [r.correct for r in expected] == [True, True, False, False, True]


# ---------------------------------------------------------------- how many grading processes

def test_the_default_number_of_grading_processes_is_capped(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 96)
    assert grader.default_workers() == grader.MAX_WORKERS == 8
    assert GradingPool().workers == 8
    monkeypatch.setattr(os, "cpu_count", lambda: 3)
    assert grader.default_workers() == 3
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert grader.default_workers() == 1
    with pytest.raises(ValueError, match="workers=0"):
        GradingPool(0)


def test_a_pool_starts_no_more_processes_than_it_has_items(monkeypatch):
    """A 6-slot pool handed 2 items starts 2 processes (it used to start all 6: one per core on a 96-core node)."""
    spawned = []
    real = grading_workers._Worker.__init__

    def counting(self):
        spawned.append(1)
        real(self)

    monkeypatch.setattr(grading_workers._Worker, "__init__", counting)
    completions, references = ["\\boxed{2}", "\\boxed{3}"], ["2", "4"]
    with GradingPool(6) as pool:
        assert [r.correct for r in pool.grade_many(completions, references)] == [True, False]
        assert pool._pool.started() == len(spawned) == 2
        pool.grade_many(completions * 2, references * 2)  # 4 items: up to 4 processes, the 2 idle ones reused
        assert pool._pool.started() == len(spawned) <= 4
    spawned.clear()
    assert [r.correct for r in grade_many(completions * 2, references * 2, workers=16)] == [True, False] * 2
    assert 1 <= len(spawned) <= 4
