"""The grader's soundness rules that are decisions, not math-verify's behaviour: what a comma
means, the release's last-box rule against the opt-in all-boxes rule, and how references are read (partial parses,
text fallbacks)."""

import pytest

from grail.evaluation.cli import SCORING_NAMES
from grail.evaluation.grader import ALL_BOXES_SCORING, grade, grade_many, reference_parse
from grail.evaluation.harness import EvalSpec
from grail.evaluation.reference_text import gold_latex
from grail.evaluation.rewards import reward_named

SPLIT = "\\boxed{1}, \\boxed{2}, \\boxed{3}"


@pytest.mark.parametrize(("completion", "reference", "correct"), [
    ("\\boxed{1.22}", "1,22", False),  # "1,22" is the list 1 and 22, not a decimal comma
    ("\\boxed{1, 22}", "1,22", True),
    ("\\boxed{22,1}", "1,22", True),  # a list compares as a set
    ("\\boxed{1,22}", "1.22", False),  # a model's decimal comma is wrong too
    ("\\boxed{1224}", "1,224", True),  # groups of three digits: a thousands separator
    ("\\boxed{1, 5}", "1,5", True),  # CollegeMath "Solve sqrt(6x-5) = x": the roots 1 and 5
    ("\\boxed{1.5}", "1,5", False),
])
def test_a_comma_between_digits_separates_a_list(completion, reference, correct):
    assert grade(completion, reference).correct is correct


@pytest.mark.parametrize(("completion", "reference", "last", "all_boxes"), [
    (SPLIT, "1, 2, 3", False, True),  # the release grades the last box only: 3 is not {1, 2, 3}
    (SPLIT, "3", True, False),
    (SPLIT, SPLIT, True, True),  # a reference with several boxes: its last (release) or all of them (opt-in)
    (SPLIT, "\\boxed{1} and \\boxed{3}", True, False),
    ("\\boxed{3}, \\boxed{1}, \\boxed{2}", "1, 2, 3", False, True),  # any order
    ("\\boxed{1}, \\boxed{2}", "1, 2, 3", False, False),  # a part missing
    ("first \\boxed{7}, so the answers are \\boxed{1, 2, 3}", "1, 2, 3", True, False),  # a boxed step counts
    ("\\boxed{1, 2, 3}", "1, 2, 3", True, True),
])
def test_the_last_box_rule_and_the_opt_in_all_boxes_rule(completion, reference, last, all_boxes):
    assert grade(completion, reference).correct is last
    [in_process] = grade_many([completion], [reference], workers=1, scoring=ALL_BOXES_SCORING)
    assert in_process.correct is all_boxes
    reward = reward_named("math_verify_all_boxes", synthetic=False)
    assert reward(completions=[completion], answer=[reference]) == [float(all_boxes)]
    assert reward_named("math_verify", synthetic=False)(completions=[completion], answer=[reference]) == [float(last)]


def test_the_all_boxes_rule_runs_in_worker_processes_and_is_offered_by_eval():
    completions, references = [SPLIT, SPLIT, "\\boxed{1}"], ["1, 2, 3", "3", "1, 2"]
    results = grade_many(completions, references, workers=2, scoring=ALL_BOXES_SCORING)
    assert [r.correct for r in results] == [True, False, False]
    assert results[0].extracted == "1, 2, 3"
    assert "grail_all_boxes" in SCORING_NAMES
    assert EvalSpec(("synthetic",), scoring="grail_all_boxes").scoring == "grail_all_boxes"


def test_gold_latex_rejects_an_unknown_box_rule():
    assert gold_latex(SPLIT, boxes="all") == "\\boxed{1, 2, 3}" == gold_latex(gold_latex(SPLIT, boxes="all"), "all")
    with pytest.raises(ValueError, match="boxes='first'"):
        gold_latex("1", boxes="first")


@pytest.mark.parametrize(("reference", "before", "after"), [
    ("1 - \\frac{1}{\\mathrm{e}}", "partial", "math"),  # the example: grail's normalisation repairs it
    ("x=\\frac{\\mathrm{gb}}{f}", "partial", "partial"),  # CollegeMath: a multi-letter upright name, left as is
    ("np.arcsin(10/13)", "text", "text"),  # Minerva: code, read as text
    ("$\\frac{1}{2}$", "math", "math"),
    ("", "none", "none"),
])
def test_reference_parse_tells_partial_parses_and_text_fallbacks_apart(reference, before, after):
    assert reference_parse(reference, normalise=False)[0] == before
    kind, extracted = reference_parse(reference)
    assert kind == after
    if kind == "partial":
        assert extracted == "x=\\frac{"  # the cut-off start math-verify keeps


def test_a_partially_parsed_reference_accepts_only_its_own_text():
    """A text-only match counts only when both sides read the same after normalisation (the guard), so answers that
    share the reference's cut-off start ("x=\\frac{") are rejected, and the reference itself is accepted."""
    reference = "x=\\frac{\\mathrm{gb}}{f}"
    assert grade("\\boxed{x=\\frac{\\mathrm{gb}}{f}}", reference).correct
    for wrong in ("x=\\frac{\\mathrm{gc}}{f}", "x=\\frac{\\mathrm{g}}{2}", "x=\\frac{"):
        assert not grade(f"\\boxed{{{wrong}}}", reference).correct, wrong
