"""The Gemma 3 270M words setting without the model: the `gemma-words` preset (SmolLM2's problems, read as SmolLM2's
are), and perf/experiments/word_problems_accuracy.py measuring the prompt a run trains on."""

import word_problems_accuracy

from grail.options.fields import GRAILFields
from grail.options.presets import PRESETS
from grail.options.prompts import PromptFormat, render_plain
from grail.tasks.synthetic import WORDS_SET, generate


def _synthetic_set(preset: str):
    values = PRESETS[preset]
    return GRAILFields(**{k: v for k, v in values.items() if k.startswith("task_")}).synthetic_set()


def test_the_gemma_preset_asks_smollms_problems_and_reads_the_last_box():
    """Only the model and its rendering differ: the same problems, the same reward (the last box, as the evaluation
    reads it), plain text for the base model."""
    gemma, smollm = PRESETS["gemma-words"], PRESETS["smollm-words"]
    assert _synthetic_set("gemma-words") == _synthetic_set("smollm-words") == WORDS_SET
    assert gemma["reward"] == smollm["reward"] == "exact_int" and gemma["conversational"] is False
    assert gemma["model_name_or_path"] == "gemma3-270m" and smollm["model_name_or_path"] == "smollm2-135m"


def _script():
    return word_problems_accuracy


def test_the_accuracy_script_measures_the_plain_prompt_training_uses():
    """By default the script renders a plain prompt as a run does (PromptFormat.training_prompt: no end marker after
    the worked answers), so its accuracy is the one GRPO starts from."""
    script = _script()
    args = script.parse_args(["--model", "gemma3-270m"])
    assert args.answer_end == "none"
    example = generate(WORDS_SET.task, 1, "heldout", 0)[0]
    answer_end = {"eos": "<eos>", "none": ""}[args.answer_end]
    assert render_plain(example.prompt, answer_end) == PromptFormat("", False, {}).training_prompt(example.prompt)


def test_the_first_box_diagnostic_reads_the_first_box_only():
    first_box_correct = _script()._first_box_correct
    rambled = "Mia has 7 + 5 = 12 apples. \\boxed{12}\n\nQuestion: Tom has 3. Put the final answer in \\boxed{}."
    assert first_box_correct(rambled, "12") == 1.0 and first_box_correct(rambled, "3") == 0.0
    assert first_box_correct("\\boxed{4} then \\boxed{12}", "12") == 0.0
    assert first_box_correct("no box at all, 12", "12") == 0.0
