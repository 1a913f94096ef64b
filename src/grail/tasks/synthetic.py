"""The synthetic task's problem sets, in either style: `generate` draws the arithmetic (grail.tasks.arithmetic) and
renders each draw as the symbolic trace (`grail.tasks.arithmetic.build_example`) or as a word problem
(`grail.tasks.word_problems`); `SyntheticSet` is the set of problems a run trains and evaluates on. Kept apart from both
so that neither style's module imports the other's (grail.tasks.arithmetic: the drawing rules and the symbolic style;
grail.tasks.word_problems: the words style).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from grail.tasks.arithmetic import (
    SPLITS,
    TaskConfig,
    TaskExample,
    _check_heldout_fraction,
    build_example,
    draw_budget,
    draw_seeds,
    expression_of,
    sample_fillers,
    sample_steps,
    split_of,
)
from grail.tasks.word_problems import DEFAULT_PROMPT, WORDS_TASK, build_word_example

__all__ = ["generate", "SyntheticSet", "WORDS_SET"]


def generate(
    config: TaskConfig, n: int, split: str, seed: int, heldout_fraction: float = 0.1, *, word_prompt=None
) -> list[TaskExample]:
    """Exactly n examples of ``split`` with distinct expressions, deterministic in (config, n, split, seed).

    Draws come from ``random.Random(f"{seed}:{split}")``; each draw seeds its own arithmetic and filler
    RNGs, so filler_rate never changes which expressions are drawn. Draws whose ``split_of`` differs
    from ``split`` and repeated expressions are skipped. At most 200*n + 10000 draws are made; if
    that does not yield n examples, ValueError (the problem space is too small).

    Style "words": the same draws, rendered by grail.tasks.word_problems with a third RNG per draw (``:words``: the
    story and the worked example); `word_prompt` (a grail.tasks.word_problems.PromptOptions, None = its DEFAULT_PROMPT)
    says how the problem is asked (for measuring prompt variants; the task's own prompt is the default).
    """
    if split not in SPLITS:
        raise ValueError(f"split={split!r} must be one of {SPLITS}.")
    _check_heldout_fraction(heldout_fraction)
    if n < 0:
        raise ValueError(f"n={n} must be >= 0.")
    rng = random.Random(f"{seed}:{split}")
    examples: list[TaskExample] = []
    seen: set[str] = set()
    for draw_seed in draw_seeds(rng, n):
        if len(examples) == n:
            break
        start, steps = sample_steps(config, random.Random(f"{draw_seed}:arithmetic"))
        expression = expression_of(start, steps)
        if expression in seen or split_of(expression, heldout_fraction) != split:
            continue
        seen.add(expression)
        fillers = sample_fillers(config, random.Random(f"{draw_seed}:filler"))
        if config.style == "symbolic":
            examples.append(build_example(start, steps, fillers))
        else:
            examples.append(build_word_example(config, start, steps, fillers, random.Random(f"{draw_seed}:words"),
                                               heldout_fraction, word_prompt or DEFAULT_PROMPT))
    if len(examples) < n:
        raise ValueError(
            f"found only {len(examples)} distinct {split!r} expressions of the n={n} asked in {draw_budget(n)} "
            f"draws: the problem space is too small. Raise num_steps or widen operand_min..operand_max "
            f"(now {config.num_steps}, {config.operand_min}..{config.operand_max}), or lower n."
        )
    return examples


@dataclass(frozen=True)
class SyntheticSet:
    """The problems of the embedded task a run uses: `num_train` training and `num_heldout` held-out problems of
    `task`, drawn with `seed` (the held-out split never overlaps the training split). Training
    (`grail.training.data`), the `synthetic` benchmark (`grail.evaluation.benchmarks`) and the demo read their rows from
    here."""

    task: TaskConfig = field(default_factory=TaskConfig)
    num_train: int = 2000
    num_heldout: int = 200
    seed: int = 0

    def __post_init__(self):
        if self.num_train < 1 or self.num_heldout < 1:
            raise ValueError(f"num_train={self.num_train} and num_heldout={self.num_heldout} must both be >= 1.")

    def rows(self, split: str) -> list[dict]:
        """`split`'s problems ("train" or "heldout") as {prompt, answer} rows, in generation order."""
        n = self.num_train if split == "train" else self.num_heldout
        return [{"prompt": e.prompt, "answer": e.answer} for e in generate(self.task, n, split, self.seed)]


WORDS_SET = SyntheticSet(task=WORDS_TASK, num_train=600, num_heldout=64)  # the word style's measured defaults
