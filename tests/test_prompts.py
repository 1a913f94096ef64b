"""grail.options.prompts: one format for training and evaluation; evaluation renders exactly what TRL renders; the named
suffixes, the release's backspace included."""

import json

import pytest

from grail.options.prompts import FORMAT_FILE, PAPER_PROMPT_SUFFIX, RELEASE_PROMPT_SUFFIX, PromptFormat, resolve_suffix


def test_plain_and_chat_training_prompts():
    assert PromptFormat(" go.").training_prompt("Q: 1+1") == "Q: 1+1 go."
    assert PromptFormat(" go.", chat=True).training_prompt("Q") == [{"role": "user", "content": "Q go."}]
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    assert PromptFormat("!", chat=True).training_prompt(messages)[1]["content"] == "U!"
    assert PromptFormat("!").training_prompt(messages) == "S\n\nQuestion: U!\n\nAnswer:"  # plain: render_plain
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


def test_named_suffixes_resolve_in_one_place():
    assert resolve_suffix("paper") == PAPER_PROMPT_SUFFIX
    assert resolve_suffix("release") == RELEASE_PROMPT_SUFFIX
    assert resolve_suffix(" Box it.") == " Box it." and resolve_suffix("") == ""  # other text: as it is
    # the release's text is the paper's with its "\b" read as a backspace (a non-raw string), nothing else
    assert RELEASE_PROMPT_SUFFIX == PAPER_PROMPT_SUFFIX.replace("\\b", chr(8))
    assert RELEASE_PROMPT_SUFFIX.startswith(" Please reason step by step") and "\\" not in RELEASE_PROMPT_SUFFIX


def test_the_release_suffix_renders_a_backspace_in_training_and_evaluation_alike(tokenizer, tmp_path):
    """prompt_suffix=release in training, --prompt-suffix release in `grail eval`: the same text reaches the model."""
    from types import SimpleNamespace

    from grail.evaluation.cli import _prompt_format
    from grail.training.config import GRAILConfig
    from grail.training.data import load_train_dataset

    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"prompt": "What is 2+2?", "answer": "4"}) + "\n")
    cfg = GRAILConfig(output_dir=str(tmp_path / "run"), dataset=str(path), prompt_suffix="release",
                      conversational=True, chat_template_kwargs={"enable_thinking": False})
    trl_side = tokenizer.apply_chat_template(load_train_dataset(cfg)[0]["prompt"], add_generation_prompt=True,
                                             tokenize=False, enable_thinking=False)  # what TRL renders
    assert chr(8) + "oxed{}" in trl_side and "\\boxed" not in trl_side
    trained = PromptFormat.from_config(cfg)
    trained.save(tmp_path)  # what training writes next to the model
    assert PromptFormat.load(tmp_path).render(tokenizer, "What is 2+2?") == trl_side
    args = SimpleNamespace(prompt_format="auto", prompt_suffix="release")
    untrained = _prompt_format(args, str(tmp_path / "no-saved-format"), tokenizer)  # a released checkpoint
    assert untrained.render(tokenizer, "What is 2+2?") == trl_side


def _three_formats(tokenizer, tmp_path, dataset: str, benchmark_synthetic: bool):
    """What `grail train`, `grail eval` and `grail explain --dataset` make of a model without a saved format, every
    prompt setting left at its default."""
    from types import SimpleNamespace

    from grail.analysis.explain.cli import _prompt_format as explain_format
    from grail.evaluation.cli import _prompt_format as eval_format
    from grail.training.config import GRAILConfig

    cfg = GRAILConfig(output_dir=str(tmp_path / "run"), dataset=dataset)
    unsaved = str(tmp_path / "no-saved-format")
    return (PromptFormat.from_config(cfg, tokenizer),
            eval_format(SimpleNamespace(prompt_format="auto", prompt_suffix=None), unsaved, tokenizer,
                        synthetic=benchmark_synthetic),
            explain_format(SimpleNamespace(prompt=None, model=unsaved), cfg, {}, unsaved, tokenizer, None))


def test_train_eval_and_explain_share_one_default_decided_by_the_model(tokenizer, tmp_path):
    """conversational=auto / prompt_suffix=auto: the chat template iff the tokenizer has one, with the paper's
    suffix; the synthetic task in plain text without a suffix (the tiny model's warm-start format)."""
    import copy

    chat = PromptFormat(PAPER_PROMPT_SUFFIX, True, {"enable_thinking": False})
    assert _three_formats(tokenizer, tmp_path, "d.jsonl", False) == (chat,) * 3
    no_template = copy.deepcopy(tokenizer)
    no_template.chat_template = None
    assert _three_formats(no_template, tmp_path, "d.jsonl", False) == (PromptFormat(PAPER_PROMPT_SUFFIX),) * 3
    assert _three_formats(tokenizer, tmp_path, "synthetic", True) == (PromptFormat(""),) * 3


def test_explicit_prompt_settings_win_over_auto(tokenizer):
    from grail.options.prompts import resolve_prompt_format

    assert resolve_prompt_format(tokenizer, False, False, "") == PromptFormat("", False, {})
    assert resolve_prompt_format(tokenizer, True, True, "paper") == PromptFormat(PAPER_PROMPT_SUFFIX, True,
                                                                                   {"enable_thinking": False})
    assert resolve_prompt_format(None, False, True, "auto", {"k": 1}) == PromptFormat(PAPER_PROMPT_SUFFIX, True,
                                                                                        {"k": 1})
    # chat-message prompts: conversational=false renders them as plain text (render_plain); auto follows the template
    assert not resolve_prompt_format(None, False, False, "", messages=True).chat
    assert resolve_prompt_format(tokenizer, True, messages=True).chat == (tokenizer.chat_template is not None)
