"""OAR's probes: the answer distribution P_final, OAR-G's gradient proxy and OAR-P's perturbation importance
(docs/methods/oar_g.md, docs/methods/oar_p.md), on the model plumbing of `grail.methods.probes` (whose docstring gives
the batch layout and the guarantees every probe keeps).

Departures from the specification (docs/methods/; choices it leaves open, or makes here):
  1. OAR's distributions use logits / temperature (the spec does not say; GRAIL's saliency does, and it is the
     distribution the tokens were sampled from); the caller passes temperature 1 for the GRAIL release's OAR-G.
  2. OAR "next-token distribution at the last position" = the logits at the row's last real input position, i.e. the
     final completion token's own position (what the model would emit after the completion).
  3. OAR "mean of the logits over the answer positions" = the mean over the positions that PREDICT the answer tokens
     (the one-position shift). Where the logits are linear in the hidden state (`output_layer.output_is_linear`: Qwen3,
     Llama, a logit scale) it is computed as the output layer applied to the mean hidden state, equal to the mean of
     the logits up to rounding; under logit soft-capping (Gemma) the logits are formed per position and averaged.
  4. OAR-G draws its noise as one (B, T, D) standard-normal tensor in float32 (from `generator`), scaled by
     `noise_std` in the embeddings' dtype and zeroed on unscored tokens, then added to the embeddings at the scored
     tokens' own positions (the OAR excerpt) or at the positions that predict them (the GRAIL release).
  5. OAR-P computes P_final of the clean row from the same padding-stripped row its perturbed copies are built from,
     so clean and perturbed distributions come from identical computations apart from the substitution.
  6. OAR-P reuses the clean row's KV cache for the prefix that precedes every substitution of a chunk (exact: a
     causal model's states before position p do not depend on the token at p). The clean forward keeps every
     position's keys and values in every layer (a config-less `DynamicCache`); a chunk's prefix cache is then built
     as the model's own cache for p0 positions (`kv_prefix.prefix_cache`), so a sliding-window layer (Gemma 3) holds
     the window − 1 positions before p0, and the model's mask functions place the window, as in generation. It falls
     back to the plain batched version when the model's cache has other kinds of layers (chunked or linear
     attention, layers sharing another's cache), attends bidirectionally, or drops the cache (gradient
     checkpointing in training mode).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal, get_args

import torch
import torch.nn.functional as F
from torch import nn

from grail.methods.core import kl_divergence
from grail.methods.kv_prefix import full_length, prefix_cache, prefix_chunks, shareable
from grail.methods.output_layer import at_least_float32, output_is_linear, output_logits
from grail.methods.probes import (
    backbone_output,
    check_batch,
    completion_mask_BT,
    hidden_states_BLD,
    in_lockstep,
    leaf_gradient,
    output_of,
    zeros_BT,
)
from grail.methods.sharding import unsharded
from grail.methods.spans import align_to_completion
from grail.options.choices import Distribution

__all__ = ["DISTRIBUTIONS", "oar_g_importance", "oar_p_importance"]

DISTRIBUTIONS: tuple[Distribution, ...] = get_args(Distribution)


# ---------------------------------------------------------------------------------------------------------------
# OAR: the answer distribution P_final (docs/methods/oar_g.md).


def _answer_pool_BL(attention_mask_BL: torch.Tensor, answer_BT: torch.Tensor,
                    distribution: Distribution) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights over input positions whose weighted hidden state gives P_final's logits, and which rows have one.

    "last_position": 1 at the row's last real input position. "answer_mean": 1/|A| at each position that predicts
    an answer token. Returns ((B, L) float64, (B,) bool valid); rows without a distribution get all-zero weights.
    """
    B, L = attention_mask_BL.shape
    T = answer_BT.shape[1]
    pool_BL = torch.zeros(B, L, dtype=torch.float64, device=attention_mask_BL.device)  # exact 1/|A| for float64 models
    if distribution == "last_position":
        real_BL = attention_mask_BL.bool()
        positions_L = torch.arange(L, device=attention_mask_BL.device)
        last_B = (real_BL * positions_L).argmax(dim=1)  # (B,) the last position where the mask is 1
        valid_B = real_BL.any(dim=1)
        pool_BL[torch.arange(B, device=pool_BL.device), last_B] = valid_B.double()
    elif distribution == "answer_mean":
        answer_BT = answer_BT.bool() & completion_mask_BT(attention_mask_BL, T)
        count_B = answer_BT.sum(dim=1)
        valid_B = count_B > 0
        align_to_completion(pool_BL, T, at="predicting").copy_(answer_BT.double() / count_B.clamp(min=1)[:, None])
    else:
        raise ValueError(f"distribution must be one of {DISTRIBUTIONS}, got {distribution!r}")
    return pool_BL, valid_B


