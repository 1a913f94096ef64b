r"""Two label sets that separate a token's role from its position, as saliency rows
(`grail.analysis.saliency.token_labels`: `prompt`, `solution`, `critical_spans`, `filler_spans`).

Why: in the one-step word problems the only filler gap sits right before `\boxed{}`, so "filler" and "nearest the
answer" are the same tokens, and a probe that favours the end of the reasoning ranks filler first whatever it knows
about the arithmetic. These sets put both classes at every distance from the box, or use no inserted words at all.

Both sets tell multi-step stories of the word-problem style (`grail.tasks.word_problems`: its names, objects,
phrasings and sentence per step, "{name} has {left} {op} {operand} = {result} {objects}." then "Then {pronoun} has
..."), teacher-forced: the model need not solve them. The arithmetic is `grail.tasks.arithmetic.sample_steps` of
`STORY_TASK` with 2-4 steps (the number drawn per row); the prompt is chat messages, `shots` worked examples (fresh
draws, no filler, never the row's own expression) as earlier user/assistant turns, then the question, each user
turn ending with the box instruction, as `grail.tasks.word_problems.render_prompt` writes them. Critical spans in
both: each step's operator and result (`grail.tasks.arithmetic.CRITICAL_ROLES`).

  multi_step_filler_rows: 1-3 words of `FILLER_WORDS` (each followed by one space) at EVERY gap: before the first
      step, after each step's sentence, and so right before the box. `filler_spans` are the words' letters. Carried
      numbers, operands, format words and the box are unlabelled.
        "so Mia has 7 + 5 = 12 apples. hmm okay Then she has 12 - 3 = 9 apples. now \boxed{9}"
  natural_contrast_rows: no inserted word. The contrast class (`filler_spans`) is the solution's own format before
      the box: the letters of the name, "has", the objects, "Then", the pronoun, and the sentence-ending ".". The
      "=" (equation syntax that the result follows), operands, carried numbers, spaces and the box are unlabelled.
        "Mia has 7 + 5 = 12 apples. Then she has 12 - 3 = 9 apples. \boxed{9}"
      critical: "+", "12", "-", "9" (before the box); format: "Mia", "has", "apples", ".", "Then", "she", ...

Rows also carry `answer`, `expression`, `num_steps` and `label_set` (ignored by the AUROC). Row i of a set depends
only on (seed, i): `rows(n, seed)` is a prefix of `rows(n + k, seed)`. Use `label_set_rows(name, n, seed)` to pick a
set by name (`LABEL_SETS`). Groups of rows in which role and position are counterbalanced by construction, for the
fixed-position AUROC: `grail.analysis.saliency.counterbalanced`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import replace

from grail.analysis.saliency.token_labels import span_runs
from grail.tasks.arithmetic import CRITICAL_ROLES, FILLER_WORDS, TaskConfig, expression_of, sample_steps
from grail.tasks.word_problems import NAMES, OBJECTS, PHRASES, PromptOptions, Story, render_prompt, solution_pieces

__all__ = ["draw_problem", "draw_story", "LABEL_SETS", "label_set_rows", "multi_step_filler_rows",
           "natural_contrast_rows", "STORY_TASK"]

# Operands as the one-step default (1..20), values kept <= 99 so every number is at most two digits.
STORY_TASK = TaskConfig(num_steps=2, operand_min=1, operand_max=20, max_value=99, style="words")
DEFAULT_STEPS = (2, 4)
DEFAULT_SHOTS = 2  # two worked examples: the format is shown; more only lengthens every teacher-forced prompt


def draw_story(steps: Sequence[tuple[str, int]], rng: random.Random, avoid: str | None = None) -> Story:
    name, pronoun = rng.choice([n for n in NAMES if n[0] != avoid])
    singular, plural = rng.choice(OBJECTS)
    return Story(name, pronoun, singular, plural, tuple(rng.randrange(len(PHRASES[op])) for op, _ in steps))


def _fillers(rng: random.Random) -> tuple[str, ...]:
    return tuple(rng.choice(FILLER_WORDS) for _ in range(rng.randint(1, 3)))


def _check(n: int, steps: tuple[int, int], shots: int) -> None:
    lo, hi = steps
    if n < 0 or shots < 0:
        raise ValueError(f"n={n} and shots={shots} must be >= 0.")
    if not 1 <= lo <= hi:
        raise ValueError(f"steps={steps}: give (min, max) with 1 <= min <= max, e.g. {DEFAULT_STEPS}.")


def draw_problem(label_set: str, seed: int, i: int, steps: tuple[int, int], shots: int):
    """Problem i of a label set: (rng, start, ops, story, examples), all from random.Random(f"{label_set}:{seed}:{i}"),
    whose state the caller goes on drawing from. Each of the `shots` worked examples has its own step count, and is
    never the problem's own expression (drawn again, with probability ~0)."""
    rng = random.Random(f"{label_set}:{seed}:{i}")
    num_steps = rng.randint(*steps)
    start, ops = sample_steps(replace(STORY_TASK, num_steps=num_steps), rng)
    story = draw_story(ops, rng)
    examples = []
    for _ in range(shots):
        k = rng.randint(*steps)
        while True:
            ex_start, ex_ops = sample_steps(replace(STORY_TASK, num_steps=k), rng)
            if expression_of(ex_start, ex_ops) != expression_of(start, ops):
                break
        examples.append((ex_start, ex_ops, draw_story(ex_ops, rng, avoid=story.name)))
    return rng, start, ops, story, examples


