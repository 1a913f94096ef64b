"""The PNG plots of `grail compare`'s report (matplotlib, Agg backend), from report.json's content and the runs'
training logs (grail.analysis.compare.report). Every plot says in its title what a line, a band and an error bar are.

    accuracy.png         per arm: each seed's value and the mean ± 95% t-interval of the headline metrics
    differences.png      each paired arm's per-seed difference from its reference, and the mean ± t-interval
    learning_curves.png  training reward (moving average) against step: mean over seeds, band min–max; with the
                         held-out headline metric before RL as the step-0 point and each arm's after RL (mean ±
                         95% t-interval over seeds) at its last step
    weights.png          the weight diagnostics against step, and the position profile
    sweep.png            with --sweep: the headline metric, the paired difference and the final model's GRAIL-weight
                         AUROC against the swept value, one line per arm of --arms
    auroc_training.png   with the saliency AUROC: each method's AUROC at step 0 (the start) and every checkpoint
"""

from __future__ import annotations

from pathlib import Path

from grail.analysis.compare.sweep import numeric_values

__all__ = ["POSITION_KEYS", "SWEEP_EXTRA", "WEIGHT_KEYS", "curve", "smoothed", "write_plots"]

WEIGHT_KEYS = ("weights/ess_ratio", "weights/top10_mass", "weights/clip_low_frac", "weights/clip_high_frac",
               "weights/adv_scale_ratio")  # the report's weight diagnostics (table and weights.png)
POSITION_KEYS = tuple(f"weights/position_{i}" for i in range(10))
SWEEP_EXTRA = "auroc/grail/weights"  # the extra metric the sweep table and plot show beside the headline metric
SMOOTH_STEPS = 10  # the learning-curve plot's moving-average window (report.json keeps the raw values)


def curve(log: list[dict], key: str) -> dict[int, float]:
    """step → value of `key` over a training log (metrics.jsonl lines; those that hold it)."""
    return {int(line["step"]): float(line[key]) for line in log if isinstance(line.get(key), int | float)}


