"""First errors of chain solutions (grail.tasks.chain_errors): every class is reached from a real reference by the
one edit that makes it, only the first error counts, and the reader sees through filler words on both sides."""

import pytest

from grail.tasks.chain_errors import FIRST_ERRORS, ChainStep, chain_steps, first_error, first_error_counts
from grail.tasks.chain_problems import ChainConfig
from grail.tasks.chains import chain_examples

REFERENCE = "Tom has 23 + 15 = 38 apples. Ava has 38 - 8 = 30 apples. Ben has 30 + 38 = 68 apples. \\boxed{68}"


def test_steps_are_read_in_order_with_their_numbers():
    assert chain_steps(REFERENCE) == [ChainStep(23, "+", 15, 38), ChainStep(38, "-", 8, 30), ChainStep(30, "+", 38, 68)]
    assert chain_steps("A has 4 × 3 = 12 cats. B has 12 - 20 = -8 cats.") == [ChainStep(4, "*", 3, 12),
                                                                              ChainStep(12, "-", 20, -8)]
    assert chain_steps("no numbers here \\boxed{5}") == []
    assert chain_steps("1.5 + 2 = 3.5") == []  # decimals are not chain steps


@pytest.mark.parametrize(("completion", "expected"), [
    (REFERENCE, "none"),
    (REFERENCE.replace("= 38", "= 39").replace("38 -", "39 -"), "arithmetic"),  # step 1 slips, step 2 carries it
    (REFERENCE.replace("30 + 38 = 68", "30 + 38 = 67").replace("{68}", "{67}"), "arithmetic"),
    (REFERENCE.replace("38 - 8", "38 - 9").replace("= 30", "= 29"), "setup"),  # right number copied wrongly
    (REFERENCE.replace("38 - 8 = 30", "38 + 8 = 46"), "setup"),  # wrong operation, correctly computed
    (REFERENCE.replace("30 + 38", "30 + 15"), "setup"),  # a total of the wrong person
    (REFERENCE.replace("23 + 15", "15 + 23"), "none"),  # + commutes: the same set-up
    (REFERENCE.replace("23 + 15 = 38", "15 + 23 = 37").replace("38 -", "37 -"), "arithmetic"),
    (REFERENCE.replace("38 - 8 = 30", "8 - 38 = -30"), "setup"),  # - does not
    (REFERENCE.replace("38 - 8", "37 - 8"), "setup"),  # the previous result not carried
    (REFERENCE.split(" Ben")[0] + " \\boxed{30}", "steps"),  # stopped a step early
    (REFERENCE.replace(" \\boxed", " Zoe has 68 + 1 = 69 apples. \\boxed"), "steps"),
    (REFERENCE.replace("\\boxed{68}", "\\boxed{38}"), "answer"),
    (REFERENCE.replace("\\boxed{68}", "So 68."), "answer"),
    ("I think the answer is \\boxed{68}", "unparsed"),
    ("", "unparsed"),
])
def test_each_class_from_one_edit(completion, expected):
    assert first_error(REFERENCE, "68", completion) == expected


def test_only_the_first_error_counts():
    both = REFERENCE.replace("23 + 15 = 38", "23 + 15 = 37").replace("38 - 8", "37 - 9")  # a slip, then a setup error
    assert first_error(REFERENCE, "68", both) == "arithmetic"


def test_real_references_read_through_filler_and_score_none_against_themselves():
    examples = chain_examples(ChainConfig(num_steps=4, filler_rate=1.0), 20, "heldout", seed=3)
    assert any(("filler" in e.roles) for e in examples)
    for e in examples:
        assert len(chain_steps(e.solution)) == 4
        assert first_error(e.solution, e.answer, e.solution) == "none"
        without_filler = "".join(c for c, role in zip(e.solution, e.roles, strict=True) if role != "filler")
        assert first_error(e.solution, e.answer, without_filler) == "none"


def test_counts_have_every_class():
    counts = first_error_counts([(REFERENCE, "68", REFERENCE), (REFERENCE, "68", "")])
    assert list(counts) == list(FIRST_ERRORS)
    assert counts["none"] == 1 and counts["unparsed"] == 1 and sum(counts.values()) == 2


def test_a_reference_without_steps_is_refused():
    with pytest.raises(ValueError, match="task_style chains"):
        first_error("The answer is \\boxed{68}", "68", REFERENCE)
