"""A synthetic verifiable reasoning task: left-to-right integer arithmetic, generated from a seed.

An expression such as ``7+5*3-4`` is evaluated strictly LEFT TO RIGHT (no operator precedence):
((7+5)*3)-4 = 32. The reference solution is a step-by-step trace ending in ``\\boxed{answer}``::

    prompt:   "Q: 7+5*3-4\\nA:"
    solution: " 7+5=12, 12*3=36, 36-4=32. \\boxed{32}"
    answer:   "32"

Step k is ``{left}{op}{operand}={result}``; ``left`` is the start number for step 1 and the previous
result afterwards. Steps are joined by ``", "``, the last is followed by ``". "``, then the box.

How a problem is drawn (all randomness from ``random.Random`` instances, never the global RNG):
  1. The start number is uniform in [operand_min, operand_max].
  2. Each step picks an operator uniformly among the feasible ones, i.e. those with at least one
     operand that keeps the running value v in [0, max_value]:
       ``+`` operands in [operand_min, operand_max] with v + o <= max_value;
       ``-`` operands in [operand_min, operand_max] with o <= v;
       ``*`` operands in [max(2, operand_min), operand_max] with v * o <= max_value. Never 0 or 1, and
       ``*`` is not offered when v == 0 (departure from "any feasible operator": 0*o would erase every
       earlier step, and the labels below claim the answer depends on all of them).
     The operand is then uniform among that operator's feasible operands.
  3. If no operator is feasible, ``+`` with the smallest feasible operand is the fallback; as ``+`` is
     infeasible in that case, this raises ValueError. For a valid TaskConfig it cannot happen: v >=
     operand_min after a start, ``+`` or ``*`` (so ``-`` is feasible), and v <= max_value - operand_min
     after ``-`` (so ``+`` is feasible). There is no rejection loop, so a draw always terminates.
  4. Filler: at each of the num_steps gaps (after each step's separator; the last gap sits just
     before ``\\boxed``), with probability filler_rate, 1-3 words from FILLER_WORDS are inserted, each
     followed by one space: ``" 7+5=12, so well 12*3=36, 36-4=32. okay \\boxed{32}"``. Filler draws
     use their own RNG, so the arithmetic of a seed does not depend on filler_rate.

Splits: ``split_of`` hashes the expression (sha256), so train and held-out never share an
expression whatever the seeds; ``generate`` keeps only draws of the requested split, de-duplicated.

Ground-truth roles, one per character of the solution (see ROLES); CRITICAL_ROLES are the
characters the final answer depends on (operators and intermediate results).
"""

import hashlib
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

__all__ = [
    "build_example", "CRITICAL_ROLES", "draw_budget", "draw_seeds", "expression_of", "FILLER_WORDS", "OPERATORS",
    "ROLES", "sample_fillers", "sample_steps", "split_of", "SPLITS", "TASK_STYLES", "TaskConfig", "TaskExample",
    "TaskStyle"
]

FILLER_WORDS = ("so", "well", "okay", "hmm", "now", "then", "right", "next")
OPERATORS = ("+", "-", "*")
ROLES = ("operand", "carry", "operator", "result", "answer", "filler", "format")
"""operand: digits of the start number and right-hand operands (copied from the prompt);
carry: digits of the left number of steps >= 2 (a copy of the previous result); operator: + - *;
result: digits after each ``=``; answer: digits inside the box braces; filler: letters of filler
words (not their spaces); format: everything else (spaces, ``=``, ``,``, ``.``, ``\\boxed{``, ``}``)."""
CRITICAL_ROLES = ("operator", "result")
SPLITS = ("train", "heldout")
TaskStyle = Literal["symbolic", "words"]
TASK_STYLES: tuple[str, ...] = get_args(TaskStyle)


