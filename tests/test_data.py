"""Training data: any file with prompt/answer columns, suffixes, chat wrapping, clear errors."""

import json

import pytest

from grail.training.config import GRAILConfig
from grail.training.data import load_train_dataset


def _cfg(tmp_path, **kw):
    """A config with plain-text prompts unless a test says otherwise (conversational=auto needs the model's
    tokenizer: tested at the end)."""
    return GRAILConfig(output_dir=str(tmp_path / "run"), **{"conversational": False, **kw})


def _jsonl(tmp_path, rows):
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_jsonl_with_custom_columns_is_normalised(tmp_path):
    path = _jsonl(tmp_path, [{"problem": "1+1?", "solution": "2", "extra": 1}, {"problem": "2*3?", "solution": 6}])
    ds = load_train_dataset(_cfg(tmp_path, dataset=path, prompt_column="problem", answer_column="solution",
                                 prompt_suffix=" Box it."))
    assert ds.column_names == ["prompt", "answer"]
    assert ds[0] == {"prompt": "1+1? Box it.", "answer": "2"}
    assert ds[1] == {"prompt": "2*3? Box it.", "answer": "6"}  # a number in the file arrives as a string


def test_list_answers_are_kept_for_the_reward_to_read(tmp_path):
    path = _jsonl(tmp_path, [{"question": "Roots?", "final_answer": ["$2$", "$-2$"]}])
    ds = load_train_dataset(_cfg(tmp_path, dataset=path, prompt_column="question", answer_column="final_answer"))
    assert ds[0]["answer"] == ["$2$", "$-2$"]


def test_conversational_wraps_strings_and_extends_message_lists(tmp_path):
    path = _jsonl(tmp_path, [{"prompt": "What is 2+2?", "answer": "4"}])
    ds = load_train_dataset(_cfg(tmp_path, dataset=path, conversational=True, prompt_suffix=" Think."))
    assert ds[0]["prompt"] == [{"role": "user", "content": "What is 2+2? Think."}]
    chat = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "3+3?"}]
    ds = load_train_dataset(_cfg(tmp_path, dataset=_jsonl(tmp_path, [{"prompt": chat, "answer": "6"}]),
                                 conversational=True, prompt_suffix=" Think."))
    assert ds[0]["prompt"][0]["content"] == "Be terse." and ds[0]["prompt"][1]["content"] == "3+3? Think."
    # conversational=false renders chat messages as plain text (a base model's prompt), the suffix included
    plain = load_train_dataset(_cfg(tmp_path, dataset=_jsonl(tmp_path, [{"prompt": chat, "answer": "6"}]),
                                    prompt_suffix=" Think."))
    assert isinstance(plain[0]["prompt"], str) and "3+3? Think." in plain[0]["prompt"]


def test_synthetic_dataset_has_the_requested_size_and_exact_answers(tmp_path):
    ds = load_train_dataset(_cfg(tmp_path, task_num_train=50))
    assert len(ds) == 50 and ds[0]["prompt"].startswith("Q: ") and ds[0]["answer"].lstrip("-").isdigit()


def test_missing_column_error_names_it_and_the_fix(tmp_path):
    path = _jsonl(tmp_path, [{"question": "1+1?", "answer": "2"}])
    with pytest.raises(ValueError, match=r"no column 'prompt'.*\['question', 'answer'\].*prompt_column"):
        load_train_dataset(_cfg(tmp_path, dataset=path))


def test_empty_rows_missing_files_and_bad_json_are_reported(tmp_path):
    with pytest.raises(ValueError, match="row 1: empty"):
        load_train_dataset(_cfg(tmp_path, dataset=_jsonl(tmp_path, [{"prompt": "a", "answer": "1"},
                                                                     {"prompt": "", "answer": "2"}])))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_train_dataset(_cfg(tmp_path, dataset=str(tmp_path / "nope.jsonl")))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "answer": \n')
    with pytest.raises(ValueError, match="could not read dataset file"):
        load_train_dataset(_cfg(tmp_path, dataset=str(bad)))


@pytest.mark.parametrize(("name", "box"), [("paper", "\\boxed{}"), ("release", chr(8) + "oxed{}")])
def test_named_prompt_suffixes_reach_the_training_prompts(tmp_path, name, box):
    """prompt_suffix `paper` is the literal \\boxed{}; `release` the released runs' text, with a backspace."""
    ds = load_train_dataset(_cfg(tmp_path, dataset=_jsonl(tmp_path, [{"prompt": "1+1?", "answer": "2"}]),
                                 prompt_suffix=name))
    assert ds[0]["prompt"] == "1+1? Please reason step by step, and put your final answer within " + box + "."


def test_auto_prompt_format_is_decided_by_the_tokenizer_and_the_task(tmp_path, tokenizer):
    """conversational=auto, prompt_suffix=auto (the defaults): a real dataset through the chat template, when the
    tokenizer has one, with the paper's suffix; plain text with the suffix when it has none; the synthetic task plain,
    without a suffix. Without a tokenizer, auto cannot be decided on a real dataset: an error that says so."""
    import copy

    from grail.options.prompts import PAPER_PROMPT_SUFFIX

    path = _jsonl(tmp_path, [{"prompt": "What is 2+2?", "answer": "4"}])
    cfg = GRAILConfig(output_dir=str(tmp_path / "run"), dataset=path)
    assert (cfg.conversational, cfg.prompt_suffix) == ("auto", "auto")
    with_template = load_train_dataset(cfg, tokenizer)
    assert with_template[0]["prompt"] == [{"role": "user", "content": "What is 2+2?" + PAPER_PROMPT_SUFFIX}]
    plain_tokenizer = copy.deepcopy(tokenizer)
    plain_tokenizer.chat_template = None
    assert load_train_dataset(cfg, plain_tokenizer)[0]["prompt"] == "What is 2+2?" + PAPER_PROMPT_SUFFIX
    synthetic = GRAILConfig(output_dir=str(tmp_path / "run"), task_num_train=4)
    assert load_train_dataset(synthetic, tokenizer)[0]["prompt"].endswith("\nA:")  # plain, no suffix
    with pytest.raises(ValueError, match="conversational=auto is decided by the model's tokenizer"):
        load_train_dataset(cfg)
