r"""Where the answer is, in completion-token positions; and the one-position shift.

Two concerns, both about indexing completion tokens:

1. `align_to_completion`: per-input-position values (B, L, ...) → per-completion-token values (B, T, ...).
   The only place the one-position shift (position S − 1 + t predicts token t) is written.
2. Answer spans (docs/methods/grail.md, steps 1 and 7): which completion tokens are inside the chosen `\boxed{...}`,
   which are its marker, closing brace and everything after it, and which are the reasoning before it.
   Three steps per row:
     ids --`token_char_offsets`--> (text, one character range per token)   the tokenizer's own decoder
     text --`grail.tasks.boxed.first_boxed` / `last_boxed`--> BoxSpan              brace-depth matching
     BoxSpan × ranges --overlap--> (B, T) masks `AnswerSpans`                 vectorised over the batch
   Character ranges come from decoding the generated ids (streamed, `tokenizers.decoders.DecodeStream`),
   never from re-tokenising the text: re-encoding a sampled completion need not give back the sampled
   ids, so offsets from `return_offsets_mapping` could point at the wrong tokens.

Cost (CPU, tokenizers 0.23, `grail.models.tiny`'s tokenizer and a byte-level BPE alike, best of several runs):
~0.6 µs per token for `token_char_offsets` (of which ~0.4 µs is `DecodeStream.step`), ~0.8 µs per real token
for `answer_spans` in all, i.e. ~0.2 s for 64 rows of 4000 tokens, once per rollout batch.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from operator import itemgetter
from typing import Literal, NamedTuple, get_args

import torch
from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

from grail.options.choices import AnswerBox
from grail.tasks.boxed import BoxSpan, first_boxed, last_boxed

__all__ = ["align_to_completion", "answer_spans", "AnswerSpans", "BOX_CHOICES", "predicting_to_token",
           "token_char_offsets"]

BOX_CHOICES: tuple[str, ...] = get_args(AnswerBox)
_PICK_BOX = {"first": first_boxed, "last": last_boxed}
_START, _END = itemgetter(0), itemgetter(1)


def align_to_completion(values_BL: torch.Tensor, num_completion_tokens: int,
                        *, at: Literal["predicting", "token"]) -> torch.Tensor:
    """Per-input-position values (B, L, ...) → per-completion-token values (B, T, ...). The only place the
    one-position shift is written.

    TRL's layout: prompt left-padded to width S, completion right-padded after it, L = S + T, so completion
    token t (0-based) sits at input position S + t and is predicted by the output at position S + t − 1.

    Args:
        values_BL: (B, L, ...) values indexed by input position (saliency, hidden states, logits, ...).
        num_completion_tokens: T, the width of the completion block at the end of the sequence.
        at: "predicting" → the values at the position that PREDICTS token t (S − 1 + t; GRAIL's saliency,
            log-probs, entropies); "token" → the values at token t's own position (S + t; OAR's per-token
            perturbation or noise on the token's embedding).
    Returns:
        (B, T, ...) view of `values_BL`.
    """
    length, T = values_BL.shape[1], num_completion_tokens
    if not 0 < T < length:
        raise ValueError(f"align_to_completion: need 0 < T < L (at least one prompt position), got T={T}, "
                         f"L={length}")
    if at == "predicting":
        return values_BL[:, length - T - 1 : length - 1]
    if at == "token":
        return values_BL[:, length - T :]
    raise ValueError(f"align_to_completion: at must be 'predicting' or 'token', got {at!r}")


def predicting_to_token(values_BT: torch.Tensor) -> torch.Tensor:
    """(B, T, ...) values aligned `at="predicting"` → the same per-input-position values read at each token's own
    position, as `at="token"` would give them: input position S + t is the one that predicts token t + 1, so token
    t's own value is the predicting-aligned value of t + 1. The last column (input position L − 1, which predicts no
    completion token and so is not in `values_BT`) is 0. Used to read GRAIL's saliency where OAR reads its signal."""
    return torch.cat([values_BT[:, 1:], torch.zeros_like(values_BT[:, :1])], dim=1)


