"""The embedded default: a tiny Qwen3-architecture causal LM and a tokenizer, both built in code.

Nothing is downloaded. `save_tiny(path)` writes a directory that `AutoModelForCausalLM.from_pretrained`
and `AutoTokenizer.from_pretrained` load by path, exactly like a Hub checkpoint, so every code path that
trains or evaluates a real model is exercised by the tiny one.

Tokenizer: a BPE model whose vocabulary is written here rather than learnt:
  1. three special tokens (`<|endoftext|>` = eos = pad, `<|im_start|>`, `<|im_end|>`, as in Qwen);
  2. 256 byte-fallback tokens `<0x00>`..`<0xFF>`, so any Unicode text encodes and decodes losslessly;
  3. every printable ASCII character as its own token (digits stay single tokens, as in Qwen's tokenizer);
  4. a few multi-character tokens built from merges, `\\boxed{` among them, so that the answer-span
     code is tested against a marker that spans several characters in one token.
No pre-tokenizer and a fusing decoder: offsets are exact character offsets into the input string.
"""

from __future__ import annotations

import string
from pathlib import Path

from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

__all__ = [
    "build_tiny_model", "build_tokenizer", "CHAT_TEMPLATE", "EOS_TOKEN", "MULTI_CHAR_TOKENS", "save_tiny",
    "SPECIAL_TOKENS", "tiny_model_config"
]

EOS_TOKEN = "<|endoftext|>"
SPECIAL_TOKENS = (EOS_TOKEN, "<|im_start|>", "<|im_end|>")
MULTI_CHAR_TOKENS = ("\\boxed{", "Q: ", "\nA:")
# A ChatML template like Qwen's, so conversational datasets also run on the tiny model.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _vocab_and_merges() -> tuple[dict[str, int], list[tuple[str, str]]]:
    vocab: dict[str, int] = {}
    for token in SPECIAL_TOKENS:
        vocab[token] = len(vocab)
    for byte in range(256):
        vocab[f"<0x{byte:02X}>"] = len(vocab)
    for char in string.printable:
        if char not in "\x0b\x0c\r":
            vocab.setdefault(char, len(vocab))
    merges: list[tuple[str, str]] = []
    for word in MULTI_CHAR_TOKENS:  # left-to-right merge chain: a, ab, abc, ...
        prefix = word[0]
        for char in word[1:]:
            merges.append((prefix, char))
            prefix += char
            vocab.setdefault(prefix, len(vocab))
    return vocab, merges


def build_tokenizer() -> PreTrainedTokenizerFast:
    """The embedded tokenizer (deterministic; same ids on every machine)."""
    vocab, merges = _vocab_and_merges()
    core = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True, fuse_unk=False))
    core.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        additional_special_tokens=list(SPECIAL_TOKENS[1:]),
        model_max_length=2048,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def tiny_model_config(
    vocab_size: int,
    eos_token_id: int,
    hidden_size: int = 192,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 512,
    max_positions: int = 512,
) -> Qwen3Config:
    """A Qwen3 config small enough for CPU RL (the defaults give ~1.7M parameters)."""
    return Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=hidden_size // num_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos_token_id,
        pad_token_id=eos_token_id,
        dtype="float32",
    )


def build_tiny_model(tokenizer: PreTrainedTokenizerFast, seed: int = 0, **config_kwargs) -> Qwen3ForCausalLM:
    """A freshly initialised tiny Qwen3 LM sized to `tokenizer`; `config_kwargs` go to `tiny_model_config`."""
    import torch

    config = tiny_model_config(len(tokenizer), tokenizer.eos_token_id, **config_kwargs)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def save_tiny(path: str | Path, seed: int = 0, **config_kwargs) -> Path:
    """Build the tiny model and tokenizer and `save_pretrained` both into `path`; returns the path."""
    path = Path(path)
    tokenizer = build_tokenizer()
    build_tiny_model(tokenizer, seed=seed, **config_kwargs).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
