"""The position profile of `saliency_auroc`'s results as one matplotlib figure per model.

`plot_position_profiles(results, model, path)`: one panel per method; x = relative position in the reasoning (bin
centres of `grail.analysis.saliency.position.position_profile`), y = the mean within-trace percentile of the critical
and of the filler (or format) tokens, for the method's signal (solid) and weights (dashed); the panel title gives
the pooled and the position-matched AUROC. matplotlib is imported inside the function (an optional dependency).
"""

from __future__ import annotations

import math
from pathlib import Path

__all__ = ["plot_position_profiles"]


def _label(result) -> str:
    matched = result.matched.auroc if result.matched is not None else math.nan
    return f"{result.auroc:.2f} pooled, {matched:.2f} matched"


def plot_position_profiles(results: dict, model: str, path: str | Path, *, contrast: str = "filler",
                           stat: str = "rank") -> Path:
    """Write the figure of one model's results to `path` (.png, .svg or .pdf); returns the path.

    Args:
        results: `saliency_auroc`'s {method: {"signal": AurocResult, "weights": AurocResult}}, with profiles.
        model: the model's name, for the title. contrast: what the filler class is called ("format" for the
            natural-contrast set). stat: "rank" (mean within-trace percentile, comparable across methods) or
            "mean" (mean raw score).
    """
    if stat not in ("rank", "mean"):
        raise ValueError(f"stat={stat!r}: choose 'rank' (within-trace percentile) or 'mean' (raw score).")
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a server
    import matplotlib.pyplot as plt

    methods = [m for m, parts in results.items() if parts["signal"].profile is not None]
    if not methods:
        raise ValueError("no result has a position profile; pass saliency_auroc's results.")
    cols = min(3, len(methods))
    rows = math.ceil(len(methods) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False, sharey=stat == "rank")
    for ax, method in zip(axes.flat, methods, strict=False):
        for part, style in (("signal", "-"), ("weights", "--")):
            profile = results[method][part].profile
            if profile is None or not any(profile.critical_count):
                continue
            x = [(k + 0.5) / profile.bins for k in range(profile.bins)]
            ax.plot(x, getattr(profile, f"critical_{stat}"), style, color="tab:red", marker=".",
                    label=f"critical, {part}")
            ax.plot(x, getattr(profile, f"filler_{stat}"), style, color="tab:blue", marker=".",
                    label=f"{contrast}, {part}")
        ax.set_title(f"{method}: {_label(results[method]['signal'])}", fontsize=9)
        ax.set_xlabel("position / reasoning length")
        ax.set_xlim(0, 1)
        if stat == "rank":
            ax.axhline(0.5, color="grey", lw=0.5)
            ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(methods):]:
        ax.axis("off")
    axes.flat[0].set_ylabel("mean within-trace percentile" if stat == "rank" else "mean score")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(f"{model}: signal (solid) and weights (dashed) by position, critical vs {contrast}", fontsize=10)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