def _pooled_logits(model: nn.Module, hidden_BLD: torch.Tensor, pool_BL: torch.Tensor,
                   temperature: float) -> torch.Tensor:
    """P_final's logits (B, V) float32: Σ_l pool_l · logits_l (only positions with weight are read). When the logits
    are linear in the hidden state this is the output layer on Σ_l pool_l h_l, one output-layer call per row; under
    soft-capping (Gemma) the logits are formed per position, then pooled."""
    rows, cols = pool_BL.nonzero(as_tuple=True)
    if not output_is_linear(model):
        logits_NV = output_logits(model, hidden_BLD[rows, cols], temperature)
        weighted_NV = logits_NV * pool_BL[rows, cols, None].to(logits_NV.dtype)
        return torch.zeros(pool_BL.shape[0], logits_NV.shape[-1], dtype=logits_NV.dtype,
                           device=logits_NV.device).index_add(0, rows, weighted_NV)
    dtype = at_least_float32(hidden_BLD)
    weighted_ND = hidden_BLD[rows, cols].to(dtype) * pool_BL[rows, cols, None].to(dtype)
    pooled_BD = torch.zeros(pool_BL.shape[0], hidden_BLD.shape[-1], dtype=dtype, device=hidden_BLD.device)
    return output_logits(model, pooled_BD.index_add(0, rows, weighted_ND), temperature)  # (B, V)


# ---------------------------------------------------------------------------------------------------------------
# OAR-G: gradient proxy.


def oar_g_importance(model: nn.Module, input_ids_BL: torch.Tensor, attention_mask_BL: torch.Tensor,
                     scored_BT: torch.Tensor, answer_BT: torch.Tensor, *, distribution: Distribution,
                     noise_std: float, temperature: float, generator: torch.Generator | None = None,
                     at: Literal["token", "predicting"] = "token", noisy_product: bool = False) -> torch.Tensor:
    """OAR-G: I_t = | Σ_d (∂J/∂e_p)_d · e_{p,d} |, J = Σ_i KL(P_0,i ‖ P_noisy,i) (docs/methods/oar_g.md), where p
    is the input position of token t chosen by `at`.

    P_0 = P_final of a clean no-grad forward; e = the input embeddings as a fresh leaf; the noisy forward adds
    noise_std · N(0, 1) to e at the scored tokens' positions only. One clean forward, one forward and one
    backward to the embeddings. The KL is formed in float64 (one row of V per row of the batch).

    Two placements (`grail.methods.weighting` picks them by `oar_variant`):
    - `at="token"`, `noisy_product=False` (the OAR excerpt): noise on, and importance read at, token t's own
      position S + t; the product uses the clean embedding e.
    - `at="predicting"`, `noisy_product=True` (the GRAIL release's OAR-G): noise on, and importance read at,
      the position that predicts token t, S − 1 + t (so token t is scored by the embedding of the token before
      it); the product uses the noisy embedding e + noise.

    Args:
        input_ids_BL, attention_mask_BL: (B, L) TRL layout.
        scored_BT: (B, T) bool, the tokens that get an importance (and noise).
        answer_BT: (B, T) bool, the answer span ("answer_mean" only).
        distribution: "last_position" or "answer_mean" (see `_answer_pool_BL`).
        noise_std: σ of the Gaussian noise (release 1e-3). At σ = 0 the KL sits at its minimum: importance ≈ 0.
        temperature: the sampling temperature (1.0 reproduces the GRAIL release, which does not divide).
        generator: source of the (B, T, D) float32 noise draw (None: the global RNG).
        at, noisy_product: the placement above.
    Returns:
        (B, T) float32 >= 0, 0 on unscored tokens and on rows with no scored token or no distribution. If nothing is
        scored, zeros without running the model.
    """
    check_batch("oar_g_importance", input_ids_BL, attention_mask_BL, temperature, scored_BT, answer_BT)
    T = scored_BT.shape[1]
    scored_BT = scored_BT.bool() & completion_mask_BT(attention_mask_BL, T)
    if not scored_BT.any():
        return zeros_BT(input_ids_BL, T)
    pool_BL, valid_B = _answer_pool_BL(attention_mask_BL, answer_BT, distribution)
    valid_B = valid_B & scored_BT.any(dim=1)
    with unsharded(model):  # both forwards and the backward, once
        return _oar_g(model, input_ids_BL, attention_mask_BL, scored_BT, pool_BL, valid_B, noise_std=noise_std,
                      temperature=temperature, generator=generator, at=at, noisy_product=noisy_product)


