"""The Gemma 3 270M words setting without the model: the `gemma-words` preset's task (its own measured difficulty,
grail.tasks.word_problems.GEMMA_WORDS_TASK; `smollm-words` keeps WORDS_SET), and perf/word_problems_accuracy.py
measuring the prompt a run trains on."""

import importlib.util
from pathlib import Path

from grail.options.fields import GRAILFields
from grail.options.presets import PRESETS
from grail.options.prompts import PromptFormat, render_plain
from grail.tasks.arithmetic import expression_of, sample_steps, split_of
from grail.tasks.synthetic import WORDS_SET, generate
from grail.tasks.word_problems import GEMMA_WORDS_TASK, WORDS_TASK

SCRIPT = Path(__file__).resolve().parents[1] / "perf" / "word_problems_accuracy.py"


def _synthetic_set(preset: str):
    values = PRESETS[preset]
    return GRAILFields(**{k: v for k, v in values.items() if k.startswith("task_")}).synthetic_set()


def _expressions_by_split(task) -> dict[str, set[str]]:
    """Every distinct expression of `task`, by split: enumerated by drawing until no new one turns up (the space has a
    few hundred; 20,000 draws leave none out)."""
    import random

    rng, found = random.Random(0), {"train": set(), "heldout": set()}
    for _ in range(20_000):
        expression = expression_of(*sample_steps(task, rng))
        found[split_of(expression, 0.1)].add(expression)
    return found


def test_the_gemma_preset_holds_its_task_and_smollm_keeps_its_own():
    gemma, smollm = _synthetic_set("gemma-words"), _synthetic_set("smollm-words")
    assert gemma.task == GEMMA_WORDS_TASK and smollm == WORDS_SET and WORDS_SET.task == WORDS_TASK
    assert GEMMA_WORDS_TASK != WORDS_TASK and GEMMA_WORDS_TASK.style == "words"
    assert PRESETS["gemma-words"]["reward"] == PRESETS["smollm-words"]["reward"] == "exact_int"  # the last box


def test_the_gemma_sets_fit_the_smaller_problem_space():
    """The preset asks for no more problems than the task has: both splits build, and the held-out split is all of
    the space's held-out expressions (the evaluation uses every one of them)."""
    gemma = _synthetic_set("gemma-words")
    space = _expressions_by_split(gemma.task)
    assert gemma.num_heldout == len(space["heldout"]) and gemma.num_train <= len(space["train"])
    for split in ("train", "heldout"):
        expressions = {e.expression for e in generate(gemma.task, len(gemma.rows(split)), split, gemma.seed)}
        assert expressions <= space[split] and len(expressions) == len(gemma.rows(split))


def _script():
    spec = importlib.util.spec_from_file_location("word_problems_accuracy", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_accuracy_script_measures_the_plain_prompt_training_uses():
    """By default the script renders a plain prompt as a run does (PromptFormat.training_prompt: no end marker after
    the worked answers), so its accuracy is the one GRPO starts from."""
    script = _script()
    args = script.parse_args(["--model", "gemma3-270m"])
    assert args.answer_end == "none"
    example = generate(GEMMA_WORDS_TASK, 1, "heldout", 0)[0]
    answer_end = {"eos": "<eos>", "none": ""}[args.answer_end]
    assert render_plain(example.prompt, answer_end) == PromptFormat("", False, {}).training_prompt(example.prompt)


def test_the_first_box_diagnostic_reads_the_first_box_only():
    first_box_correct = _script()._first_box_correct
    rambled = "Mia has 7 + 5 = 12 apples. \\boxed{12}\n\nQuestion: Tom has 3. Put the final answer in \\boxed{}."
    assert first_box_correct(rambled, "12") == 1.0 and first_box_correct(rambled, "3") == 0.0
    assert first_box_correct("\\boxed{4} then \\boxed{12}", "12") == 0.0
    assert first_box_correct("no box at all, 12", "12") == 0.0
