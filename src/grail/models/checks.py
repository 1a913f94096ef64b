"""Checks of the model and tokenizer a run will load, made before the trainer is built, so that a missing tokenizer,
a tokenizer without pad or EOS token, or a chat template the prompts need but the tokenizer lacks costs seconds and
gives a message naming the field and the fix (docs/reference/errors.md). The model's own accessors (input
embeddings, the saliency leaf) are checked by `GRAILTrainer` when it is built, where the loaded model is at hand."""

from __future__ import annotations

from transformers import AutoTokenizer

__all__ = ["check_tokenizer"]


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def check_tokenizer(model_name_or_path: str, model_path: str, conversational: bool):
    """The tokenizer of `model_path` (the resolved `model_name_or_path`), or ValueError naming what is wrong:
    none can be loaded; it has neither a pad token nor an EOS token (TRL pads with EOS when there is no pad token,
    and a completion ends at EOS); `conversational` is set but it has no chat template."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_path)
    except (OSError, ValueError, TypeError, KeyError) as err:
        raise ValueError(f"model_name_or_path={model_name_or_path!r}: no tokenizer could be loaded from {model_path} "
                         f"({_first_line(err)}). Save the tokenizer next to the model (tokenizer.save_pretrained("
                         f"{str(model_path)!r})) or point model_name_or_path at a directory or Hub id that has one."
                         ) from err
    if not tokenizer("1 + 1 = 2")["input_ids"]:  # transformers builds an empty tokenizer when the files are missing
        raise ValueError(f"model_name_or_path={model_name_or_path!r}: no tokenizer could be loaded from {model_path} "
                         f"(the tokenizer found there has no vocabulary: it encodes text to nothing; are "
                         f"tokenizer.json / vocab files missing?). Save the tokenizer next to the model "
                         f"(tokenizer.save_pretrained({str(model_path)!r})) or point model_name_or_path at a directory "
                         f"or Hub id that has one.")
    if tokenizer.pad_token is None and tokenizer.eos_token is None:
        raise ValueError(f"model_name_or_path={model_name_or_path!r}: the tokenizer has neither a pad token nor an EOS "
                         f"token; GRPO pads completions (with EOS when there is no pad token) and ends them at EOS. "
                         f"Set "
                         f"them and save the tokenizer, e.g. tokenizer.add_special_tokens({{'eos_token': ..., "
                         f"'pad_token': ...}}); tokenizer.save_pretrained(...).")
    if conversational and getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(f"conversational=true renders each prompt as a user message with the tokenizer's chat "
                         f"template, but the tokenizer of {model_name_or_path!r} has none: use conversational=false "
                         f"(plain-text prompts) or a tokenizer with a chat_template.")
    return tokenizer
