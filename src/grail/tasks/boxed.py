r"""`\boxed{...}` spans in character space, and the map from characters to tokens.

The reward reads the LAST complete box of a completion, GRAIL's answer span the FIRST
(docs/methods/none.md, docs/methods/grail.md step 1). Both come from `find_boxed_spans`, so they agree on what a box is:

- The marker is exactly `\boxed{` (no space, no `\fbox`, no `\boxed 5`).
- A box is complete iff the opening brace of its marker has a matching closing brace. Matching is
  by brace depth, LaTeX-aware: a backslash escapes the next character, so `\{` and `\}` are
  literal braces that do not count, and `\\` is an escaped backslash (hence `\\boxed{` is a line
  break followed by plain text, not a box).
- Only outermost complete boxes are returned: a complete box inside another complete box's
  content is part of that content, not a box of its own.
- An unclosed box (`\boxed{12` at the end of a truncated completion) is not returned. Everything
  after its opening brace is, textually, inside it; a complete box in there is still returned
  (it is complete and no complete box encloses it).

Pure Python, no torch. Every function is linear in the length of its input.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "all_boxed_content", "BOX_MARKER", "BoxSpan", "char_span_to_token_positions", "find_boxed_spans", "first_boxed",
    "last_boxed", "last_boxed_content", "release_boxes", "release_last_box"
]

BOX_MARKER = "\\boxed{"


@dataclass(frozen=True)
class BoxSpan:
    r"""Character positions of one complete `\boxed{...}` in a text.

    text[start:end] == "\\boxed{" + text[content_start:content_end] + "}".
    """

    start: int  # index of the backslash of "\boxed{"
    content_start: int  # index just after "{"
    content_end: int  # index of the matching closing "}"
    end: int  # content_end + 1: exclusive end of the whole box

    def content(self, text: str) -> str:
        """The text strictly inside the braces (may be empty)."""
        return text[self.content_start : self.content_end]


def find_boxed_spans(text: str) -> list[BoxSpan]:
    r"""Every outermost complete `\boxed{...}` of `text`, in order of `start`.

    One left-to-right pass with a stack of open braces (each remembers whether it opened a box),
    so the cost is O(len(text)) even for text full of unclosed markers. A `}` with no open brace
    is ignored. Matching a pair this way gives the same pairs as counting depth from each marker.

    >>> [s.content(t) for t in [r"a \boxed{\frac{1}{2}} b \boxed{3}"] for s in find_boxed_spans(t)]
    ['\\frac{1}{2}', '3']
    """
    complete: list[BoxSpan] = []  # in order of closing, inner boxes before the box around them
    open_braces: list[int] = []  # for each open "{": the marker start if it opened a box, else -1
    i, n = 0, len(text)
    while i < n:
        if text.startswith(BOX_MARKER, i):
            open_braces.append(i)
            i += len(BOX_MARKER)
            continue
        char = text[i]
        if char == "\\":
            i += 2  # escaped character: `\{`, `\}`, `\\`, or the first letter of a command
            continue
        if char == "{":
            open_braces.append(-1)
        elif char == "}" and open_braces:
            box_start = open_braces.pop()
            if box_start >= 0:
                complete.append(BoxSpan(box_start, box_start + len(BOX_MARKER), i, i + 1))
        i += 1

    outermost: list[BoxSpan] = []
    for span in sorted(complete, key=lambda s: s.start):
        if not outermost or span.start >= outermost[-1].end:  # complete boxes nest or are disjoint
            outermost.append(span)
    return outermost


def first_boxed(text: str) -> BoxSpan | None:
    """The first outermost complete box of `text` (GRAIL's answer span), or None."""
    spans = find_boxed_spans(text)
    return spans[0] if spans else None


def last_boxed(text: str) -> BoxSpan | None:
    """The last outermost complete box of `text` (what the reward reads), or None."""
    spans = find_boxed_spans(text)
    return spans[-1] if spans else None


def last_boxed_content(text: str) -> str | None:
    """Content of the last complete box, or None if `text` has no complete box ("" if it is empty)."""
    span = last_boxed(text)
    return None if span is None else span.content(text)


def all_boxed_content(text: str) -> str | None:
    """The contents of every outermost complete box, in order, joined by ", " (the opt-in "all boxes" rule:
    "\\boxed{1}, \\boxed{2}" reads as "1, 2"); None if `text` has no complete box."""
    spans = find_boxed_spans(text)
    return ", ".join(span.content(text) for span in spans) if spans else None


# ---- the GRAIL release's evaluation extraction (grail.evaluation.release_scoring, rule 1)
# ---------------------------------


def release_boxes(text: str) -> list[str]:
    """The contents of the boxes the release's evaluation finds in `text`, in order (it keeps the last): from each
    `\\boxed{` marker, every `{` and `}` counts (a backslash escapes nothing) until the depth is 0; the search resumes
    after that box and stops at the first marker whose braces never close."""
    boxes, search_from = [], 0
    while (start := text.find(BOX_MARKER, search_from)) != -1:
        depth, end = 1, start + len(BOX_MARKER)
        while end < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[end], 0)
            end += 1
        if depth:  # never closed: the release stops looking
            break
        boxes.append(text[start + len(BOX_MARKER) : end - 1])
        search_from = end
    return boxes


def release_last_box(text: str) -> str | None:
    """The answer rule 1 extracts from a completion: the last box's content, or None."""
    boxes = release_boxes(text)
    return boxes[-1] if boxes else None


def char_span_to_token_positions(offsets: Sequence[tuple[int, int]], start: int, end: int) -> list[int]:
    """Sorted indices of the tokens whose characters overlap the half-open range [start, end).

    `offsets[k] = (a_k, b_k)` is token k's character range [a_k, b_k), as a Hugging Face fast
    tokenizer returns with `return_offsets_mapping=True`. Token k is kept iff
    a_k < b_k and a_k < end and b_k > start: a token that covers any character of the range is kept
    (whole or partial overlap), one that only touches its boundary is not. Tokens with an empty range
    (a_k == b_k, e.g. special tokens) never match, and an empty range (start >= end) matches nothing.

    Offsets need not be sorted. Cost O(len(offsets)).
    """
    positions = []
    for k, (tok_start, tok_end) in enumerate(offsets):
        tok_start, tok_end = int(tok_start), int(tok_end)
        if tok_start < tok_end and tok_start < end and tok_end > start:
            positions.append(k)
    return positions
