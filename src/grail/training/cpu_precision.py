"""`CPUPrecision`: where each phase of `GRAILTrainer`'s step computes, and in which precision, on a CPU in bf16.

On a CPU in bf16 (grail.models.precision), generation (the trainer's seam S5), each separate probe and each
micro-batch's loss forward (S2) run inside one autocast region (`_cast_once`), so each fp32 master weight is cast to
bf16 once per phase; on one plain process generation computes from bf16 weights instead, the fp32 master weights put
back after (`_generation_precision`, grail.models.bf16_weights, the `cpu_bf16_generation` field); the policy's
weights must be fp32 there (`check_cpu_master_weights`, checked by the trainer); a method of
`precision.FP32_PROBES` is probed separately, in fp32 (`_probe_precision`), while its loss stays bf16. In fp32 and
on GPUs every region here is a no-op.

A mixin of `grail.training.trainer.GRAILTrainer`: it reads the trainer's `args`, `accelerator`, `method` and `model`.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext

import torch

from grail.models.bf16_weights import bf16_weights
from grail.models.precision import FP32_PROBES

__all__ = ["CPUPrecision"]


class CPUPrecision:
    """The trainer's precision per phase under CPU bf16 (module docstring)."""

    cpu_bf16: bool = False  # autocast over fp32 weights (`_cast_once`)
    generate_from_bf16: bool = False  # generation from bf16 weights (`_generation_precision`)
    fp32_probe: bool = False  # the method's separate probe in fp32 (`_probe_precision`)

    def choose_cpu_precision(self, device: torch.device) -> None:
        """Set the three flags for this run; called once by the trainer, after its method is resolved."""
        self.cpu_bf16 = bool(self.args.bf16 and device.type == "cpu")
        # generation from bf16 weights on one plain process only (`bf16_weights`: a dtype swap stops DDP's all-reduce)
        self.generate_from_bf16 = (self.cpu_bf16 and self.args.cpu_bf16_generation == "weights"
                                   and self.accelerator.distributed_type.name == "NO")
        # a method whose weights do not hold in bf16 is probed separately, in fp32 (precision.FP32_PROBES)
        self.fp32_probe = self.cpu_bf16 and self.method.name in FP32_PROBES

    @contextmanager
    def _cast_once(self):
        """CPU bf16: one autocast region around a whole phase (generation, a separate probe, a micro-batch's loss
        forward), so autocast's cast cache holds each fp32 weight's bf16 copy for the phase: TRL's and accelerate's
        own regions open and close around every model call, and each closing empties the cache, so without this
        generation would re-cast every weight at every new token. Backward still reaches the fp32 weights through
        the cached casts (tests/test_precision.py). A no-op in fp32 and on GPUs (their path is unchanged)."""
        if self.cpu_bf16:
            with self.accelerator.autocast():
                yield
        else:
            yield

    @contextmanager
    def _probe_precision(self, model):
        """Around a separate probe: in fp32 for a method of FP32_PROBES under CPU bf16 (autocast off, and the model's
        own forward in place of accelerate's autocast wrapper, `_original_forward`, put back after); else one cast
        region (`_cast_once`)."""
        if not self.fp32_probe:
            with self._cast_once():
                yield
            return
        wrapped = model.__dict__.get("forward")
        original = model.__dict__.get("_original_forward")
        if original is not None:
            model.forward = original
        try:
            with torch.autocast("cpu", enabled=False):
                yield
        finally:
            if original is not None:
                model.forward = wrapped

    @contextmanager
    def _generation_precision(self):
        """Around generation (S5): under CPU bf16, from bf16 weights (`bf16_weights` on the model TRL generates with,
        `accelerator.unwrap_model`) where `generate_from_bf16`, and inside one cast region (`_cast_once`) either way.
        Over bf16 weights the region casts nothing a plain model makes (its norms compute in fp32 and cast back by
        their own code), but it catches fp32 activations that would meet a bf16 weight: TRL's cast_lm_head_to_fp32 on
        tied embeddings casts the embeddings' output back to fp32, which fails without autocast
        (tests/test_bf16_generation.py), and accelerate's autocast wrapper covers only the forward it wrapped (PEFT's
        generate calls the base model's)."""
        model = self.accelerator.unwrap_model(self.model)
        with bf16_weights(model) if self.generate_from_bf16 else nullcontext(), self._cast_once():
            yield

    def _generate_single_turn(self, prompt_ids, *args, **kwargs):  # S5
        with self._generation_precision():
            return super()._generate_single_turn(prompt_ids, *args, **kwargs)
