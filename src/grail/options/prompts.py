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

Named response prefixes (`resolve_response_prefix`; `grail eval --response-prefix`): the text a response starts with,
prefilled right after the generation prompt (`render(..., response_prefix=...)`), so the model continues it:
  answer-only  "\\boxed{": the model must box an answer at once, without reasoning (`grail validity`'s answer-only
               accuracy: how much of the accuracy the reasoning does not explain).

Chat messages in a plain format (a base model without a chat template, e.g. Gemma 3 270M on the words task's few-shot
prompts) are rendered by `render_plain` ("Question: ...\n\nAnswer: ..." turns); `render` prefixes plain text with the
BOS text the tokenizer adds (`plain_prefix`), since TRL tokenises plain prompts with special tokens.

`auto` (the default of training's `conversational` and `prompt_suffix`, and what `grail eval` and `grail explain` use
for a model without a saved format) is decided in one place, `resolve_prompt_format`, from the model's tokenizer and
the task: the chat template iff the tokenizer has one, with the paper's suffix; plain text without a suffix on the
embedded synthetic task, whose prompts ("Q: 7+5*3-4\\nA:") the tiny model is warm-started on.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "ANSWER_ONLY_PREFIX", "AUTO", "empty_completions_warning", "FORMAT_FILE", "has_chat_template",
    "NAMED_RESPONSE_PREFIXES", "NAMED_SUFFIXES", "PAPER_PROMPT_SUFFIX", "plain_prefix", "PLAIN_ASSISTANT", "PLAIN_USER",
    "PromptFormat", "RELEASE_PROMPT_SUFFIX", "render_plain", "resolve_prompt_format", "resolve_response_prefix",
    "resolve_suffix", "synthetic_task"
]

PAPER_PROMPT_SUFFIX = " Please reason step by step, and put your final answer within \\boxed{}."
RELEASE_PROMPT_SUFFIX = " Please reason step by step, and put your final answer within \x08oxed{}."
NAMED_SUFFIXES = {"paper": PAPER_PROMPT_SUFFIX, "release": RELEASE_PROMPT_SUFFIX}
ANSWER_ONLY_PREFIX = "\\boxed{"
NAMED_RESPONSE_PREFIXES = {"answer-only": ANSWER_ONLY_PREFIX}
FORMAT_FILE = "grail_prompt.json"
AUTO = "auto"  # conversational / prompt_suffix: decided by `resolve_prompt_format`
THINKING_OFF = {"enable_thinking": False}  # chat_template_kwargs of a chat format that sets none (Qwen3's switch)


PLAIN_USER, PLAIN_ASSISTANT = "Question:", "Answer:"  # how render_plain labels the turns


def render_plain(messages: list[dict], answer_end: str = "") -> str:
    """Chat messages as plain text, for a model without a chat template (a base model such as Gemma 3 270M).

    Each turn is a paragraph (turns are separated by a blank line): a system turn as its text, a user turn as
    "Question: {content}", an assistant turn as "Answer: {content}{answer_end}"; after a last user turn comes
    "Answer:", so the completion continues the pattern (" Mia has 7 + 5 = 12 apples. ..."). `answer_end`: text
    closing each worked answer, e.g. the tokenizer's EOS token, so that a base model learns from the examples to
    end its own answer there instead of writing the next question. ValueError for a role other than
    system/user/assistant."""
    labels = {"system": "", "user": f"{PLAIN_USER} ", "assistant": f"{PLAIN_ASSISTANT} "}
    paragraphs = []
    for message in messages:
        role = message.get("role")
        if role not in labels:
            raise ValueError(f"a chat message has role {role!r}; plain text renders system, user and assistant turns.")
        end = answer_end if role == "assistant" else ""
        paragraphs.append(f"{labels[role]}{message['content']}{end}")
    if messages and messages[-1]["role"] == "user":
        paragraphs.append(PLAIN_ASSISTANT)
    return "\n\n".join(paragraphs)