def _row(seed: int, i: int, label_set: str, steps: tuple[int, int], shots: int) -> dict:
    """Row i: the arithmetic, story and examples of `draw_problem`."""
    rng, start, ops, story, examples = draw_problem(label_set, seed, i, steps, shots)
    num_steps = len(ops)
    filler = label_set == "multi_step_filler"
    lead = [(w, role) for word in _fillers(rng) for w, role in ((word, "filler"), (" ", "format"))] if filler else []
    after = [_fillers(rng) if filler else () for _ in ops]
    pieces = [*lead, *solution_pieces(start, ops, story, after)]
    solution = "".join(text for text, _ in pieces)
    roles = [role for text, role in pieces for _ in text]
    box_start = solution.index("\\boxed{")
    critical = [role in CRITICAL_ROLES for role in roles]
    if filler:
        contrast = [role == "filler" for role in roles]
    else:  # the format's words and sentence ends, before the box (not "=", spaces, or the box's own letters)
        contrast = [role == "format" and i < box_start and (ch.isalpha() or ch == ".")
                    for i, (role, ch) in enumerate(zip(roles, solution, strict=True))]
    return {"prompt": render_prompt(start, ops, story, examples, PromptOptions(shots=shots)),
            "solution": solution, "critical_spans": span_runs(critical), "filler_spans": span_runs(contrast),
            "answer": pieces[-2][0], "expression": expression_of(start, ops), "num_steps": num_steps,
            "label_set": label_set}


def multi_step_filler_rows(n: int, seed: int = 0, *, steps: tuple[int, int] = DEFAULT_STEPS,
                           shots: int = DEFAULT_SHOTS) -> list[dict]:
    """`n` saliency rows of multi-step stories with filler words at every gap (module docstring).

    Args:
        n: rows; seed: row i depends on (seed, i) only. steps: (min, max) steps per story, inclusive, drawn
            uniformly per row. shots: worked examples in the prompt.
    Returns:
        saliency rows (prompt as chat messages; critical = operators and results, filler = inserted words)."""
    _check(n, steps, shots)
    return [_row(seed, i, "multi_step_filler", steps, shots) for i in range(n)]


def natural_contrast_rows(n: int, seed: int = 0, *, steps: tuple[int, int] = DEFAULT_STEPS,
                          shots: int = DEFAULT_SHOTS) -> list[dict]:
    """`n` saliency rows of multi-step stories without inserted words: critical tokens (operators, results) against
    the solution's own format words and full stops, interleaved with them (module docstring). `filler_spans` holds
    the format: in these rows the AUROC's "filler" class reads "format". Arguments as `multi_step_filler_rows`."""
    _check(n, steps, shots)
    return [_row(seed, i, "natural_contrast", steps, shots) for i in range(n)]


LABEL_SETS: dict[str, Callable[..., list[dict]]] = {"multi_step_filler": multi_step_filler_rows,
                                                     "natural_contrast": natural_contrast_rows}


def label_set_rows(name: str, n: int, seed: int = 0, **kwargs) -> list[dict]:
    """`LABEL_SETS[name](n, seed, **kwargs)`; the error lists the names."""
    if name not in LABEL_SETS:
        raise ValueError(f"label set {name!r} is not one of {', '.join(LABEL_SETS)}.")
    return LABEL_SETS[name](n, seed, **kwargs)
