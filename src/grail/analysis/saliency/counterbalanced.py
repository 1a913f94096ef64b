r"""Label sets in which a token's role and its position are counterbalanced by construction, as saliency rows
(`grail.analysis.saliency.token_labels`: `prompt`, `solution`, `critical_spans`, `filler_spans`, plus `group`), for
the fixed-position AUROC (`grail.analysis.saliency.fixed_position`).

Why: in `grail.analysis.saliency.label_sets` each row has its own layout, so at a given position one class is often
alone (the last step's sentence holds no filler; the positions just before the box hold no critical token), and the
estimator that matches positions drops those tokens. Here a GROUP of rows tells one problem in several layouts of the
same length, moving a block of contrast words between the gaps, so that the same position holds an operator or a
result in one layout and a contrast word in another.

The construction, group i (deterministic in (seed, i): `random.Random(f"{label_set}:{seed}:{i}")`):
  1. A multi-step story of `label_sets.STORY_TASK` with k steps (k drawn from `steps`), told one sentence per step
     that ENDS with its result: "Mia has 7 + 5 = 12." then "Then she has 12 - 3 = 9." (the word-problem sentence of
     `label_sets` without the trailing objects, so the last step's result can sit right before the box), then
     `\boxed{answer}`. Critical: each step's operator and result (`grail.tasks.arithmetic.CRITICAL_ROLES`).
  2. A block of W movable words, one sequence per group: W `FILLER_WORDS` (`counterbalanced_filler_rows`), or the
     story's own frame words as clauses "Mia has apples. Then she has apples. ..." cut to W words
     (`counterbalanced_format_rows`).
  3. The rows of the group: for each step j = 1..k and each cut c = 0..W, the first c words in the gap before step
     j's sentence and the other W − c in the gap after it (the gap after the last step is the one before the box);
     duplicates (c = W before step j is c = 0 before step j+1) are dropped, so a group has k·W + 1 rows. Every row
     opens with the same unlabelled "Solution:" and separates its pieces (word, sentence, box) by one space, so
     every row holds the same pieces in another order, each after a space: the same characters, and the same tokens
     wherever the tokenizer cuts at the spaces (without the opener, a word that starts the text is cut differently
     from the same word after a space, and a group splits into two lengths).
  Why this covers every position: step j's sentence is shifted by every cut c = 0..W words, so its operator and
  result visit every offset of a window of W words after their base place, and with W words at least a sentence's
  length the critical tokens of consecutive steps sweep the whole reasoning from the first operator on; the block,
  moved across every gap, puts contrast words at every position from the first token to the last before the box.
  What it cannot cover: the first words of the first sentence ("Mia has 7") never hold a critical token, and on a
  tokenizer that cuts words into several tokens a shift of one word is several tokens, which leaves holes. The
  positions are counted in the scoring model's tokens; the estimator verifies the layout (its strata are (group,
  reasoning length, position), so a row whose pieces tokenize to another length is in strata of its own) and
  reports the share of the labelled tokens that entered. `reasoning_tokens` + `entered_shares` measure it for a
  tokenizer without a model (tests/test_saliency_counterbalanced.py; the guide gives the figures).

The contrast class (`filler_spans`): the filler words' letters (filler set), or the frame words and sentence ends of
the sentences AND of the moved clauses (format set: the letters of names, pronouns, "Then", "has", objects, and each
"."). The format set's block is the story's own words, but a cut can split a clause ("Mia has 7 + 5 = 12. Mia has
Then she has 12 - 3 = 9. apples."): the text stays the solution's vocabulary, not always its grammar.

The prompt (chat messages) is shared by the rows of a group: `shots` worked examples and the question, as
`label_sets` writes them. Rows also carry `group` (i), `variant` ("j:c"), `answer`, `expression`, `num_steps` and
`label_set`. `rows(n, seed)` are the n groups' rows, a prefix of `rows(n + m, seed)`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from grail.analysis.saliency.label_sets import DEFAULT_SHOTS, draw_problem
from grail.analysis.saliency.token_labels import char_labels, span_runs, token_labels
from grail.tasks.arithmetic import FILLER_WORDS, expression_of
from grail.tasks.word_problems import PromptOptions, Story, render_prompt

__all__ = ["COUNTERBALANCED_SETS", "counterbalanced_filler_rows", "counterbalanced_format_rows", "DEFAULT_WORDS",
           "entered_shares", "reasoning_tokens"]

DEFAULT_STEPS = (2, 3)
DEFAULT_WORDS = 14  # movable words per group: a sentence's length in SmolLM2's tokens (digits cut one by one)
OPENER = "Solution:"  # the same first piece in every row, so that every moved piece follows a space


def _sentence(k: int, left: int, op: str, operand: int, result: int, story: Story) -> list[tuple[str, str]]:
    """Step k's sentence as (text, role) pieces, ending with the result (rule 1)."""
    subject = story.name if k == 0 else f"Then {story.pronoun}"
    return [(f"{subject} has", "format"), (" ", "space"), (str(left), "operand"), (" ", "space"), (op, "operator"),
            (" ", "space"), (str(operand), "operand"), (" = ", "equals"), (str(result), "result"), (".", "format")]


def _clauses(story: Story, words: int) -> list[str]:
    """The format set's block: the story's frame as clauses, cut to `words` words."""
    out: list[str] = []
    while len(out) < words:
        subject = story.name if not out else f"Then {story.pronoun}"
        out += f"{subject} has {story.plural}.".split()
    return out[:words]


