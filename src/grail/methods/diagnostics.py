"""Weight diagnostics as additive statistics: where the credit goes (docs/reference/metrics.md).

Pure tensor functions (torch only, no `.item()`). A batch gives `weight_sums`: sums and counts (and one max), all
0-dim or (num_bins,) tensors on the batch's device. Sums from several micro-batches and processes add up (and the
max takes the max), so the trainer accumulates them on the device with no host synchronisation inside the loss
forward, reduces them across processes once per logging step, and `finish` turns the pooled sums into the metric
values. Token statistics are pooled over tokens and row statistics over rows, whatever the micro-batch or process
they came from; `weight_diagnostics` is the same for one batch.

The rows described are those that carry a policy gradient: A_i ≠ 0 and ≥ 1 real token (a row with A = 0 has Â = 0
whatever its weights). Â = w · A is passed in, computed once per micro-batch by the caller.

Dimension letters: B rows, T completion tokens (grail/__init__.py has the package's legend).
"""

from __future__ import annotations

import torch

__all__ = ["CLIP_TOL", "RELEASE_KEYS", "finish", "release_diagnostics", "weight_diagnostics", "weight_sums"]

CLIP_TOL = 1e-6  # a weight within this of w_min / w_max counts as clipped
RELEASE_KEYS = ("clip_low_frac", "clip_high_frac", "adv_scale_ratio")  # weights/release/*: the GRAIL release's own


