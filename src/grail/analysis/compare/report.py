"""The report of `grail compare`: report.json (grail.analysis.compare.summary: statistics over seeds from the
finished runs' files), report.md (rendered here) and PNG plots (grail.analysis.compare.plots) in the
comparison's directory. Plots need matplotlib (Agg backend); without it the report says so and writes no PNG.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from grail.analysis.compare.auroc import AurocPlan
from grail.analysis.compare.plots import POSITION_KEYS, SWEEP_EXTRA, WEIGHT_KEYS, write_plots
from grail.analysis.compare.summary import (
    CHECKPOINT_AUROC_FILE,
    EXTRA_METRICS_FILE,
    LAST_STEPS,
    RESOLVE_POINTS,
    SEED_COUNTS,
    load_runs,
    load_start,
    summarize,
)

__all__ = ["WEIGHT_KEYS", "render_markdown", "write_report"]


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


def _stat_tables(title: str, stats: dict, arms: list[str], scale: float, digits: int, unit: str,
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
                                   _cell(start["over_problems"][m], scale, digits) for m in names)])
    lines += [""] + _table(["arm", "seeds", *names],
                           rows + [[arm, str(stats[names[0]]["per_arm"][arm]["n"]),
                                    *(_cell(stats[m]["per_arm"][arm], scale, digits) for m in names)]
                                   for arm in arms])
    paired = stats[names[0]]["paired"]
    references = list(dict.fromkeys(d["reference"] for d in paired.values()))
    if len(references) == 1:
        lines += ["", f"Paired difference from **{references[0]}** (arm − {references[0]}, per seed, then the "
                  f"t-interval over seeds; {unit}):", ""]
        lines += _table(["arm", "paired seeds", *names],
                        [[arm, str(paired[arm]["n"]), *(_cell(stats[m]["paired"][arm], scale, digits, signed=True)
                                                        for m in names)] for arm in paired])
    elif paired:
        lines += ["", f"Paired difference from each arm's reference, the first arm at the same swept value (arm − "
                  f"reference, per seed, then the t-interval over seeds; {unit}):", ""]
        lines += _table(["arm", "reference", "paired seeds", *names],
                        [[arm, paired[arm]["reference"], str(paired[arm]["n"]),
                          *(_cell(stats[m]["paired"][arm], scale, digits, signed=True) for m in names)]
                         for arm in paired])
    return lines + _robust_lines(stats, names, scale, digits) + [""]


def _robust(stat: dict, scale: float, digits: int, with_holm: bool) -> str:
    p, boot = stat.get("sign_flip_p"), stat.get("bootstrap")
    if p is None:
        return "–"
    holm = f" (Holm {stat['holm_p']:.3g})" if with_holm and stat.get("holm_p") is not None else ""
    interval = "" if boot is None else f", [{scale * boot[0]:+.{digits}f}, {scale * boot[1]:+.{digits}f}]"
    return f"p = {p:.3g}{holm}{interval}"


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
    return ["", "The same differences without assuming them normal: the exact sign-flip permutation test's "
            "two-sided p over seeds, and a 95% percentile bootstrap interval of the mean over seeds "
            f"(with {n} seeds no p can be below {2 / 2**n:.3g}).{holm}", "",
            *_table(["arm", *names], [[arm, *(_robust(stats[m]["paired"][arm], scale, digits, several)
                                              for m in names)] for arm in paired])]


def _warmstart_text(warm: dict, arms: list[str]) -> str:
    """The starting model's AUROCs, once per distinct set (arms named where they differ, as across a filler sweep)."""
    groups: dict[str, list[str]] = {}
    for arm in arms:
        if isinstance(warm.get(arm), dict):
            groups.setdefault(json.dumps(warm[arm], sort_keys=True), []).append(arm)
    if not groups:
        return ""
    def values(key):
        return ", ".join(f"{k.removeprefix('auroc/')} {v:.3f}" for k, v in json.loads(key).items())
    if len(groups) == 1:
        return f" The starting model every run began from (step 0, before RL): {values(next(iter(groups)))}."
    return " At the start (step 0, before RL), under each arm's own task and weighting settings: " + "; ".join(
        f"{', '.join(group)}: {values(key)}" for key, group in groups.items()) + "."