def plain_prefix(tokenizer) -> str:
    """The special-token text a tokenizer puts before plain text it encodes with its special tokens (Gemma's
    "<bos>"; "" for most tokenizers), so that a rendered plain prompt tokenised without special tokens reads as TRL
    feeds it (TRL tokenises plain-text prompts with them)."""
    bos = getattr(tokenizer, "bos_token", None)
    if tokenizer is None or bos is None:
        return ""
    return bos if tokenizer("x")["input_ids"][:1] == [tokenizer.bos_token_id] else ""


def resolve_suffix(text: str) -> str:
    """A suffix name from NAMED_SUFFIXES ("paper", "release") as its text; any other text unchanged."""
    return NAMED_SUFFIXES.get(text, text)


def resolve_response_prefix(text: str | None) -> str:
    """A response-prefix name from NAMED_RESPONSE_PREFIXES ("answer-only") as its text; None as ""; any other text
    unchanged."""
    return "" if text is None else NAMED_RESPONSE_PREFIXES.get(text, text)


def has_chat_template(tokenizer) -> bool:
    return getattr(tokenizer, "chat_template", None) is not None


def synthetic_task(cfg) -> bool:
    """Whether a config trains on the embedded synthetic task: `resolve_prompt_format`'s `synthetic`. (Its symbolic
    prompts, "Q: 7+5*3-4\\nA:", are plain text, which the tiny model is warm-started on; its `words` prompts are chat
    messages carrying their own instruction: chat, no suffix.)"""
    from grail.options.fields import SYNTHETIC_DATASET

    return cfg.dataset == SYNTHETIC_DATASET


def resolve_prompt_format(tokenizer, synthetic: bool, conversational: bool | str = AUTO, suffix: str = AUTO,
                          chat_template_kwargs: dict | None = None, messages: bool = False) -> PromptFormat:
    """The prompt format of a run, the one place where `auto` is decided (`grail train`, `grail eval` and `grail
    explain` all come here). Explicit values win; `auto`:
      conversational  the chat template iff the tokenizer has one, except on the synthetic task (`synthetic`), whose
                      prompts are plain text (the tiny model is warm-started on them, without a template);
      suffix          "" on the synthetic task, else PAPER_PROMPT_SUFFIX (the reward reads the last \\boxed{}).
    `messages`: the prompts already are chat messages (the words task's few-shot turns): `auto` is the chat
    template iff the tokenizer has one (or no tokenizer is given), else plain text, the messages rendered by
    `render_plain`, as for conversational=false. chat_template_kwargs None: THINKING_OFF for a chat format (the
    paper's setting; templates without the switch ignore it), {} for plain text. `tokenizer` may be None when
    nothing needs it (conversational given, or the synthetic task)."""
    if conversational != AUTO:
        chat = bool(conversational)
    elif messages:  # chat messages: the template when there is one, else `render_plain` (a base model)
        chat = tokenizer is None or has_chat_template(tokenizer)
    elif synthetic:
        chat = False
    elif tokenizer is None:
        raise ValueError("conversational=auto is decided by the model's tokenizer (chat template or not), and none "
                         "was given; set conversational to true or false.")
    else:
        chat = has_chat_template(tokenizer)
    if suffix == AUTO:
        suffix = "" if synthetic else PAPER_PROMPT_SUFFIX
    if chat_template_kwargs is None:
        chat_template_kwargs = dict(THINKING_OFF) if chat else {}
    return PromptFormat(resolve_suffix(suffix), chat, dict(chat_template_kwargs))


