"""Chain word problems (grail.tasks.chain_problems): an independent reader of the question and of the solution text
recomputes the chain, checks that every intermediate result is needed later, and rebuilds the per-character roles;
the drawing rules keep every quantity in range; bad settings fail naming the field."""

import random
import re
from dataclasses import replace

import pytest

from grail.analysis.saliency.token_labels import CRITICAL, FILLER, char_labels, check_row, saliency_row, token_labels
from grail.evaluation.rewards import exact_int_reward
from grail.models.tiny import build_tokenizer
from grail.tasks.arithmetic import CRITICAL_ROLES, FILLER_WORDS
from grail.tasks.boxed import last_boxed_content
from grail.tasks.chain_problems import ChainConfig, render_chain, sample_chain
from grail.tasks.chains import chain_examples

INSTRUCTION = " Put the final answer in \\boxed{}."
NAME = r"[A-Z][a-z]+"
GIVEN = re.compile(rf"(?P<who>{NAME}) has (?P<n>\d+) (?P<obj>[a-z ]+?)\.")
QUESTION_STEPS = [  # (pattern, operation) of each sentence after the first
    (re.compile(rf"(?P<who>{NAME}) has (?P<n>\d+) more [a-z ]+? than (?P<a>{NAME})\."), "+"),
    (re.compile(rf"(?P<who>{NAME}) has (?P<n>\d+) fewer [a-z ]+? than (?P<a>{NAME})\."), "-"),
    (re.compile(rf"(?P<who>{NAME}) has (?P<n>\d+) times as many [a-z ]+? as (?P<a>{NAME})\."), "*"),
    (re.compile(rf"(?P<who>{NAME}) has as many [a-z ]+? as (?P<a>{NAME}) and (?P<c>{NAME}) together\."), "total"),
]
ASK = re.compile(rf"How many [a-z ]+? does (?P<who>{NAME}) have\?")
FILL = "|".join(FILLER_WORDS)
EQUATION = re.compile(rf"(?P<who>{NAME}) has (?P<left>\d+) (?P<op>[-+*]) (?P<right>\d+) = (?P<res>\d+) [a-z ]+?\. "
                      rf"(?P<fill>(?:(?:{FILL}) )*)")
ALL_OPS = ("add", "subtract", "multiply", "total")


def read_question(text: str):
    """(values by name, [(who, op, a, n or c)], asked name), from the question text alone."""
    assert text.endswith(INSTRUCTION), text
    sentences = re.findall(r"[^.?]+[.?]", text[: -len(INSTRUCTION)])
    sentences = [s.strip() for s in sentences]
    given = GIVEN.fullmatch(sentences[0])
    values = {given["who"]: int(given["n"])}
    steps = []
    for sentence in sentences[1:-1]:
        matches = [(m, op) for pattern, op in QUESTION_STEPS if (m := pattern.fullmatch(sentence))]
        assert len(matches) == 1, sentence
        m, op = matches[0]
        assert m["who"] not in values, f"a person is defined twice: {sentence}"
        a = values[m["a"]]  # KeyError: defined from someone not yet known
        if op == "total":
            assert m["c"] != m["a"]
            values[m["who"]] = a + values[m["c"]]
            steps.append((m["who"], op, m["a"], m["c"]))
        else:
            n = int(m["n"])
            values[m["who"]] = a + n if op == "+" else a - n if op == "-" else a * n
            steps.append((m["who"], op, m["a"], n))
    asked = ASK.fullmatch(sentences[-1])["who"]
    return values, steps, asked, given["who"]