def write_plots(s: dict, runs: list, out_dir: Path) -> list[str]:
    """The PNGs of the report `s` (grail.analysis.compare.summary.summarize) in out_dir; returns their names. `runs`:
    the report's RunData (arm, log, ...)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = s["arms"]
    groups = _groups(s)
    palette = plt.get_cmap("tab10")
    if s.get("sweep"):  # one colour per arm of --arms, the same at every swept value
        colours = {arm: palette(k % 10) for k, by_value in enumerate(s["sweep"]["series"].values())
                   for arm in by_value.values()}
    else:
        palette = plt.get_cmap("tab10" if len(arms) <= 10 else "tab20")
        colours = {arm: palette(i % palette.N) for i, arm in enumerate(arms)}
    headline = [m for m in s["metrics"] if "/pass@" not in m][:3]
    written = []

    def save(fig, name):
        fig.tight_layout()
        fig.savefig(out_dir / name, dpi=110)
        plt.close(fig)
        written.append(name)

    def seed_panels(kind: str, members: list[str]):
        """One panel per headline metric: each seed's value per arm, and the mean ± 95% t-interval."""
        width, height, rotation = _ticks(len(members))
        fig, axes = plt.subplots(1, len(headline), figsize=(width * len(headline), height), squeeze=False)
        for ax, metric in zip(axes[0], headline, strict=True):
            for i, arm in enumerate(members):
                st = s["metrics"][metric][kind][arm]
                ax.scatter([i] * len(st["values"]), [100 * v for v in st["values"]], color=colours[arm], alpha=0.5,
                           s=18, label="one seed" if i == 0 else None)
                if st["mean"] is not None:
                    err = 0 if st["half_width"] is None else 100 * st["half_width"]
                    ax.errorbar([i + 0.15], [100 * st["mean"]], yerr=[err], fmt="o", color="black", capsize=4,
                                label="mean ± 95% t-interval" if i == 0 else None)
            ax.set_xticks(range(len(members)), members, rotation=rotation, ha="right")
            ax.set_xlim(-0.5, len(members) - 0.5)
        return fig, axes[0]

    if headline:
        fig, axes = seed_panels("per_arm", arms)
        for ax, metric in zip(axes, headline, strict=True):
            ax.set_ylabel("accuracy (%)")
            ax.set_title(f"{metric}\n{s['seeds']} seeds per arm")
            ax.legend(fontsize=8)
        save(fig, "accuracy.png")
    paired = list(s["metrics"][headline[0]]["paired"]) if headline else []
    references = sorted({s["reference"][arm] for arm in paired})
    against = references[0] if len(references) == 1 else "its reference"
    if paired:
        fig, axes = seed_panels("paired", paired)
        for ax, metric in zip(axes, headline, strict=True):
            ax.axhline(0, color="grey", lw=0.8)
            ax.set_ylabel(f"difference from {against} (points)")
            ax.set_title(f"{metric}\narm − {against}, paired by seed")
            ax.legend(fontsize=8)
        save(fig, "differences.png")
    fig, axes = plt.subplots(1, len(groups), figsize=(7 if len(groups) == 1 else 5 * len(groups), 4.5),
                             squeeze=False, sharey=True)
    for ax, (title, members) in zip(axes[0], groups, strict=True):
        for arm, label in members:
            _band(ax, [smoothed(curve(r.log, "reward"), SMOOTH_STEPS) for r in runs if r.arm == arm], colours[arm],
                  label)
        _heldout_points(ax, s, runs, [arm for arm, _ in members], colours)
        ax.set_xlabel("optimizer step")
        ax.set_title(title, fontsize=10)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel(f"mean reward per completion ({SMOOTH_STEPS}-step moving average)")
    fig.suptitle(f"Training reward: mean over seeds (band: min–max over {s['seeds']} seeds)"
                 + (f"\n★ held-out {s['primary_metric']} before RL; ◆ after RL (mean ± 95% t)"
                    if s["primary_metric"] in s.get("before_rl", {}).get("change", {}) else ""), fontsize=10)
    save(fig, "learning_curves.png")
    fig, axes = plt.subplots(2, 3, figsize=(14, 7.5))
    for ax, key in zip(axes.flat, WEIGHT_KEYS, strict=False):
        for arm in arms:
            _band(ax, [curve(r.log, key) for r in runs if r.arm == arm], colours[arm], arm)
        ax.set_xlabel("optimizer step")
        ax.set_ylabel(key.removeprefix("weights/"))
        ax.set_title(key)
        ax.xaxis.get_major_locator().set_params(integer=True)
    ax = axes.flat[-1]
    for arm in arms:
        profile = [s["weights"][k][arm]["mean"] for k in POSITION_KEYS]
        if all(v is not None for v in profile):
            ax.plot(range(1, 11), profile, marker="o", color=colours[arm], label=arm)
    ax.set_xlabel("tenth of the reasoning (before \\boxed{)")
    ax.set_ylabel("mean token weight")
    ax.set_title("weights/position_0..9 (mean over steps, seeds)")
    fig.suptitle(f"Token-weight diagnostics over training: mean over {s['seeds']} seeds per arm, band min–max")
    for a in axes.flat:
        if a.get_legend_handles_labels()[0]:
            a.legend(fontsize=7)
    save(fig, "weights.png")
    if s.get("sweep") and s["primary_metric"] in s["metrics"]:
        save(_sweep_figure(plt, s), "sweep.png")
    if any(n.endswith("/signal") for n in s.get("auroc_training") or {}):
        save(_auroc_figure(plt, s, colours, groups), "auroc_training.png")
    return written


def _heldout_points(ax, s: dict, runs: list, arms: list[str], colours: dict) -> None:
    """The held-out headline metric on the learning curve's axes: each start's value before RL at step 0 (one star
    per start) and each arm's mean ± 95% t-interval over seeds at its last logged step."""
    primary = s["primary_metric"]
    change = (s.get("before_rl") or {}).get("change", {}).get(primary, {})
    starts = dict.fromkeys(change[arm]["start"] for arm in arms if arm in change)
    for k, sid in enumerate(starts):
        ax.scatter([0], [s["before_rl"]["starts"][sid]["metrics"][primary]], marker="*", s=140, color="black",
                   zorder=3, label=f"before RL: held-out {primary}" if k == 0 else None)
    for arm in arms:
        stat = s["metrics"].get(primary, {}).get("per_arm", {}).get(arm)
        steps = [max(curve(r.log, "reward")) for r in runs if r.arm == arm and curve(r.log, "reward")]
        if arm not in change or stat is None or stat["mean"] is None or not steps:
            continue
        ax.errorbar([max(steps)], [stat["mean"]], yerr=[stat["half_width"] or 0.0], fmt="D", color=colours[arm],
                    capsize=4, zorder=3)


def _groups(s: dict) -> list[tuple[str, list[tuple[str, str]]]]:
    """Panels of the per-step plots: [(title, [(arm, legend label)])]: one panel of every arm, or with a sweep one
    panel per swept value, its arms labelled by their arm of --arms."""
    if not s.get("sweep"):
        return [("", [(arm, arm) for arm in s["arms"]])]
    sweep = s["sweep"]
    return [(f"{sweep['field']} = {v}", [(by_value[v], name) for name, by_value in sweep["series"].items()
                                         if v in by_value]) for v in sweep["values"]]


