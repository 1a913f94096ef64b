"""Shared by the weight tests: random inputs and plain per-row loop references (the slow, obvious version of each
formula in grail.methods.core, grail.methods.bilevel and grail.methods.diagnostics)."""

import math

import torch


def random_batch(seed, B=7, T=13):
    """Positive log-normal signal, a random right-padded mask (row 0 empty, row 1 a single token), NaN padding."""
    g = torch.Generator().manual_seed(seed)
    signal = torch.exp(2.0 * torch.randn(B, T, generator=g))
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    lengths[0], lengths[1] = 0, 1
    mask = torch.arange(T)[None, :] < lengths[:, None]
    signal = torch.where(mask, signal, torch.nan)  # padding values must be ignored
    return signal, mask, g


def ref_log_zscore(signal, mask):
    out = torch.zeros(signal.shape, dtype=torch.float64)
    for i in range(signal.shape[0]):
        idx = [t for t in range(signal.shape[1]) if mask[i, t]]
        if not idx:
            continue
        x = [math.log(float(signal[i, t]) + 1e-8) for t in idx]
        mean = sum(x) / len(x)
        var = sum((v - mean) ** 2 for v in x) / len(x)
        for t, v in zip(idx, x, strict=True):
            out[i, t] = (v - mean) / math.sqrt(var + 1e-8)
    return out


def ref_bilevel(importance, scored, mask, quantile, beta, floor):
    out = mask.to(torch.float64).clone()
    for i in range(importance.shape[0]):
        idx = [t for t in range(importance.shape[1]) if scored[i, t] and mask[i, t]]
        if not idx:
            continue
        ibar = [math.log1p(float(importance[i, t])) for t in idx]
        lo, hi = min(ibar), max(ibar)
        if hi == lo:
            continue  # constant row: ω = 1
        ihat = [(v - lo) / (hi - lo) for v in ibar]
        tau = float(torch.quantile(torch.tensor(ihat, dtype=torch.float64), quantile))
        omega = []
        for v in ihat:
            if v < tau:
                omega.append(max(v / tau, floor))
            else:
                omega.append(1.0 + beta * (v - tau) / (1.0 - tau) if tau < 1 else 1.0)
        scale = len(idx) / sum(omega)
        for t, o in zip(idx, omega, strict=True):
            out[i, t] = o * scale
    return out


def ref_diagnostics(weights, adv, mask, reasoning, num_bins):
    """ess_ratio, top10_mass and the position profile, one row and one token at a time."""
    ess, top, sums, counts = [], [], [0.0] * num_bins, [0] * num_bins
    for i in range(weights.shape[0]):
        a = float(adv[i])
        idx = [t for t in range(weights.shape[1]) if mask[i, t]]
        if a == 0 or not idx:
            continue
        w = [float(weights[i, t]) for t in idx]
        if sum(v * v for v in w) > 0:
            ess.append(sum(w) ** 2 / (len(w) * sum(v * v for v in w)))
        mags = sorted((abs(v * a) for v in w), reverse=True)
        if sum(mags) > 0:
            k = 0.1 * len(mags)
            whole = math.floor(k)
            head = sum(mags[:whole]) + (k - whole) * (mags[whole] if whole < len(mags) else 0.0)
            top.append(head / sum(mags))
        reason = [t for t in idx if reasoning[i, t]]
        for j, t in enumerate(reason):
            b = num_bins * j // len(reason)
            sums[b] += float(weights[i, t])
            counts[b] += 1
    profile = [s / c if c else 0.0 for s, c in zip(sums, counts, strict=True)]
    return (sum(ess) / len(ess) if ess else 1.0, sum(top) / len(top) if top else 0.1, profile, counts)