def _sweep_lines(s: dict) -> list[str]:
    """The headline metric (and the final model's GRAIL-weight AUROC) per series × swept value, and each series'
    paired difference from the reference series at that value."""
    sweep, primary = s["sweep"], s["primary_metric"]
    if not sweep or primary not in s["metrics"]:
        return []
    values, series = sweep["values"], sweep["series"]
    lines = [f"## Sweep over {sweep['field']}", "",
             f"Rows: the arms of --arms; columns: {sweep['field']}. Each arm is paired with the first arm at the same "
             f"value. Mean ± 95% t half-width over seeds.", ""]
    tables = [(f"{primary} (percent)", s["metrics"][primary], 100.0, 1, "points")]
    if SWEEP_EXTRA in s["extra_metrics"]:
        tables.append((f"{SWEEP_EXTRA} of the final model", s["extra_metrics"][SWEEP_EXTRA], 1.0, 3, "raw"))
    for title, stats, scale, digits, unit in tables:
        def short(stat, scale=scale, digits=digits):
            if stat is None or stat["mean"] is None:
                return "–"
            sign = "+" if stat.get("reference") else ""
            half = "" if stat["half_width"] is None else f" ± {scale * stat['half_width']:.{digits}f}"
            return f"{scale * stat['mean']:{sign}.{digits}f}{half}"
        lines += [f"**{title}**", ""]
        lines += _table(["arm", *values], [[name, *(short(stats["per_arm"].get(by_value.get(v))) if v in by_value
                                                    else "–" for v in values)] for name, by_value in series.items()])
        lines += ["", f"Paired difference from the reference at each value ({unit}):", ""]
        rows = [[name, *(short(stats["paired"].get(by_value.get(v))) for v in values)]
                for name, by_value in series.items() if any(by_value.get(v) in stats["paired"] for v in values)]
        lines += _table(["arm − reference", *values], rows) + [""]
    return lines


def _auroc_training_lines(s: dict) -> list[str]:
    """Saliency AUROC over training: step 0 (the starting model) and each checkpoint, mean over seeds."""
    curves = s.get("auroc_training") or {}
    names = [n for n in curves if n.endswith("/signal")]
    if not names:
        return []
    steps = sorted({int(step) for n in names for arm in curves[n].values() for step in arm})
    lines = ["### Saliency AUROC over training", "",
             f"The AUROC of each method's signal (critical vs filler tokens) at step 0 (the starting model, before RL) "
             f"and at every checkpoint still on disk (`{CHECKPOINT_AUROC_FILE}`), mean over seeds; steps "
             f"{', '.join(map(str, steps))}:", ""]
    header = ["arm", *(n.removeprefix("auroc/").removesuffix("/signal") for n in names)]
    rows = []
    for arm in s["arms"]:
        cells = []
        for n in names:
            points = curves[n].get(arm, {})
            cells.append(" → ".join(f"{points[str(t)]['mean']:.3f}" for t in steps if str(t) in points) or "–")
        rows.append([arm, *cells])
    return lines + _table(header, rows) + [""]


