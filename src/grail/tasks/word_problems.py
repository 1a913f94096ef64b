r"""The "words" style of the synthetic task (`TaskConfig(style="words")`): the same arithmetic as
`grail.tasks.arithmetic`, told as a short story, for pretrained chat models.

`grail.tasks.arithmetic` draws the arithmetic (the start number and the ``(op, operand)`` steps, `sample_steps`) and the
split (`split_of` on the expression ``7+5-3``); this module only renders it. Each step acts on the running amount, so
left-to-right evaluation is the order of events in the story. The prompt is a list of chat messages: `shots` worked
examples as earlier user/assistant turns, then the problem as the last user turn; every user turn ends with the
instruction to box the answer::

    user:      "Mia has 7 apples. She buys 5 more. Then she gives away 3. How many apples does Mia have now?
                Put the final answer in \boxed{}."
    solution:  "Mia has 7 + 5 = 12 apples. Then she has 12 - 3 = 9 apples. \boxed{9}"
    answer:    "9"

``*`` reads "ends up with 3 times as many" (3 = the operand); values stay in [0, max_value] by the symbolic
style's drawing rules. The solution is one short sentence per step, "{name} has {left} {op} {operand} = {result}
{objects}." then "Then {pronoun} has ...", then ``\boxed{answer}``: the phrasing SmolLM2-135M-Instruct itself uses
when it gets these right, which at temperature 1 it follows far more often than a longer narrative (below).

Roles (`grail.tasks.arithmetic.ROLES`, one per solution character): the first left number is ``operand`` (the start
number, copied from the question), later left numbers ``carry``, the right-hand numbers ``operand``, ``+ - *``
``operator``, the number after ``=`` ``result``, the box digits ``answer``, filler-word letters ``filler``,
everything else (name, "has", objects, "Then", pronoun, spaces, ``=``, ``.``, ``\boxed{``, ``}``) ``format``. So the
critical spans (`CRITICAL_ROLES`) are each step's operator and result, as in the symbolic style. Filler: the
symbolic style's gaps and words (`sample_fillers`): 1-3 lowercase FILLER_WORDS after the sentence of step k (the
last gap right before ``\boxed``), each followed by one space: "Mia has 7 + 5 = 12 apples. so well Then she has
...". No other word of a solution is a filler word.

The story (name, pronoun, object, one phrasing per step) and the worked examples come from the draw's own RNG
(``f"{draw_seed}:words"``), so a seed draws the same arithmetic in both styles and the splits are shared. Each
worked example is a fresh `sample_steps` draw of the same TaskConfig whose expression is in the training split, so
no held-out expression appears in any prompt, not even as an example. The task's prompts are chat messages: a run
renders them with the model's chat template whatever `conversational` says, and needs no prompt suffix (the
instruction is in every user turn; prompt_suffix `auto` is "" on the synthetic task).

Measured difficulty (perf/experiments/word_problems_accuracy.py: the model's chat template, T=1.0, top-p 1, top-k 0, the
held-out split, grail.evaluation.rewards.exact_int_reward on the last box), SmolLM2-135M-Instruct (the de-quantised Q4_1
conversion, `grail models fetch smollm2-135m`). Screening runs (24 problems x 4 samples, 64 new tokens; the prompt
variants differ in the worked examples only; "long" = the earlier narrative solution "Mia starts with 7 apples. After
buying 5 more, she has 7 + 5 = 12. ..."; "compact" = the equations only, "7 + 5 = 12. \boxed{12}"; "short" = the format
above):

  steps, operands, max   prompt                                  sampled   greedy   no box
  1, 1..20, 40           no example, box instruction               0%*       0%*     95%*
  1, 1..20, 40           no example, the paper's suffix            0%*       0%*     98%*
  1, 1..20, 40           1 long example inside the user turn       2%*       0%*     88%*
  1, 1..20, 40           2 long examples as chat turns            13.5%     29.2%    18%
  1, 1..20, 40           4 long examples as chat turns            19.8%     41.7%    16%
  1, 1..20, 40           4 compact examples as chat turns         30.2%     50.0%     9%
  1, 1..20, 40           4 short examples as chat turns           27.1%     25.0%     9%
  1, 1..50, 100          2 long examples as chat turns             7.3%     33.3%    15%
  2, 1..9, 20            4 compact examples as chat turns          9.4%      8.3%     5%
  2, 1..9, 999           4 compact examples as chat turns          2.1%      4.2%    14%
  2, 1..9, 999           2 long examples as chat turns             4.2%      0.0%    40%
  (* 8 problems x 8 samples.) Two steps stay below 10% whatever the prompt: the 135M model's arithmetic at T=1.

Chosen default (WORDS_TASK / WORDS_SET, the `smollm-words` preset): 1 step, operands 1..20, every value <= 40 (so ``*``
is "2 to 20 times as many" with a product <= 40), 4 worked examples, the short solution. 708 distinct expressions:
642 train, 66 held-out, hence WORDS_SET's 600 / 64. Confirmation on 64 held-out problems x 4 samples, 128 new
tokens (python perf/experiments/word_problems_accuracy.py --threads 1; the defaults are WORDS_SET's):
sampled 19.1% [95% CI 13.3%, 25.4%], greedy 32.8%, 42% of problems with mixed rewards, 5.9% with no box, 94.9%
stopped before the limit, completions 30 tokens and prompts 324 tokens on average. Just under the 20% aimed at: GRPO
still gets a mixed group on 4 problems in 10 at 4 generations, more at 8.

Gemma 3 270M (the base model, `grail models fetch gemma3-270m --accept_gemma_terms`; no chat template, so the turns
are rendered by grail.options.prompts.render_plain, after its BOS token), 4 worked examples, measured under load
(python perf/experiments/word_problems_accuracy.py --model gemma3-270m --threads 1 ..., the options in the table;
--answer-end none is the prompt a run trains on, PromptFormat.training_prompt; "first box": the share whose first box
holds the answer, a diagnostic):

  operands, max   split     problems x samples   tokens   T     answer end   sampled [95% CI]      greedy   first box
  1..20, 40       heldout   16 x 4               64       1.0   eos           4.7% [0%, 9.4%]       -        -
  1..20, 40       heldout   16 x 4               64       1.0   none          6.2% [1.6%, 12.5%]    -        -
  1..20, 40       heldout   32 x 4               48       1.0   none         16.4% [7.8%, 26.6%]   31.2%    17.2%
  1..9, 20        train     32 x 4               48       1.0   none         16.4% [9.4%, 24.2%]   -        18.8%
  1..20, 40       heldout   32 x 4               48       0.7   none         19.5% [10.2%, 30.5%]  -        20.3%

A base model does not end its answer: 92% of the 48-token completions (1..20, T=1) went on to write a next
"Question:", 4% stopped with EOS (16% with an EOS token after each worked answer, 64 tokens). With 64 new tokens that
next question often reaches its own instruction, "Put the final answer in \boxed{}.", whose empty box is then the last
box, which the reward reads: hence 5-6% there. At 48 tokens (the `gemma-words` preset's max_completion_length) it
rarely does: the first box holds the answer 1-2 points more often than the last, so a first-box reward would gain
little and would need the evaluation to read the first box too; the reward and the evaluation keep reading the last
box. Smaller numbers (1..9, values <= 20: 159 expressions, only 12 of them held out) did not help either: what fails
is the operation, not the size of the numbers (at T=1 on 1..20 the equation wrote the question's operator in 71% of
the ``-`` samples, 54% of ``*``, 31% of ``+``). The number of worked examples, which the screening for SmolLM2 varied,
is not a run setting (a run uses DEFAULT_PROMPT) and was not varied for Gemma. T=0.7 (a run's `temperature`, which
its rollouts and its sampled evaluation share) gave 19.5%, within the noise of T=1's 16.4%: the `gemma-words` preset
keeps SmolLM2's problems, T=1.0 and the last-box reward, and Gemma's accuracy before RL stays just under the 20-60%
band aimed at (38% of problems with mixed rewards at 4 samples, as for SmolLM2).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from grail.tasks.arithmetic import TaskConfig, TaskExample, _apply, expression_of, sample_steps, split_of

__all__ = ["build_word_example", "DEFAULT_PROMPT", "INSTRUCTION", "NAMES", "OBJECTS", "PHRASES",
           "PromptOptions", "question", "render_prompt", "solution_pieces", "Story", "WORDS_TASK"]

NAMES = (("Mia", "she"), ("Tom", "he"), ("Ava", "she"), ("Leo", "he"), ("Zoe", "she"), ("Sam", "he"),
         ("Lily", "she"), ("Ben", "he"), ("Emma", "she"), ("Max", "he"), ("Nora", "she"), ("Jack", "he"))
# (singular, plural): countable things that can be bought, found, given away or lost
OBJECTS = (("apple", "apples"), ("marble", "marbles"), ("sticker", "stickers"), ("coin", "coins"),
           ("book", "books"), ("pencil", "pencils"), ("card", "cards"), ("shell", "shells"), ("stamp", "stamps"),
           ("cookie", "cookies"), ("balloon", "balloons"), ("toy car", "toy cars"))
# per operator, the question's phrasings of a step (after the pronoun); {n} = the operand
PHRASES = {
    "+": ("buys {n} more", "finds {n} more", "gets {n} more from a friend", "wins {n} more"),
    "-": ("gives away {n}", "loses {n}", "gives {n} to a friend", "sells {n}"),
    "*": ("ends up with {n} times as many",),
}
INSTRUCTION = "Put the final answer in \\boxed{}."


@dataclass(frozen=True)
class PromptOptions:
    """How a problem is asked. shots: worked examples before it, as earlier chat turns (each a fresh training-split
    draw); instruction: the text ending every user turn ("" = none)."""

    shots: int = 4
    instruction: str = INSTRUCTION

    def __post_init__(self):
        if self.shots < 0:
            raise ValueError(f"shots={self.shots} must be >= 0.")


DEFAULT_PROMPT = PromptOptions()
# The measured default (module docstring): 1-step problems on 1..20 with every value <= 40.
WORDS_TASK = TaskConfig(num_steps=1, operand_min=1, operand_max=20, max_value=40, style="words")


@dataclass(frozen=True)
class Story:
    """The non-arithmetic choices of one problem: who, what, and which phrasing (index into PHRASES[op]) per step."""

    name: str
    pronoun: str
    singular: str
    plural: str
    phrasing: tuple[int, ...]


def _draw_story(steps: Sequence[tuple[str, int]], rng: random.Random, avoid: str | None = None) -> Story:
    name, pronoun = rng.choice([n for n in NAMES if n[0] != avoid])
    singular, plural = rng.choice(OBJECTS)
    return Story(name, pronoun, singular, plural, tuple(rng.randrange(len(PHRASES[op])) for op, _ in steps))


def _objects(n: int, story: Story) -> str:
    return story.singular if n == 1 else story.plural


def question(start: int, steps: Sequence[tuple[str, int]], story: Story) -> str:
    """The word problem itself (no instruction)."""
    sentences = [f"{story.name} has {start} {_objects(start, story)}."]
    for k, ((op, operand), which) in enumerate(zip(steps, story.phrasing, strict=True)):
        verb = PHRASES[op][which].format(n=operand)
        sentences.append(f"{story.pronoun.capitalize()} {verb}." if k == 0 else f"Then {story.pronoun} {verb}.")
    sentences.append(f"How many {story.plural} does {story.name} have now?")
    return " ".join(sentences)


def solution_pieces(start: int, steps: Sequence[tuple[str, int]], story: Story,
                    fillers: Sequence[Sequence[str]]) -> list[tuple[str, str]]:
    """The reference solution as (text, role) pieces (roles of grail.tasks.arithmetic.ROLES, see the module
    docstring)."""
    pieces: list[tuple[str, str]] = []
    value = start
    for k, ((op, operand), words) in enumerate(zip(steps, fillers, strict=True)):
        result = _apply(value, op, operand)
        pieces += [(f"{story.name} has " if k == 0 else f"Then {story.pronoun} has ", "format"),
                   (str(value), "operand" if k == 0 else "carry"), (" ", "format"), (op, "operator"),
                   (" ", "format"), (str(operand), "operand"), (" = ", "format"), (str(result), "result"),
                   (f" {_objects(result, story)}. ", "format")]
        for word in words:
            pieces += [(word, "filler"), (" ", "format")]
        value = result
    return [*pieces, ("\\boxed{", "format"), (str(value), "answer"), ("}", "format")]


def render_prompt(start: int, steps: Sequence[tuple[str, int]], story: Story,
                  examples: Sequence[tuple[int, Sequence[tuple[str, int]], Story]] = (),
                  options: PromptOptions = DEFAULT_PROMPT) -> list[dict[str, str]]:
    """The prompt as chat messages: each worked example as a user turn (its question) and an assistant turn (its
    reference solution, without filler), then the problem as the last user turn."""
    def ask(text: str) -> dict[str, str]:
        return {"role": "user", "content": f"{text} {options.instruction}" if options.instruction else text}

    messages = []
    for ex_start, ex_steps, ex_story in examples:
        solution = "".join(text for text, _ in solution_pieces(ex_start, ex_steps, ex_story, [()] * len(ex_steps)))
        messages += [ask(question(ex_start, ex_steps, ex_story)), {"role": "assistant", "content": solution}]
    return [*messages, ask(question(start, steps, story))]


def build_word_example(config: TaskConfig, start: int, steps: Sequence[tuple[str, int]],
                       fillers: Sequence[Sequence[str]] | None, rng: random.Random,
                       heldout_fraction: float = 0.1, options: PromptOptions = DEFAULT_PROMPT) -> TaskExample:
    """A `grail.tasks.arithmetic.TaskExample` of the words style. `rng` (the draw's ``:words`` RNG) picks the story,
    then the worked examples (fresh `sample_steps` draws of `config` in the training split, each with its own story)."""
    fillers = fillers if fillers is not None else [()] * len(steps)
    if len(fillers) != len(steps):
        raise ValueError(f"fillers has {len(fillers)} gaps, expected one per step ({len(steps)}).")
    story = _draw_story(steps, rng)
    examples = []
    for _ in range(options.shots):
        for _attempt in range(1000):  # a draw is in the training split with probability 1 - heldout_fraction
            ex_start, ex_steps = sample_steps(config, rng)
            if split_of(expression_of(ex_start, ex_steps), heldout_fraction) == "train":
                break
        else:
            raise ValueError(f"no training-split expression for a worked example in 1000 draws: {config}")
        examples.append((ex_start, ex_steps, _draw_story(ex_steps, rng, avoid=story.name)))
    pieces = solution_pieces(start, steps, story, fillers)
    return TaskExample(
        expression=expression_of(start, steps),
        prompt=render_prompt(start, steps, story, examples, options),
        solution="".join(text for text, _ in pieces),
        answer=pieces[-2][0],
        roles=tuple(role for text, role in pieces for _ in text),
    )
