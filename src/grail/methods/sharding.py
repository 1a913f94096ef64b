"""Probes on models sharded over processes (ZeRO-3, FSDP2). Every process gets the weights an unsharded model gives
(tests/test_fsdp_cpu.py, tests/test_deepspeed_cpu.py) through the probes of `grail.methods.probes` and
`grail.methods.oar_probes`, with what is here:

- The output layer: the probes read its weight without calling the layer, so an engine that gathers parameters in
  hooks around each module's forward never gathers it for them. `unsharded` gathers it once per probe and
  `output_layer_weights` hands the copy to `output_layer.output_logits`.
- FSDP2's forwards must go through the model's own forward (`is_fsdp2`; `probes.backbone_output` routes them).
- A probe with a data-dependent number of forwards (OAR-P, span masking) runs them in lockstep over processes
  (`lockstep`, `announce_forward`).
Everything here is a no-op for a model that is not sharded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

__all__ = ["announce_forward", "is_fsdp2", "is_sharded", "lockstep", "output_layer_weights", "unsharded"]

_GATHERED: dict[int, tuple[torch.Tensor, torch.Tensor | None]] = {}  # id(model) → its whole output layer, in scope
_OPEN: set[int] = set()  # ids of the models inside `unsharded` (it is re-entrant)
_LOCKSTEP: dict[int, bool] = {}  # id(model) → inside `lockstep`, still running its own forwards


def is_fsdp2(model: nn.Module) -> bool:
    """Whether the model is the root of torch's FSDP2 (`fully_shard`, accelerate's FSDP v2)."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch without FSDP2
        return False
    return isinstance(model, FSDPModule)


def _head(model: nn.Module) -> nn.Module | None:
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    return head if isinstance(head, nn.Module) else None


def _zero3_output_params(model: nn.Module) -> list[nn.Parameter]:
    head = _head(model)
    return [p for p in head.parameters(recurse=False) if hasattr(p, "ds_id")] if head is not None else []


def is_sharded(model: nn.Module) -> bool:
    """Whether the model's parameters are sharded over processes (torch FSDP2, DeepSpeed ZeRO-3)."""
    return is_fsdp2(model) or bool(_zero3_output_params(model))


def _full(tensor: torch.Tensor | None) -> torch.Tensor | None:
    if tensor is None:
        return None
    tensor = tensor.detach()
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor  # a DTensor shard: all-gathered


@contextmanager
def unsharded(model: nn.Module) -> Iterator[None]:
    """While active, `output_layer_weights` gives a whole copy of the output layer, gathered once on entry; a no-op
    for a model that is not sharded. Every probe enters this once, around all its forwards (re-entrant: an inner
    entry does nothing), so each process runs the same collectives however many rows or chunks it has. The copy
    (V × D, the model's dtype) lives until exit.

    - torch FSDP2: the output layer's DTensor shards are all-gathered (`full_tensor`, outside FSDP's own
      bookkeeping). The forwards go through the model's own forward (`probes.backbone_output`), in which FSDP
      gathers and releases its units as in training.
    - DeepSpeed ZeRO-3: the output layer's parameters are gathered (`deepspeed.zero.GatheredParameters`) and copied.
      A copy, not the gathered parameter itself: with tied embeddings the input embedding module shares the weight
      and releases it again after its own forward. The backbone runs alone (every module gathers in its own hooks).
    """
    if id(model) in _OPEN:
        yield
        return
    _OPEN.add(id(model))
    try:
        head = _head(model)
        if zero3 := _zero3_output_params(model):
            import deepspeed

            with deepspeed.zero.GatheredParameters(zero3, modifier_rank=None):
                _GATHERED[id(model)] = tuple(None if t is None else t.detach().clone()
                                             for t in (head.weight, getattr(head, "bias", None)))
        elif head is not None and is_fsdp2(model):
            _GATHERED[id(model)] = (_full(head.weight), _full(getattr(head, "bias", None)))
        yield
    finally:
        _GATHERED.pop(id(model), None)
        _OPEN.discard(id(model))


def _whole(tensor: torch.Tensor | None, model: nn.Module) -> torch.Tensor | None:
    """`tensor` detached, or an error naming the fix if it is a shard (read outside `unsharded`)."""
    if tensor is None:
        return None
    shard = hasattr(tensor, "full_tensor") or tuple(getattr(tensor, "ds_shape", tensor.shape)) != tuple(tensor.shape)
    if shard:
        raise RuntimeError(f"output_logits: the output layer of {type(model).__name__} is sharded on this process "
                           f"(FSDP2 / ZeRO-3) and was read outside `grail.methods.sharding.unsharded(model)`; call "
                           f"the probe inside `with unsharded(model):` (every built-in probe does), on every process "
                           f"alike.")
    return tensor.detach()


def output_layer_weights(model: nn.Module, head: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight, bias) of the output layer `head`, detached and whole: the copy `unsharded` gathered, or the layer's
    own (an error if they are shards: read outside `unsharded`)."""
    return _GATHERED.get(id(model)) or (_whole(head.weight, model), _whole(getattr(head, "bias", None), model))


def _any_process_busy(model: nn.Module, busy: bool) -> bool:
    """One round of `lockstep`: whether any process runs a forward in this round (an all-reduce)."""
    flag = torch.tensor([int(busy)], device=next(model.parameters()).device)
    torch.distributed.all_reduce(flag)
    return bool(flag.item())


def announce_forward(model: nn.Module) -> None:
    """Before each forward of a probe: inside `lockstep`, tell the other processes that this one runs one."""
    if _LOCKSTEP.get(id(model)):
        _any_process_busy(model, True)


@contextmanager
def lockstep(model: nn.Module, idle_forward: Callable[[], object]) -> Iterator[None]:
    """While active, every process runs the same number of model forwards, however many its own rows need: for a
    probe whose number of forwards depends on the data (OAR-P: one per row and one per chunk of perturbed copies)
    on a model sharded over processes, where every forward gathers parameters from all processes.

    Forwards go in rounds: before each of its forwards (`announce_forward`) a process all-reduces "busy"; a process
    whose own forwards are done keeps all-reducing "idle" and runs `idle_forward` (a one-token forward through the
    same path, output unused) in every round where another process is busy, until a round where none is. A no-op
    (re-entrant) unless the model is sharded over several processes. Cost: one all-reduce of one number per forward,
    and the idle processes' one-token forwards."""
    dist = torch.distributed
    if id(model) in _LOCKSTEP or not (is_sharded(model) and dist.is_available() and dist.is_initialized()
                                      and dist.get_world_size() > 1):
        yield
        return
    _LOCKSTEP[id(model)] = True
    try:
        yield
    finally:
        _LOCKSTEP[id(model)] = False
        with torch.no_grad():
            while _any_process_busy(model, False):
                idle_forward()  # in step with a busy process
        del _LOCKSTEP[id(model)]