def _ticks(n: int) -> tuple[float, float, int]:
    """(panel width, figure height, tick rotation) for n arm labels on an x axis."""
    return (4.5, 4.0, 20) if n <= 5 else (max(4.5, 0.42 * n + 1.5), 5.5, 55)


def _sweep_figure(plt, s: dict):
    """The headline metric against the swept value per arm of --arms, the paired difference from the reference arm
    at each value, and (when measured) the final model's GRAIL-weight AUROC: mean ± 95% t-interval over seeds."""
    sweep, primary = s["sweep"], s["primary_metric"]
    values, series = sweep["values"], sweep["series"]
    xs = numeric_values(tuple(values)) or list(range(len(values)))
    panels = [(s["metrics"][primary], "per_arm", f"{primary} (%)", 100.0),
              (s["metrics"][primary], "paired", f"{primary}: arm − reference (points)", 100.0)]
    if SWEEP_EXTRA in s["extra_metrics"]:
        panels.append((s["extra_metrics"][SWEEP_EXTRA], "per_arm", f"{SWEEP_EXTRA} (final model)", 1.0))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.3), squeeze=False)
    palette = plt.get_cmap("tab10")
    width = (max(xs) - min(xs) or 1.0) * 0.012
    for ax, (stats, kind, ylabel, scale) in zip(axes[0], panels, strict=True):
        for k, (name, by_value) in enumerate(series.items()):
            points = [(x + (k - len(series) / 2) * width, stats[kind][by_value[v]])
                      for x, v in zip(xs, values, strict=True) if by_value.get(v) in stats[kind]]
            points = [(x, st) for x, st in points if st["mean"] is not None]
            if not points:
                continue
            ax.errorbar([x for x, _ in points], [scale * st["mean"] for _, st in points],
                        yerr=[0 if st["half_width"] is None else scale * st["half_width"] for _, st in points],
                        marker="o", capsize=3, color=palette(k % 10), label=name)
        if kind == "paired":
            ax.axhline(0, color="grey", lw=0.8)
        if numeric_values(tuple(values)) is None:
            ax.set_xticks(xs, values)
        ax.set_xlabel(sweep["field"])
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7)
    fig.suptitle(f"Sweep over {sweep['field']}: mean ± 95% t-interval over {s['seeds']} seeds\n"
                 f"differences: each arm paired with the first arm at the same value")
    return fig


def _auroc_figure(plt, s: dict, colours: dict, groups: list):
    """AUROC of each method's signal against step: step 0 is the starting model, then every checkpoint on disk; one
    column per method, one row per panel group (one, or one per swept value)."""
    curves = s["auroc_training"]
    names = [n for n in curves if n.endswith("/signal")]
    fig, axes = plt.subplots(len(groups), len(names), figsize=(max(8.0, 4.2 * len(names)), 3.8 * len(groups)),
                             squeeze=False,
                             sharey=True)
    for row, (title, members) in zip(axes, groups, strict=True):
        for ax, name in zip(row, names, strict=True):
            for arm, label in members:
                points = sorted((int(t), p) for t, p in curves[name].get(arm, {}).items())
                if not points:
                    continue
                steps = [t for t, _ in points]
                ax.plot(steps, [p["mean"] for _, p in points], marker="o", color=colours[arm], label=label)
                ax.fill_between(steps, [p["min"] for _, p in points], [p["max"] for _, p in points],
                                color=colours[arm], alpha=0.15)
            ax.axhline(0.5, color="grey", lw=0.8, ls="--")
            ax.set_xlabel("optimizer step (0: before RL)")
            ax.set_title(f"{name}" + (f"\n{title}" if title else ""), fontsize=10)
        row[0].set_ylabel("AUROC, critical vs filler tokens")
        row[0].legend(fontsize=7)
    fig.suptitle(f"Saliency AUROC over training: mean over {s['seeds']} seeds\nband min–max; 0.5: no separation")
    return fig


def smoothed(values: dict[int, float], window: int) -> dict[int, float]:
    """Trailing moving average over the last `window` logged steps (fewer at the start): a step's reward is the mean
    of one small batch, too noisy to compare arms by eye."""
    steps = sorted(values)
    return {step: sum(values[s] for s in steps[max(0, i - window + 1) : i + 1]) / (i + 1 - max(0, i - window + 1))
            for i, step in enumerate(steps)}


def _band(ax, curves: list[dict[int, float]], colour, label: str) -> None:
    """Mean over the curves at each step they share with any, and the min–max band."""
    steps = sorted({step for c in curves for step in c})
    if not steps:
        return
    values = [[c[step] for c in curves if step in c] for step in steps]
    ax.plot(steps, [sum(v) / len(v) for v in values], color=colour, label=label)
    ax.fill_between(steps, [min(v) for v in values], [max(v) for v in values], color=colour, alpha=0.2)
