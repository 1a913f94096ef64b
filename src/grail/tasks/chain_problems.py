r"""Chain word problems: one person's count after another's, each defined from an earlier one, so the answer needs
every step (the draw and the text; the splits and problem sets are `grail.tasks.chains`).

A problem is a chain of quantities q0, q1, ..., qn, one person each: q0 is given, and step k (1..n) defines qk from
the previous quantity q(k-1) and either a new number from the question or an earlier quantity qj (j <= k-2)::

    user:      "Mia has 23 apples. Tom has 15 more apples than Mia. Ava has 8 fewer apples than Tom. Ben has as many
                apples as Ava and Tom together. How many apples does Ben have? Put the final answer in \boxed{}."
    solution:  "Tom has 23 + 15 = 38 apples. Ava has 38 - 8 = 30 apples. Ben has 30 + 38 = 68 apples. \boxed{68}"
    answer:    "68"

So every intermediate result is the left number of the next step (and, for a "total", possibly the right number of a
later one too), and the question asks only about the last person: no step can be skipped. Operations (`OPERATIONS`):
  add        "B has {n} more {objects} than A."            B = A + n, n in [operand_min, operand_max]
  subtract   "B has {n} fewer {objects} than A."           B = A - n, n in [operand_min, operand_max]
  multiply   "B has {n} times as many {objects} as A."     B = A * n, n in [2, factor_max]
  total      "B has as many {objects} as A and C together." B = A + C, C an earlier person than A (never the same)

The prompt is one user turn, the question and `grail.tasks.word_problems.INSTRUCTION`, with no worked example: a
supervised warm start on the `sft` split (`grail.tasks.chains`) teaches the solution's format. The solution is one
sentence per step, "{name} has {left} {op} {right} = {result} {objects}.", then ``\boxed{answer}``.

How a chain is drawn (`sample_chain`; all randomness from the `random.Random` passed in):
  1. q0 is uniform in [operand_min, operand_max].
  2. Each step picks an operation uniformly among the feasible ones of `operations`, those with at least one argument
     that keeps the new quantity in [operand_min, max_value], then the argument uniformly among
     that operation's feasible arguments (a number for add, subtract and multiply; the index j of the earlier
     quantity for total, which needs two earlier quantities, so it is never step 1).
  3. A step always has a feasible operation for a valid `ChainConfig` (its checks say why), so there is no rejection.
     The floor is operand_min, not 1: with a floor of 1 (and operands 2..49) the answers piled up on 1, 2, 3 (a
     subtraction from a small count has few outcomes; the answer 1 alone took 2.2% of 5,000 draws), where a constant
     answer must score at most 3% of a held-out set.
Names (distinct within a problem, from `grail.tasks.word_problems.NAMES`), the object and the filler words come from
a second RNG (`render_chain`), so the arithmetic of a seed does not depend on how it is told.

Identity (`identity_of`, what the splits hash and the sets de-duplicate): the arithmetic alone, e.g. ``23+15-8+q1``
(``+q1``: a total with q1). Two problems with the same arithmetic and different names are the same problem.

Roles (`grail.tasks.arithmetic.ROLES`, one per solution character): a number copied from the question (q0, n) is
``operand``; a number copied from an earlier result (q1 and later, as a left number or a total's right number) is
``carry``; ``+ - *`` are ``operator``; the number after ``=`` is ``result``; the box digits are ``answer``; the letters
of filler words are ``filler``; everything else (names, "has", objects, spaces, ``=``, ``.``, ``\boxed{``, ``}``) is
``format``. So `CRITICAL_ROLES` marks each step's operator and result, as in the other styles. Filler (rate
`filler_rate`): after the sentence of step k, 1-3 `FILLER_WORDS`, each followed by one space.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from grail.tasks.arithmetic import FILLER_WORDS, TaskExample
from grail.tasks.word_problems import INSTRUCTION, NAMES, OBJECTS

__all__ = ["ChainConfig", "ChainStory", "identity_of", "OPERATIONS", "question_of", "render_chain", "sample_chain",
           "solution_pieces", "Step", "values_of"]

OPERATIONS = ("add", "subtract", "multiply", "total")
SYMBOLS = {"add": "+", "subtract": "-", "multiply": "*", "total": "+"}
Step = tuple[str, int]  # (operation, argument): the number n, or for "total" the index j of the earlier quantity


@dataclass(frozen=True)
class ChainConfig:
    """Knobs of the chain generator (the difficulty: more steps, wider operands, multiply and total are harder).

    num_steps: steps per problem (quantities after the given one; people = num_steps + 1).
    operand_min, operand_max: inclusive range of q0 and of the add/subtract numbers.
    operations: which of `OPERATIONS` a step may use; must include "add" and "subtract" (see `__post_init__`).
    factor_max: multiply's factors are 2..factor_max (kept small: a 135M model multiplies poorly).
    max_value: every quantity stays in [operand_min, max_value], so these also bound the answers.
    filler_rate: probability, per step, of 1-3 filler words after its sentence.
    style: the task's name among the synthetic task's styles (a config's `task_style`; not a field).
    """

    style: ClassVar[str] = "chains"

    num_steps: int = 3
    operand_min: int = 10
    operand_max: int = 49
    operations: tuple[str, ...] = ("add", "subtract", "total")
    factor_max: int = 3
    max_value: int = 199
    filler_rate: float = 0.0

    def __post_init__(self):
        def bad(field_name: str, why: str, fix: str) -> ValueError:
            return ValueError(f"ChainConfig {field_name}={getattr(self, field_name)!r} {why}; {fix}.")

        if self.num_steps < 1:
            raise bad("num_steps", "has no step", "use num_steps >= 1 (3 or more for an answer that needs a chain)")
        if self.num_steps > len(NAMES) - 1:
            raise bad("num_steps", f"needs more people than the {len(NAMES)} names",
                      f"use num_steps <= {len(NAMES) - 1}")
        if self.operand_min < 1:
            raise bad("operand_min", "is below 1 (a step of 0 changes nothing)", "set operand_min >= 1")
        if self.operand_max < self.operand_min:
            raise bad("operand_max", f"is below operand_min={self.operand_min}: the operand range is empty",
                      "set operand_max >= operand_min")
        unknown = [op for op in self.operations if op not in OPERATIONS]
        if unknown or len(set(self.operations)) != len(self.operations):
            raise bad("operations", "has unknown or repeated names", f"choose distinct names of {OPERATIONS}")
        # With add and subtract, every count v in [lo, max_value] (lo = operand_min) has a step: add is feasible
        # when v <= max_value - lo, subtract when v >= 2 * lo, and no integer lies strictly between them iff
        # max_value >= 3 * lo - 1 (checked below; below it v = 2 * lo - 1 has no step, a start number when
        # operand_max >= 2 * lo - 1, so the check is exact there and only cautious for narrower operands).
        if not {"add", "subtract"} <= set(self.operations):
            raise bad("operations", "lacks add or subtract, so a chain could reach a quantity with no step left",
                      "include both 'add' and 'subtract' (and optionally 'multiply', 'total')")
        if self.factor_max < 2:
            raise bad("factor_max", "leaves multiply no factor (factors are 2..factor_max)", "set factor_max >= 2")
        need = max(self.operand_max, 3 * self.operand_min - 1)  # q0 must fit, and every quantity needs a step
        if self.max_value < need:
            raise bad("max_value", f"is below max(operand_max, 3 * operand_min - 1) = {need}, so a start number "
                      f"does not fit or a count in [{self.operand_min}, {self.max_value}] has no step",
                      f"set max_value >= {need} or lower operand_max / operand_min")
        if not 0.0 <= self.filler_rate <= 1.0:
            raise bad("filler_rate", "is not a probability", "use a value in [0, 1]")


@dataclass(frozen=True)
class ChainStory:
    """How one chain is told: the people (q0's first) and the object."""

    names: tuple[str, ...]
    singular: str
    plural: str

    def objects(self, n: int) -> str:
        return self.singular if n == 1 else self.plural


def _feasible(config: ChainConfig, values: Sequence[int], op: str) -> range | list[int]:
    """The arguments of `op` that keep the next quantity in [operand_min, max_value] (possibly none)."""
    v, lo, hi = values[-1], config.operand_min, config.operand_max
    if op == "add":
        return range(lo, min(hi, config.max_value - v) + 1)
    if op == "subtract":
        return range(lo, min(hi, v - lo) + 1)
    if op == "multiply":
        return range(2, min(config.factor_max, config.max_value // v) + 1)
    return [j for j in range(len(values) - 1) if v + values[j] <= config.max_value]  # total: q(k-1) + qj, j <= k-2


def _apply(values: Sequence[int], op: str, arg: int) -> int:
    v = values[-1]
    return v + arg if op == "add" else v - arg if op == "subtract" else v * arg if op == "multiply" else v + values[arg]


def sample_chain(config: ChainConfig, rng: random.Random) -> tuple[int, list[Step]]:
    """Draw (q0, [(operation, argument), ...]) by rules 1-3 of the module docstring."""
    values = [rng.randint(config.operand_min, config.operand_max)]
    steps: list[Step] = []
    for _ in range(config.num_steps):
        options = {op: args for op in OPERATIONS
                   if op in config.operations and len(args := _feasible(config, values, op))}
        if not options:  # unreachable for a valid ChainConfig (its max_value check)
            raise ValueError(f"no operation keeps {values[-1]} in [{config.operand_min}, {config.max_value}]: "
                             f"{config}")
        op = rng.choice(list(options))
        arg = rng.choice(options[op])
        steps.append((op, arg))
        values.append(_apply(values, op, arg))
    return values[0], steps


def values_of(start: int, steps: Sequence[Step]) -> list[int]:
    """The quantities q0..qn of a chain."""
    values = [start]
    for op, arg in steps:
        values.append(_apply(values, op, arg))
    return values


def identity_of(start: int, steps: Sequence[Step]) -> str:
    """The arithmetic of a chain as text, e.g. ``23+15-8+q1`` (what the splits hash)."""
    return str(start) + "".join(f"+q{arg}" if op == "total" else f"{SYMBOLS[op]}{arg}" for op, arg in steps)


def question_of(start: int, steps: Sequence[Step], story: ChainStory) -> str:
    """The word problem (without the instruction)."""
    names = story.names
    sentences = [f"{names[0]} has {start} {story.objects(start)}."]
    for k, (op, arg) in enumerate(steps, start=1):
        who, prev = names[k], names[k - 1]
        if op == "add":
            sentences.append(f"{who} has {arg} more {story.objects(arg)} than {prev}.")
        elif op == "subtract":
            sentences.append(f"{who} has {arg} fewer {story.objects(arg)} than {prev}.")
        elif op == "multiply":
            sentences.append(f"{who} has {arg} times as many {story.plural} as {prev}.")
        else:
            sentences.append(f"{who} has as many {story.plural} as {prev} and {names[arg]} together.")
    sentences.append(f"How many {story.plural} does {names[len(steps)]} have?")
    return " ".join(sentences)


def solution_pieces(start: int, steps: Sequence[Step], story: ChainStory,
                    fillers: Sequence[Sequence[str]] | None = None) -> list[tuple[str, str]]:
    """The reference solution as (text, role) pieces (the roles of the module docstring)."""
    fillers = fillers if fillers is not None else [()] * len(steps)
    if len(fillers) != len(steps):
        raise ValueError(f"fillers has {len(fillers)} gaps, expected one per step ({len(steps)}).")
    values = values_of(start, steps)

    def copied(j: int) -> str:  # q0 is in the question; later quantities are results of the solution
        return "operand" if j == 0 else "carry"

    pieces: list[tuple[str, str]] = []
    for k, ((op, arg), words) in enumerate(zip(steps, fillers, strict=True), start=1):
        right, right_role = (values[arg], copied(arg)) if op == "total" else (arg, "operand")
        pieces += [(f"{story.names[k]} has ", "format"), (str(values[k - 1]), copied(k - 1)), (" ", "format"),
                   (SYMBOLS[op], "operator"), (" ", "format"), (str(right), right_role), (" = ", "format"),
                   (str(values[k]), "result"), (f" {story.objects(values[k])}. ", "format")]
        for word in words:
            pieces += [(word, "filler"), (" ", "format")]
    return [*pieces, ("\\boxed{", "format"), (str(values[-1]), "answer"), ("}", "format")]


def render_chain(config: ChainConfig, start: int, steps: Sequence[Step], rng: random.Random) -> TaskExample:
    """A chain as a `grail.tasks.arithmetic.TaskExample`: `rng` draws the people, the object, then the filler."""
    names = tuple(name for name, _ in rng.sample(NAMES, len(steps) + 1))
    singular, plural = rng.choice(OBJECTS)
    story = ChainStory(names, singular, plural)
    fillers = [tuple(rng.choice(FILLER_WORDS) for _ in range(rng.randint(1, 3))) if rng.random() < config.filler_rate
               else () for _ in steps]
    pieces = solution_pieces(start, steps, story, fillers)
    return TaskExample(
        expression=identity_of(start, steps),
        prompt=[{"role": "user", "content": f"{question_of(start, steps, story)} {INSTRUCTION}"}],
        solution="".join(text for text, _ in pieces),
        answer=pieces[-2][0],
        roles=tuple(role for text, role in pieces for _ in text),
    )
