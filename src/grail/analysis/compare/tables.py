"""The statistics tables of `grail compare`'s report.md (rendered by grail.analysis.compare.report): a statistic's
cell, the per-arm and paired tables over seeds with their checks that do not assume normality, each arm's change
from before RL, and the seeds needed to resolve a difference."""

from __future__ import annotations

from grail.analysis.compare.summary import RESOLVE_POINTS, SEED_COUNTS

__all__ = ["cell", "change_lines", "change_table", "resolution_lines", "spread", "stat_tables", "table"]


def cell(stat: dict, scale: float, digits: int, signed: bool = False) -> str:
    if stat["mean"] is None:
        return "–"
    sign = "+" if signed else ""
    text = f"{scale * stat['mean']:{sign}.{digits}f}"
    if stat["half_width"] is None:
        return f"{text} (1 seed)"
    return (f"{text} ± {scale * stat['half_width']:.{digits}f} "
            f"[{scale * stat['low']:{sign}.{digits}f}, {scale * stat['high']:{sign}.{digits}f}]")


def spread(stat: dict, digits: int) -> str:
    if stat["mean"] is None:
        return "–"
    return f"{stat['mean']:.{digits}f} [{min(stat['values']):.{digits}f}, {max(stat['values']):.{digits}f}]"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|",
            *("| " + " | ".join(row) + " |" for row in rows)]


def stat_tables(title: str, stats: dict, arms: list[str], scale: float, digits: int, unit: str,
                 before: dict | None = None) -> list[str]:
    """Per-arm and paired tables of `stats`; `before` (summary's before_rl): first rows, each start before RL."""
    if not stats:
        return []
    names = list(stats)
    starts = (before or {}).get("starts") or {}
    lines = [f"### {title}", "", f"Per arm, mean ± 95% t-interval half-width [low, high] over seeds ({unit}):"]
    if starts:
        lines[-1] += (" the first row" + ("s" if len(starts) > 1 else "") + ", before RL, " +
                      ("is one evaluation of the starting model" if len(starts) == 1 else
                       "are one evaluation of each starting model") +
                      f" by the same protocol (seed {next(iter(starts.values()))['seed']}'s evaluation config), with "
                      "a t-interval over the held-out problems instead of seeds.")
    rows = []
    for start in starts.values():
        label = "before RL" + ("" if len(starts) == 1 else f" ({', '.join(start['arms'])})")
        rows.append([label, "–", *("–" if start["over_problems"].get(m) is None else
                                   cell(start["over_problems"][m], scale, digits) for m in names)])
    lines += [""] + table(["arm", "seeds", *names],
                           rows + [[arm, str(stats[names[0]]["per_arm"][arm]["n"]),
                                    *(cell(stats[m]["per_arm"][arm], scale, digits) for m in names)]
                                   for arm in arms])
    paired = stats[names[0]]["paired"]
    references = list(dict.fromkeys(d["reference"] for d in paired.values()))
    if len(references) == 1:
        lines += ["", f"Paired difference from **{references[0]}** (arm − {references[0]}, per seed, then the "
                  f"t-interval over seeds; {unit}):", ""]
        lines += table(["arm", "paired seeds", *names],
                        [[arm, str(paired[arm]["n"]), *(cell(stats[m]["paired"][arm], scale, digits, signed=True)
                                                        for m in names)] for arm in paired])
    elif paired:
        lines += ["", f"Paired difference from each arm's reference, the first arm at the same swept value (arm − "
                  f"reference, per seed, then the t-interval over seeds; {unit}):", ""]
        lines += table(["arm", "reference", "paired seeds", *names],
                        [[arm, paired[arm]["reference"], str(paired[arm]["n"]),
                          *(cell(stats[m]["paired"][arm], scale, digits, signed=True) for m in names)]
                         for arm in paired])
    return lines + _robust_lines(stats, names, scale, digits) + [""]


def _robust(stat: dict, scale: float, digits: int, with_holm: bool) -> str:
    p, boot = stat.get("sign_flip_p"), stat.get("bootstrap")
    if p is None:
        return "–"
    holm = f" (Holm {stat['holm_p']:.3g})" if with_holm and stat.get("holm_p") is not None else ""
    interval = "" if boot is None else f", [{scale * boot[0]:+.{digits}f}, {scale * boot[1]:+.{digits}f}]"
    t = ""
    if stat.get("t_p") is not None:  # reports rendered before the t-test was added have none
        t_holm = f" (Holm {stat['t_holm_p']:.3g})" if with_holm and stat.get("t_holm_p") is not None else ""
        t = f"t-test p = {stat['t_p']:.3g}{t_holm}; "
    return f"{t}sign-flip p = {p:.3g}{holm}{interval}"


