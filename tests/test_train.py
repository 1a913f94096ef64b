"""grail.training.run's pieces without a training run: the step line (groups with a gradient, the empty-completions
warning), config.yaml's types, and the prompt format a run resolves and records."""

import copy
import json
from types import SimpleNamespace

import pytest
import yaml

from grail.training.config import GRAILConfig
from grail.training.run import Progress, resolve_prompt_fields, write_run_config


def _args(**kw):
    values = dict(scale_rewards="group", per_device_train_batch_size=8, gradient_accumulation_steps=2, world_size=1,
                  num_generations=4, prompt_suffix="", conversational=False)
    return SimpleNamespace(**{**values, **kw})


def _step_lines(logs: list[dict], args=None) -> list[str]:
    lines = []
    progress = Progress(lines.append)
    state = SimpleNamespace(is_world_process_zero=True, global_step=3, max_steps=10)
    for entry in logs:
        progress.on_log(args or _args(), state, None, logs=entry)
    return lines


def test_the_step_line_says_how_many_groups_had_a_gradient():
    """TRL's frac_reward_zero_std is the share of rows whose group's rewards all agree (A = 0): 8 × 2 rows of 4 per
    step are 4 groups, so 0.25 is 3 groups with a gradient, 1.0 none."""
    (line,) = _step_lines([{"reward": 0.5, "loss": 0.1, "frac_reward_zero_std": 0.25}])
    assert "| gradient from 3/4 groups |" in line and line.startswith("step 3/10 | reward 0.500")
    (line,) = _step_lines([{"reward": 0.0, "loss": 0.0, "frac_reward_zero_std": 1.0}])
    assert "no group had a gradient: every group's rewards are equal" in line
    (line,) = _step_lines([{"reward": 0.5, "loss": 0.1, "frac_reward_zero_std": 0.0}], _args(scale_rewards="batch"))
    assert "gradient" not in line  # with batch scaling TRL measures the share over the batch, not per group
    (line,) = _step_lines([{"reward": 1.0, "loss": 0.0, "frac_reward_zero_std": 1.0}], _args(scale_rewards="batch"))
    assert "no group had a gradient" in line


def test_mostly_empty_completions_are_warned_about_once_with_the_cause_and_the_fix():
    """TRL counts the end-of-sequence token: a mean length <= 1.5 means at least half the completions are empty."""
    lines = _step_lines([{"reward": 0.0, "loss": 0.0, "completions/mean_length": 1.0}] * 2)
    warnings = [line for line in lines if line.startswith("warning:")]
    assert len(warnings) == 1 and len(lines) == 3  # two step lines, one warning
    assert "most completions are empty" in warnings[0] and "plain text" in warnings[0]
    assert "--conversational true" in warnings[0] and "--prompt_suffix paper" in warnings[0]
    assert not [line for line in _step_lines([{"reward": 0.3, "completions/mean_length": 7.0}])
                if line.startswith("warning:")]


def test_config_yaml_writes_whole_step_counts_as_integers(tmp_path):
    """TrainingArguments types logging_steps / save_steps as floats (below 1: a fraction of the run), so a flag's
    "1" arrives as 1.0; config.yaml writes the integer. A fraction, and other float fields, stay floats."""
    cfg = GRAILConfig(output_dir=str(tmp_path))
    write_run_config(cfg, {"logging_steps": 1.0, "save_steps": 0.5, "learning_rate": 1.0, "max_steps": 2}, tmp_path)
    text = (tmp_path / "config.yaml").read_text()
    assert "logging_steps: 1\n" in text and "save_steps: 0.5\n" in text and "learning_rate: 1.0\n" in text
    values = yaml.safe_load(text)
    assert type(values["logging_steps"]) is int and values["max_steps"] == 2


def test_a_run_records_chat_for_prompts_that_are_chat_messages(tmp_path, tokenizer):
    """Prompts that are chat messages are rendered by TRL with the chat template when the tokenizer has one and
    conversational is not false: the resolved format (written into the config, so resolved_config.json and
    grail_prompt.json record it) is chat, with the chat_template_kwargs TRL is handed. conversational=false renders
    them as plain text (a base model's format) and records that."""
    from datasets import Dataset

    rows = Dataset.from_list([{"prompt": [{"role": "user", "content": "2+2?"}], "answer": "4"}])
    plain = GRAILConfig(output_dir=str(tmp_path), dataset="d.jsonl", conversational=False, prompt_suffix="")
    assert not resolve_prompt_fields(plain, tokenizer, rows).chat and plain.conversational is False
    cfg = GRAILConfig(output_dir=str(tmp_path), dataset="d.jsonl", prompt_suffix="")
    fmt = resolve_prompt_fields(cfg, tokenizer, rows)
    assert fmt.chat and fmt.chat_template_kwargs == {"enable_thinking": False}
    assert (cfg.conversational, cfg.prompt_suffix, cfg.chat_template_kwargs) == (True, "", {"enable_thinking": False})
    fmt.save(tmp_path)
    assert json.loads((tmp_path / "grail_prompt.json").read_text()) == {
        "suffix": "", "chat": True, "chat_template_kwargs": {"enable_thinking": False}}
    given = GRAILConfig(output_dir=str(tmp_path), dataset="d.jsonl", chat_template_kwargs={"custom": 1})
    assert resolve_prompt_fields(given, tokenizer, rows).chat_template_kwargs == {"custom": 1}  # explicit wins
    no_template = copy.deepcopy(tokenizer)
    no_template.chat_template = None
    # without a template, `auto` renders them as plain text (a base model); asking for chat is refused
    assert not resolve_prompt_fields(GRAILConfig(output_dir=str(tmp_path), dataset="d.jsonl"), no_template, rows).chat
    with pytest.raises(ValueError, match="holds chat messages.*has none"):
        resolve_prompt_fields(GRAILConfig(output_dir=str(tmp_path), dataset="d.jsonl", conversational=True),
                              no_template, rows)