def check_chain(ex, config):
    """Everything about one example that the texts determine, recomputed without grail.tasks.chain_problems."""
    assert len(ex.prompt) == 1 and ex.prompt[0]["role"] == "user"  # one user turn, no worked example
    values, steps, asked, first = read_question(ex.prompt[0]["content"])
    assert len(steps) == config.num_steps
    # the answer is the chain evaluated from the question; every quantity stays in range
    assert ex.answer == str(values[asked])
    assert all(config.operand_min <= v <= config.max_value for v in values.values())
    # it is a chain: each step is defined from the step just before, and the question asks about the last person
    order = [first] + [who for who, *_ in steps]
    assert [a for _, _, a, _ in steps] == order[:-1] and asked == order[-1]
    # the identity is the arithmetic read from the question
    pieces = [f"+q{order.index(arg)}" if op == "total" else f"{op}{arg}" for _, op, _, arg in steps]
    assert ex.expression == str(values[first]) + "".join(pieces)
    # the solution: one equation per step, in order, each with the question's numbers and its correct result
    equations = list(EQUATION.finditer(ex.solution))
    assert "".join(m.group() for m in equations) + f"\\boxed{{{ex.answer}}}" == ex.solution, ex.solution
    assert len(equations) == len(steps)
    expected_roles = ["format"] * len(ex.solution)
    for m, (who, op, a, arg) in zip(equations, steps, strict=True):
        left, right, res = int(m["left"]), int(m["right"]), int(m["res"])
        assert m["who"] == who and left == values[a]
        right_name = arg if op == "total" else None
        assert right == (values[right_name] if right_name else arg)
        assert m["op"] == ("+" if op == "total" else op)
        assert res == values[who] == (left + right if m["op"] == "+" else left - right if m["op"] == "-"
                                      else left * right)
        for group, role in [("left", "operand" if a == first else "carry"), ("op", "operator"),
                            ("right", "carry" if right_name and right_name != first else "operand"),
                            ("res", "result")]:
            expected_roles[m.start(group):m.end(group)] = [role] * (m.end(group) - m.start(group))
        for word in re.finditer("[a-z]+", m["fill"]):
            start = m.start("fill") + word.start()
            expected_roles[start:start + len(word.group())] = ["filler"] * len(word.group())
    # every intermediate result is used later: person k's result is the left number of step k + 1
    for k in range(len(equations) - 1):
        assert equations[k + 1]["left"] == equations[k]["res"]
    box = len(ex.solution) - len(ex.answer) - 1
    expected_roles[box:box + len(ex.answer)] = ["answer"] * len(ex.answer)
    assert list(ex.roles) == expected_roles
    assert ex.critical_mask() == [r in CRITICAL_ROLES for r in expected_roles]
    # the reward reads the box and accepts the reference solution
    assert last_boxed_content(ex.solution) == ex.answer
    assert exact_int_reward([ex.solution], answer=[ex.answer]) == [1.0]
    return steps


@pytest.mark.parametrize("config", [
    ChainConfig(),
    ChainConfig(num_steps=5, operations=ALL_OPS, filler_rate=0.5),
    ChainConfig(num_steps=3, operand_min=1, operand_max=9, max_value=30, operations=ALL_OPS, factor_max=4,
                filler_rate=1.0),
])
def test_generated_chains_pass_the_independent_reader(config):
    ops = set()
    for ex in chain_examples(config, 60, "train", seed=1):
        ops |= {op for _, op, _, _ in check_chain(ex, config)}
    assert len(ops) == len(config.operations)  # every allowed operation occurs


def test_hand_built_chain_with_every_operation():
    # 23 +15 = 38, 38 -8 = 30, 30 *2 = 60, 60 + q1 (38) = 98
    config = ChainConfig(num_steps=4, operations=ALL_OPS)
    ex = render_chain(config, 23, [("add", 15), ("subtract", 8), ("multiply", 2), ("total", 1)], random.Random(0))
    steps = check_chain(ex, config)
    assert [op for _, op, _, _ in steps] == ["+", "-", "*", "total"]
    assert ex.answer == "98" and ex.expression == "23+15-8*2+q1"
    assert "30 * 2 = 60" in ex.solution and "60 + 38 = 98" in ex.solution


def test_a_total_with_the_given_number_copies_an_operand():
    # q2 = q1 + q0 = 31 + 20: the 31 is copied from a result (carry), the 20 from the question (operand)
    ex = render_chain(ChainConfig(num_steps=2), 20, [("add", 11), ("total", 0)], random.Random(0))
    equation = "31 + 20 = 51"
    start = ex.solution.index(equation)
    code = {"carry": "c", "format": "_", "operator": "p", "operand": "o", "result": "r"}
    assert "".join(code[r] for r in ex.roles[start:start + len(equation)]) == "cc_p_oo___rr"
    check_chain(ex, ChainConfig(num_steps=2))


