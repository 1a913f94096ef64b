"""Tests for grail.evaluation.rewards: TRL-contract reward functions over the last complete box."""

import threading
import time

import pytest

from grail.evaluation import grader, rewards
from grail.evaluation.reference_text import gold_latex
from grail.evaluation.rewards import completion_text, exact_int_reward, math_verify_reward

# past the oversize guard (it reads |-9| as a symbol), sympy computes |-9| = 9, then 9^(9^9): only a timeout stops it
SLOW = "\\boxed{|-9|^{9^{9}}}"


def run_in_thread(func, *args, **kwargs):
    out = {}
    thread = threading.Thread(target=lambda: out.setdefault("value", func(*args, **kwargs)))
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive() and "value" in out
    return out["value"]


# ---------------------------------------------------------------- exact_int_reward


@pytest.mark.parametrize(
    ("completion", "answer", "reward"),
    [
        ("so \\boxed{32}", 32, 1.0),
        ("so \\boxed{31}", 32, 0.0),
        ("\\boxed{3} no, \\boxed{32}", "32", 1.0),  # last box wins
        ("\\boxed{32} no, \\boxed{3}", "32", 0.0),
        ("\\boxed{32} and \\boxed{3", 32, 1.0),  # the unclosed box is not a box
        ("the answer is 32", 32, 0.0),
        ("\\boxed{ 32 }", 32, 1.0),
        ("\\boxed{32.0}", 32, 0.0),
        ("\\boxed{+32}", 32, 0.0),
        ("\\boxed{3 2}", 32, 0.0),
        ("\\boxed{x=32}", 32, 0.0),
        ("\\boxed{-7}", "-7", 1.0),
        ("\\boxed{7}", -7, 0.0),
        ("\\boxed{}", 0, 0.0),
        ("\\boxed{" + "9" * 5000 + "}", 9, 0.0),  # more digits than int() reads: 0.0, no crash
    ],
)
def test_exact_int_reward(completion, answer, reward):
    assert exact_int_reward(completions=[completion], answer=[answer]) == [reward]


def test_exact_int_reward_batch_conversational_and_list_answers():
    completions = [[{"role": "assistant", "content": "\\boxed{4}"}], "\\boxed{5}"]
    out = exact_int_reward(completions=completions, answer=[["4", "four"], 6])
    assert out == [1.0, 0.0] and all(type(r) is float for r in out)


def test_exact_int_reward_rejects_non_integer_reference():
    with pytest.raises(ValueError, match="not an integer"):
        exact_int_reward(completions=["\\boxed{32}"], answer=["32.0"])


# ---------------------------------------------------------------- math_verify_reward


@pytest.mark.parametrize(
    ("answer", "box"),
    [
        ("1/2", "\\frac{1}{2}"),
        ("0.5", "\\frac12"),
        ("\\frac{1}{2}", "0.5"),
        ("3", "x=3"),
        ("x=3", "3"),
        ("27.0", "27"),
        ("\\boxed{5}", "5"),
        ("$\\frac{1}{2}$", "1/2"),
        ("\\(3\\)", "3"),
        ("[0, 1)", "[0,1)"),
        ("\\{1, 2\\}", "\\{2, 1\\}"),
        ("\\frac{\\sqrt{3}}{2}", "\\sqrt{3}/2"),
        ("(x+1)^2", "x^2+2x+1"),
    ],
)
def test_math_verify_reward_accepts_equivalent_forms(answer, box):
    assert math_verify_reward(completions=[f"work... \\boxed{{{box}}}"], answer=[answer]) == [1.0]


@pytest.mark.parametrize(
    ("answer", "box"),
    [("1/2", "\\frac{1}{3}"), ("27", "28"), ("[0, 1)", "(0, 1]"), ("x^2", "y^2"), ("\\pi", "3.14")],
)
def test_math_verify_reward_rejects_wrong_answers(answer, box):
    assert math_verify_reward(completions=[f"\\boxed{{{box}}}"], answer=[answer]) == [0.0]


def test_math_verify_reward_passes_gold_first():
    # verify(gold, pred) is not symmetric: an interval answer matches an inequality reference, but
    # an inequality answer does not match an interval reference (allow_set_relation_comp=False).
    assert math_verify_reward(completions=["\\boxed{(1,2)}"], answer=["1<x<2"]) == [1.0]
    assert math_verify_reward(completions=["\\boxed{1<x<2}"], answer=["(1,2)"]) == [0.0]


def test_math_verify_reward_reads_the_last_complete_box():
    completions = ["\\boxed{3} no: \\boxed{4}", "\\boxed{4} no: \\boxed{3}", "\\boxed{4} \\boxed{3", "4"]
    assert math_verify_reward(completions=completions, answer=["4"] * 4) == [1.0, 0.0, 1.0, 0.0]


def test_an_empty_box_is_a_wrong_answer_without_a_parse(monkeypatch):
    """`\\boxed{}` is the grader's "empty_box": 0.0, and math-verify is not asked to parse anything for it."""
    parsed = []
    real_parse = grader.parse
    monkeypatch.setattr(grader, "parse", lambda text, **kw: parsed.append(text) or real_parse(text, **kw))
    assert math_verify_reward(completions=["so \\boxed{}", "so \\boxed{ }"], answer=["0", "1"]) == [0.0, 0.0]
    assert parsed == []
    assert [r.reason for r in grader.grade_many(["\\boxed{}"], ["0"], workers=1)] == ["empty_box"]