def _robust_lines(stats: dict, names: list[str], scale: float, digits: int) -> list[str]:
    """The paired differences' checks that do not assume normality (grail.analysis.compare.stats), with Holm's
    adjustment of the p over the arms when there are several."""
    paired = stats[names[0]]["paired"]
    if not paired:
        return []
    n = max(d["n"] for d in paired.values())
    several = len(paired) > 1
    holm = (f" In brackets, Holm's adjustment of each p over the {len(paired)} arms compared, the p to read when the "
            "question is whether any arm differs." if several else "")
    return ["", "Tests of the same differences: the paired t-test's two-sided p over seeds, then two checks that do "
            "not assume the differences normal, the exact sign-flip permutation test's two-sided p (with "
            f"{n} seeds it cannot be below {2 / 2**n:.3g}) and a 95% percentile bootstrap interval of the mean over "
            f"seeds.{holm}", "",
            *table(["arm", *names], [[arm, *(_robust(stats[m]["paired"][arm], scale, digits, several)
                                              for m in names)] for arm in paired])]


def change_lines(s: dict) -> list[str]:
    """Each arm's change from before RL, for the headline (non-pass@) metrics."""
    change = (s.get("before_rl") or {}).get("change") or {}
    return change_table("Change from before RL", "accuracy", {m: c for m, c in change.items() if "/pass@" not in m},
                        s["metrics"], s["arms"])


def change_table(title: str, quantity: str, change: dict, stats: dict, arms: list[str]) -> list[str]:
    """The table of `change` ({metric: {arm: summary's before-RL change}}) with its two intervals explained;
    `quantity` names what a problem's value is (its accuracy, its share of completions with an error...)."""
    if not change:
        return []
    lines = [f"### {title}", "",
             "Each arm's mean over seeds minus its start's value before RL (points), with two 95% t-intervals. "
             f"**Paired over problems**: each held-out problem's {quantity}, averaged over the arm's seeds, minus its "
             f"{quantity} before RL, then the t-interval over the problems; this is what one evaluation of the start "
             "supports, and it holds the problems' and the evaluation sampling's variation, but training's "
             "seed-to-seed variation only as far as it differs between problems. **Over seeds**: arm_s − before for "
             "each seed s, then the t-interval over seeds; it holds training's seed-to-seed variation but treats the "
             "before value as exact.", ""]
    rows = []
    for m in change:
        for arm in arms:
            c = change[m].get(arm)
            if c is None:
                continue
            after = stats[m]["per_arm"][arm]["mean"]
            rows.append([arm, m, f"{100 * c['before']:.1f}", "–" if after is None else f"{100 * after:.1f}",
                         "–" if c["over_problems"] is None else cell(c["over_problems"], 100.0, 1, signed=True)
                         + f" ({c['over_problems']['n']} problems)",
                         cell(c["over_seeds"], 100.0, 1, signed=True)])
    return lines + table(["arm", "metric", "before RL", "after RL (mean over seeds)", "change, paired over problems",
                           "change, over seeds"], rows) + [""]


def resolution_lines(s: dict) -> list[str]:
    primary, arms = s["primary_metric"], s["arms"]
    lines = [f"### Seeds needed ({primary})", ""]
    if not s["resolution"]:
        return lines + ["Not available: it needs at least two seeds and two arms (the standard deviation of the "
                        "per-seed differences).", ""]
    spread = s["metrics"][primary]["per_arm"]
    lines += ["Seed-to-seed standard deviation of each arm's " + primary + ": " + ", ".join(
        f"{arm} {100 * spread[arm]['sd']:.2f} points" for arm in arms if spread[arm]["sd"] is not None) + ".", ""]
    lines += [f"The 95% interval's half-width with S seeds is t_{{0.975,S−1}} · sd / √S, where sd is the observed "
              f"standard deviation of the per-seed differences from the arm's reference. A difference smaller than the "
              f"half-width is not resolved; to detect a true difference d with 80% power needs "
              f"(t_{{0.975,S−1}} + t_{{0.80,S−1}}) · sd / √S ≤ d; at the seeds this comparison has, that d is the "
              f"smallest true difference it would detect with 80% power (a difference it leaves undetected may still "
              f"be there if it is smaller). Points of {primary}:", ""]
    header = ["arm", "sd of differences", "detected with 80% power at these seeds",
              *(f"half-width, S={n}" for n in SEED_COUNTS),
              *(f"S for ±{p:g}" for p in RESOLVE_POINTS), *(f"S for 80% power at {p:g}" for p in RESOLVE_POINTS)]
    rows = []
    for arm, r in s["resolution"].items():
        if r["sd_of_differences_points"] == 0:  # every seed gave the same difference: nothing to scale
            rows.append([arm, "0 (every seed gave the same difference)", *["–"] * (len(header) - 2)])
            continue
        paired = s["metrics"][primary]["paired"][arm]
        detectable = r.get("detectable_80pct_power_points")  # absent from a report.json of earlier versions
        rows.append([arm, f"{r['sd_of_differences_points']:.2f}",
                     "–" if detectable is None else f"{detectable:.2f} (S={paired['n']})",
                     *(f"{r['half_width_points'][str(n)]:.2f}" for n in SEED_COUNTS),
                     *(str(r["seeds_for_half_width"][f"{p:g}"] or "> 10000") for p in RESOLVE_POINTS),
                     *(str(r["seeds_for_80pct_power"][f"{p:g}"] or "> 10000") for p in RESOLVE_POINTS)])
    return lines + table(header, rows) + [""]