def test_roles_line_up_with_the_tiny_tokenizer():
    tokenizer = build_tokenizer()
    n_critical = n_filler = 0
    for i, ex in enumerate(chain_examples(ChainConfig(filler_rate=0.6), 20, "heldout", seed=0)):
        row = saliency_row(ex)
        check_row(row, i)
        enc = tokenizer(row["solution"], add_special_tokens=False, return_offsets_mapping=True)
        labels = token_labels(row["solution"], char_labels(len(row["solution"]), row["critical_spans"],
                                                           row["filler_spans"]), enc["offset_mapping"])
        for label, (a, b) in zip(labels, enc["offset_mapping"], strict=True):
            piece = row["solution"][a:b].strip()
            if label == CRITICAL:
                assert re.fullmatch(r"[-+*0-9=]+", piece), piece
                n_critical += 1
            elif label == FILLER:
                assert piece and any(piece in w for w in FILLER_WORDS), piece
                n_filler += 1
        assert "".join(row["solution"][a:b] for a, b in row["critical_spans"]) == "".join(
            m["op"] + m["res"] for m in EQUATION.finditer(row["solution"]))
    assert n_critical and n_filler


def test_every_quantity_stays_in_range_at_the_smallest_valid_max_value():
    # max_value = max(operand_max, 3 * operand_min - 1) is the least that leaves every quantity a step
    for lo, hi in [(1, 1), (2, 5), (10, 12), (7, 20), (10, 19)]:
        config = ChainConfig(num_steps=8, operand_min=lo, operand_max=hi, max_value=max(hi, 3 * lo - 1),
                             operations=ALL_OPS)
        rng = random.Random(lo * 100 + hi)
        for _ in range(200):
            start, steps = sample_chain(config, rng)
            values = [start]
            for op, arg in steps:
                v = values[-1]
                if op == "total":
                    assert 0 <= arg <= len(values) - 2  # an earlier person than the previous one
                    values.append(v + values[arg])
                elif op == "multiply":
                    assert 2 <= arg <= config.factor_max
                    values.append(v * arg)
                else:
                    assert lo <= arg <= hi
                    values.append(v + arg if op == "add" else v - arg)
            assert lo <= start <= hi and all(lo <= v <= config.max_value for v in values)


def test_below_that_max_value_a_start_number_has_no_step():
    # independent of the generator: with operands 10..19 and max_value 28, the start 19 can neither add (19 + 10 > 28)
    # nor subtract (19 - 10 < 10, the floor); one more (29 = 3 * 10 - 1) and it can add
    lo, hi, max_value = 10, 19, 28
    assert hi + lo > max_value and hi - lo < lo and hi + lo <= max_value + 1
    with pytest.raises(ValueError, match="max_value=28 is below .* = 29, so a start number does not fit or a count "
                                         "in \\[10, 28\\] has no step; set max_value >= 29"):
        ChainConfig(operand_min=lo, operand_max=hi, max_value=max_value)
    ChainConfig(operand_min=lo, operand_max=hi, max_value=max_value + 1)  # accepted (drawn from in the test above)


def test_same_seed_same_problems_and_arithmetic_independent_of_filler():
    a = chain_examples(ChainConfig(), 30, "train", seed=3)
    assert a == chain_examples(ChainConfig(), 30, "train", seed=3)
    assert [e.expression for e in a] != [e.expression for e in chain_examples(ChainConfig(), 30, "train", seed=4)]
    filled = chain_examples(ChainConfig(filler_rate=1.0), 30, "train", seed=3)
    assert [e.expression for e in a] == [e.expression for e in filled]
    assert all(any(r == "filler" for r in e.roles) for e in filled)


@pytest.mark.parametrize(("changes", "field", "fix"), [
    ({"num_steps": 0}, "num_steps=0", "num_steps >= 1"),
    ({"num_steps": 12}, "num_steps=12", "num_steps <= 11"),
    ({"operand_min": 0}, "operand_min=0", "operand_min >= 1"),
    ({"operand_min": 30, "operand_max": 20}, "operand_max=20", "operand_max >= operand_min"),
    ({"max_value": 40}, "max_value=40", "max_value >= 49"),
    ({"operations": ("add",)}, "operations=", "include both 'add' and 'subtract'"),
    ({"operations": ("add", "subtract", "divide")}, "operations=", "choose distinct names"),
    ({"factor_max": 1}, "factor_max=1", "factor_max >= 2"),
    ({"filler_rate": 1.5}, "filler_rate=1.5", r"\[0, 1\]"),
])
def test_bad_settings_name_the_field_and_the_fix(changes, field, fix):
    with pytest.raises(ValueError, match=f"ChainConfig {field}.*{fix}"):
        replace(ChainConfig(), **changes)