def _backend(tokenizer) -> Tokenizer:
    """The Rust `tokenizers.Tokenizer` behind a Hugging Face fast tokenizer (or `tokenizer` itself)."""
    if isinstance(tokenizer, Tokenizer):
        return tokenizer
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if not isinstance(backend, Tokenizer):
        raise TypeError(f"answer spans need a fast tokenizer (one backed by `tokenizers`); got "
                        f"{type(tokenizer).__name__}, which has no `backend_tokenizer`. Load it with "
                        f"AutoTokenizer.from_pretrained(..., use_fast=True).")
    return backend


def _reference_decode(backend: Tokenizer, ids: list[int]) -> str:
    """The full decode that the streamed chunks must reproduce: the Rust decoder, special tokens kept.

    This is `tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)` without the
    Python overhead. The clean-up is left out on purpose: it is a string edit made after the decoder, which no
    per-token range can follow (and transformers 5 skips it for BPE models anyway)."""
    return backend.decode(ids, skip_special_tokens=False)


def token_char_offsets(tokenizer, ids: Sequence[int]) -> tuple[str, list[tuple[int, int]]]:
    """The decoded text of `ids` and each token's character range [a, b) in it, from the tokenizer's own decoder.

    The ids are fed one by one to `DecodeStream(skip_special_tokens=False)`, which returns each token's new text
    chunk, or None while the token does not yet complete a character (a multi-byte UTF-8 character split over
    byte-fallback or byte-level tokens). Ranges are in Python `str` indices (code points), as in `grail.tasks.boxed`.

    - A token that emits a chunk gets the chunk's range; tokens that emitted nothing just before it share that
      range (both tokens of a split "é" cover "é"). Every character of `text` is covered by at least one token.
    - Special tokens are kept: `<|endoftext|>` covers its own text.
    - Tokens at the end that never complete a character (a completion truncated inside a multi-byte character)
      get the empty range (len(text), len(text)), and their bytes are not part of `text`.

    Check: `text` must equal `tokenizer.decode` of the ids that completed (all ids, unless the end is pending),
    with special tokens kept and no clean-up. Ids are never re-tokenised.

    Args:
        tokenizer: a Hugging Face fast tokenizer (uses `tokenizer.backend_tokenizer`) or a `tokenizers.Tokenizer`.
        ids: token ids, in order (real tokens only: no padding).
    Returns:
        (text, offsets) with len(offsets) == len(ids), offsets non-decreasing and contiguous over `text`.
    Raises:
        TypeError: the tokenizer has no Rust backend (a slow tokenizer).
        ValueError: the streamed text differs from the full decode (a decoder that DecodeStream does not
            reproduce), or DecodeStream itself fails. `answer_spans` treats such a row as having no box.
    Cost: ~0.6 µs per token (the stream decodes a short window of ids per step; one full decode to check).
    """
    backend = _backend(tokenizer)
    ids = list(map(int, ids))
    step = DecodeStream(skip_special_tokens=False).step
    chunks: list[str] = []
    offsets: list[tuple[int, int]] = []
    pos = pending = 0  # characters emitted so far; tokens waiting for the chunk that completes them
    try:
        for token_id in ids:
            chunk = step(backend, token_id)
            if chunk is None:
                pending += 1
                continue
            end = pos + len(chunk)
            if pending:
                offsets.extend([(pos, end)] * pending)
                pending = 0
            offsets.append((pos, end))
            chunks.append(chunk)
            pos = end
    except Exception as err:  # the Rust side raises plain Exception (e.g. "invalid prefix")
        raise ValueError(f"token_char_offsets: DecodeStream failed at token {len(offsets) + pending}: {err}") from err
    completed = len(offsets)
    offsets.extend([(pos, pos)] * pending)
    text = "".join(chunks)
    reference = _reference_decode(backend, ids[:completed])
    if text != reference:
        diff = next((i for i, (x, y) in enumerate(zip(text, reference, strict=False)) if x != y),
                    min(len(text), len(reference)))
        raise ValueError(f"token_char_offsets: streamed decode differs from tokenizer.decode at character {diff} "
                         f"({text[diff:diff + 20]!r} vs {reference[diff:diff + 20]!r}); this tokenizer's decoder "
                         f"is not reproduced token by token by DecodeStream")
    return text, offsets


