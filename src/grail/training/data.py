"""Training data: the synthetic task, a local JSONL/JSON file, or a Hub dataset, normalised to the two
columns TRL's GRPOTrainer and our reward functions read: `prompt` (string or chat messages) and `answer`.

`load_prompts` reads and checks the rows (prompts as the data has them), `format_prompts` applies a prompt format
(suffix, chat wrapping); `load_train_dataset` does both. Training reads the rows first and formats them once the
model's tokenizer has resolved the format (`conversational` / `prompt_suffix` = auto).
"""

from __future__ import annotations

from pathlib import Path

from datasets import Dataset, load_dataset

from grail.options.fields import SYNTHETIC_DATASET
from grail.options.prompts import PromptFormat
from grail.training.config import GRAILConfig

__all__ = ["format_prompts", "load_prompts", "load_train_dataset", "LOCAL_SUFFIXES", "prompts_are_messages"]

LOCAL_SUFFIXES = (".jsonl", ".json")


def _load_raw(cfg: GRAILConfig) -> Dataset:
    path = Path(cfg.dataset).expanduser()
    if path.suffix in LOCAL_SUFFIXES or path.exists():
        if not path.is_file():
            raise FileNotFoundError(f"dataset file {str(path)!r} does not exist; check the path given as "
                                    f"dataset, or give a Hub dataset id.")
        _check_text_file(path, cfg)
        try:
            return load_dataset("json", data_files=str(path), split="train")
        except Exception as err:  # datasets raises several types for malformed JSON
            raise ValueError(f"could not read dataset file {str(path)!r} as JSON lines: {err}. Each line must "
                             f"be one JSON object with a {cfg.prompt_column!r} and an {cfg.answer_column!r} "
                             f"field.") from err
    return load_dataset(cfg.dataset, cfg.dataset_config, split=cfg.dataset_split)


def _check_text_file(path: Path, cfg: GRAILConfig) -> None:
    """A local data file must be UTF-8 text with at least one line; checked line by line (the JSON reader's own
    errors name neither the line nor the cause)."""
    lines = 0
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                lines += bool(raw.decode("utf-8").strip())
            except UnicodeDecodeError as err:
                raise ValueError(f"dataset file {str(path)!r}, line {number}: not UTF-8 text ({err.reason} at byte "
                                 f"{err.start} of the line); save the file as UTF-8.") from None
    if not lines:
        raise ValueError(f"dataset file {str(path)!r} is empty; it needs one JSON object per line with a "
                         f"{cfg.prompt_column!r} and an {cfg.answer_column!r} field.")


def load_train_dataset(cfg: GRAILConfig, tokenizer=None) -> Dataset:
    """The training prompts as a Dataset with columns `prompt` and `answer` (other columns dropped), in the run's
    prompt format (`PromptFormat.from_config(cfg, tokenizer)`: the tokenizer decides conversational=auto)."""
    rows = load_prompts(cfg)
    return format_prompts(rows, PromptFormat.from_config(cfg, tokenizer, messages=prompts_are_messages(rows)))


def prompts_are_messages(rows: Dataset) -> bool:
    """Whether the prompts of `load_prompts` rows are chat messages (a column holds one type: the first row says)."""
    return len(rows) > 0 and isinstance(rows[0]["prompt"], list)


def format_prompts(rows: Dataset, fmt: PromptFormat) -> Dataset:
    """`load_prompts` rows with each prompt as TRL receives it in format `fmt` (`PromptFormat.training_prompt`)."""
    return rows.map(lambda row: {"prompt": fmt.training_prompt(row["prompt"]), "answer": row["answer"]},
                    remove_columns=rows.column_names)


def load_prompts(cfg: GRAILConfig) -> Dataset:
    """The training rows as a Dataset with columns `prompt` (as the data has it: a string or chat messages, no
    suffix) and `answer`; every row checked (ValueError naming the row and the fix)."""
    if cfg.dataset == SYNTHETIC_DATASET:
        return Dataset.from_list(cfg.synthetic_set().rows("train"))
    raw = _load_raw(cfg)
    missing = [c for c in (cfg.prompt_column, cfg.answer_column) if c not in raw.column_names]
    if missing:
        raise ValueError(f"dataset {cfg.dataset!r} has no column {', '.join(map(repr, missing))}; its columns "
                         f"are {raw.column_names}. Set prompt_column / answer_column to the right names.")
    if len(raw) == 0:
        raise ValueError(f"dataset {cfg.dataset!r} (split {cfg.dataset_split!r}) is empty.")
    raw = raw.select_columns([cfg.prompt_column, cfg.answer_column])

    def normalise(row: dict, index: int) -> dict:  # one pass: checks and rewrites each row
        prompt, answer = row[cfg.prompt_column], row[cfg.answer_column]
        if prompt in (None, "", []) or answer in (None, "", []):
            raise ValueError(f"dataset {cfg.dataset!r}, row {index}: empty {cfg.prompt_column!r} or "
                             f"{cfg.answer_column!r}; remove or fix that row.")
        is_chat = isinstance(prompt, list) and all(isinstance(m, dict) and "content" in m for m in prompt)
        if not (isinstance(prompt, str) or is_chat):
            raise ValueError(f"dataset {cfg.dataset!r}, row {index}: {cfg.prompt_column!r} is a "
                             f"{type(prompt).__name__} ({str(prompt)[:40]!r}); it must be a string or a list of chat "
                             f"messages with 'role' and 'content'. Fix that row, or point prompt_column at the text.")
        # JSON readers infer numbers ("2" may arrive as 2): one type for the reward functions.
        return {"prompt": prompt, "answer": answer if isinstance(answer, list) else str(answer)}

    return raw.map(normalise, with_indices=True, remove_columns=raw.column_names)
