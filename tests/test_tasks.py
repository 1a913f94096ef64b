"""Tests for grail.tasks.arithmetic: formats, per-character roles, determinism, splits, bounds, errors."""

import json
import re
from collections import Counter

import pytest

from grail.tasks.arithmetic import CRITICAL_ROLES, FILLER_WORDS, ROLES, TaskConfig, build_example, split_of
from grail.tasks.synthetic import generate

# One letter per role, so expected role sequences can be written under the solution string.
CODE = {"operand": "o", "carry": "c", "operator": "p", "result": "r", "answer": "a", "filler": "f",
        "format": "_"}


def role_codes(example):
    return "".join(CODE[r] for r in example.roles)


# ---------------------------------------------------------------------------------------------
# Independent checker: parses a solution with regexes and recomputes everything.

STEP = re.compile(r"(?P<left>\d+)(?P<op>[-+*])(?P<rhs>\d+)=(?P<res>\d+)")
FILL = r"(?:(?:so|well|okay|hmm|now|then|right|next) )*"
STEP_SRC = r"\d+[-+*]\d+=\d+"
SHAPE = re.compile(rf" {STEP_SRC}(?:, {FILL}{STEP_SRC})*\. {FILL}\\boxed\{{(?P<box>\d+)\}}")


def check_example(ex, config):
    """Assert everything derivable from the solution text; return the parsed steps."""
    shape = SHAPE.fullmatch(ex.solution)
    assert shape, ex.solution
    steps = list(STEP.finditer(ex.solution))
    assert len(steps) == config.num_steps
    assert ex.expression == steps[0]["left"] + "".join(m["op"] + m["rhs"] for m in steps)
    assert ex.prompt == f"Q: {ex.expression}\nA:"
    expected = ["format"] * len(ex.solution)
    value = int(steps[0]["left"])
    for k, m in enumerate(steps):
        left, rhs, res = int(m["left"]), int(m["rhs"]), int(m["res"])
        assert left == value, "left operand must be the previous result"
        value = left + rhs if m["op"] == "+" else left - rhs if m["op"] == "-" else left * rhs
        assert res == value, f"step {m.group()} computed wrongly"
        for group, role in [("left", "operand" if k == 0 else "carry"), ("op", "operator"),
                            ("rhs", "operand"), ("res", "result")]:
            expected[m.start(group):m.end(group)] = [role] * (m.end(group) - m.start(group))
    for word in re.finditer(r"[a-z]+(?= )", ex.solution):
        expected[word.start():word.end()] = ["filler"] * (word.end() - word.start())
    expected[shape.start("box"):shape.end("box")] = ["answer"] * len(shape["box"])
    assert ex.answer == shape["box"] == str(value)
    assert list(ex.roles) == expected
    assert ex.critical_mask() == [r in CRITICAL_ROLES for r in expected]
    assert ex.filler_mask() == [r == "filler" for r in expected]
    return steps


@pytest.mark.parametrize("filler_rate", [0.0, 0.5])
def test_generated_examples_pass_independent_checker(filler_rate):
    config = TaskConfig(num_steps=4, filler_rate=filler_rate)
    examples = generate(config, 300, "train", seed=3)
    for ex in examples:
        check_example(ex, config)
    assert any("filler" in ex.roles for ex in examples) == (filler_rate > 0)


# ---------------------------------------------------------------------------------------------
# Hand-written cases.

def test_hand_written_plain_example():
    # ((7+5)*3)-4 = 32, evaluated left to right.
    ex = build_example(7, [("+", 5), ("*", 3), ("-", 4)])
    assert ex.expression == "7+5*3-4"
    assert ex.prompt == "Q: 7+5*3-4\nA:"
    assert ex.solution == " 7+5=12, 12*3=36, 36-4=32. \\boxed{32}"
    assert ex.answer == "32"
    #          " 7+5=12, 12*3=36, 36-4=32. \boxed{32}"
    expected = "_opo_rr__ccpo_rr__ccpo_rr__" + "_______" + "aa_"
    assert role_codes(ex) == expected
    assert sum(ex.critical_mask()) == 3 + 6  # three operators, six result digits
    assert not any(ex.filler_mask())
    assert ex.to_row() == {"prompt": ex.prompt, "answer": "32", "solution": ex.solution,
                           "expression": "7+5*3-4"}
    json.dumps(ex.to_row())