def _group(seed: int, i: int, label_set: str, steps: tuple[int, int], words: int, shots: int) -> list[dict]:
    rng, start, ops, story, examples = draw_problem(label_set, seed, i, steps, shots)
    num_steps = len(ops)
    filler = label_set == "counterbalanced_filler"
    block = [rng.choice(FILLER_WORDS) for _ in range(words)] if filler else _clauses(story, words)
    sentences, value = [], start
    for k, (op, operand) in enumerate(ops):
        result = {"+": value + operand, "-": value - operand, "*": value * operand}[op]
        sentences.append(_sentence(k, value, op, operand, result, story))
        value = result
    prompt = render_prompt(start, ops, story, examples, PromptOptions(shots=shots))
    rows, seen = [], set()
    for j in range(num_steps):
        for c in range(words + 1):
            gaps = [[] for _ in range(num_steps + 1)]
            gaps[j], gaps[j + 1] = block[:c], block[c:]
            layout = tuple(map(len, gaps))
            if layout in seen:
                continue
            seen.add(layout)
            units = [[(OPENER, "opener")]]  # one space between units; a unit is a list of (text, role) pieces
            for gap, sentence in zip(gaps, [*sentences, None], strict=True):
                units += [[(w, "moved")] for w in gap]
                if sentence is not None:
                    units.append(sentence)
            units.append([("\\boxed{", "box"), (str(value), "answer"), ("}", "box")])
            pieces = [p for u, unit in enumerate(units) for p in ([(" ", "space")] if u else []) + unit]
            solution = "".join(text for text, _ in pieces)
            roles = [role for text, role in pieces for _ in text]
            critical = [role in ("operator", "result") for role in roles]
            contrast = [role == "moved" or (not filler and role == "format") for role in roles]
            if not filler:  # only the letters and full stops of the frame words (rule 3 of the module docstring)
                contrast = [flag and (ch.isalpha() or ch == ".") for flag, ch in zip(contrast, solution, strict=True)]
            rows.append({"prompt": prompt, "solution": solution, "critical_spans": span_runs(critical),
                         "filler_spans": span_runs(contrast), "group": i, "variant": f"{j + 1}:{c}",
                         "answer": str(value), "expression": expression_of(start, ops), "num_steps": num_steps,
                         "label_set": label_set})
    return rows


def _check(n: int, steps: tuple[int, int], words: int, shots: int) -> None:
    if n < 0 or shots < 0 or words < 1:
        raise ValueError(f"n={n} and shots={shots} must be >= 0 and words={words} >= 1 (the movable block).")
    if not 1 <= steps[0] <= steps[1]:
        raise ValueError(f"steps={steps}: give (min, max) with 1 <= min <= max, e.g. {DEFAULT_STEPS}.")


def counterbalanced_filler_rows(n: int, seed: int = 0, *, steps: tuple[int, int] = DEFAULT_STEPS,
                                words: int = DEFAULT_WORDS, shots: int = DEFAULT_SHOTS) -> list[dict]:
    """The rows of `n` groups (k·words + 1 rows each, k = the group's steps) with a block of `words` filler words
    moved across the gaps (module docstring). Critical: operators and results; `filler_spans`: the filler words."""
    _check(n, steps, words, shots)
    return [r for i in range(n) for r in _group(seed, i, "counterbalanced_filler", steps, words, shots)]


def counterbalanced_format_rows(n: int, seed: int = 0, *, steps: tuple[int, int] = DEFAULT_STEPS,
                                words: int = DEFAULT_WORDS, shots: int = DEFAULT_SHOTS) -> list[dict]:
    """As `counterbalanced_filler_rows`, the moved block being the story's own frame words; `filler_spans` holds
    every frame word and sentence end (the contrast reads "format")."""
    _check(n, steps, words, shots)
    return [r for i in range(n) for r in _group(seed, i, "counterbalanced_format", steps, words, shots)]


COUNTERBALANCED_SETS = {"counterbalanced_filler": counterbalanced_filler_rows,
                        "counterbalanced_format": counterbalanced_format_rows}


# ---- what a tokenizer makes of them -------------------------------------------------------------------------------
def reasoning_tokens(tokenizer, rows: Sequence[dict]) -> dict[str, torch.Tensor]:
    """Every reasoning token of each row's solution as the tokenizer cuts it (one trace per row): (N,) label,
    position (index in the solution), trace (row index) and group (`row["group"]`, else the row index). The
    reasoning ends before the first token that reaches into `\\boxed{` (as `grail.methods.spans` counts it)."""
    out = {k: [] for k in ("label", "position", "trace", "group")}
    for i, row in enumerate(rows):
        text = row["solution"]
        offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        labels = token_labels(text, char_labels(len(text), row["critical_spans"], row["filler_spans"]), offsets)
        box = text.index("\\boxed{")
        k0 = next(t for t, (_, end) in enumerate(offsets) if end > box)
        for t in range(k0):
            out["label"].append(labels[t])
            out["position"].append(t)
            out["trace"].append(i)
            out["group"].append(row.get("group", i))
    return {k: torch.tensor(v, dtype=torch.long) for k, v in out.items()}


def entered_shares(tokenizer, rows: Sequence[dict]) -> tuple[float, float]:
    """(critical, contrast): the share of each class's labelled reasoning tokens that enter the fixed-position
    AUROC with this tokenizer (their (group, length, position) stratum holds both classes)."""
    from grail.analysis.saliency.fixed_position import fixed_position_auroc_result

    x = reasoning_tokens(tokenizer, rows)
    result = fixed_position_auroc_result(x["position"].double(), x["label"], x["group"], x["trace"], x["position"],
                                         num_bootstrap=0)
    return result.n_critical / result.labelled_critical, result.n_filler / result.labelled_filler
