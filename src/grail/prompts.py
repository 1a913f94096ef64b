"""The one prompt template, shared by training and evaluation.

A `PromptFormat` says how a problem becomes what the model reads: the problem text plus `suffix`, either as
plain text or as one user message rendered with the tokenizer's chat template (with `chat_template_kwargs`,
e.g. `enable_thinking: false` for Qwen3). Training hands TRL `training_prompt(...)` (TRL renders chat
prompts with the same template and kwargs); evaluation renders `render(tokenizer, ...)` itself, exactly as
TRL does (`apply_chat_template(..., add_generation_prompt=True)`). A training run saves its format next to
the model (`grail_prompt.json`), so `grail eval` on a trained model reads problems the way it was trained.

Named suffixes (`resolve_suffix`, the one place where names become text; training's prompt_suffix and
`grail eval --prompt-suffix` both go through it):
  paper    PAPER_PROMPT_SUFFIX, the instruction as the paper prints it, with a literal `\boxed{}`.
  release  RELEASE_PROMPT_SUFFIX, the text the released models were trained and evaluated with. The release
           writes the instruction in a non-raw Python string (src/train/grpo.py `add_boxed_prompt`,
           src/eval/run_eval.py `process_item`: the same text, leading space included), so its `\b` is a
           backspace, chr(8): the models read "\x08oxed{}", not "\boxed{}".
Any other text is used as it is.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "FORMAT_FILE", "NAMED_SUFFIXES", "PAPER_PROMPT_SUFFIX", "PromptFormat", "RELEASE_PROMPT_SUFFIX",
    "resolve_suffix"
]

PAPER_PROMPT_SUFFIX = " Please reason step by step, and put your final answer within \\boxed{}."
RELEASE_PROMPT_SUFFIX = " Please reason step by step, and put your final answer within \x08oxed{}."
NAMED_SUFFIXES = {"paper": PAPER_PROMPT_SUFFIX, "release": RELEASE_PROMPT_SUFFIX}
FORMAT_FILE = "grail_prompt.json"


def resolve_suffix(text: str) -> str:
    """A suffix name from NAMED_SUFFIXES ("paper", "release") as its text; any other text unchanged."""
    return NAMED_SUFFIXES.get(text, text)


@dataclass(frozen=True)
class PromptFormat:
    suffix: str = ""  # appended to the problem text (to the last user message of a chat prompt)
    chat: bool = False  # render as one user message through the tokenizer's chat template
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_config(cls, cfg) -> PromptFormat:
        """The format a training config uses (GRAILConfig: prompt_suffix, a name resolved by `resolve_suffix`,
        conversational, chat_template_kwargs)."""
        return cls(resolve_suffix(cfg.prompt_suffix), bool(cfg.conversational), dict(cfg.chat_template_kwargs or {}))

    @classmethod
    def default_for(cls, tokenizer) -> PromptFormat:
        """For a model with no saved format: the paper's suffix; the chat template (thinking off) if it has one."""
        has_template = getattr(tokenizer, "chat_template", None) is not None
        return cls(PAPER_PROMPT_SUFFIX, has_template, {"enable_thinking": False} if has_template else {})

    @classmethod
    def load(cls, model_dir: str | Path) -> PromptFormat | None:
        """The format saved by a training run in `model_dir`, or None (a Hub id, or a model grail did not train)."""
        path = Path(model_dir) / FORMAT_FILE
        if not path.is_file():
            return None
        try:
            return cls(**json.loads(path.read_text()))
        except (ValueError, TypeError) as err:
            raise ValueError(f"{path} is not a valid prompt format ({err}); delete it to use the default "
                             f"format, or fix it: keys suffix, chat, chat_template_kwargs.") from err

    def save(self, model_dir: str | Path) -> None:
        (Path(model_dir) / FORMAT_FILE).write_text(json.dumps(asdict(self), indent=2) + "\n")

    def training_prompt(self, prompt: str | list[dict]) -> str | list[dict]:
        """What TRL receives for a dataset prompt (a string, or chat messages whose last user turn gets the
        suffix); TRL applies the chat template to message lists."""
        if isinstance(prompt, list):
            messages = [dict(m) for m in prompt]
            last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=None)
            if last_user is None:
                raise ValueError("a chat prompt has no user message to append prompt_suffix to.")
            messages[last_user]["content"] = messages[last_user]["content"] + self.suffix
            return messages
        text = prompt + self.suffix
        return [{"role": "user", "content": text}] if self.chat else text

    def render(self, tokenizer, prompt: str | list[dict]) -> str:
        """The text the model reads: `training_prompt` rendered as TRL renders it."""
        prompt = self.training_prompt(prompt)
        if isinstance(prompt, str):
            return prompt
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("the prompt format asks for the chat template, but the tokenizer has none; use a plain "
                             "format (--prompt-format plain).")
        return tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False,
                                             **self.chat_template_kwargs)