class AnswerSpans(NamedTuple):
    r"""Where the answer box is, per completion token. Every (B, T) field is bool on the device of the ids.

    For a row with a box, the three masks split the row's real tokens by the characters they cover (text =
    reasoning `\boxed{` content `}` rest):
    - `answer_BT`: tokens covering any character strictly inside the box braces (METHODS 2.7: weight w_max).
      Wins over the others: a token "{3" or "2}" covering content and marker/brace is an answer token.
    - `after_BT`: other tokens covering any character of `\boxed{`, the closing `}` or anything after it, and
      the trailing tokens with an empty range (METHODS 2.7: weight w_mean). A token covering the end of the
      reasoning and the start of the marker (a byte-level " \\") is here.
    - `reasoning_BT`: the rest, i.e. tokens covering only text before the box.
    One more mask overlaps those three:
    - `box_BT`: tokens covering any character of the whole box string `\boxed{` content `}` (the marker
      tokens, the answer tokens and the closing brace's token): the span whose NLL the GRAIL release
      differentiates (METHODS 2.1, `answer_nll_span="box"`). answer_BT ⊆ box_BT ⊆ answer_BT | after_BT.
    For a row with no box (none complete, an empty `\boxed{}` chosen, or a failed decode check) every real token
    is reasoning and the other masks are all False. Padding is in no mask; answer, after and reasoning are
    disjoint and their union is the real-token mask.
    """

    answer_BT: torch.Tensor  # (B, T) bool
    after_BT: torch.Tensor  # (B, T) bool
    reasoning_BT: torch.Tensor  # (B, T) bool
    has_box_B: torch.Tensor  # (B,) bool: a complete box was chosen and it has at least one answer token
    decoded_B: torch.Tensor  # (B,) bool: the row's decode check passed (False → counted as no box); log its mean
    box_BT: torch.Tensor  # (B, T) bool: the whole box (marker, content, closing brace), see above

    def probe_span(self, answer_nll_span: str) -> torch.Tensor:
        """(B, T) bool: the tokens whose likelihood the probes explain: the whole box (`"box"`, the GRAIL
        release) or the content strictly inside the braces (`"content"`)."""
        if answer_nll_span == "box":
            return self.box_BT
        if answer_nll_span == "content":
            return self.answer_BT
        raise ValueError(f"answer_nll_span must be 'box' or 'content', got {answer_nll_span!r}")


