"""Which weight path a trainer can take, and what it refuses before the first step: functions of plain values (the
method's table entry, config values, what the engine and the model are), which `GRAILTrainer` calls when it starts
(the engine itself: `grail.training.engines`). tests/test_paths.py checks each without building a trainer.

The paths are those of the trainer's docstring: weights at rollout time, a separate probe before each micro-batch's
loss, or fused into TRL's own forward (`saliency_path`).
"""

from __future__ import annotations

from collections.abc import Callable

from grail.methods import probes
from grail.methods.spec import MethodSpec

__all__ = ["check_fused_request", "check_probe_reaches_the_model", "check_shared_prompt", "fused_unavailable_reason",
           "reentrant_checkpointing"]


def reentrant_checkpointing(checkpointing: bool, kwargs: dict | None) -> bool:
    """Activation checkpointing (`checkpointing`: activation_checkpointing or its old name) is on with
    use_reentrant=True (`kwargs`: the config's activation_checkpointing_kwargs; TRL forces it for PEFT + ZeRO-3).
    Non-reentrant checkpointing (transformers 5's default) recomputes inside autograd, so gradient queries work
    through it."""
    return checkpointing and bool((kwargs or {}).get("use_reentrant", False))


def fused_unavailable_reason(method: MethodSpec, saliency_path: str, weights_from: str, *, peft: bool,
                             sharded: str | None, deepspeed: bool, reentrant: bool,
                             leaf_trainable: Callable[[], bool]) -> str | None:
    """None if the fused path can run for `method` and this setup, else why not, in words. `sharded`: the engine that
    shards the model (`engines.sharded_by`), if any; `leaf_trainable`: whether the input embeddings or the saliency
    leaf have a parameter that requires grad (asked last, only when everything else allows fusing)."""
    if method.fuse is None:
        return f"token_weighting={method.name!r} has no saliency, entropy or probe signal to fuse"
    if saliency_path == "separate":
        return "saliency_path='separate'"
    if weights_from != "current_policy":
        return "weights_from='rollout_policy' computes weights at generation time, outside the training forward"
    if method.fuse == "entropy":
        return None  # TRL's forward computes the entropies anyway
    if method.fuse == "probe" and (peft or sharded or deepspeed):
        return ("a PEFT/LoRA model, a sharded model or DeepSpeed (the method's probe would call the model inside the "
                "training forward, where adapters, gathered parameters and the engine's hooks are the trainer's)")
    if method.fuse == "probe":
        return None  # no gradient query: checkpointing and frozen leaves do not matter
    if peft:
        return "a PEFT/LoRA model (frozen base embeddings, adapter-wrapped modules)"
    if sharded:
        return f"{sharded} (parameters are gathered and released around each module)"
    if deepspeed:
        return ("DeepSpeed (its engine hooks the model's outputs and takes any backward through them for the "
                "training backward: the fused saliency's gradient query puts ZeRO-1/2's gradient buckets out of "
                "step, an IndexError in reduce_ipg_grads with deepspeed 0.19.8)")
    if reentrant:
        return ("reentrant activation checkpointing (use_reentrant=True: its segments answer only .backward(), "
                "not a gradient query; non-reentrant checkpointing, transformers' default, fuses)")
    if not leaf_trainable():
        return "frozen embeddings (the leaf is not part of the training graph)"
    return None


def check_fused_request(saliency_path: str, unavailable: str | None) -> None:
    """ValueError when saliency_path='fused' was asked for and the fused path cannot run (`unavailable`: why)."""
    if saliency_path == "fused" and unavailable:
        raise ValueError(f"saliency_path='fused' cannot work here: {unavailable}. Use saliency_path='auto' (falls "
                         f"back to a separate pass) or 'separate'.")


def check_shared_prompt(shared_prompt: bool, num_processes: int, engine: str | None, checkpointing: bool) -> None:
    """shared_prompt=true needs one process without an engine wrapper (`engine`: "DeepSpeed", a sharding engine, or
    None) and no activation checkpointing (grail.training.shared_prompt); ValueError naming the fix otherwise."""
    if not shared_prompt:
        return
    why = None
    if num_processes > 1 or engine:
        why = (f"it runs on one process without an engine wrapper only (this launch: {num_processes} process(es), "
               f"{engine or 'DDP'})")
    elif checkpointing:
        why = "transformers turns the KV cache off under activation checkpointing; set activation_checkpointing false"
    if why:
        raise ValueError(f"shared_prompt=true cannot work here: {why}. Set shared_prompt false (the default).")


def check_probe_reaches_the_model(method: MethodSpec, model, saliency_leaf: str) -> None:
    """Before any step: a method whose probe calls the model needs its input embeddings (the saliency leaf by default,
    OAR-G's perturbation point) and, for the fused saliency, the chosen leaf; a model without them is refused now,
    with the probes' message naming the accessor to add, instead of at the first probe. `model`: unwrapped."""
    if method.probe is None or not method.calls_model:
        return
    probes.leaf_module(model, "embeddings")
    if method.fuse == "saliency":
        probes.leaf_module(model, saliency_leaf)