def test_hand_written_filler_example():
    ex = build_example(7, [("+", 5), ("*", 3), ("-", 4)], fillers=[("so", "well"), (), ("okay",)])
    assert ex.solution == " 7+5=12, so well 12*3=36, 36-4=32. okay \\boxed{32}"
    #          " 7+5=12, so well 12*3=36, 36-4=32. okay \boxed{32}"
    expected = "_opo_rr__ff_ffff_ccpo_rr__ccpo_rr__ffff_" + "_______" + "aa_"
    assert role_codes(ex) == expected
    assert "".join(c for c, f in zip(ex.solution, ex.filler_mask(), strict=True) if f) == "sowellokay"


def test_constants():
    assert set(CRITICAL_ROLES) == {"operator", "result"}
    assert set(ROLES) == set(CODE)
    assert FILLER_WORDS == ("so", "well", "okay", "hmm", "now", "then", "right", "next")


# ---------------------------------------------------------------------------------------------
# Determinism.

def test_same_seed_same_examples_different_seed_different():
    config = TaskConfig(filler_rate=0.5)
    a = generate(config, 50, "train", seed=11)
    assert a == generate(config, 50, "train", seed=11)
    assert [e.expression for e in a] != [e.expression for e in generate(config, 50, "train", seed=12)]


def test_golden_expressions_are_stable_across_processes():
    # Pinned output: catches any use of hash() or the global RNG, and any silent change of the
    # generation procedure (which would invalidate saved datasets). Update only deliberately.
    assert [e.expression for e in generate(TaskConfig(num_steps=3), 5, "train", seed=0)] == [
        "2-2+1*4", "8-6-2+4", "1-1+5-1", "3*9*4+8", "3-1+4+3"]
    assert split_of("7+5*3-4", 0.1) == "train"


def test_global_rng_untouched():
    import random
    random.seed(123)
    expected = random.random()
    random.seed(123)
    generate(TaskConfig(filler_rate=0.5), 20, "train", seed=0)
    assert random.random() == expected


# ---------------------------------------------------------------------------------------------
# Filler.

def strip_filler(solution):
    return re.sub(r"(?<=[,.] )(?:[a-z]+ )+", "", solution)


def test_filler_rate_zero_is_plain_and_one_fills_every_gap():
    plain = generate(TaskConfig(num_steps=4, filler_rate=0.0), 100, "train", seed=5)
    full = generate(TaskConfig(num_steps=4, filler_rate=1.0), 100, "train", seed=5)
    for ex in plain:
        assert "filler" not in ex.roles
        assert re.fullmatch(r" (\d+[-+*]\d+=\d+, ){3}\d+[-+*]\d+=\d+\. \\boxed\{\d+\}", ex.solution)
    for ex in full:
        gaps = re.findall(r"[,.] ((?:[a-z]+ )*)", ex.solution)
        assert len(gaps) == 4
        for gap in gaps:
            words = gap.split()
            assert 1 <= len(words) <= 3 and set(words) <= set(FILLER_WORDS)


def test_stripping_filler_recovers_plain_solution():
    plain = generate(TaskConfig(filler_rate=0.0), 200, "train", seed=9)
    noisy = generate(TaskConfig(filler_rate=0.5), 200, "train", seed=9)
    assert [e.expression for e in plain] == [e.expression for e in noisy]
    assert any(e.solution != p.solution for e, p in zip(noisy, plain, strict=True))
    for e, p in zip(noisy, plain, strict=True):
        assert strip_filler(e.solution) == p.solution
        assert e.answer == p.answer