def _setting_lines(s: dict) -> list[str]:
    """The report's first lines: the model(s) compared and where they come from, the data, the steps, the base."""
    setting = s.get("setting")
    if not setting:
        return []
    starts = setting["starts"]
    lines = []
    for start in starts:
        arms = "" if len(starts) == 1 else f" (arms {', '.join(start['arms'])})"
        lines.append(f"**Model{arms}**: `{start['model']}`: {start['text']}.  ")
    steps = setting["max_steps"]
    steps = f"{steps} per run" if isinstance(steps, int) else "per arm: " + ", ".join(map(str, steps))
    lines += [f"**Training data**: {setting['data']}.  ", f"**Steps**: {steps}.  ",
              f"**Base config**: {setting['base_source']}." + ("  " if setting.get("amendments") else "")]
    for amendment in setting.get("amendments", []):
        changed = [f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in amendment["fields"].items()]
        changed += ["checkpoints dropped once a run finishes"] if amendment.get("drop_checkpoints") else []
        if changed:
            lines.append(f"**Checkpointing changed on resume** ({amendment['at']}; for the runs not finished then, "
                         f"no number depends on it): {', '.join(changed)}.  ")
        if amendment.get("seeds"):
            lines.append(_extension_line(amendment["at"], amendment["seeds"]))
    return lines + [""]


def _extension_line(at: str, seeds: dict) -> str:
    """An extension's record (grail.analysis.compare.plan.amend_plan): when, from and to, and the paired intervals of
    the headline metric the report showed before it."""
    before = seeds.get("before")
    text = f"**Seeds extended on resume** ({at}): from {seeds['from']} to {seeds['to']} per arm"
    if not before or not before["paired"]:
        return text + "; no paired interval had been reported before.  "
    shown = [f"{arm} {_cell(d, 100.0, 1, signed=True)} over {d['n']} seeds"
             + ("" if d.get("sign_flip_p") is None else f" (sign-flip p = {d['sign_flip_p']:.3g})")
             for arm, d in before["paired"].items()]
    return text + f"; before it, the paired differences in {before['metric']} (points) were: {'; '.join(shown)}.  "


def _start_phrase(s: dict) -> str:
    """How the runs start, as it happened: one warm-started model, one pretrained model, or several starts."""
    starts = (s.get("setting") or {}).get("starts")
    if not starts:
        return "every run starts from the same model"
    if len(starts) > 1:
        return (f"the arms start from {len(starts)} different models (above), every run of an arm from its arm's "
                f"model")
    return ("every run starts from the same warm-started model" if starts[0]["warm_start"] else
            "every run starts from the same pretrained model, without a warm start")


def _change_lines(s: dict) -> list[str]:
    """Each arm's change from before RL, for the headline (non-pass@) metrics."""
    change = (s.get("before_rl") or {}).get("change") or {}
    names = [m for m in change if "/pass@" not in m]
    if not names:
        return []
    lines = ["### Change from before RL", "",
             "Each arm's mean over seeds minus its start's value before RL (points), with two 95% t-intervals. "
             "**Paired over problems**: each held-out problem's accuracy, averaged over the arm's seeds, minus its "
             "accuracy before RL, then the t-interval over the problems; this is what one evaluation of the start "
             "supports, and it holds the problems' and the evaluation sampling's variation, but training's "
             "seed-to-seed variation only as far as it differs between problems. **Over seeds**: arm_s − before for "
             "each seed s, then the t-interval over seeds; it holds training's seed-to-seed variation but treats the "
             "before value as exact.", ""]
    rows = []
    for m in names:
        for arm in s["arms"]:
            c = change[m].get(arm)
            if c is None:
                continue
            after = s["metrics"][m]["per_arm"][arm]["mean"]
            rows.append([arm, m, f"{100 * c['before']:.1f}", "–" if after is None else f"{100 * after:.1f}",
                         "–" if c["over_problems"] is None else _cell(c["over_problems"], 100.0, 1, signed=True)
                         + f" ({c['over_problems']['n']} problems)",
                         _cell(c["over_seeds"], 100.0, 1, signed=True)])
    return lines + _table(["arm", "metric", "before RL", "after RL (mean over seeds)", "change, paired over problems",
                           "change, over seeds"], rows) + [""]


def _seed_range(s: dict) -> str:
    first = s.get("first_seed", 0)
    return f" (seeds {first}..{first + s['seeds'] - 1})" if first else ""


