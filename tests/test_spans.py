r"""Tests for grail.methods.spans: the one-position shift, token character offsets and `\boxed{}` answer spans."""

import random

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

import grail.methods.spans
from grail.methods.spans import (
    BOX_CHOICES,
    AnswerBox,
    align_to_completion,
    answer_spans,
    predicting_to_token,
    token_char_offsets,
)
from grail.tasks.boxed import char_span_to_token_positions, first_boxed, last_boxed

EOS = "<|endoftext|>"


def ids_of(tokenizer, tokens: list[str]) -> list[int]:
    """Token strings → ids, checking that each string is one vocabulary entry."""
    ids = tokenizer.convert_tokens_to_ids(tokens)
    assert None not in ids and tokenizer.convert_ids_to_tokens(ids) == tokens
    return ids


def batch(rows: list[list[int]], pad_id: int, width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded (B, T) ids and mask, TRL's completion layout."""
    width = width or max(len(r) for r in rows)
    ids_BT = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask_BT = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, row in enumerate(rows):
        ids_BT[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask_BT[i, : len(row)] = True
    return ids_BT, mask_BT


def positions(mask_T: torch.Tensor) -> list[int]:
    return mask_T.nonzero().flatten().tolist()


# --- align_to_completion ---------------------------------------------------------------------------------------


def test_align_to_completion_shifts_by_one():
    # Values are their own input position (+100 per row), L = 7, T = 4, so P = 3:
    # "predicting" takes positions P-1+t = 2, 3, 4, 5 and "token" takes P+t = 3, 4, 5, 6.
    values_BL = torch.arange(7).repeat(2, 1) + torch.tensor([[0], [100]])
    assert align_to_completion(values_BL, 4, at="predicting").tolist() == [[2, 3, 4, 5], [102, 103, 104, 105]]
    assert align_to_completion(values_BL, 4, at="token").tolist() == [[3, 4, 5, 6], [103, 104, 105, 106]]
    values_BLD = values_BL[:, :, None].expand(2, 7, 3)  # trailing dimensions ride along
    assert align_to_completion(values_BLD, 4, at="predicting")[1, :, 2].tolist() == [102, 103, 104, 105]


def test_predicting_to_token_reads_the_values_at_each_tokens_own_position():
    values_BL = torch.arange(2 * 7, dtype=torch.float32).reshape(2, 7)  # L = 7: prompt S = 3, completion T = 4
    own_BT = predicting_to_token(align_to_completion(values_BL, 4, at="predicting"))  # from positions 2..5
    assert own_BT[:, :-1].tolist() == align_to_completion(values_BL, 4, at="token")[:, :-1].tolist()  # 3..5
    assert own_BT.tolist() == [[3, 4, 5, 0], [10, 11, 12, 0]]  # the last token's own position (6) is not held


def test_align_to_completion_rejects_bad_arguments():
    values_BL = torch.zeros(2, 5)
    for T in (5, 6, 0):  # T >= L leaves no predicting position for the first token; T = 0 is empty
        with pytest.raises(ValueError, match="0 < T < L"):
            align_to_completion(values_BL, T, at="token")
    with pytest.raises(ValueError, match="at must be"):
        align_to_completion(values_BL, 2, at="next")


# --- token_char_offsets --------------------------------------------------------------------------------------------


def test_offsets_of_ascii_are_one_character_each(tokenizer):
    ids = ids_of(tokenizer, ["a", "b", " ", "c"])
    assert token_char_offsets(tokenizer, ids) == ("ab c", [(0, 1), (1, 2), (2, 3), (3, 4)])


def test_offsets_of_the_multi_character_marker_token(tokenizer):
    ids = ids_of(tokenizer, ["x", "\\boxed{", "1", "}"])
    # "x" is 0, "\boxed{" is 7 characters (1..8), "1" at 8, "}" at 9.
    assert token_char_offsets(tokenizer, ids) == ("x\\boxed{1}", [(0, 1), (1, 8), (8, 9), (9, 10)])


def test_offsets_of_byte_fallback_characters_are_shared(tokenizer):
    # UTF-8: é = C3 A9 (2 bytes), € = E2 82 AC (3), 😀 = F0 9F 98 80 (4); each byte is one fallback token, and
    # every byte token of a character covers that one character (Python str indices: 😀 is one code point).
    ids = tokenizer("é€😀", add_special_tokens=False)["input_ids"]
    assert tokenizer.convert_ids_to_tokens(ids) == ["<0xC3>", "<0xA9>", "<0xE2>", "<0x82>", "<0xAC>",
                                                     "<0xF0>", "<0x9F>", "<0x98>", "<0x80>"]
    text, offsets = token_char_offsets(tokenizer, ids)
    assert text == "é€😀"
    assert offsets == [(0, 1)] * 2 + [(1, 2)] * 3 + [(2, 3)] * 4


def test_offsets_of_special_tokens_cover_their_text(tokenizer):
    ids = ids_of(tokenizer, ["a", EOS, "b"])
    # "<|endoftext|>" is 13 characters: 1..14.
    assert token_char_offsets(tokenizer, ids) == ("a<|endoftext|>b", [(0, 1), (1, 14), (14, 15)])


def test_trailing_incomplete_character_gets_empty_ranges_at_the_end(tokenizer):
    # "x" then the first three of the four bytes of 😀: the character never completes.
    ids = ids_of(tokenizer, ["x", "<0xF0>", "<0x9F>", "<0x98>"])
    assert token_char_offsets(tokenizer, ids) == ("x", [(0, 1), (1, 1), (1, 1), (1, 1)])
    assert token_char_offsets(tokenizer, ids[1:]) == ("", [(0, 0)] * 3)
    assert token_char_offsets(tokenizer, []) == ("", [])


def test_offsets_reconstruct_the_decode_and_cover_it_contiguously(tokenizer):
    for text in [" 7+5=12, so 12*3=36. \\boxed{36}" + EOS, "naïve ∑ x² — 数学\n\\boxed{\\frac{1}{2}}", "Q: 3\nA:"]:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        decoded, offsets = token_char_offsets(tokenizer, ids)
        assert decoded == tokenizer.decode(ids, skip_special_tokens=False) == text
        assert offsets[0][0] == 0 and offsets[-1][1] == len(text)
        for (a0, b0), (a1, b1) in zip(offsets, offsets[1:], strict=False):
            assert (a1, b1) == (a0, b0) or a1 == b0  # shared (split character) or contiguous
    # A `tokenizers.Tokenizer` works as well as the transformers wrapper.
    ids = ids_of(tokenizer, ["a", "<0xC3>", "<0xA9>"])
    assert token_char_offsets(tokenizer.backend_tokenizer, ids) == ("aé", [(0, 1), (1, 2), (1, 2)])


def test_decode_mismatch_raises_and_the_row_has_no_box(tokenizer, monkeypatch):
    # Simulate a decoder that DecodeStream does not reproduce: the reference decode disagrees.
    monkeypatch.setattr(grail.methods.spans, "_reference_decode", lambda backend, ids: "something else")
    ids = ids_of(tokenizer, ["\\boxed{", "1", "}"])
    with pytest.raises(ValueError, match="differs from tokenizer.decode"):
        token_char_offsets(tokenizer, ids)
    ids_BT, mask_BT = batch([ids], tokenizer.pad_token_id)
    spans = answer_spans(tokenizer, ids_BT, mask_BT)
    assert spans.has_box_B.tolist() == [False] and spans.decoded_B.tolist() == [False]
    assert torch.equal(spans.reasoning_BT, mask_BT) and not spans.answer_BT.any() and not spans.after_BT.any()


def test_slow_tokenizer_is_a_type_error():
    with pytest.raises(TypeError, match="fast tokenizer"):
        token_char_offsets(object(), [1])
    with pytest.raises(TypeError, match="fast tokenizer"):
        answer_spans(object(), torch.zeros(1, 2, dtype=torch.long), torch.ones(1, 2, dtype=torch.bool))


# --- answer_spans --------------------------------------------------------------------------------------------------


def test_answer_after_and_reasoning_of_a_completion_with_padding(tokenizer):
    tokens = ["1", "2", "*", "3", "=", "3", "6", ".", " ", "\\boxed{", "3", "2", "}", EOS]
    ids_BT, mask_BT = batch([ids_of(tokenizer, tokens)], tokenizer.pad_token_id, width=len(tokens) + 3)
    spans = answer_spans(tokenizer, ids_BT, mask_BT)
    # Positions: "12*3=36. " is 0..8, "\boxed{" 9, "3" 10, "2" 11, "}" 12, eos 13, padding 14..16.
    assert positions(spans.answer_BT[0]) == [10, 11]
    assert positions(spans.after_BT[0]) == [9, 12, 13]
    assert positions(spans.reasoning_BT[0]) == list(range(9))
    assert positions(spans.box_BT[0]) == [9, 10, 11, 12]  # marker, content, closing brace: the release's NLL span
    assert torch.equal(spans.probe_span("box"), spans.box_BT) and torch.equal(spans.probe_span("content"),
                                                                                spans.answer_BT)
    with pytest.raises(ValueError, match="answer_nll_span"):
        spans.probe_span("marker")
    assert spans.has_box_B.tolist() == [True] and spans.decoded_B.tolist() == [True]
    for mask in spans[:3]:
        assert mask.shape == (1, 17) and mask.dtype == torch.bool


def test_nested_braces_stay_in_the_answer(tokenizer):
    text = "so \\boxed{\\frac{1}{2}} ok" + EOS
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    # "s","o"," " (0..2), "\boxed{" (3), "\frac{1}{2}" one token per character (4..14), "}" (15), " ok" (16..18),
    # eos (19): only "\boxed{" is a merge in the tiny vocabulary ("\f" is not).
    assert len(ids) == 20 and tokenizer.convert_ids_to_tokens(ids)[3] == "\\boxed{"
    spans = answer_spans(tokenizer, *batch([ids], tokenizer.pad_token_id))
    assert positions(spans.answer_BT[0]) == list(range(4, 15))
    assert positions(spans.after_BT[0]) == [3, 15, 16, 17, 18, 19]
    assert positions(spans.reasoning_BT[0]) == [0, 1, 2]
    assert positions(spans.box_BT[0]) == list(range(3, 16))


def test_first_and_last_box(tokenizer):
    tokens = ["\\boxed{", "1", "}", " ", "o", "r", " ", "\\boxed{", "2", "3", "}"]
    ids_BT, mask_BT = batch([ids_of(tokenizer, tokens)], tokenizer.pad_token_id)
    first = answer_spans(tokenizer, ids_BT, mask_BT, box="first")
    # First box: its content "1" is token 1; its marker (0) and everything from its "}" on (2..10) are after.
    assert positions(first.answer_BT[0]) == [1]
    assert positions(first.after_BT[0]) == [0] + list(range(2, 11))
    assert positions(first.reasoning_BT[0]) == []
    last = answer_spans(tokenizer, ids_BT, mask_BT, box="last")
    # Last box: "23" is tokens 8, 9; marker 7, brace 10; the first box is part of the text before it.
    assert positions(last.answer_BT[0]) == [8, 9]
    assert positions(last.after_BT[0]) == [7, 10]
    assert positions(last.reasoning_BT[0]) == list(range(7))


def test_rows_without_a_usable_box(tokenizer):
    rows = [
        ["x", "=", "\\boxed{", "1", "2"],  # unclosed (truncated)
        ["\\boxed{", "}", " ", "x"],  # empty box
        ["\\boxed{", "}", " ", "\\boxed{", "5", "}"],  # empty first box: no box for "first", a box for "last"
        ["n", "o", " ", "b", "o", "x"],
    ]
    ids_BT, mask_BT = batch([ids_of(tokenizer, r) for r in rows], tokenizer.pad_token_id)
    spans = answer_spans(tokenizer, ids_BT, mask_BT, box="first")
    assert spans.has_box_B.tolist() == [False] * 4
    assert torch.equal(spans.reasoning_BT, mask_BT)
    assert not spans.answer_BT.any() and not spans.after_BT.any()
    last = answer_spans(tokenizer, ids_BT, mask_BT, box="last")
    assert last.has_box_B.tolist() == [False, False, True, False]
    assert positions(last.answer_BT[2]) == [4]  # "5"
    assert positions(last.after_BT[2]) == [3, 5]
    assert positions(last.reasoning_BT[2]) == [0, 1, 2]  # the empty box is text before the last box


def test_padding_only_row_and_empty_batch(tokenizer):
    ids_BT, mask_BT = batch([ids_of(tokenizer, ["\\boxed{", "7", "}"]), []], tokenizer.pad_token_id)
    ids_BT[1] = ids_BT[0]  # padding holding a box must not be read
    spans = answer_spans(tokenizer, ids_BT, mask_BT)
    assert spans.has_box_B.tolist() == [True, False] and spans.decoded_B.tolist() == [True, True]
    for mask in spans[:3]:
        assert not mask[1].any()
    empty = answer_spans(tokenizer, torch.zeros(0, 5, dtype=torch.long), torch.zeros(0, 5, dtype=torch.bool))
    assert empty.answer_BT.shape == (0, 5) and empty.has_box_B.shape == (0,)


def test_trailing_incomplete_tokens_are_after_with_a_box_else_reasoning(tokenizer):
    box = ids_of(tokenizer, ["a", "\\boxed{", "1", "}", "<0xF0>", "<0x9F>"])  # ends inside a 4-byte character
    nobox = ids_of(tokenizer, ["a", "<0xF0>", "<0x9F>"])
    spans = answer_spans(tokenizer, *batch([box, nobox], tokenizer.pad_token_id))
    assert positions(spans.answer_BT[0]) == [2]
    assert positions(spans.after_BT[0]) == [1, 3, 4, 5]
    assert positions(spans.reasoning_BT[0]) == [0]
    assert positions(spans.reasoning_BT[1]) == [0, 1, 2] and spans.has_box_B.tolist() == [True, False]


def test_split_character_tokens_share_their_class(tokenizer):
    # "½" = C2 BD: both byte tokens are answer tokens; "é" = C3 A9 before the box: both reasoning.
    ids = tokenizer("é\\boxed{½}", add_special_tokens=False)["input_ids"]
    assert len(ids) == 6  # 2 bytes, "\boxed{", 2 bytes, "}"
    spans = answer_spans(tokenizer, *batch([ids], tokenizer.pad_token_id))
    assert positions(spans.reasoning_BT[0]) == [0, 1]
    assert positions(spans.answer_BT[0]) == [3, 4]
    assert positions(spans.after_BT[0]) == [2, 5]


def loop_reference(tokenizer, ids_T: list[int], mask_T: list[bool], box: str) -> tuple[list[int], list[int], bool]:
    """Answer and after positions of one row, token by token with `char_span_to_token_positions`."""
    cols = [t for t, real in enumerate(mask_T) if real]
    text, offsets = token_char_offsets(tokenizer, [ids_T[t] for t in cols])
    span = (first_boxed if box == "first" else last_boxed)(text)
    if span is None or span.content_start == span.content_end:
        return [], [], False
    answer = set(char_span_to_token_positions(offsets, span.content_start, span.content_end))
    after = set(char_span_to_token_positions(offsets, span.start, span.content_start))
    after |= set(char_span_to_token_positions(offsets, span.content_end, len(text)))
    after |= {k for k, (a, b) in enumerate(offsets) if a == b}  # trailing incomplete tokens
    return sorted(cols[k] for k in answer), sorted(cols[k] for k in after - answer), True


@pytest.mark.parametrize("box", BOX_CHOICES)
def test_vectorised_matches_loop_reference_with_scattered_padding(tokenizer, box):
    rng = random.Random(0)
    pieces = ["x=1", " so ", "12*3", "\\boxed{", "}", "{", "\\{", "\\\\", "é", "😀", "½", "7", EOS]
    rows, masks = [], []
    for _ in range(40):
        text = "".join(rng.choice(pieces) for _ in range(rng.randrange(0, 12)))
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if ids and rng.random() < 0.3:
            ids = ids[: rng.randrange(len(ids))]  # truncate, possibly inside a character or a box
        row, mask = [], []
        for token_id in ids:  # padding scattered between real tokens, holding ids that must not be read
            while rng.random() < 0.2:
                row.append(rng.choice(ids))
                mask.append(False)
            row.append(token_id)
            mask.append(True)
        rows.append(row)
        masks.append(mask)
    width = max(len(r) for r in rows) + 2
    ids_BT = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    mask_BT = torch.tensor([m + [False] * (width - len(m)) for m in masks])
    spans = answer_spans(tokenizer, ids_BT, mask_BT.long(), box=box)  # a 0/1 mask works too
    assert spans.has_box_B.any() and not spans.has_box_B.all()  # the random batch exercises both cases
    for i in range(len(rows)):
        answer, after, has_box = loop_reference(tokenizer, ids_BT[i].tolist(), mask_BT[i].tolist(), box)
        assert positions(spans.answer_BT[i]) == answer
        assert positions(spans.after_BT[i]) == after
        assert spans.has_box_B[i].item() == has_box
    # Invariants: disjoint, union = real tokens, padding in no mask; answer ⊆ box ⊆ answer ∪ after, the box is one
    # run of real tokens that starts where `after` starts, and only rows with a box have one.
    total_BT = spans.answer_BT.long() + spans.after_BT.long() + spans.reasoning_BT.long()
    assert torch.equal(total_BT, mask_BT.long())
    assert not (spans.answer_BT & ~spans.box_BT).any()
    assert not (spans.box_BT & ~(spans.answer_BT | spans.after_BT)).any()
    assert torch.equal(spans.box_BT.any(1), spans.has_box_B)
    for i in range(len(rows)):
        real = [j for j in range(width) if mask_BT[i, j]]
        in_box = [k for k, j in enumerate(real) if spans.box_BT[i, j]]
        if in_box:
            assert in_box == list(range(in_box[0], in_box[-1] + 1))
            assert real[in_box[0]] == positions(spans.after_BT[i])[0]


def test_bad_arguments(tokenizer):
    ids_BT, mask_BT = batch([ids_of(tokenizer, ["a"])], tokenizer.pad_token_id)
    with pytest.raises(ValueError, match="box must be one of"):
        answer_spans(tokenizer, ids_BT, mask_BT, box="middle")
    with pytest.raises(ValueError, match="same shape"):
        answer_spans(tokenizer, ids_BT, mask_BT[:, :0])
    assert BOX_CHOICES == AnswerBox.__args__ == ("first", "last")


# --- other tokenizer families --------------------------------------------------------------------------------------


def test_a_token_covering_a_brace_and_content_is_an_answer_token():
    # A word-level vocabulary where "{3" and "2}" are single tokens: each covers a box brace and a content
    # character. Text "a\boxed{32}.": "a" 0, "\boxed" 1..6, "{3" 7..8, "2}" 9..10, "." 11; content is [8, 10).
    words = ["a", "\\boxed", "{3", "2}", ".", "[UNK]"]
    core = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]", pad_token="[UNK]")
    ids = [0, 1, 2, 3, 4]
    assert token_char_offsets(tokenizer, ids) == ("a\\boxed{32}.", [(0, 1), (1, 7), (7, 9), (9, 11), (11, 12)])
    spans = answer_spans(tokenizer, *batch([ids], pad_id=5))
    assert positions(spans.answer_BT[0]) == [2, 3]
    assert positions(spans.after_BT[0]) == [1, 4]
    assert positions(spans.reasoning_BT[0]) == [0]
    assert positions(spans.box_BT[0]) == [1, 2, 3]  # "." after the closing brace is not in the box


def test_byte_level_bpe_like_qwen_and_llama3():
    # A byte-level BPE (the decoder of Qwen and Llama-3 models) trained here on ASCII math, so "π" (CF 80) and
    # "é" (C3 A9) stay two byte tokens each. The ByteLevel pre-tokenizer never merges across its pieces
    # "... Résultat", " \", "boxed", "{", "2", "π", "}", so the answer tokens are exactly those of "2π", and the
    # token holding " \" covers the last reasoning space and the marker's backslash: it is an `after` token.
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = [" 7+5=12, so 12*3=36. \\boxed{36}", "Let x = \\frac{1}{2}, hence \\boxed{\\frac{1}{2}}."] * 20
    core.train_from_iterator(corpus, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, eos_token=EOS, pad_token=EOS)

    text = "Soit x = 12*3. Résultat \\boxed{2π}" + EOS
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    decoded, offsets = token_char_offsets(tokenizer, ids)
    assert decoded == tokenizer.decode(ids, skip_special_tokens=False) == text
    pi = text.index("π")
    assert offsets.count((pi, pi + 1)) == 2  # both byte tokens of π cover π
    e = text.index("é")
    assert offsets.count((e, e + 1)) == 2

    spans = answer_spans(tokenizer, *batch([ids], tokenizer.pad_token_id, width=len(ids) + 2))
    ids_T = torch.tensor(ids + [tokenizer.pad_token_id] * 2)

    def decode(mask_T):
        return tokenizer.decode(ids_T[mask_T].tolist(), skip_special_tokens=False)

    assert spans.has_box_B.tolist() == [True]
    assert decode(spans.answer_BT[0]) == "2π"
    assert decode(spans.reasoning_BT[0]) == "Soit x = 12*3. Résultat"
    assert decode(spans.after_BT[0]) == " \\boxed{}" + EOS
    assert positions(spans.answer_BT[0]) == list(range(positions(spans.answer_BT[0])[0], len(ids) - 2))