# ---------------------------------------------------------------------------------------------
# Splits.

def test_splits_are_disjoint():
    config = TaskConfig(num_steps=3)
    train = generate(config, 2000, "train", seed=0)
    heldout = generate(config, 300, "heldout", seed=1)
    train_set, heldout_set = {e.expression for e in train}, {e.expression for e in heldout}
    assert len(train_set) == 2000 and len(heldout_set) == 300  # de-duplicated
    assert not train_set & heldout_set
    assert all(split_of(e, 0.1) == "train" for e in train_set)
    assert all(split_of(e, 0.1) == "heldout" for e in heldout_set)


def test_split_of_fraction_and_monotonicity():
    exprs = [f"{a}+{b}*{c}" for a in range(30) for b in range(30) for c in range(10)]  # 9000
    heldout_10 = {e for e in exprs if split_of(e, 0.1) == "heldout"}
    heldout_30 = {e for e in exprs if split_of(e, 0.3) == "heldout"}
    assert 0.08 < len(heldout_10) / len(exprs) < 0.12
    assert 0.27 < len(heldout_30) / len(exprs) < 0.33
    assert heldout_10 <= heldout_30


# ---------------------------------------------------------------------------------------------
# Bounds and operator choice.

@pytest.mark.parametrize("config", [
    TaskConfig(num_steps=6, operand_min=0, operand_max=9, max_value=20),
    TaskConfig(num_steps=5, operand_min=3, operand_max=9, max_value=12),
    TaskConfig(num_steps=4, operand_min=1, operand_max=9, max_value=999),
])
def test_values_in_range_and_no_trivial_multiplication(config):
    for ex in generate(config, 200, "train", seed=2):
        for m in check_example(ex, config):
            assert 0 <= int(m["res"]) <= config.max_value
            if m["op"] == "*":
                assert int(m["rhs"]) >= 2 and int(m["left"]) != 0
            else:
                assert config.operand_min <= int(m["rhs"]) <= config.operand_max


def test_operators_roughly_uniform_when_all_feasible():
    config = TaskConfig(num_steps=3, operand_min=1, operand_max=9, max_value=10**6)
    ops = Counter(c for ex in generate(config, 1000, "train", seed=4) for c in ex.expression if c in "+-*")
    for op in "+-*":
        assert 0.28 < ops[op] / 3000 < 0.39, ops


# ---------------------------------------------------------------------------------------------
# Errors.

def test_too_small_problem_space_raises():
    config = TaskConfig(num_steps=1, operand_min=1, operand_max=2, max_value=4)
    with pytest.raises(ValueError, match="too small") as err:
        generate(config, 50, "train", seed=0)
    msg = str(err.value)
    assert "num_steps" in msg and "operand_min..operand_max" in msg and "lower n" in msg


@pytest.mark.parametrize("kwargs, field", [
    ({"num_steps": 0}, "num_steps"),
    ({"operand_min": -1}, "operand_min"),
    ({"operand_min": 5, "operand_max": 3}, "operand_max"),
    ({"filler_rate": 1.5}, "filler_rate"),
    ({"filler_rate": -0.1}, "filler_rate"),
    ({"max_value": 5}, "max_value"),
])
def test_bad_config_names_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"{field}={list(kwargs.values())[-1]}"):
        TaskConfig(**kwargs)


@pytest.mark.parametrize("kwargs, match", [
    ({"split": "test"}, "split"),
    ({"heldout_fraction": 0.0}, "heldout_fraction"),
    ({"heldout_fraction": 1.0}, "heldout_fraction"),
    ({"n": -1}, "n=-1"),
])
def test_bad_generate_arguments(kwargs, match):
    args = {"config": TaskConfig(), "n": 5, "split": "train", "seed": 0} | kwargs
    with pytest.raises(ValueError, match=match):
        generate(**args)