def answer_spans(tokenizer, completion_ids_BT: torch.Tensor, mask_BT: torch.Tensor, *,
                 box: AnswerBox = "first") -> AnswerSpans:
    r"""Answer span, post-box tokens and reasoning of each completion (docs/methods/grail.md steps 1 and 7,
    docs/methods/oar_g.md).

    Per row: the real tokens (mask True, taken in order wherever they are; no prefix layout assumed) are decoded
    with `token_char_offsets`; the FIRST (`box="first"`, the GRAIL release) or LAST (`"last"`, what the reward
    reads) outermost complete box of the text is found with `grail.tasks.boxed`; tokens are classified by the overlap
    of their character ranges with the box, with the rule of `grail.tasks.boxed.char_span_to_token_positions` (token
    [a, b) covers [s, e) iff a < b, a < e and b > s). Because the ranges from `token_char_offsets` are
    non-decreasing and contiguous, each class is a run of the row's real tokens, in order
    reasoning [0, k0), after [k0, k1), answer [k1, k2), after [k2, n), and the box is [k0, k3) with k3 the first
    token after the closing brace's characters, found by four bisections per row; the
    masks are then built for the whole batch at once on the ids' device, by each real token's rank in its row.
    See `AnswerSpans` for what each mask holds.

    Only the chosen box counts: with `box="first"`, an empty first box is no box even if a later one is not
    empty; a later box's tokens are in `after_BT` (they come after the first box's closing brace).

    Args:
        tokenizer: a Hugging Face fast tokenizer or a `tokenizers.Tokenizer` (the one that produced the ids).
        completion_ids_BT: (B, T) integer token ids, any device.
        mask_BT: (B, T) real-token mask (bool or 0/1), same shape.
        box: "first" or "last" (`BOX_CHOICES`).
    Returns:
        `AnswerSpans` on `completion_ids_BT.device`.
    Raises:
        ValueError: bad `box` or shapes. TypeError: a slow tokenizer.
    Cost: one device-to-host copy of ids and mask, then ~0.8 µs per real token on CPU: the streamed decode
    ~75%, box finding (`grail.tasks.boxed`, pure Python) ~20%, bisections and the batched masks the rest. O(T) per row.
    """
    if box not in _PICK_BOX:
        raise ValueError(f"answer_spans: box must be one of {BOX_CHOICES}, got {box!r}")
    if completion_ids_BT.dim() != 2 or completion_ids_BT.shape != mask_BT.shape:
        raise ValueError(f"answer_spans: need (B, T) ids and a mask of the same shape, got "
                         f"{tuple(completion_ids_BT.shape)} and {tuple(mask_BT.shape)}")
    _backend(tokenizer)  # fail fast, outside the per-row ValueError handling
    pick = _PICK_BOX[box]
    device = completion_ids_BT.device
    B, T = completion_ids_BT.shape
    ids_BT = completion_ids_BT.detach().cpu()
    real_cpu_BT = mask_BT.detach().cpu().bool()

    # Per row, the class boundaries k0 <= k1 <= k2 <= k3 in real-token ranks; T (no real token has that rank) = no box.
    bounds = [[T, T, T, T] for _ in range(B)]
    decoded = [True] * B
    for row in range(B):
        row_ids = ids_BT[row].masked_select(real_cpu_BT[row]).tolist()  # the real ids, in order
        if not row_ids:
            continue
        try:
            text, offsets = token_char_offsets(tokenizer, row_ids)
        except ValueError:
            decoded[row] = False
            continue
        span: BoxSpan | None = pick(text)
        if span is None or span.content_start == span.content_end:
            continue
        # Starts and ends are both non-decreasing, so each bisection is O(log n).
        k0 = bisect_right(offsets, span.start, key=_END)  # first token with end > box start: marker or later
        k1 = bisect_right(offsets, span.content_start, key=_END)  # first token with end > content start
        k2 = bisect_left(offsets, span.content_end, key=_START)  # first token starting at the closing brace or later
        k3 = bisect_left(offsets, span.end, key=_START)  # first token starting after the closing brace
        if k1 < k2:  # always, when the content is not empty: every character is covered by a token
            bounds[row] = [k0, k1, k2, k3]

    real_BT = mask_BT.detach().to(device).bool()
    rank_BT = real_BT.long().cumsum(dim=1) - 1  # (B, T) index of each real token among its row's real tokens
    bounds_B4 = torch.tensor(bounds, dtype=torch.long, device=device).reshape(B, 4)  # (B, 4)
    k0_B1, k1_B1, k2_B1, k3_B1 = (bounds_B4[:, i : i + 1] for i in range(4))  # (B, 1) each
    answer_BT = real_BT & (rank_BT >= k1_B1) & (rank_BT < k2_B1)  # (B, T)
    after_BT = real_BT & (rank_BT >= k0_B1) & ~answer_BT  # (B, T)
    reasoning_BT = real_BT & ~answer_BT & ~after_BT  # (B, T)
    box_BT = real_BT & (rank_BT >= k0_B1) & (rank_BT < k3_B1)  # (B, T)
    has_box_B = bounds_B4[:, 1] < bounds_B4[:, 2]  # (B,)
    return AnswerSpans(answer_BT, after_BT, reasoning_BT, has_box_B, torch.tensor(decoded, device=device), box_BT)