def weight_sums(weights_BT: torch.Tensor, adv_B: torch.Tensor, adv_BT: torch.Tensor, mask_BT: torch.Tensor,
                reasoning_BT: torch.Tensor, normalised_BT: torch.Tensor, *, weight_min: float, weight_max: float,
                num_bins: int = 10, clip_BT: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Additive statistics of one batch's weights (see the module docstring); `finish` turns them into metrics.

    Args:
        weights_BT: (B, T) weights ≥ 0. adv_B: (B,) advantages. adv_BT: (B, T) Â = w · A. mask_BT: (B, T) bool
            real tokens. reasoning_BT: (B, T) bool, the reasoning tokens (before `\\boxed{`). normalised_BT:
            (B, T) bool, the tokens whose weight came from normalisation (`SaliencyWeights.normalised_BT`).
        clip_BT: optional (B, T) int8, −1 / +1 where the affine weight was clipped at w_min / w_max before any
            override or rescale (`SaliencyWeights.clip_BT`). Given, clip_low / clip_high count it on the normalised
            tokens instead of comparing weights_BT with the bounds: with `weight_rescale="row_mean"` the final
            weights no longer sit at them. (The random control permutes a row's values over its reasoning tokens,
            which are its normalised tokens, so the row's counts are the same either way.)
    Returns float32 tensors: `max` (reduce by max) and sums (reduce by sum): tokens, weight_sum, abs_token_adv
    (Σ|Â|), abs_adv (Σ|A| over the same tokens), normalised, clip_low, clip_high (token counts), rows, ess_sum,
    ess_rows, top10_sum, top10_rows (row sums and counts), reasoning_tokens, reasoning_dev_sum, reasoning_dev_sq
    (count, Σ(w − 1) and Σ(w − 1)² over reasoning tokens), position_sum, position_count ((num_bins,)).
    """
    w = weights_BT.detach().float()
    mask = mask_BT.bool()
    adv = adv_B.detach().float()
    rows_B = (adv != 0) & mask.any(dim=1)
    tok = mask & rows_B[:, None]
    tokf = tok.float()
    zero = torch.zeros((), device=w.device)
    out = {"tokens": tokf.sum(), "weight_sum": (w * tokf).sum(), "max": torch.cat([torch.where(tok, w, 0.0)
                                                                                    .flatten(), zero[None]]).max()}
    norm = normalised_BT.bool() & tok
    out["normalised"] = norm.float().sum()
    if clip_BT is None:
        out["clip_low"] = ((w <= weight_min + CLIP_TOL) & norm).float().sum()
        out["clip_high"] = ((w >= weight_max - CLIP_TOL) & norm).float().sum()
    else:
        out["clip_low"] = ((clip_BT < 0) & norm).float().sum()
        out["clip_high"] = ((clip_BT > 0) & norm).float().sum()
    a_BT = adv_BT.detach().float()
    out["abs_token_adv"] = (a_BT.abs() * tokf).sum()
    out["abs_adv"] = (adv.abs()[:, None] * tokf).sum()
    out["rows"] = rows_B.float().sum()
    out.update(_ess(w, tokf, rows_B))
    out.update(_top10(a_BT, tok, rows_B))
    out.update(_reasoning_spread(w, reasoning_BT.bool() & tok))
    out.update(_position_profile(w, reasoning_BT.bool() & tok, num_bins))
    return out


def _ess(w: torch.Tensor, tokf: torch.Tensor, rows_B: torch.Tensor) -> dict[str, torch.Tensor]:
    """Row sums of (Σw)² / (T_i · Σw²) (1 = uniform, lower = concentrated) over rows with Σw² > 0."""
    s1, s2, n = (w * tokf).sum(dim=1), (w.square() * tokf).sum(dim=1), tokf.sum(dim=1)
    ok = rows_B & (s2 > 0)
    ess = s1.square() / (n * s2).clamp(min=torch.finfo(torch.float32).tiny)
    return {"ess_sum": torch.where(ok, ess, 0.0).sum(), "ess_rows": ok.float().sum()}


def _top10(a_BT: torch.Tensor, tok: torch.Tensor, rows_B: torch.Tensor) -> dict[str, torch.Tensor]:
    """Row sums of the share of Σ|Â| held by the 10% largest |Â|, k = 0.1 · T_i counted fractionally (the floor(k)
    largest plus (k − floor(k)) × the next), so uniform weights give 0.10 for every T_i; rows with Σ|Â| > 0."""
    ordered = torch.where(tok, a_BT.abs(), -1.0).sort(dim=1, descending=True).values.clamp(min=0.0)  # pad last
    k_B1 = 0.1 * tok.float().sum(dim=1, keepdim=True)
    rank = torch.arange(a_BT.shape[1], device=a_BT.device, dtype=torch.float32)
    share_of_token = (k_B1 - rank).clamp(0.0, 1.0)
    top, total = (ordered * share_of_token).sum(dim=1), ordered.sum(dim=1)
    ok = rows_B & (total > 0)
    return {"top10_sum": torch.where(ok, top / torch.where(total > 0, total, 1.0), 0.0).sum(),
            "top10_rows": ok.float().sum()}


def _reasoning_spread(w: torch.Tensor, reason: torch.Tensor) -> dict[str, torch.Tensor]:
    """Count, Σ(w − 1) and Σ(w − 1)² over the reasoning tokens: `finish` makes their pooled std. The shift by GRPO's
    weight 1 (a constant, so the sums still add up) keeps the one-pass variance E[d²] − E[d]² accurate in float32,
    where the weights sit near 1 and E[w²] − E[w]² would cancel."""
    d = torch.where(reason, w - 1.0, 0.0)
    return {"reasoning_tokens": reason.float().sum(), "reasoning_dev_sum": d.sum(),
            "reasoning_dev_sq": d.square().sum()}


def _position_profile(w: torch.Tensor, reason: torch.Tensor, num_bins: int) -> dict[str, torch.Tensor]:
    """Weight sums and token counts per position bin: the j-th (0-based) of a row's R reasoning tokens goes to bin
    floor(num_bins · j / R)."""
    j = reason.long().cumsum(dim=1) - 1
    r = reason.long().sum(dim=1, keepdim=True).clamp(min=1)
    bins = torch.where(reason, (num_bins * j).div(r, rounding_mode="floor"), num_bins)  # overflow bin for others
    sums = torch.zeros(num_bins + 1, device=w.device).scatter_add_(0, bins.flatten(),
                                                                   torch.where(reason, w, 0.0).flatten())
    counts = torch.zeros(num_bins + 1, device=w.device).scatter_add_(0, bins.flatten(), reason.float().flatten())
    return {"position_sum": sums[:num_bins], "position_count": counts[:num_bins]}


def finish(sums: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Metric values from (pooled) `weight_sums`, with the values of an empty selection:
        mean, max: mean / max weight over the described tokens (0 if none).
        clip_low_frac, clip_high_frac: fraction of normalised tokens with w ≤ w_min + 1e-6 (resp. ≥ w_max − 1e-6);
            0 if there is no normalised token.
        adv_scale_ratio: Σ|Â| / Σ|A| over the described tokens; 1 if none.
        ess_ratio, top10_mass: row means (1 and 0.1, the uniform values, if no row).
        reasoning_std: population std of the weights of the reasoning tokens (before `\\boxed{`), pooled over
            tokens; 0 if none. How far the weights of the tokens that carry the reasoning spread: GRAIL's z-score
            over the whole completion compresses it (docs/methods/grail.md, zscore_scope).
        position_profile: (num_bins,) token-pooled mean weight per bin (0 for an empty bin); position_count.
    """
    def ratio(num, den, empty):
        return torch.where(den > 0, num / den.clamp(min=torch.finfo(torch.float32).tiny), torch.full_like(num, empty))

    return {
        "mean": ratio(sums["weight_sum"], sums["tokens"], 0.0),
        "max": sums["max"],
        "clip_low_frac": ratio(sums["clip_low"], sums["normalised"], 0.0),
        "clip_high_frac": ratio(sums["clip_high"], sums["normalised"], 0.0),
        "adv_scale_ratio": ratio(sums["abs_token_adv"], sums["abs_adv"], 1.0),
        "ess_ratio": ratio(sums["ess_sum"], sums["ess_rows"], 1.0),
        "top10_mass": ratio(sums["top10_sum"], sums["top10_rows"], 0.1),
        "reasoning_std": _pooled_std(sums["reasoning_dev_sum"], sums["reasoning_dev_sq"], sums["reasoning_tokens"]),
        "position_profile": sums["position_sum"] / sums["position_count"].clamp(min=1.0),
        "position_count": sums["position_count"],
    }


def _pooled_std(dev_sum: torch.Tensor, dev_sq: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """sqrt(E[d²] − E[d]²) from the sums of d and d² over `count` values (0 if none; rounding below 0 → 0)."""
    n = count.clamp(min=1.0)
    return ((dev_sq / n) - (dev_sum / n).square()).clamp(min=0.0).sqrt()


def weight_diagnostics(weights_BT: torch.Tensor, adv_B: torch.Tensor, mask_BT: torch.Tensor,
                       reasoning_BT: torch.Tensor, normalised_BT: torch.Tensor, *, weight_min: float,
                       weight_max: float, num_bins: int = 10,
                       clip_BT: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """`finish(weight_sums(...))` for one batch, with Â = w · A formed here (arguments as `weight_sums`)."""
    adv_BT = weights_BT.detach().float() * adv_B.detach().float()[:, None]
    return finish(weight_sums(weights_BT, adv_B, adv_BT, mask_BT, reasoning_BT, normalised_BT,
                              weight_min=weight_min, weight_max=weight_max, num_bins=num_bins, clip_BT=clip_BT))


def release_diagnostics(adv_B: torch.Tensor, adv_BT: torch.Tensor, mask_BT: torch.Tensor, clip_BT: torch.Tensor,
                        reweighted_BT: torch.Tensor) -> dict[str, torch.Tensor]:
    """The GRAIL release's own definitions of three logged statistics, for comparison with its logs. They differ
    from `weight_diagnostics`' on purpose; both are logged (docs/reference/metrics.md).

    Keys (0-dim float32; per micro-batch and process, as the release computes them; the trainer averages them
    over micro-batches and processes, as the release averages them over processes):
        clip_low_frac, clip_high_frac: fraction of the reweighted rows' real tokens whose affine weight was clipped
            at w_min (resp. w_max), counted BEFORE the answer-span overrides, so box and post-box tokens count;
            NaN when no token is reweighted (the release then logs nothing).
        adv_scale_ratio: (Σ |Â| over real tokens / number of real tokens) / (mean over ALL rows of |A| + 1e-8);
            every row counts, A = 0 and fully masked rows included.

    Args:
        adv_B: (B,) advantages. adv_BT: (B, T) Â = w · A. mask_BT: (B, T) bool real tokens.
        clip_BT: (B, T) int8 from `SaliencyWeights.clip_BT`. reweighted_BT: (B, T) bool, the tokens it describes
            (real tokens of the rows the normalisation ran on).
    """
    mask = mask_BT.bool()
    active = reweighted_BT.bool() & mask
    n_active = active.float().sum()
    nan = torch.full((), float("nan"), device=adv_BT.device)
    low, high = ((clip_BT < 0) & active).float().sum(), ((clip_BT > 0) & active).float().sum()
    per_token = (adv_BT.detach().float().abs() * mask).sum() / mask.float().sum().clamp(min=1.0)
    return {
        "clip_low_frac": torch.where(n_active > 0, low / n_active.clamp(min=1.0), nan),
        "clip_high_frac": torch.where(n_active > 0, high / n_active.clamp(min=1.0), nan),
        "adv_scale_ratio": per_token / (adv_B.detach().float().abs().mean() + 1e-8),
    }
