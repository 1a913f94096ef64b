"""`WeightSums`: a trainer's weight statistics, accumulated on the device per micro-batch and pooled once per logging
step into the `weights/*` metrics (docs/reference/metrics.md).

Each micro-batch adds `grail.methods.diagnostics.weight_sums` (plus row counts and the GRAIL release's own values)
to one flat device tensor per mode: no host synchronisation inside the loss forward. At a logging step the trainer
gathers every process's tensor once (`local`, stacked by its accelerator) and `pooled_metrics` turns the stack into
metric values, pooled over tokens and rows whatever the micro-batch or process they came from.

Dimension letters: B rows, T completion tokens, K packed statistics, Q processes.
"""

from __future__ import annotations

import torch

from grail.methods import diagnostics
from grail.methods.spec import TokenWeights

__all__ = ["DIAGNOSTIC_KEYS", "NUM_BINS", "SUM_KEYS", "WeightSums", "pooled_metrics"]

NUM_BINS = 10  # weights/position_0..9
# The additive statistics, in the order they are packed into one tensor (then the position bins' sums and counts,
# then the peak weight, which pools by max).
SUM_KEYS = ("tokens", "weight_sum", "normalised", "clip_low", "clip_high", "abs_token_adv", "abs_adv", "rows",
            "ess_sum", "ess_rows", "top10_sum", "top10_rows", "reasoning_tokens", "reasoning_dev_sum",
            "reasoning_dev_sq", "rows_without_box", "fallback_rows",
            "probed_rows", "micro_batches",
            *(f"release_{k}_{part}" for k in diagnostics.RELEASE_KEYS for part in ("sum", "count")))
DIAGNOSTIC_KEYS = ("mean", "max", "clip_low_frac", "clip_high_frac", "adv_scale_ratio", "ess_ratio", "top10_mass")
WIDTH = len(SUM_KEYS) + 2 * NUM_BINS  # K: the packed sums; the peak follows them in `local`


class WeightSums:
    """Per mode ("train", "eval"): the packed sums (K,) and the peak weight () of the micro-batches since the last
    logging step, on the batch's device. `weight_min` / `weight_max`: the run's clip bounds; `count_clips`: count
    GRAIL's own pre-override clips (`TokenWeights.clip_BT`) instead of comparing the final weights with the bounds
    (with `weight_rescale="row_mean"` the final weights leave them)."""

    def __init__(self, weight_min: float, weight_max: float, count_clips: bool):
        self.weight_min, self.weight_max, self.count_clips = weight_min, weight_max, count_clips
        self._sums: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def add(self, mode: str, adv_B: torch.Tensor, adv_BT: torch.Tensor, mask_BT: torch.Tensor,
            weights: TokenWeights) -> None:
        """Add one micro-batch: A (B,), Â = w · A (B, T), the real tokens (B, T) and its weights."""
        stats = diagnostics.weight_sums(weights.weights_BT, adv_B, adv_BT, mask_BT, weights.reasoning_BT & mask_BT,
                                        weights.normalised_BT, weight_min=self.weight_min,
                                        weight_max=self.weight_max, num_bins=NUM_BINS,
                                        clip_BT=weights.clip_BT if self.count_clips else None)
        signal_B = mask_BT.any(1) & (adv_B != 0)  # the rows the diagnostics describe (weight_sums' "rows")
        stats.update(rows_without_box=(signal_B & ~weights.has_box_B).sum(),
                     fallback_rows=weights.fallback_B.sum(), probed_rows=(weights.probed_B & signal_B).sum(),
                     micro_batches=torch.ones((), device=adv_BT.device))
        release = diagnostics.release_diagnostics(adv_B, adv_BT, mask_BT, weights.clip_BT, weights.reweighted_BT)
        for key, value in release.items():  # per micro-batch values, averaged as the release does (NaN: none)
            stats[f"release_{key}_sum"] = torch.nan_to_num(value, nan=0.0)
            stats[f"release_{key}_count"] = (~value.isnan()).float()
        sums_K = torch.cat([*(stats[k].float().reshape(1) for k in SUM_KEYS), stats["position_sum"].float(),
                            stats["position_count"].float()])
        peak = stats["max"].float()
        previous = self._sums.get(mode)
        if previous is not None:
            sums_K, peak = previous[0] + sums_K, torch.maximum(previous[1], peak)
        self._sums[mode] = (sums_K, peak)

    def local(self, mode: str, device) -> torch.Tensor:
        """(1, K + 1): this process's packed sums and peak for `mode` (zeros if nothing was added), and reset them.
        Every process calls it at the same logging step, and the trainer gathers the results into (Q, K + 1)."""
        sums_K, peak = self._sums.pop(mode, (torch.zeros(WIDTH, device=device), torch.zeros((), device=device)))
        return torch.cat([sums_K, peak.reshape(1)]).reshape(1, -1)

    def pending(self, mode: str) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The (sums (K,), peak) accumulated for `mode` so far, without resetting them (None if none)."""
        return self._sums.get(mode)


def pooled_metrics(gathered_QK: torch.Tensor) -> dict[str, float]:
    """The `weights/*` metric values from every process's `WeightSums.local` stacked (Q, K + 1): sums add, the peak
    takes the max. {} when no micro-batch was added anywhere. Rows per micro-batch count every process's."""
    gathered_QK = gathered_QK.cpu()
    total = dict(zip(SUM_KEYS, gathered_QK[:, : len(SUM_KEYS)].sum(0), strict=True))
    if total["micro_batches"] == 0:
        return {}
    bins = gathered_QK[:, len(SUM_KEYS) : WIDTH].sum(0)
    total.update(max=gathered_QK[:, WIDTH].max(), position_sum=bins[:NUM_BINS], position_count=bins[NUM_BINS:])
    out: dict[str, float] = {}
    if total["rows"] > 0:  # micro-batches whose advantages are all 0 have nothing to describe
        values = diagnostics.finish(total)
        out.update({f"weights/{key}": float(values[key]) for key in DIAGNOSTIC_KEYS})
        out.update({f"weights/position_{b}": float(values["position_profile"][b]) for b in range(NUM_BINS)
                    if values["position_count"][b] > 0})
        if total["reasoning_tokens"] > 0:
            out["weights/reasoning_std"] = float(values["reasoning_std"])
        out["weights/rows_without_box"] = float(total["rows_without_box"] / total["rows"])
        out["weights/probed_rows"] = float(total["probed_rows"] / total["rows"])
    for key in diagnostics.RELEASE_KEYS:
        if total[f"release_{key}_count"] > 0:
            out[f"weights/release/{key}"] = float(total[f"release_{key}_sum"] / total[f"release_{key}_count"])
    micro = float(total["micro_batches"]) / gathered_QK.shape[0]
    out["weights/fallback_rows"] = float(total["fallback_rows"]) / micro  # per micro-batch, all processes
    return out