@dataclass(frozen=True)
class TaskConfig:
    """Knobs of the problem generator.

    num_steps: operators per expression (and reasoning steps per solution).
    operand_min, operand_max: inclusive range of the start number and of ``+``/``-`` operands;
        ``*`` uses [max(2, operand_min), operand_max].
    filler_rate: probability, per gap after a step, of inserting 1-3 filler words.
    max_value: upper bound on every running value (all values also stay >= 0).
    style: how a problem is written. "symbolic": the expression and trace above (``Q: 7+5*3-4``). "words": the
        same arithmetic as a short story in natural language with a step-by-step solution in words, for chat models
        (grail.tasks.word_problems); the arithmetic, the splits and the roles' meaning are the same.
    """

    num_steps: int = 2  # the embedded default; grail.models.warmstart.WarmStartConfig records what it reaches
    operand_min: int = 1
    operand_max: int = 9
    filler_rate: float = 0.0
    max_value: int = 999
    style: TaskStyle = "symbolic"

    def __post_init__(self):
        if self.style not in TASK_STYLES:
            raise ValueError(f"style={self.style!r} is not a task style; choose one of {', '.join(TASK_STYLES)} "
                             f"(symbolic: `Q: 7+5*3-4`; words: the same arithmetic as a word problem).")
        if self.num_steps < 1:
            raise ValueError(f"num_steps={self.num_steps} must be >= 1; use at least one step.")
        if self.operand_min < 0:
            raise ValueError(f"operand_min={self.operand_min} must be >= 0; values never go negative.")
        if self.operand_max < self.operand_min:
            raise ValueError(
                f"operand_max={self.operand_max} is below operand_min={self.operand_min}; "
                "set operand_max >= operand_min."
            )
        if not 0.0 <= self.filler_rate <= 1.0:
            raise ValueError(f"filler_rate={self.filler_rate} must be in [0, 1]; it is a probability.")
        if self.max_value < self.operand_max:
            raise ValueError(
                f"max_value={self.max_value} is below operand_max={self.operand_max}; "
                "set max_value >= operand_max so the start number fits."
            )


@dataclass(frozen=True)
class TaskExample:
    """One problem. ``roles[i]`` is the ROLES entry of ``solution[i]``; len(roles) == len(solution). ``prompt``: a
    string (symbolic style) or chat messages ending with the user's question (words style,
    grail.tasks.word_problems)."""

    expression: str
    prompt: str | list[dict[str, str]]
    solution: str
    answer: str
    roles: tuple[str, ...]

    def critical_mask(self) -> list[bool]:
        """Per solution character: True where the role is in CRITICAL_ROLES."""
        return [r in CRITICAL_ROLES for r in self.roles]

    def filler_mask(self) -> list[bool]:
        """Per solution character: True where the role is "filler"."""
        return [r == "filler" for r in self.roles]

    def to_row(self) -> dict:
        """A JSON-able dataset row: {"prompt", "answer", "solution", "expression"}."""
        return {"prompt": self.prompt, "answer": self.answer, "solution": self.solution,
                "expression": self.expression}


def _apply(value: int, op: str, operand: int) -> int:
    return value + operand if op == "+" else value - operand if op == "-" else value * operand


