r"""grail.evaluation.oversize: box contents that sympy would compute until the alarm are told from their text, and no
legitimate answer is: every reference of the six benchmarks (skipped when ../shared/data/benchmarks is absent)."""

import json
from pathlib import Path

import pytest

from grail.evaluation.oversize import MAX_NESTING, oversize
from grail.evaluation.reference_text import gold_latex
from grail.tasks.boxed import last_boxed_content

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "benchmarks"

TOO_LARGE = [  # without the guard, each one runs until a 2 s alarm
    "9^{9^{9^{9}}}", "1239^{9^{9^{9}}}", "9^{9^{9^{9}}}7", "9^{9^{9}}", "3^{3^{3^{3}}}", "10^{10^{10^{10}}}",
    "10^{10000000}", "2^{2^{2^{2^{2^{2^{1}}}}}}", "x^{9^{9^{9}}}", "\\frac{1}{2}^{10^{9}}", "\\sqrt{2}^{10^{9}}",
    "\\log(10^{10^{6}})", "1000000!", "-1000000!", "121000000!", "1000000!5", "(10^{100})!", "20000!!", "10^{10}!",
    "\\binom{1000000}{500000}", "{" * 200 + "1" + "}" * 200, "{" * 50 + "}" * 50, "\\frac{" * 20 + "1}{2}" * 20,
    "(" * 500 + "1",
]
LEGITIMATE = [  # forms from the benchmarks' references and beyond: cheap for sympy, and not rejected
    "2^{1009}", "\\frac{100!}{2^{50}}", "10^{100}, 10^{1 / 100}", "1-5051 / 2^{100}", "\\binom{2n}{n}", "2023!", "3!!",
    "\\dbinom{100}{50}", "\\binom{10^{30}}{2}", "9^99", "2^{10}^{2}", "2^{2^{16}}", "x^{10^{9}}", "e^{i\\pi}",
    "0^{10^{9}}", "1^{10^{9}}", "(-1)^{10^{9}}", "\\sqrt[3]{-8}", "[0,1)", "1,000,000",
    "\\left(4 x\\left(x^{2}+1\\right)\\right)", "\\{\\{\\{1\\}\\}\\}", "x" + ")" * 500, "()" * 500,
    "{" * MAX_NESTING + "1" + "}" * MAX_NESTING,
]


@pytest.mark.parametrize("text", TOO_LARGE)
def test_too_large(text):
    assert oversize(text) is not None


@pytest.mark.parametrize("text", LEGITIMATE)
def test_legitimate(text):
    assert oversize(text) is None


def test_the_bounds():
    """Values just under and just over MAX_DIGITS (7^118000: 99,722 digits; 26000!: 103,566), MAX_BINOMIAL_DIGITS
    (C(33000, 16500): 9,932 digits) and MAX_NESTING."""
    assert oversize("7^{118000}") is None and "power" in oversize("7^{119000}")
    assert oversize("25000!") is None and "factorial" in oversize("26000!")
    assert oversize("\\binom{33000}{16500}") is None and "binomial" in oversize("\\binom{34000}{17000}")
    deeper = MAX_NESTING + 1
    assert "nested 11 deep" in oversize("(" * deeper + "1" + ")" * deeper)


def test_unclosed_brackets_count_to_the_end_of_their_group_and_nothing_recurses_deeply():
    """An unclosed "(" nests what follows it up to the "}" that closes its group; a stray closer nests nothing. No
    input of MAX_ANSWER_CHARS reaches Python's recursion limit (commands nest without brackets, too)."""
    assert "nested 1000 deep" in oversize("(" * 1000)
    assert oversize("}" * 1000) is None and oversize("{(}" * 300) is None
    assert "commands nested" in oversize("\\sqrt" * 200 + "2") and oversize("\\sqrt" * MAX_NESTING + "2") is None
    assert oversize("{1 \\choose " * 140 + "1" + "}" * 140) is not None  # nested 140 deep
    assert oversize("1 \\choose " * 140 + "1") is None


@pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data/benchmarks is not present")
def test_no_benchmark_reference_or_math500_solution_is_rejected():
    """Each of the 4,335 references as the grader reads it (gold_latex) and as written, and each MATH500 worked
    solution whole and its last box."""
    from grail.evaluation.benchmarks import BENCHMARK_NAMES, load_benchmark

    texts = []
    for name in BENCHMARK_NAMES:
        for problem in load_benchmark(name, data_dir=DATA, size=None).problems:
            texts += [gold_latex(problem.answer)[len("\\boxed{"):-1], str(problem.answer)]
    with (DATA / "math500" / "test.jsonl").open(encoding="utf-8") as lines:
        solutions = [json.loads(line)["solution"] for line in lines if line.strip()]
    texts += solutions + [last_boxed_content(s) or "" for s in solutions]
    assert len(texts) > 9000
    assert [t for t in texts if oversize(t)] == []
