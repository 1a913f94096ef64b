"""Which distributed engine a trainer runs under, and the launches accelerate quietly changes: plain functions of
the trainer's accelerator state and the launch environment, read by `GRAILTrainer` when it starts."""

from __future__ import annotations

__all__ = ["dropped_engine", "refuse_if_unshardable", "sharded_by"]


def sharded_by(trainer) -> str | None:
    """How a trainer's model is sharded over processes ("DeepSpeed ZeRO-3", "FSDP"), or None (DDP, ZeRO-1/2)."""
    plugin = getattr(trainer.accelerator.state, "deepspeed_plugin", None)
    if plugin is not None and plugin.zero_stage == 3:
        return "DeepSpeed ZeRO-3"
    if getattr(trainer, "is_fsdp_enabled", False):
        return "FSDP"
    return None


def dropped_engine(environ, distributed_type: str) -> str | None:
    """Why the launch asked for a sharded engine that accelerate did not start, or None. accelerate 1.15 takes its
    FSDP branch only for accelerator devices (accelerate/state.py: `MULTI_CPU` is not in the list that becomes
    `FSDP`), so an FSDP config on CPU processes runs as plain DDP without a word (tests/test_fsdp_cpu.py); and it
    takes DeepSpeed only without cpu=True (`GRAILConfig._cpu_engine` arranges that; tests/test_deepspeed_cpu.py)."""
    if environ.get("ACCELERATE_USE_FSDP", "").lower() in ("true", "1") and distributed_type == "MULTI_CPU":
        return ("the launch asked for FSDP (ACCELERATE_USE_FSDP=true), but accelerate runs FSDP configs on CPU "
                "processes as DDP (its FSDP branch covers accelerator devices only): every process holds the whole "
                "model. This run trains correctly, unsharded; use a GPU launch for FSDP, or DeepSpeed "
                "(examples/accelerate_zero3_cpu.yaml)")
    if environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() in ("true", "1") and distributed_type != "DEEPSPEED":
        return ("the launch asked for DeepSpeed (ACCELERATE_USE_DEEPSPEED=true), but accelerate takes DeepSpeed only "
                "when not told cpu=True, and use_cpu=True was given: this run trains without DeepSpeed. Leave "
                "use_cpu unset (grail then runs DeepSpeed on CPU processes over gloo)")
    return None


def refuse_if_unshardable(method, sharded: str | None) -> None:
    """ValueError, before training, for a method (a `MethodSpec`) whose probe cannot run on a sharded model."""
    if sharded and method.unshardable:
        raise ValueError(f"token_weighting={method.name!r} cannot train a model sharded by {sharded}: "
                         f"{method.unshardable}. Use DeepSpeed ZeRO-2 or DDP (docs/getting-started/clusters.md), "
                         f"or another token_weighting.")
