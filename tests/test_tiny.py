"""The embedded tokenizer and tiny model: round trip, offsets for \\boxed{...}, coverage, reload by path."""

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grail.models.tiny import build_tiny_model
from grail.tasks.arithmetic import TaskConfig
from grail.tasks.boxed import char_span_to_token_positions, find_boxed_spans
from grail.tasks.synthetic import generate


def test_round_trip_ascii_unicode_and_specials(tokenizer):
    for text in [" 7+5=12, so 12*3=36. \\boxed{36}", "Q: 3*4-2\nA:", "naïve ∑ x² — 数学 \t tab", ""]:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert tokenizer.decode(ids) == text
    ids = tokenizer("a<|endoftext|>", add_special_tokens=False)["input_ids"]
    assert ids[-1] == tokenizer.eos_token_id == tokenizer.pad_token_id
    assert tokenizer.decode(ids, skip_special_tokens=True) == "a"


def test_offsets_of_boxed_answer_map_to_the_right_tokens(tokenizer):
    text = " 4+5=9, 9*2=18. \\boxed{18}"
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    tokens = tokenizer.convert_ids_to_tokens(enc["input_ids"])
    (box,) = find_boxed_spans(text)
    # "\boxed{" is one multi-character token; its offsets cover exactly those 7 characters.
    marker = char_span_to_token_positions(enc["offset_mapping"], box.start, box.content_start)
    assert [tokens[i] for i in marker] == ["\\boxed{"]
    assert enc["offset_mapping"][marker[0]] == (box.start, box.start + 7)
    inside = char_span_to_token_positions(enc["offset_mapping"], box.content_start, box.content_end)
    assert "".join(tokens[i] for i in inside) == "18"
    closing = char_span_to_token_positions(enc["offset_mapping"], box.content_end, box.end)
    assert closing == [len(tokens) - 1] and tokens[-1] == "}"


def test_offsets_are_exact_for_byte_fallback_characters(tokenizer):
    text = "é\\boxed{½}"
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    for (start, end), tok in zip(enc["offset_mapping"], tokenizer.convert_ids_to_tokens(enc["input_ids"]), strict=True):
        if not tok.startswith("<0x"):
            assert tokenizer.convert_tokens_to_string([tok]) == text[start:end]
    (box,) = find_boxed_spans(text)
    inside = char_span_to_token_positions(enc["offset_mapping"], box.content_start, box.content_end)
    assert tokenizer.decode([enc["input_ids"][i] for i in inside]) == "½"


def test_task_characters_need_no_byte_fallback(tokenizer):
    """Every character of the synthetic task (filler included) has a token of its own."""
    examples = generate(TaskConfig(num_steps=4, filler_rate=1.0), 200, "train", seed=3)
    for e in examples[:200]:
        ids = tokenizer(e.prompt + e.solution, add_special_tokens=False)["input_ids"]
        tokens = tokenizer.convert_ids_to_tokens(ids)
        assert not any(t.startswith("<0x") for t in tokens), (e.solution, tokens)


def test_tiny_model_size_and_reload_by_path(tiny_dir, tokenizer):
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    reloaded_tok = AutoTokenizer.from_pretrained(tiny_dir)
    assert model.config.model_type == "qwen3"
    assert 1_000_000 <= sum(p.numel() for p in model.parameters()) <= 5_000_000
    text = "Q: 1+2\nA: 1+2=3. \\boxed{3}"
    assert reloaded_tok(text)["input_ids"] == tokenizer(text)["input_ids"]
    fresh = build_tiny_model(tokenizer, seed=0)
    ids = torch.tensor([tokenizer(text)["input_ids"]])
    torch.testing.assert_close(model(ids).logits, fresh(ids).logits)  # same seed, same weights after reload
    other = build_tiny_model(tokenizer, seed=1)
    assert not torch.allclose(other(ids).logits, fresh(ids).logits)
