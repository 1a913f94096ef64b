"""GRAIL's floor: the least its fused probe could cost. The fused path reads the saliency from the loss's own forward,
so what it adds to a step is one backward from the answer NLL to the leaf (the embeddings' output), with no parameter
gradients, plus the weighting pipeline. Its floor is that backward alone, on the probed rows alone:

    forward (TRL's log-prob method, as the fused path calls it) of the rows `probe_rows` selects, untimed;
    timed: d(answer NLL) / d(leaf output) with torch.autograd.grad (input-only: no parameter .grad written).

The fused probe runs its backward on the whole micro-batch (unprobed rows contribute zeros but are still computed)
and then the pipeline, so probe / floor > 1 measures both: how far the fused design is from an input-only backward
of the rows it needs. perf/step_overhead.py measures it after each timed `grail` step, on that step's rollout.
"""

from __future__ import annotations

import time


def input_only_backward(trainer, model, batch: dict, clock=time.perf_counter) -> dict | None:
    """Seconds of the input-only backward of the probed rows of `batch` (a rollout's output, as the loss receives
    it); None when no row is probed."""
    import torch

    from grail.methods import probes
    from grail.methods.weighting import probe_rows

    mask_BT = trainer.real_token_mask(batch)
    spans = trainer._spans(batch, mask_BT)
    options = trainer.weighting
    rows_B = probe_rows(batch["advantages"], spans, mask_BT, options, spec=trainer.method)
    if not bool(rows_B.any()):
        return None
    ids_PL = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)[rows_B]
    mask_PL = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)[rows_B]
    leaf = probes.leaf_module(trainer.accelerator.unwrap_model(model), options.saliency_leaf)
    with probes.output_of(leaf) as captured:
        logps_PT = trainer._get_per_token_logps_and_entropies(model, ids_PL, mask_PL,
                                                              batch["completion_ids"].shape[1])[0]
    if len(captured) != 1:
        raise RuntimeError(f"probe floor: the leaf module ran {len(captured)} times in one forward (expected 1).")
    nll = -(logps_PT * spans.probe_span(options.answer_nll_span)[rows_B]).sum()
    start = clock()
    probes.leaf_gradient(nll, captured[0])
    return {"seconds": clock() - start, "rows": int(rows_B.sum())}