def _feasible_operands(config: TaskConfig, value: int, op: str) -> range:
    """Operands of ``op`` that keep ``value op operand`` in [0, max_value] (possibly empty)."""
    lo, hi = config.operand_min, config.operand_max
    if op == "+":
        return range(lo, min(hi, config.max_value - value) + 1)
    if op == "-":
        return range(lo, min(hi, value) + 1)
    if value == 0:  # 0*o erases the earlier steps: not offered (see module docstring, rule 2)
        return range(0)
    return range(max(2, lo), min(hi, config.max_value // value) + 1)


def sample_steps(config: TaskConfig, rng: random.Random) -> tuple[int, list[tuple[str, int]]]:
    """Draw (start, [(op, operand), ...]) with num_steps steps, by rules 1-3 of the module docstring."""
    value = rng.randint(config.operand_min, config.operand_max)
    start, steps = value, []
    for _ in range(config.num_steps):
        options = {op: r for op in OPERATORS if len(r := _feasible_operands(config, value, op))}
        if options:
            op = rng.choice(sorted(options, key=OPERATORS.index))
            operand = rng.choice(options[op])
        else:  # unreachable for a valid TaskConfig (rule 3): "+" is infeasible here too
            raise ValueError(f"no operator keeps value {value} in [0, {config.max_value}]: {config}")
        steps.append((op, operand))
        value = _apply(value, op, operand)
    return start, steps


def sample_fillers(config: TaskConfig, rng: random.Random) -> list[tuple[str, ...]]:
    """One tuple of filler words per gap (num_steps gaps); empty where no filler is inserted."""
    return [
        tuple(rng.choice(FILLER_WORDS) for _ in range(rng.randint(1, 3)))
        if rng.random() < config.filler_rate else ()
        for _ in range(config.num_steps)
    ]


def build_example(
    start: int, steps: Sequence[tuple[str, int]], fillers: Sequence[Sequence[str]] | None = None
) -> TaskExample:
    """Render an example and its per-character roles from the arithmetic and the filler words.

    ``fillers[k]`` are the words placed after the separator that follows step k (None: no filler).
    """
    fillers = fillers if fillers is not None else [()] * len(steps)
    if len(fillers) != len(steps):
        raise ValueError(f"fillers has {len(fillers)} gaps, expected one per step ({len(steps)}).")
    pieces: list[tuple[str, str]] = [(" ", "format")]  # (text, role)
    value = start
    for k, ((op, operand), words) in enumerate(zip(steps, fillers, strict=True)):
        result = _apply(value, op, operand)
        pieces += [(str(value), "operand" if k == 0 else "carry"), (op, "operator"),
                   (str(operand), "operand"), ("=", "format"), (str(result), "result"),
                   (", " if k < len(steps) - 1 else ". ", "format")]
        for word in words:
            pieces += [(word, "filler"), (" ", "format")]
        value = result
    pieces += [("\\boxed{", "format"), (str(value), "answer"), ("}", "format")]
    expression = expression_of(start, steps)
    return TaskExample(
        expression=expression,
        prompt=f"Q: {expression}\nA:",
        solution="".join(text for text, _ in pieces),
        answer=str(value),
        roles=tuple(role for text, role in pieces for _ in text),
    )


def expression_of(start: int, steps: Sequence[tuple[str, int]]) -> str:
    """The expression of a draw, e.g. ``7+5*3-4`` (what `split_of` hashes and `generate` de-duplicates)."""
    return str(start) + "".join(f"{op}{operand}" for op, operand in steps)


def _check_heldout_fraction(heldout_fraction: float) -> None:
    if not 0.0 < heldout_fraction < 1.0:
        raise ValueError(f"heldout_fraction={heldout_fraction} must be in (0, 1), e.g. 0.1.")


def draw_budget(n: int) -> int:
    """How many draws a set of n distinct problems may take before its problem space counts as too small."""
    return 200 * n + 10000


def draw_seeds(rng: random.Random, n: int) -> Iterator[int]:
    """The seeds of the draws of a set of n problems (each seeds its own RNGs): `draw_budget(n)` of them from `rng`,
    one at a time, so that a caller that has its n problems stops drawing."""
    for _ in range(draw_budget(n)):
        yield rng.getrandbits(64)


def split_of(expression: str, heldout_fraction: float) -> str:
    """"heldout" if sha256(expression), read as a fraction in [0, 1), is below heldout_fraction.

    Stable across processes and machines; raising heldout_fraction only moves expressions to heldout.
    """
    _check_heldout_fraction(heldout_fraction)
    digest = hashlib.sha256(expression.encode("utf-8")).digest()
    return "heldout" if int.from_bytes(digest[:8], "big") / 2**64 < heldout_fraction else "train"
