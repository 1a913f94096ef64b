"""A model's parameters computed in bf16 for the duration of a block, its fp32 master weights put back after.

Why: CPU bf16 training keeps fp32 master weights and runs its matmuls under autocast (`grail.models.precision`), and
in generation autocast is the wrong tool. Sampling 16 rows of 64 tokens after an 88-token prompt from SmolLM2
(`perf/benchmarks/bf16_generation.py`, one thread, docs/results/cpu-step-native.md) took 16.2-19.4 s in fp32,
14.4-15.6 s under one autocast region over the fp32 weights and 11.9-12.0 s from a bf16 copy of the model: under
autocast every layer casts its activations to bf16 and back (13% of the time) and the KV cache stays fp32. From bf16
weights the whole forward, its cache included, is bf16, and the weights are cast once per generation.

What `bf16_weights(model)` guarantees:
  * inside, every floating-point parameter that is not bf16 holds a bf16 cast of its value (`.data` swapped); a
    parameter shared by two modules (tied embeddings and output layer) is one Parameter and is cast once, so it stays
    shared; buffers are left as they are (rotary `inv_freq` stays fp32, as in a model loaded in bf16);
  * after, on a normal exit or an exception, every parameter is the same Parameter object (the optimizer's) back on
    its own fp32 storage: bit-identical values, nothing copied, its `.grad` untouched.
Its limit: a change of a parameter's dtype makes autograd drop the parameter's gradient accumulator (torch's
`Tensor.data` setter), and the next backward makes a new one, so a hook registered on the old accumulator never fires
again (one registered with `register_post_accumulate_grad_hook` survives). DDP's reducer hangs its gradient
all-reduce on those accumulators: on two gloo processes a swap and restore left each rank with its own gradient. So
the trainer swaps on one plain process only (`GRAILTrainer.generate_from_bf16`); DeepSpeed and FSDP, which manage the
parameters' storage themselves, are left out too. tests/test_bf16_generation.py pins the accumulator's replacement.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

__all__ = ["bf16_weights"]


@contextmanager
def bf16_weights(model: torch.nn.Module):
    """Swap each floating-point parameter of `model` to a bf16 cast of itself for the block, and back after."""
    masters: list[tuple[torch.nn.Parameter, torch.Tensor]] = []  # (parameter, its own tensor), each parameter once
    try:
        for param in model.parameters():  # yields a shared (tied) parameter once
            if param.is_floating_point() and param.dtype != torch.bfloat16:
                master = param.data
                param.data = master.to(torch.bfloat16)
                masters.append((param, master))
        yield
    finally:
        for param, master in masters:
            param.data = master
