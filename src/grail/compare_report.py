"""The report of `grail compare`: statistics over seeds from the finished runs' files, as report.md, report.json
and PNG plots in the comparison's directory.

Reads, for each (arm, seed) run directory `runs/<arm-slug>/seed<s>/`:
    compare_result.json   the finished marker: the held-out metrics (fractions), per-problem results, timings
    metrics.jsonl         the training log: `reward` per step (learning curves) and the `weights/*` diagnostics
    extra_metrics.json    optional {name: number}: any further per-run evaluation (the hook for e.g. saliency
                          AUROC); tabulated per arm with the same intervals, and paired against the first arm

Statistics (the unit of replication is the training seed, not the problem):
    per arm    mean over seeds ± t_{0.975, S−1} · sd / √S   (Student t-interval over the S per-seed values)
    paired     d_s = arm_s − first_s for each seed s both have; the same t-interval over the d_s
    seeds      half-width(S) = t_{0.975, S−1} · sd_d / √S; the S that brings it under d points, and the S that
               gives 80% power at a true difference d: (t_{0.975, S−1} + t_{0.80, S−1}) · sd_d / √S ≤ d
With one seed there is no interval (the seed-to-seed spread is unknown); two seeds give one with t = 12.7.
The Student t quantile is computed here (regularised incomplete beta), so no SciPy is needed. Plots need
matplotlib (Agg backend); without it the report says so and writes no PNG.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = [
    "EXTRA_METRICS_FILE", "Interval", "RESULT_FILE", "WEIGHT_KEYS", "load_runs", "paired_interval", "run_path",
    "seeds_needed", "summarize", "t_cdf", "t_interval", "t_quantile", "write_report"
]

RESULT_FILE = "compare_result.json"  # written last by a run: its presence means finished
EXTRA_METRICS_FILE = "extra_metrics.json"
SMOOTH_STEPS = 10  # the learning-curve plot's moving-average window (report.json keeps the raw values)
LEVEL = 0.95
POWER = 0.80
WEIGHT_KEYS = ("weights/ess_ratio", "weights/top10_mass", "weights/clip_low_frac", "weights/clip_high_frac",
               "weights/adv_scale_ratio")
POSITION_KEYS = tuple(f"weights/position_{i}" for i in range(10))
RESOLVE_POINTS = (1.0, 2.0, 5.0)  # differences (points) the seeds-needed table is given for
SEED_COUNTS = (2, 3, 5, 10, 20, 50)


def run_path(out_dir: str | Path, slug: str, seed: int) -> Path:
    """The run directory of one (arm, seed)."""
    return Path(out_dir) / "runs" / slug / f"seed{seed}"


# ---- Student t ------------------------------------------------------------------------------------------------

def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz; Numerical Recipes §6.4)."""
    tiny, h = 1e-300, 0.0
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T ≤ t) for Student's t with df degrees of freedom: 1 − ½·I_{df/(df+t²)}(df/2, ½) for t ≥ 0."""
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t with df > 0 degrees of freedom (bisection on `t_cdf`, to ~1e-12)."""
    if not 0.0 < p < 1.0 or not df > 0:
        raise ValueError(f"t_quantile: need 0 < p < 1 and df > 0; got p={p}, df={df}.")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        low, high = high, 2.0 * high
    for _ in range(200):
        mid = 0.5 * (low + high)
        low, high = (mid, high) if t_cdf(mid, df) < p else (low, mid)
        if high - low < 1e-12 * max(1.0, high):
            break
    return 0.5 * (low + high)


@dataclass(frozen=True)
class Interval:
    """Mean over n values with a t-interval; sd, half_width, low and high are None when n < 2."""

    n: int
    mean: float | None
    sd: float | None = None
    half_width: float | None = None
    low: float | None = None
    high: float | None = None
    values: tuple[float, ...] = ()


def t_interval(values: Sequence[float], level: float = LEVEL) -> Interval:
    """mean ± t_{(1+level)/2, n−1} · sd / √n over `values` (sd with n − 1); no interval for n < 2."""
    values = tuple(float(v) for v in values)
    n = len(values)
    if n == 0:
        return Interval(0, None)
    mean = sum(values) / n
    if n < 2:
        return Interval(n, mean, values=values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = t_quantile((1.0 + level) / 2.0, n - 1) * sd / math.sqrt(n)
    return Interval(n, mean, sd, half, mean - half, mean + half, values)


def paired_interval(base: dict[int, float], other: dict[int, float], level: float = LEVEL) -> Interval:
    """t-interval of other_s − base_s over the seeds s both have (keyed by seed)."""
    seeds = sorted(set(base) & set(other))
    return t_interval([other[s] - base[s] for s in seeds], level)


def seeds_needed(sd: float, difference: float, level: float = LEVEL, power: float | None = None,
                 most: int = 10_000) -> int | None:
    """Smallest S ≥ 2 with t_{(1+level)/2, S−1}·sd/√S ≤ difference (the interval's half-width), or, with `power`,
    (t_{(1+level)/2, S−1} + t_{power, S−1})·sd/√S ≤ difference (a true difference of that size excludes 0 from
    the interval with probability ≈ power). None if more than `most` seeds would be needed."""
    if sd <= 0:
        return 2  # no spread observed: the smallest S with an interval
    def factor(s):
        return t_quantile((1 + level) / 2, s - 1) + (t_quantile(power, s - 1) if power else 0.0)

    low, high = 2, 2
    while factor(high) * sd / math.sqrt(high) > difference:
        if high >= most:
            return None
        low, high = high, min(2 * high, most)
    while low < high:  # the factor·sd/√S decreases in S: bisect for the first S that fits
        mid = (low + high) // 2
        low, high = (mid + 1, high) if factor(mid) * sd / math.sqrt(mid) > difference else (low, mid)
    return low


# ---- reading the runs ----------------------------------------------------------------------------------------

@dataclass
class RunData:
    arm: str
    seed: int
    path: Path
    result: dict | None  # compare_result.json, None while unfinished
    log: list[dict]  # metrics.jsonl lines
    extra: dict[str, float]


def _read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    lines = []
    for line in path.read_text().splitlines():
        try:
            lines.append(json.loads(line))
        except ValueError:
            continue  # a torn last line of a killed run
    return lines


def load_runs(out_dir: str | Path, plan: dict) -> list[RunData]:
    """Every (arm, seed) of the plan with whatever its directory holds."""
    runs = []
    for arm in plan["arms"]:
        for seed in range(plan["seeds"]):
            path = run_path(out_dir, arm["slug"], seed)
            result_file, extra_file = path / RESULT_FILE, path / EXTRA_METRICS_FILE
            result = json.loads(result_file.read_text()) if result_file.is_file() else None
            extra = json.loads(extra_file.read_text()) if extra_file.is_file() else {}
            bad = [k for k, v in extra.items() if not isinstance(v, int | float) or isinstance(v, bool)]
            if bad:
                raise ValueError(f"{extra_file}: {bad[0]!r} is not a number; the file must map names to numbers.")
            runs.append(RunData(arm["label"], seed, path, result, _read_jsonl(path / "metrics.jsonl"), extra))
    return runs


def _key_mean(log: list[dict], key: str) -> float | None:
    values = [line[key] for line in log if isinstance(line.get(key), int | float)]
    return sum(values) / len(values) if values else None


def curve(log: list[dict], key: str) -> dict[int, float]:
    """step → value of `key` over the training log (the lines that hold it)."""
    return {int(line["step"]): float(line[key]) for line in log if isinstance(line.get(key), int | float)}


# ---- statistics ----------------------------------------------------------------------------------------------

def _per_arm(runs: list[RunData], arms: list[str], value_of) -> dict[str, dict[int, float]]:
    """arm → {seed: value} over the runs where value_of(run) is a number."""
    table: dict[str, dict[int, float]] = {arm: {} for arm in arms}
    for run in runs:
        value = value_of(run)
        if value is not None:
            table[run.arm][run.seed] = float(value)
    return table


def _stats(table: dict[str, dict[int, float]], arms: list[str]) -> dict:
    """Per-arm intervals and paired differences against the first arm, JSON-ready."""
    base = table[arms[0]]
    return {"per_arm": {arm: {**asdict(t_interval(list(table[arm].values()))), "seeds": sorted(table[arm])}
                        for arm in arms},
            "paired": {arm: {**asdict(paired_interval(base, table[arm])),
                             "seeds": sorted(set(base) & set(table[arm]))} for arm in arms[1:]}}


def summarize(plan: dict, runs: list[RunData]) -> dict:
    """The content of report.json (see the module docstring for the statistics)."""
    arms = [a["label"] for a in plan["arms"]]
    finished = [r for r in runs if r.result is not None]
    metric_names = list(dict.fromkeys(k for r in finished for k in r.result["metrics"]))
    extra_names = list(dict.fromkeys(k for r in finished for k in r.extra))
    metrics = {m: _stats(_per_arm(finished, arms, lambda r, m=m: r.result["metrics"].get(m)), arms)
               for m in metric_names}
    extra = {m: _stats(_per_arm(finished, arms, lambda r, m=m: r.extra.get(m)), arms) for m in extra_names}
    weights = {k: _stats(_per_arm(finished, arms, lambda r, k=k: _key_mean(r.log, k)), arms)["per_arm"]
               for k in (*WEIGHT_KEYS, *POSITION_KEYS)}
    timing = {k: _stats(_per_arm([r for r in finished if not r.result.get("resumed")], arms,
                                 lambda r, k=k: r.result.get(k)), arms)["per_arm"]
              for k in ("train_seconds", "seconds_per_step", "eval_seconds")}
    primary = plan["protocol"]["primary"]
    resolution = {}
    if primary in metrics:
        for arm, d in metrics[primary]["paired"].items():
            if d["sd"] is None:
                continue
            sd_points = 100 * d["sd"]
            resolution[arm] = {
                "sd_of_differences_points": sd_points,
                "half_width_points": {str(s): t_quantile((1 + LEVEL) / 2, s - 1) * sd_points / math.sqrt(s)
                                      for s in SEED_COUNTS},
                "seeds_for_half_width": {f"{p:g}": seeds_needed(sd_points, p) for p in RESOLVE_POINTS},
                "seeds_for_80pct_power": {f"{p:g}": seeds_needed(sd_points, p, power=POWER) for p in RESOLVE_POINTS},
            }
    return {
        "arms": arms, "seeds": plan["seeds"], "level": LEVEL,
        "interval": "Student t over seeds: mean ± t_{0.975, S-1} · sd / sqrt(S); paired: the same over per-seed "
                    "differences from the first arm",
        "protocol": plan["protocol"], "seed_fields": plan.get("seed_fields", []),
        "runs": [{"arm": r.arm, "seed": r.seed, "run_dir": str(r.path), "finished": r.result is not None}
                 for r in runs],
        "metrics": metrics, "extra_metrics": extra, "weights": weights, "timing": timing,
        "primary_metric": primary, "resolution": resolution,
    }


# ---- markdown --------------------------------------------------------------------------------------------------

def _cell(stat: dict, scale: float, digits: int, signed: bool = False) -> str:
    if stat["mean"] is None:
        return "–"
    sign = "+" if signed else ""
    text = f"{scale * stat['mean']:{sign}.{digits}f}"
    if stat["half_width"] is None:
        return f"{text} (1 seed)"
    return (f"{text} ± {scale * stat['half_width']:.{digits}f} "
            f"[{scale * stat['low']:{sign}.{digits}f}, {scale * stat['high']:{sign}.{digits}f}]")


def _spread(stat: dict, digits: int) -> str:
    if stat["mean"] is None:
        return "–"
    return f"{stat['mean']:.{digits}f} [{min(stat['values']):.{digits}f}, {max(stat['values']):.{digits}f}]"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|",
            *("| " + " | ".join(row) + " |" for row in rows)]


def _stat_tables(title: str, stats: dict, arms: list[str], scale: float, digits: int, unit: str) -> list[str]:
    if not stats:
        return []
    names = list(stats)
    lines = [f"### {title}", "", f"Per arm, mean ± 95% t-interval half-width [low, high] over seeds ({unit}):", ""]
    lines += _table(["arm", "seeds", *names],
                    [[arm, str(stats[names[0]]["per_arm"][arm]["n"]),
                      *(_cell(stats[m]["per_arm"][arm], scale, digits) for m in names)] for arm in arms])
    if len(arms) > 1:
        lines += ["", f"Paired difference from **{arms[0]}** (arm − {arms[0]}, per seed, then the t-interval over "
                  f"seeds; {unit}):", ""]
        lines += _table(["arm", "paired seeds", *names],
                        [[arm, str(stats[names[0]]["paired"][arm]["n"]),
                          *(_cell(stats[m]["paired"][arm], scale, digits, signed=True) for m in names)]
                         for arm in arms[1:]])
    return lines + [""]


def render_markdown(s: dict, plots: list[str], plot_note: str, jobs: int) -> str:
    arms, seeds = s["arms"], s["seeds"]
    proto = s["protocol"]
    lines = ["# grail compare", "",
             f"{len(arms)} arms × {seeds} seeds; every run starts from the same warm-started model and seed s sets "
             f"{', '.join(s['seed_fields'])} = s for every arm, so the arms are paired by seed. "
             f"Evaluation ({proto['kind']}): {proto['description']}.", "",
             "Intervals are 95% Student t-intervals over the training seeds (mean ± t_{0.975,S−1}·sd/√S): they "
             "contain the seed-to-seed variation of training (and evaluation sampling), which the per-problem "
             "bootstrap of `grail demo` does not."]
    if seeds == 1:
        lines.append("With one seed there is no interval: the seed-to-seed spread cannot be estimated from one "
                     "run. Run with --seeds 3 or more.")
    elif seeds == 2:
        lines.append("With two seeds the interval uses t = 12.71 (one degree of freedom): it is very wide.")
    unfinished = [f"{r['arm']}/seed{r['seed']}" for r in s["runs"] if not r["finished"]]
    if unfinished:
        lines.append(f"Not finished (left out): {', '.join(unfinished)}.")
    lines += ["", "## Held-out accuracy", ""]
    lines += _stat_tables("Accuracy (percent)", s["metrics"], arms, 100.0, 1, "percent; differences in points")
    lines += _resolution_lines(s)
    if s["extra_metrics"]:
        lines += ["## Extra per-run metrics", "", f"From each run's `{EXTRA_METRICS_FILE}`. `auroc/<method>/<signal|"
                  "weights>`: the AUROC of critical vs filler tokens of the final model's per-token signal or weights "
                  "under that method (grail.compare_auroc: held-out synthetic problems, 0.5 = no separation)."
                  + (" The warm start every run began from: " + ", ".join(
                      f"{k.removeprefix('auroc/')} {v:.3f}" for k, v in s["auroc_warmstart"].items()) + "."
                     if s.get("auroc_warmstart") else ""), ""]
        lines += _stat_tables("Extra metrics", s["extra_metrics"], arms, 1.0, 3, "raw values")
    lines += ["## Token-weight diagnostics", "",
              "Each run's mean over the logged training steps (a step whose groups all agree logs none), then "
              "mean ± t half-width over seeds. `weights/adv_scale_ratio` = mean |Â| / mean |A| (1 for GRPO).", ""]
    w = s["weights"]
    lines += _table(["arm", *(k.removeprefix("weights/") for k in WEIGHT_KEYS),
                     "position profile (tenths 1→10 of the reasoning, mean weight)"],
                    [[arm, *(_cell(w[k][arm], 1.0, 3) for k in WEIGHT_KEYS),
                      " ".join("–" if w[k][arm]["mean"] is None else f"{w[k][arm]['mean']:.2f}" for k in POSITION_KEYS)]
                     for arm in arms])
    t = s["timing"]
    lines += ["", "## Wall time", "",
              f"Seconds per run, mean [min, max] over the runs that were not resumed (a resumed run's clock covers "
              f"only its last part); {jobs} run(s) at a time"
              f"{'' if jobs == 1 else ', sharing the machine, so each ran slower than it would alone'}:", ""]
    lines += _table(["arm", "runs timed", "training wall time (s)", "median s/step", "evaluation (s)"],
                    [[arm, str(t["train_seconds"][arm]["n"]), _spread(t["train_seconds"][arm], 1),
                      _spread(t["seconds_per_step"][arm], 3), _spread(t["eval_seconds"][arm], 1)] for arm in arms])
    lines += ["", "## Plots", ""]
    lines += [f"![{p}]({p})" for p in plots] or [plot_note]
    return "\n".join(lines) + "\n"


def _resolution_lines(s: dict) -> list[str]:
    primary, arms = s["primary_metric"], s["arms"]
    lines = [f"### Seeds needed ({primary})", ""]
    if not s["resolution"]:
        return lines + ["Not available: it needs at least two seeds and two arms (the standard deviation of the "
                        "per-seed differences).", ""]
    spread = s["metrics"][primary]["per_arm"]
    lines += ["Seed-to-seed standard deviation of each arm's " + primary + ": " + ", ".join(
        f"{arm} {100 * spread[arm]['sd']:.2f} points" for arm in arms if spread[arm]["sd"] is not None) + ".", ""]
    lines += [f"The 95% interval's half-width with S seeds is t_{{0.975,S−1}} · sd / √S, where sd is the observed "
              f"standard deviation of the per-seed differences from {arms[0]}. A difference smaller than the "
              f"half-width is not resolved; to detect a true difference d with 80% power needs "
              f"(t_{{0.975,S−1}} + t_{{0.80,S−1}}) · sd / √S ≤ d. Points of {primary}:", ""]
    header = ["arm", "sd of differences", *(f"half-width, S={n}" for n in SEED_COUNTS),
              *(f"S for ±{p:g}" for p in RESOLVE_POINTS), *(f"S for 80% power at {p:g}" for p in RESOLVE_POINTS)]
    rows = []
    for arm, r in s["resolution"].items():
        if r["sd_of_differences_points"] == 0:  # every seed gave the same difference: nothing to scale
            rows.append([arm, "0 (every seed gave the same difference)", *["–"] * (len(header) - 2)])
            continue
        rows.append([arm, f"{r['sd_of_differences_points']:.2f}",
                     *(f"{r['half_width_points'][str(n)]:.2f}" for n in SEED_COUNTS),
                     *(str(r["seeds_for_half_width"][f"{p:g}"] or "> 10000") for p in RESOLVE_POINTS),
                     *(str(r["seeds_for_80pct_power"][f"{p:g}"] or "> 10000") for p in RESOLVE_POINTS)])
    return lines + _table(header, rows) + [""]


# ---- plots ---------------------------------------------------------------------------------------------------

def _plots(s: dict, runs: list[RunData], out_dir: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = s["arms"]
    colours = {arm: plt.get_cmap("tab10")(i % 10) for i, arm in enumerate(arms)}
    headline = [m for m in s["metrics"] if "/pass@" not in m][:3]
    written = []

    def save(fig, name):
        fig.tight_layout()
        fig.savefig(out_dir / name, dpi=110)
        plt.close(fig)
        written.append(name)

    if headline:
        fig, axes = plt.subplots(1, len(headline), figsize=(4.5 * len(headline), 4), squeeze=False)
        for ax, metric in zip(axes[0], headline, strict=True):
            for i, arm in enumerate(arms):
                st = s["metrics"][metric]["per_arm"][arm]
                ax.scatter([i] * len(st["values"]), [100 * v for v in st["values"]], color=colours[arm], alpha=0.5,
                           s=18, label="one seed" if i == 0 else None)
                if st["mean"] is not None:
                    err = 0 if st["half_width"] is None else 100 * st["half_width"]
                    ax.errorbar([i + 0.15], [100 * st["mean"]], yerr=[err], fmt="o", color="black", capsize=4,
                                label="mean ± 95% t-interval" if i == 0 else None)
            ax.set_xticks(range(len(arms)), arms, rotation=20, ha="right")
            ax.set_xlim(-0.5, len(arms) - 0.5)
            ax.set_ylabel("accuracy (%)")
            ax.set_title(f"{metric}\n{s['seeds']} seeds per arm")
            ax.legend(fontsize=8)
        save(fig, "accuracy.png")
    if headline and len(arms) > 1:
        fig, axes = plt.subplots(1, len(headline), figsize=(4.5 * len(headline), 4), squeeze=False)
        for ax, metric in zip(axes[0], headline, strict=True):
            for i, arm in enumerate(arms[1:]):
                d = s["metrics"][metric]["paired"][arm]
                ax.scatter([i] * len(d["values"]), [100 * v for v in d["values"]], color=colours[arm], alpha=0.5,
                           s=18, label="one seed" if i == 0 else None)
                if d["mean"] is not None:
                    err = 0 if d["half_width"] is None else 100 * d["half_width"]
                    ax.errorbar([i + 0.15], [100 * d["mean"]], yerr=[err], fmt="o", color="black", capsize=4,
                                label="mean ± 95% t-interval" if i == 0 else None)
            ax.axhline(0, color="grey", lw=0.8)
            ax.set_xticks(range(len(arms) - 1), arms[1:], rotation=20, ha="right")
            ax.set_xlim(-0.5, len(arms) - 1.5)
            ax.set_ylabel(f"difference from {arms[0]} (points)")
            ax.set_title(f"{metric}\narm − {arms[0]}, paired by seed")
            ax.legend(fontsize=8)
        save(fig, "differences.png")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for arm in arms:
        _band(ax, [smoothed(curve(r.log, "reward"), SMOOTH_STEPS) for r in runs if r.arm == arm], colours[arm], arm)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(f"mean reward per completion ({SMOOTH_STEPS}-step moving average)")
    ax.set_title(f"Training reward: mean over seeds (band: min–max over {s['seeds']} seeds)")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.legend(fontsize=8)
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
    return written


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


def write_report(out_dir: str | Path, plan: dict, jobs: int = 1) -> dict:
    """report.json, report.md and the PNGs in out_dir, from the runs' files; returns report.json's content."""
    out_dir = Path(out_dir)
    runs = load_runs(out_dir, plan)
    summary = summarize(plan, runs)
    warm = out_dir / "auroc_warmstart.json"  # grail.compare.WARMSTART_AUROC_FILE (this module cannot import it)
    summary["auroc_warmstart"] = json.loads(warm.read_text()) if warm.is_file() else {}
    try:
        plots, note = _plots(summary, runs, out_dir), ""
    except ImportError:
        plots, note = [], "No plots: matplotlib is not installed (`pip install matplotlib`, then rerun the command)."
    summary["plots"] = plots
    for name, text in (("report.json", json.dumps(summary, indent=2) + "\n"),
                       ("report.md", render_markdown(summary, plots, note, jobs))):
        temporary = out_dir / f".{name}.tmp"
        temporary.write_text(text)
        os.replace(temporary, out_dir / name)
    return summary