def _oar_g(model, input_ids_BL, attention_mask_BL, scored_BT, pool_BL, valid_B, *, noise_std, temperature, generator,
           at, noisy_product) -> torch.Tensor:
    T = scored_BT.shape[1]
    with torch.no_grad(), output_of(model.get_input_embeddings()) as embeddings:  # e, from the clean forward
        clean_BV = _pooled_logits(model, hidden_states_BLD(model, attention_mask_BL, input_ids=input_ids_BL), pool_BL,
                                  temperature)
    with torch.enable_grad():
        embeds_BLD = embeddings[-1].detach().requires_grad_()
        B, L, D = embeds_BLD.shape
        noise_BTD = torch.randn(B, T, D, generator=generator, dtype=torch.float32,
                                device=generator.device if generator is not None else embeds_BLD.device)
        noise_BLD = torch.zeros(B, L, D, dtype=embeds_BLD.dtype, device=embeds_BLD.device)
        align_to_completion(noise_BLD, T, at=at).copy_(noise_BTD.to(embeds_BLD) * noise_std * scored_BT[..., None])
        hidden_BLD = hidden_states_BLD(model, attention_mask_BL, inputs_embeds=embeds_BLD + noise_BLD)
        kl_B = kl_divergence(clean_BV, _pooled_logits(model, hidden_BLD, pool_BL, temperature))
        grad_BLD = leaf_gradient((kl_B * valid_B).sum(), embeds_BLD)
    product_BLD = embeds_BLD.detach() + noise_BLD if noisy_product else embeds_BLD.detach()
    dtype = at_least_float32(grad_BLD)  # the sum over D cancels: a float64 model keeps float64
    importance_BL = (grad_BLD.to(dtype) * product_BLD.to(dtype)).sum(dim=-1).abs()
    return (align_to_completion(importance_BL, T, at=at) * scored_BT).float().detach()  # (B, T)


# ---------------------------------------------------------------------------------------------------------------
# OAR-P: perturbation (substitute each scored token, or span of tokens, by the pad token, one copy each, batched).


def _stripped_rows(input_ids_BL, attention_mask_BL, scored_BT, answer_BT, distribution, span_tokens=1):
    """Per row with something to score: (row, ids_n, pool_n, spans) in padding-stripped coordinates; spans: the row's
    scored positions, ascending, in consecutive groups of `span_tokens` (the last may be shorter), one copy each."""
    T = scored_BT.shape[1]
    pool_BL, valid_B = _answer_pool_BL(attention_mask_BL, answer_BT, distribution)
    scored_BL = F.pad(scored_BT.bool() & completion_mask_BT(attention_mask_BL, T), (input_ids_BL.shape[1] - T, 0))
    out = []
    for i in (valid_B & scored_BL.any(dim=1)).nonzero().squeeze(1).tolist():
        real_L = attention_mask_BL[i].bool()
        pool_n = pool_BL[i][real_L]
        positions = scored_BL[i][real_L].nonzero().squeeze(1)  # sorted ascending
        # A token after the last position P_final reads cannot change it (causality): importance exactly 0, no copy.
        positions = positions[positions <= pool_n.nonzero().max()]
        if positions.numel():
            out.append((i, input_ids_BL[i][real_L], pool_n, list(positions.split(span_tokens))))
    return out