def render_markdown(s: dict, plots: list[str], plot_note: str, jobs: int) -> str:
    arms, seeds = s["arms"], s["seeds"]
    proto = s["protocol"]
    lines = ["# grail compare", "", *_setting_lines(s),
             f"{len(arms)} arms × {seeds} seeds{_seed_range(s)}; {_start_phrase(s)}, and seed s sets "
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
        lines.append(f"**Partial**: {len(s['runs']) - len(unfinished)} of {len(s['runs'])} runs finished; every "
                     f"table, interval and plot is over the finished runs alone. Not finished (left out): "
                     f"{', '.join(unfinished)}. Stopping or extending on what a partial report shows (peeking) breaks "
                     f"the intervals' 95% coverage: fix that rule in advance (on the interval's width, never its "
                     f"sign).")
    lines += ["", "## Held-out accuracy", ""]
    lines += _stat_tables("Accuracy (percent)", s["metrics"], arms, 100.0, 1, "percent; differences in points",
                          before=s.get("before_rl"))
    lines += _change_lines(s)
    lines += _resolution_lines(s)
    lines += _sweep_lines(s)
    if s["extra_metrics"]:
        rows = AurocPlan.of(s).describe()
        lines += ["## Extra per-run metrics", "", f"From each run's `{EXTRA_METRICS_FILE}`. `auroc/<method>/<signal|"
                  "weights>`: the AUROC of critical vs filler tokens of the final model's per-token signal or weights "
                  f"under that method (grail.analysis.compare.auroc, on {rows}; 0.5 = no separation); "
                  "`signal_matched`: the signal's, comparing only tokens at the same distance from the answer."
                  + _warmstart_text(s.get("auroc_warmstart") or {}, arms), ""]
        lines += _stat_tables("Extra metrics", s["extra_metrics"], arms, 1.0, 3, "raw values")
    lines += _auroc_training_lines(s)
    lines += ["## Token-weight diagnostics", "",
              "Each run's mean over the logged training steps (a step whose groups all agree logs none), then "
              "mean ± t half-width over seeds. `weights/adv_scale_ratio` = mean |Â| / mean |A| (1 for GRPO).", ""]
    w = s["weights"]
    lines += _table(["arm", *(k.removeprefix("weights/") for k in WEIGHT_KEYS),
                     "position profile (tenths 1→10 of the reasoning, mean weight)"],
                    [[arm, *(_cell(w[k][arm], 1.0, 3) for k in WEIGHT_KEYS),
                      " ".join("–" if w[k][arm]["mean"] is None else f"{w[k][arm]['mean']:.2f}" for k in POSITION_KEYS)]
                     for arm in arms])
    c = s.get("completions") or {}
    if any(c[k][arm]["mean"] is not None for k in c for arm in arms):
        lines += ["", "## Completions during training", "",
                  f"TRL's completion statistics: each run's mean over all logged steps and over its last {LAST_STEPS}, "
                  f"then mean ± t half-width over seeds. `clipped_ratio`: the fraction of completions cut at "
                  f"max_completion_length before they ended (no answer box, reward 0), which grows with filler words.",
                  ""]
        lines += _table(["arm", *(k.removeprefix("completions/") for k in c)],
                        [[arm, *(_cell(c[k][arm], 1.0, 3) for k in c)] for arm in arms])
    t = s["timing"]
    lines += ["", "## Wall time", "",
              f"Seconds per run, mean [min, max] over the runs that were not resumed (a run resumed in training "
              f"or in evaluation has a clock that covers only its last part); {jobs} run(s) at a time"
              f"{'' if jobs == 1 else ', sharing the machine, so each ran slower than it would alone'}:", ""]
    step = t.get("step_seconds") or {arm: {"mean": None, "n": 0} for arm in arms}  # a report.json of earlier versions
    lines += _table(["arm", "runs timed", "training wall time (s)", "median s/step", "evaluation (s)",
                     "sum of step times (s), every run"],
                    [[arm, str(t["train_seconds"][arm]["n"]), _spread(t["train_seconds"][arm], 1),
                      _spread(t["seconds_per_step"][arm], 3), _spread(t["eval_seconds"][arm], 1),
                      _spread(step[arm], 1) + (f" ({step[arm]['n']})" if step[arm]["mean"] is not None else "")]
                     for arm in arms])
    phases = t.get("eval_phase_seconds") or {}
    if phases:
        lines += ["", "Where the evaluation's time went, seconds per run, mean [min, max] over the same runs: each "
                      "accuracy evaluation's sampling and grading, loading the model and writing, and the evaluations "
                      "after it (the saliency AUROC where the plan asks for it):", ""]
        lines += _table(["arm", *phases], [[arm, *(_spread(phases[k][arm], 1) for k in phases)] for arm in arms])
    total = t.get("total")
    if total and total["runs"]:
        lines += ["", f"The last column sums TRL's per-step time (generation and loss) over each finished run's steps, "
                      f"resumed runs included (their steps count once; work lost to a kill does not), with the number "
                      f"of runs. In total: {total['runs']} finished run(s), {total['resumed']} of them resumed "
                      f"(in training or evaluation); "
                      f"{total['step_seconds'] / 3600:.2f} h of training steps and "
                      f"{total['eval_seconds'] / 3600:.2f} h of evaluation (the start's included)."]
    lines += _code_lines(s.get("code"))
    lines += ["", "## Plots", ""]
    lines += [f"![{p}]({p})" for p in plots] or [plot_note]
    return "\n".join(lines) + "\n"


def _code_lines(c: dict | None) -> list[str]:
    """Which code trained the finished runs (summary's `code`; a report.json of earlier versions has none)."""
    if not c or not c["runs"]:
        return []
    text = (f"From the runs' code.jsonl (one line per start and per resume): {c['attempts']} attempt(s) of the "
            f"{c['runs'] - c['runs_without_record']} finished run(s) that have one")
    if c["runs_without_record"]:
        text += f"; {c['runs_without_record']} finished run(s) trained before grail-rl wrote it"
    lines = ["", "## Code", "", text + ".", ""]
    if c["attempts"]:
        lines += _table(["grail-rl commit", "attempts"], [[key, str(n)] for key, n in c["commits"].items()])
        lines += ["", "Versions: " + "; ".join(f"{name} {', '.join(seen)}" for name, seen in c["versions"].items())
                  + "."]
    return lines


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
    return lines + _table(header, rows) + [""]


def write_report(out_dir: str | Path, plan: dict, jobs: int = 1, into: str | Path | None = None) -> dict:
    """report.json, report.md and the PNGs in out_dir (or `into`), from the runs' files in out_dir; returns
    report.json's content. `jobs`: how many runs trained at a time (the wall-time table says so; report.json keeps it
    for a later re-render)."""
    from grail.analysis.compare.start import describe_setting

    out_dir = Path(out_dir)
    into = out_dir if into is None else Path(into)
    start = load_start(out_dir, [a["label"] for a in plan["arms"]])
    runs = load_runs(out_dir, plan, start)
    summary = {"setting": describe_setting(plan, out_dir), **summarize(plan, runs, start)}
    try:
        plots, note = write_plots(summary, [r for r in runs if r.result is not None], into), ""
    except ImportError:
        plots, note = [], "No plots: matplotlib is not installed (`pip install matplotlib`, then rerun the command)."
    summary["plots"], summary["jobs"] = plots, jobs
    for name, text in (("report.json", json.dumps(summary, indent=2) + "\n"),
                       ("report.md", render_markdown(summary, plots, note, jobs))):
        temporary = into / f".{name}.tmp"
        temporary.write_text(text)
        os.replace(temporary, into / name)
    return summary
