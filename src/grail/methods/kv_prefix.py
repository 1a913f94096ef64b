"""Sharing a clean row's KV cache with copies of it that differ from some position p0 on (OAR-P's exact prefix
sharing, grail.methods.oar_probes): whether a model's cache can be rebuilt at any prefix length, the rebuilt cache, and
how one row's substitution positions are cut into chunks. Exact because a causal model's states before p0 do not
depend on the tokens from p0 on; the float64 tests against whole forwards (tests/test_oar_p_sharing.py) hold it.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["full_length", "MAX_PREFIX_WASTE", "prefix_cache", "prefix_chunks", "shareable"]


def shareable(model: nn.Module) -> bool:
    """Whether `prefix_cache` rebuilds the model's own cache exactly at any prefix length: a causal model whose cache
    (`DynamicCache(config=...)`) has only full-attention and sliding-window layers (Llama, Qwen3, Gemma 3, Mistral);
    not chunked or linear attention, nor layers that read another layer's cache."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    config = getattr(model, "config", None)
    if not callable(getattr(config, "get_text_config", None)):  # not a transformers model: no cache to rebuild
        return False
    if getattr(config.get_text_config(decoder=True), "use_bidirectional_attention", False):
        return False
    return all(type(layer) in (DynamicLayer, DynamicSlidingWindowLayer) for layer in DynamicCache(config=config).layers)


def full_length(cache, length: int) -> bool:
    """Whether `cache` holds all `length` positions' keys and values in every layer (a config-less `DynamicCache`
    after the clean forward; gradient checkpointing in training mode leaves it empty)."""
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None)
    return bool(layers) and all(type(layer) is DynamicLayer and layer.get_seq_length() == length for layer in layers)


def prefix_cache(model: nn.Module, kv: list[tuple[torch.Tensor, torch.Tensor]], p0: int, copies: int):
    """The model's own cache after positions [0, p0) of the clean row, for `copies` copies.

    `kv`: each layer's (1, heads, n, head_dim) keys and values of the whole clean row. The cache is filled as a forward
    fills `DynamicCache(config=...)`: a full-attention layer keeps all p0 positions; a sliding-window layer keeps the
    last window − 1 of them and counts p0, which is what the model's mask functions read (the window's offset) and
    what its next positions continue from, exactly as in generation. Relied on in transformers (5.x): each layer of
    `DynamicCache(ddp_cache_data=..., config=...)` is filled through its own `update`; a config-less `DynamicCache`
    holds plain `DynamicLayer`s; the masks and positions come from the cache's `get_mask_sizes` and
    `get_seq_length`. The float64 tests against whole forwards (tests/test_oar_p_sharing.py) fail if any of it
    changes."""
    from transformers import DynamicCache

    cache = DynamicCache(ddp_cache_data=[(k[:, :, :p0], v[:, :, :p0]) for k, v in kv], config=model.config)
    cache.batch_repeat_interleave(copies)  # after the window's cut: a sliding layer copies only what it keeps
    return cache


MAX_PREFIX_WASTE = 0.25


def prefix_chunks(positions: list[int], length: int, chunk_tokens: int,
                   max_waste: float = MAX_PREFIX_WASTE) -> list[tuple[int, int]]:
    """Split one row's sorted substitution positions into chunks [start, stop) for prefix sharing.

    A chunk of C copies whose first substitution is at p0 runs C × (length − p0) positions, of which
    Σ_c (length − p_c) are needed (the rest recompute clean states between p0 and each copy's own p_c). A copy joins
    the chunk while C × length ≤ chunk_tokens (the memory bound) and the positions run stay within
    (1 + max_waste) × the positions needed; at least one copy per chunk.
    """
    chunks, start = [], 0
    while start < len(positions):
        stop, needed = start + 1, length - positions[start]
        while stop < len(positions) and (stop + 1 - start) * length <= chunk_tokens:
            needed_next = needed + length - positions[stop]
            if (stop + 1 - start) * (length - positions[start]) > (1 + max_waste) * needed_next:
                break
            stop, needed = stop + 1, needed_next
        chunks.append((start, stop))
        start = stop
    return chunks
