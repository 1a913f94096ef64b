r"""Tests for grail.tasks.boxed: `\boxed{}` spans in character space and the character-to-token map."""

import random

import pytest

from grail.tasks.boxed import (
    BoxSpan,
    char_span_to_token_positions,
    find_boxed_spans,
    first_boxed,
    last_boxed,
    last_boxed_content,
)


def contents(text: str) -> list[str]:
    return [span.content(text) for span in find_boxed_spans(text)]


def test_box_in_the_middle_of_text_has_exact_positions():
    text = "ab \\boxed{x}yz"
    # "ab " is 0..2, the backslash at 3, "\boxed{" is 7 characters (3..9), "x" at 10, "}" at 11.
    assert find_boxed_spans(text) == [BoxSpan(start=3, content_start=10, content_end=11, end=12)]
    assert text[3:12] == "\\boxed{x}"


def test_nested_braces_stay_inside_the_content():
    text = "so \\boxed{\\frac{1}{2}} done"
    assert contents(text) == ["\\frac{1}{2}"]
    assert text[last_boxed(text).end :] == " done"


def test_first_and_last_of_several_boxes():
    text = "try \\boxed{1}, then \\boxed{2}, finally \\boxed{3}."
    assert contents(text) == ["1", "2", "3"]
    assert first_boxed(text).content(text) == "1"
    assert last_boxed(text).content(text) == "3"
    assert last_boxed_content(text) == "3"


def test_no_box():
    text = "the answer is 3 (boxed) {3}"
    assert find_boxed_spans(text) == []
    assert first_boxed(text) is None and last_boxed(text) is None and last_boxed_content(text) is None


def test_empty_content_is_a_complete_box():
    assert contents("\\boxed{}") == [""]
    assert last_boxed_content("a \\boxed{} b") == ""  # "" (a box, empty), not None (no box)


def test_unclosed_box_is_not_returned():
    assert find_boxed_spans("the answer is \\boxed{12") == []
    assert find_boxed_spans("\\boxed{\\frac{1}{2}") == []  # inner braces close, the box's own does not
    # A truncated completion: the last COMPLETE box is the one before the cut.
    assert last_boxed_content("\\boxed{5} but wait, \\boxed{\\frac{1") == "5"


def test_complete_box_inside_an_unclosed_one_is_returned():
    # Documented choice: the inner box's brace is matched and no complete box encloses it.
    assert contents("\\boxed{12 \\boxed{5}") == ["5"]


def test_only_outermost_boxes():
    text = "\\boxed{\\boxed{3}} x \\boxed{4}"
    assert contents(text) == ["\\boxed{3}", "4"]
    assert first_boxed(text).start == 0


def test_marker_must_be_exact_and_unescaped():
    assert find_boxed_spans("\\boxed {3} \\boxed3 \\fbox{3} boxed{3}") == []
    assert find_boxed_spans("\\\\boxed{3}") == []  # `\\` is a line break, then plain "boxed{3}"


def test_escaped_braces_do_not_count():
    assert contents("\\boxed{\\{1,2\\}}") == ["\\{1,2\\}"]
    assert contents("\\boxed{\\left\\{ x \\right.}") == ["\\left\\{ x \\right."]  # one `\{`, unpaired
    assert contents("}} \\boxed{1}") == ["1"]  # stray closing braces before the box are ignored


def _reference_spans(text: str) -> list[BoxSpan]:
    """Slow reference: depth counting from each marker, then drop boxes inside other boxes."""
    marker = "\\boxed{"
    complete = []
    for k in range(len(text)):
        backslashes_before = len(text[:k]) - len(text[:k].rstrip("\\"))
        if not text.startswith(marker, k) or backslashes_before % 2:
            continue  # not a marker, or its backslash is escaped
        depth, i = 1, k + len(marker)
        while i < len(text):
            if text[i] == "\\":
                i += 2
                continue
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                complete.append(BoxSpan(k, k + len(marker), i, i + 1))
                break
            i += 1
    return [s for s in complete if not any(o.start < s.start and s.end <= o.end for o in complete)]


def test_matches_slow_reference_on_random_text():
    rng = random.Random(0)
    pieces = ["\\boxed{", "{", "}", "\\", "\\{", "\\}", "a", " "]
    for _ in range(2000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 14)))
        assert find_boxed_spans(text) == _reference_spans(text), text


# Hand-made offsets for text = "ab \boxed{12}", as a fast tokenizer with a BOS/EOS would return them:
#   idx: 0 BOS   1 "ab"  2 " "   3 "\boxed{"  4 "1"     5 (empty)  6 "2}"    7 EOS
OFFSETS = [(0, 0), (0, 2), (2, 3), (3, 10), (10, 11), (11, 11), (11, 13), (13, 13)]


@pytest.mark.parametrize(
    ("start", "end", "expected"),
    [
        # Box content "12" is [10, 12): token 4 [10, 11) inside; token 6 [11, 13) partly; token 3
        # [3, 10) only touches 10; token 5 [11, 11) is empty; BOS/EOS are empty.
        (10, 12, [4, 6]),
        # Whole box [3, 13): tokens 3, 4, 6 (5 and 7 are empty).
        (3, 13, [3, 4, 6]),
        # [5, 11) starts inside token 3 and ends at the end of token 4.
        (5, 11, [3, 4]),
        # Everything: only the non-empty tokens.
        (0, 13, [1, 2, 3, 4, 6]),
        # Empty range and a range past the text: nothing.
        (10, 10, []),
        (13, 20, []),
    ],
)
def test_char_span_to_token_positions(start, end, expected):
    assert char_span_to_token_positions(OFFSETS, start, end) == expected


def test_char_span_to_token_positions_of_found_box_content():
    text = "ab \\boxed{12}"
    span = first_boxed(text)
    assert char_span_to_token_positions(OFFSETS, span.content_start, span.content_end) == [4, 6]
    assert char_span_to_token_positions(OFFSETS, span.start, span.end) == [3, 4, 6]