def test_math_verify_reward_conversational_and_list_gold():
    completions = [
        [{"role": "assistant", "content": "It is \\boxed{\\frac{1}{2}}."}],
        [{"role": "assistant", "content": [{"type": "text", "text": "It is \\boxed{0.5}"}]}],
        [{"role": "assistant", "content": "It is \\boxed{2}."}],
    ]
    answers = [["0.5", "junk"], ("\\frac12",), ["3", "2"]]  # the first accepted form is the reference
    out = math_verify_reward(completions=completions, answer=answers)
    assert out == [1.0, 1.0, 0.0] and all(type(r) is float for r in out)


def test_math_verify_reward_garbage_scores_zero_without_raising():
    completions = [
        "\\boxed{\\frac{",
        "\\boxed{}}}}",
        "\\boxed{@@#$%^&}",
        "\\boxed{\\frac{1}{0}}",
        "\\boxed{\\}",
        "\\boxed{}",
        "",
        "\\boxed{" + "1" + " " * grader.MAX_ANSWER_CHARS + "}",  # equal to 1, but over the length cap
    ]
    assert math_verify_reward(completions=completions, answer=["1"] * len(completions)) == [0.0] * 8
    assert math_verify_reward(completions=["\\boxed{1}"] * 3, answer=["", "\\frac{", []]) == [0.0] * 3


def test_math_verify_reward_times_out_on_main_thread(monkeypatch):
    monkeypatch.setattr(rewards, "TIMEOUT_S", 1)
    started = time.perf_counter()
    assert math_verify_reward(completions=[SLOW, "\\boxed{2}"], answer=["5", "2"]) == [0.0, 1.0]
    assert time.perf_counter() - started < 1.9  # without the timeout this runs for hours


def test_math_verify_reward_off_the_main_thread_matches_main_thread(off_main_worker):
    completions = [
        "\\boxed{\\frac{1}{2}}",
        "\\boxed{0.3}",
        "no box",
        [{"role": "assistant", "content": "\\boxed{.5}"}],
    ]
    answers = ["0.5"] * 4
    expected = [1.0, 0.0, 0.0, 1.0]
    assert math_verify_reward(completions=completions, answer=answers) == expected
    assert run_in_thread(math_verify_reward, completions=completions, answer=answers) == expected
    assert off_main_worker() is not None  # the threaded call went through the worker process


def test_worker_that_overruns_is_killed_and_replaced(monkeypatch, off_main_worker):
    assert run_in_thread(math_verify_reward, completions=["\\boxed{2}"], answer=["2"]) == [1.0]  # warm
    monkeypatch.setattr(rewards, "TIMEOUT_S", 0.1)  # the item's wall-clock deadline becomes 4 × 0.1 s
    assert run_in_thread(math_verify_reward, completions=[SLOW], answer=["5"]) == [0.0]
    assert off_main_worker() is None
    monkeypatch.undo()
    assert run_in_thread(math_verify_reward, completions=["\\boxed{2}"], answer=["2"]) == [1.0]


# ---------------------------------------------------------------- contract


@pytest.mark.parametrize("func", [math_verify_reward, exact_int_reward])
def test_missing_answer_column_names_it(func):
    with pytest.raises(ValueError, match="`answer`") as info:
        func(
            prompts=["p"],
            completions=["\\boxed{1}"],
            completion_ids=[[1]],
            solution=["1"],
            trainer_state=None,
            log_extra=None,
            log_metric=None,
        )
    assert "['solution']" in str(info.value)  # the columns that were there, without TRL's extras


@pytest.mark.parametrize("func", [math_verify_reward, exact_int_reward])
def test_trl_call_signature_and_name(func):
    out = func(
        prompts=["p", "q"],
        completions=["\\boxed{1}", "\\boxed{2}"],
        completion_ids=[[1], [2]],
        answer=["1", "1"],
        trainer_state=None,
        log_extra=lambda *a: None,
        log_metric=lambda *a: None,
    )
    assert out == [1.0, 0.0]
    assert func.__name__ in ("math_verify_reward", "exact_int_reward")


def test_answer_length_mismatch_raises():
    with pytest.raises(ValueError, match="2 completions but 1 answers"):
        math_verify_reward(completions=["a", "b"], answer=["1"])


def test_gold_latex_forms():
    assert gold_latex("27.0") == "\\boxed{27.0}"
    assert gold_latex(27) == "\\boxed{27}"
    assert gold_latex(" $\\frac{1}{2}$ ") == "\\boxed{\\frac{1}{2}}"
    assert gold_latex("$$4$$") == "\\boxed{4}"
    assert gold_latex("so \\boxed{3} and \\boxed{5}") == "\\boxed{5}"
    assert gold_latex(["7", "8"]) == "\\boxed{7}"
    assert gold_latex("$1$ and $2$") == "\\boxed{$1$ and $2$}"  # not one delimited formula


def test_completion_text_rejects_unknown_types():
    assert (
        completion_text([{"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}])
        == "ab"
    )
    with pytest.raises(TypeError, match="string or a list of message dicts"):
        completion_text(42)