def _span_index(spans: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(copy index, position), one pair per token of `spans` (copy c substitutes spans[c]): the index pairs that
    write the pad token into each copy and each copy's KL back to its span's tokens."""
    sizes = torch.tensor([span.numel() for span in spans], device=spans[0].device)
    return torch.repeat_interleave(torch.arange(len(spans), device=sizes.device), sizes), torch.cat(spans)


def _oar_p_batched(model, input_ids_BL, attention_mask_BL, scored_BT, answer_BT, *, distribution, pad_token_id,
                   temperature, chunk_tokens, span_tokens=1) -> torch.Tensor:
    """OAR-P, every copy run in full: chunks of copies (any rows, right-padded to the chunk's longest) with
    copies × longest length ≤ chunk_tokens. Clean rows go through the same path first (copy position −1)."""
    T = scored_BT.shape[1]
    importance_BT = zeros_BT(input_ids_BL, T)
    rows = _stripped_rows(input_ids_BL, attention_mask_BL, scored_BT, answer_BT, distribution, span_tokens)
    if not rows:
        return importance_BT
    prompt_lengths = attention_mask_BL[:, : input_ids_BL.shape[1] - T].sum(dim=1).tolist()  # real prompt tokens

    def run(copies: list[tuple[int, int]]) -> Iterator[tuple[list[tuple[int, int]], torch.Tensor]]:
        """Yields (chunk of (row index into `rows`, index of the substituted span or −1), logits (C, V))."""
        start = 0
        while start < len(copies):
            stop, longest = start + 1, len(rows[copies[start][0]][1])
            while stop < len(copies):
                n = max(longest, len(rows[copies[stop][0]][1]))
                if (stop + 1 - start) * n > chunk_tokens:
                    break
                stop, longest = stop + 1, n
            chunk = copies[start:stop]
            ids_CN = torch.full((len(chunk), longest), pad_token_id, dtype=input_ids_BL.dtype,
                                device=input_ids_BL.device)
            mask_CN = torch.zeros_like(ids_CN)
            pool_CN = torch.zeros(len(chunk), longest, dtype=torch.float32, device=input_ids_BL.device)
            for c, (r, j) in enumerate(chunk):
                _, ids_n, pool_n, spans = rows[r]
                ids_CN[c, : len(ids_n)], mask_CN[c, : len(ids_n)], pool_CN[c, : len(ids_n)] = ids_n, 1, pool_n
                if j >= 0:
                    ids_CN[c, spans[j]] = pad_token_id
            hidden_CND = hidden_states_BLD(model, mask_CN, input_ids=ids_CN)
            yield chunk, _pooled_logits(model, hidden_CND, pool_CN, temperature)
            start = stop

    with torch.no_grad():
        clean_RV = torch.cat([logits for _, logits in run([(r, -1) for r in range(len(rows))])])
        copies = [(r, j) for r, (_, _, _, spans) in enumerate(rows) for j in range(len(spans))]
        for chunk, logits_CV in run(copies):
            r_C = torch.tensor([r for r, _ in chunk], device=clean_RV.device)
            kl_C = kl_divergence(clean_RV[r_C], logits_CV).clamp(min=0).to(importance_BT.dtype)
            copy_P, position_P = _span_index([rows[r][3][j] for r, j in chunk])  # each span's tokens: its KL
            i_P = torch.tensor([rows[r][0] for r, _ in chunk], device=importance_BT.device)[copy_P]
            prompt_P = torch.tensor([prompt_lengths[rows[r][0]] for r, _ in chunk], device=position_P.device)[copy_P]
            importance_BT[i_P, position_P - prompt_P] = kl_C[copy_P]
    return importance_BT


def _oar_p_prefix_shared(model, input_ids_BL, attention_mask_BL, scored_BT, answer_BT, *, distribution,
                         pad_token_id, temperature, chunk_tokens, span_tokens=1) -> torch.Tensor:
    """OAR-P with prefix sharing: per row, one clean forward that keeps every layer's keys and values; its copies,
    sorted by substituted position, in the chunks of `kv_prefix.prefix_chunks`; a chunk whose first substitution is
    at p0 runs only positions [p0, n), against the clean row's cache for [0, p0) (`kv_prefix.prefix_cache`), and reads
    P_final's positions before p0 from the clean forward."""
    from transformers import DynamicCache

    T = scored_BT.shape[1]
    importance_BT = zeros_BT(input_ids_BL, T)
    S = input_ids_BL.shape[1] - T
    batched = dict(distribution=distribution, pad_token_id=pad_token_id, temperature=temperature,
                   chunk_tokens=chunk_tokens, span_tokens=span_tokens)
    if not shareable(model) or (model.training and any(getattr(module, "gradient_checkpointing", False)
                                                        for module in model.modules())):
        # a cache `kv_prefix.prefix_cache` cannot rebuild, or checkpointed layers, which drop the cache in training
        # mode: nothing to share
        return _oar_p_batched(model, input_ids_BL, attention_mask_BL, scored_BT, answer_BT, **batched)
    with torch.no_grad():
        for i, ids_n, pool_n, spans in _stripped_rows(input_ids_BL, attention_mask_BL, scored_BT, answer_BT,
                                                      distribution, span_tokens):
            n = ids_n.shape[0]
            ones_1N = torch.ones(1, n, dtype=attention_mask_BL.dtype, device=ids_n.device)
            # config-less: every layer keeps every position, a sliding one too (its mask still applies the window)
            out = backbone_output(model, ones_1N, use_cache=True, input_ids=ids_n[None],
                                  past_key_values=DynamicCache())
            if not full_length(out.past_key_values, n):  # the cache was dropped: nothing to share
                return _oar_p_batched(model, input_ids_BL, attention_mask_BL, scored_BT, answer_BT, **batched)
            clean_hidden_ND = out.last_hidden_state[0]  # (n, D)
            clean_1V = _pooled_logits(model, clean_hidden_ND[None], pool_n[None], temperature)
            kv = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
            read_K = pool_n.nonzero().squeeze(1)  # the positions P_final reads, ascending
            firsts = [int(span[0]) for span in spans]  # a span's copy runs from its first position
            for start, stop in prefix_chunks(firsts, n, chunk_tokens):
                C, p0 = stop - start, firsts[start]
                ids_CS = ids_n[p0:].expand(C, n - p0).clone()  # (C, n − p0): the suffix each copy runs
                copy_P, position_P = _span_index(spans[start:stop])
                ids_CS[copy_P, position_P - p0] = pad_token_id
                prefix = prefix_cache(model, kv, p0, C) if p0 > 0 else None
                hidden_CSD = backbone_output(model, ones_1N.expand(C, n), use_cache=prefix is not None,
                                             input_ids=ids_CS, past_key_values=prefix).last_hidden_state
                # the hidden states P_final reads: before p0 the clean row's (shared), from p0 on each copy's own
                before_K = read_K < p0
                hidden_CKD = torch.cat([clean_hidden_ND[read_K[before_K]].expand(C, -1, -1),
                                        hidden_CSD[:, read_K[~before_K] - p0]], dim=1)  # (C, K, D)
                logits_CV = _pooled_logits(model, hidden_CKD, pool_n[read_K].expand(C, -1), temperature)
                prompt_length = int(attention_mask_BL[i, :S].sum())  # stripped position of token t: prompt + t
                kl_C = kl_divergence(clean_1V.expand_as(logits_CV), logits_CV).clamp(min=0)  # rounding can dip < 0
                importance_BT[i, position_P - prompt_length] = kl_C[copy_P].to(importance_BT.dtype)  # span's KL
    return importance_BT


def oar_p_importance(model: nn.Module, input_ids_BL: torch.Tensor, attention_mask_BL: torch.Tensor,
                     scored_BT: torch.Tensor, answer_BT: torch.Tensor, *, distribution: Distribution,
                     pad_token_id: int, temperature: float, chunk_tokens: int, span_tokens: int = 1) -> torch.Tensor:
    """OAR-P: I_t = KL(P_final ‖ P_final^(t)), P^(t) from a copy of the row with y_t replaced by `pad_token_id`
    (substitution: the attention mask is unchanged) (docs/methods/oar_p.md). No gradient.

    With span_tokens = k > 1, the span baseline: a row's scored tokens, in order, are cut into consecutive spans of k
    (the last may be shorter); one copy per span has all its tokens replaced, and each token of the span gets the
    span's KL. About T/k copies instead of T (their suffixes cost about T²/2k positions); k = 1 is OAR-P.

    One extra forward per scored token, batched: each row is stripped of its padding (its copies have the row's real
    length), and the copies run in chunks of at most max(1, chunk_tokens // n) copies of a row of real length n. A
    chunk reuses the clean row's KV cache for the positions before its first substitution and runs only the rest;
    chunks are cut so that the positions run exceed the positions needed by at most
    `kv_prefix.MAX_PREFIX_WASTE` = 25% (`kv_prefix.prefix_chunks`). Only P_final's logits are formed (one row of V
    per copy). Tokens after the last position P_final reads (after the answer, for "answer_mean") get no copy: by
    causality their importance is exactly 0.
    Exact: equals one full forward per copy up to rounding (tested against that loop in float64).

    Several processes: the number of forwards depends on the rows (one per row, one per chunk of copies). On a model
    sharded over processes (ZeRO-3, FSDP2: a parameter gather per forward) the processes run in lockstep
    (`probes.in_lockstep`): a process whose rows need fewer forwards runs one-token forwards while another still
    runs its own, so every process runs as many as the busiest (tests/test_fsdp_cpu.py, tests/test_deepspeed_cpu.py).

    Memory per chunk, roughly: the chunk's KV cache, chunk_tokens × num_layers × 2 × num_kv_heads × head_dim entries
    (Qwen3-4B in bf16: ~147 KB per token, ~4.8 GB at chunk_tokens = 32768; transiently up to twice one layer's share
    while it is extended; a sliding-window layer keeps only window − 1 prefix positions per copy), plus one layer's
    activations for the positions run (at most chunk_tokens) and C × V logits, and the clean row's own cache (every
    position of every layer, one copy). That is an estimate: `perf/benchmarks/oar_p_memory.py` measures 1.2-1.7x it
    on a CPU in float32 (T = 4096, 256 copies; allocator overhead and transient copies), while the peak grows in
    proportion to chunk_tokens and does not depend on the number of copies. Where the cache cannot be shared (see
    module docstring, 6) the plain batched path runs instead: no cache, copies of any rows right-padded to the
    chunk's longest, copies × longest ≤ chunk_tokens, so only one layer's activations for chunk_tokens positions.

    Args:
        input_ids_BL, attention_mask_BL: (B, L) TRL layout; each row's real tokens are contiguous.
        scored_BT: (B, T) bool, the tokens to perturb and score.
        answer_BT: (B, T) bool, the answer span ("answer_mean" only).
        distribution: "last_position" or "answer_mean" (see `_answer_pool_BL`).
        pad_token_id: the substitute token.
        temperature: the sampling temperature.
        chunk_tokens: the memory bound above (>= 1; one copy per chunk at least).
        span_tokens: the tokens replaced together in one copy (>= 1; 1: token-level OAR-P).
    Returns:
        (B, T) float32 >= 0, 0 on unscored tokens and on rows with no scored token or no distribution ("answer_mean"
        without answer tokens). If nothing is scored, zeros without running the model.
    """
    check_batch("oar_p_importance", input_ids_BL, attention_mask_BL, temperature, scored_BT, answer_BT)
    if chunk_tokens < 1:
        raise ValueError(f"oar_p_importance: chunk_tokens must be >= 1, got {chunk_tokens}")
    if span_tokens < 1:
        raise ValueError(f"oar_p_importance: span_tokens must be >= 1, got {span_tokens}")
    with unsharded(model), in_lockstep(model):  # a data-dependent number of forwards, in step on sharded models
        return _oar_p_prefix_shared(model, input_ids_BL, attention_mask_BL, scored_BT, answer_BT,
                                    distribution=distribution, pad_token_id=pad_token_id, temperature=temperature,
                                    chunk_tokens=chunk_tokens, span_tokens=span_tokens)
