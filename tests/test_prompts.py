"""grail.prompts: one format for training and evaluation; evaluation renders exactly what TRL renders."""

import pytest

from grail.prompts import FORMAT_FILE, PAPER_PROMPT_SUFFIX, PromptFormat


def test_plain_and_chat_training_prompts():
    assert PromptFormat(" go.").training_prompt("Q: 1+1") == "Q: 1+1 go."
    assert PromptFormat(" go.", chat=True).training_prompt("Q") == [{"role": "user", "content": "Q go."}]
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    assert PromptFormat("!").training_prompt(messages)[1]["content"] == "U!"
    with pytest.raises(ValueError, match="no user message"):
        PromptFormat("!").training_prompt([{"role": "system", "content": "S"}])


def test_render_matches_trls_chat_rendering(tokenizer):
    """TRL renders a conversational prompt with apply_chat_template(add_generation_prompt=True, **kwargs)."""
    fmt = PromptFormat(PAPER_PROMPT_SUFFIX, chat=True, chat_template_kwargs={"enable_thinking": False})
    rendered = fmt.render(tokenizer, "What is 2+2?")
    trl_side = tokenizer.apply_chat_template(fmt.training_prompt("What is 2+2?"), add_generation_prompt=True,
                                             tokenize=False, enable_thinking=False)
    assert rendered == trl_side
    assert rendered == f"<|im_start|>user\nWhat is 2+2?{PAPER_PROMPT_SUFFIX}<|im_end|>\n<|im_start|>assistant\n"
    assert PromptFormat("").render(tokenizer, "Q: 1+1\nA:") == "Q: 1+1\nA:"


def test_default_format_and_the_saved_one(tokenizer, tmp_path):
    default = PromptFormat.default_for(tokenizer)  # the tiny tokenizer has a (ChatML) template
    assert default == PromptFormat(PAPER_PROMPT_SUFFIX, True, {"enable_thinking": False})
    assert PromptFormat.load(tmp_path) is None
    trained = PromptFormat("", chat=False)
    trained.save(tmp_path)
    assert PromptFormat.load(tmp_path) == trained
    (tmp_path / FORMAT_FILE).write_text('{"suffix": 1, "bogus": 2}')
    with pytest.raises(ValueError, match="not a valid prompt format"):
        PromptFormat.load(tmp_path)