def empty_completions_warning(count: str, fmt: PromptFormat | None = None) -> str:
    """The one warning when most completions are empty (nothing but the end-of-sequence token), with the likely
    cause and the fix; `count` says how many, in words ("7 of 8 completions are empty"); `fmt`: the prompt format
    the completions answered, if known."""
    used = "" if fmt is None else (f" (here {'the chat template' if fmt.chat else 'plain text'}, suffix "
                                   f"{fmt.suffix!r})")
    return (f"warning: {count}: the model ends at once with its end-of-sequence token. The likely cause is the "
            f"prompt format{used}: a chat model given plain text, or no instruction to answer. Fix: --conversational "
            f"true (or auto: the chat template when the tokenizer has one) and --prompt_suffix paper.")


@dataclass(frozen=True)
class PromptFormat:
    suffix: str = ""  # appended to the problem text (to the last user message of a chat prompt)
    chat: bool = False  # render as one user message through the tokenizer's chat template
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_config(cls, cfg, tokenizer=None, *, synthetic: bool | None = None, messages: bool = False
                    ) -> PromptFormat:
        """The format a training config uses (GRAILConfig: prompt_suffix, conversational, chat_template_kwargs),
        `auto` resolved by `resolve_prompt_format` for `tokenizer`. `synthetic`: whether the task is the embedded
        synthetic one in plain text (default: `synthetic_task(cfg)`); `messages`: the prompts are chat messages."""
        synthetic = synthetic_task(cfg) if synthetic is None else synthetic
        return resolve_prompt_format(tokenizer, synthetic, cfg.conversational, cfg.prompt_suffix,
                                     cfg.chat_template_kwargs, messages=messages)

    @classmethod
    def default_for(cls, tokenizer) -> PromptFormat:
        """For a model with no saved format, on real problems: `resolve_prompt_format` with every value `auto`."""
        return resolve_prompt_format(tokenizer, synthetic=False)

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

    def describe(self) -> str:
        """The format in words, a named suffix by its name: "chat template {'enable_thinking': False}, suffix paper"."""
        names = {text: name for name, text in NAMED_SUFFIXES.items()}
        suffix = names.get(self.suffix, repr(self.suffix)) if self.suffix else "none"
        return (f"chat template {self.chat_template_kwargs}" if self.chat else "plain text") + f", suffix {suffix}"

    def save(self, model_dir: str | Path) -> None:
        (Path(model_dir) / FORMAT_FILE).write_text(json.dumps(asdict(self), indent=2) + "\n")

    def training_prompt(self, prompt: str | list[dict]) -> str | list[dict]:
        """What TRL receives for a dataset prompt (a string, or chat messages whose last user turn gets the
        suffix); TRL applies the chat template to message lists. In a plain format, chat messages become text
        (`render_plain`)."""
        if isinstance(prompt, list):
            messages = [dict(m) for m in prompt]
            last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=None)
            if last_user is None:
                raise ValueError("a chat prompt has no user message to append prompt_suffix to.")
            messages[last_user]["content"] = messages[last_user]["content"] + self.suffix
            return messages if self.chat else render_plain(messages)
        text = prompt + self.suffix
        return [{"role": "user", "content": text}] if self.chat else text

    def render(self, tokenizer, prompt: str | list[dict], response_prefix: str = "") -> str:
        """The text the model reads, to be tokenised without special tokens: `training_prompt` rendered as TRL
        renders it (plain text after `plain_prefix`, the BOS text a tokenizer such as Gemma's adds).
        `response_prefix`: text the response starts with, put as it is right after the generation prompt (the chat
        template's assistant turn start, or the plain format's "Answer:" and the space its worked answers have after
        it, as in render_plain), so that the model continues it; the caller grades prefix + completion."""
        prompt = self.training_prompt(prompt)
        if isinstance(prompt, str):  # TRL tokenises plain text with the special tokens: Gemma's BOS
            return plain_prefix(tokenizer) + prompt + (" " + response_prefix if response_prefix else "")
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("the prompt format asks for the chat template, but the tokenizer has none; use a plain "
                             "format (--prompt-format plain).")
        return tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False,
                                             **self.chat_template_kwargs) + response_prefix
