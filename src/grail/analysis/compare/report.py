"""The report of `grail compare`: report.json (grail.analysis.compare.summary: statistics over seeds from the
finished runs' files), report.md (rendered here; its statistics tables in grail.analysis.compare.tables) and PNG plots
(grail.analysis.compare.plots) in the comparison's directory. Plots need matplotlib (Agg backend); without it the
report says so and writes no PNG."""

from __future__ import annotations

import json
import os
from pathlib import Path

from grail.analysis.compare.auroc import AurocPlan
from grail.analysis.compare.errors import first_error_lines, first_error_summary
from grail.analysis.compare.plots import POSITION_KEYS, SWEEP_EXTRA, WEIGHT_KEYS, write_plots
from grail.analysis.compare.sharpening import sharpening_lines, sharpening_summary
from grail.analysis.compare.summary import (
    CHECKPOINT_AUROC_FILE,
    EXTRA_METRICS_FILE,
    LAST_STEPS,
    load_runs,
    load_start,
    summarize,
)
from grail.analysis.compare.tables import cell, change_lines, resolution_lines, spread, stat_tables, table

__all__ = ["WEIGHT_KEYS", "render_markdown", "write_report"]


# ---- markdown --------------------------------------------------------------------------------------------------

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


def _mechanism_text(extra: dict) -> str:
    """What the position-fixed AUROC and the label log-probabilities are, when the report has them (a comparison
    measured before they existed renders as it did)."""
    text = ""
    if any(name.endswith("/signal_fixed") for name in extra):
        text += (" `signal_fixed` (a counterbalanced set): the signal's with position held fixed, 0.5 for any signal "
                 "of position alone.")
    if any(name.startswith("logp/") for name in extra):
        text += (" `logp/<critical|contrast>`: the model's mean log-probability of the critical and of the contrast "
                 "tokens of the same rows' reference solutions (the start's follow); an arm's difference from the "
                 "reference arm is where its update went that the reference's did not.")
    return text


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
        lines += table(["arm", *values], [[name, *(short(stats["per_arm"].get(by_value.get(v))) if v in by_value
                                                    else "–" for v in values)] for name, by_value in series.items()])
        lines += ["", f"Paired difference from the reference at each value ({unit}):", ""]
        rows = [[name, *(short(stats["paired"].get(by_value.get(v))) for v in values)]
                for name, by_value in series.items() if any(by_value.get(v) in stats["paired"] for v in values)]
        lines += table(["arm − reference", *values], rows) + [""]
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
    return lines + table(header, rows) + [""]


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
    shown = [f"{arm} {cell(d, 100.0, 1, signed=True)} over {d['n']} seeds"
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
    lines += stat_tables("Accuracy (percent)", s["metrics"], arms, 100.0, 1, "percent; differences in points",
                          before=s.get("before_rl"))
    lines += change_lines(s)
    lines += resolution_lines(s)
    lines += first_error_lines(s)
    lines += sharpening_lines(s)
    lines += _sweep_lines(s)
    if s["extra_metrics"]:
        rows = AurocPlan.of(s).describe()
        lines += ["## Extra per-run metrics", "", f"From each run's `{EXTRA_METRICS_FILE}`. `auroc/<method>/<signal|"
                  "weights>`: the AUROC of critical vs filler tokens of the final model's per-token signal or weights "
                  f"under that method (grail.analysis.compare.auroc, on {rows}; 0.5 = no separation); "
                  "`signal_matched`: the signal's, comparing only tokens at the same distance from the answer."
                  + _mechanism_text(s["extra_metrics"]) + _warmstart_text(s.get("auroc_warmstart") or {}, arms), ""]
        lines += stat_tables("Extra metrics", s["extra_metrics"], arms, 1.0, 3, "raw values")
    lines += _auroc_training_lines(s)
    lines += ["## Token-weight diagnostics", "",
              "Each run's mean over the logged training steps (a step whose groups all agree logs none), then "
              "mean ± t half-width over seeds. `weights/adv_scale_ratio` = mean |Â| / mean |A| (1 for GRPO).", ""]
    w = s["weights"]
    lines += table(["arm", *(k.removeprefix("weights/") for k in WEIGHT_KEYS),
                     "position profile (tenths 1→10 of the reasoning, mean weight)"],
                    [[arm, *(cell(w[k][arm], 1.0, 3) for k in WEIGHT_KEYS),
                      " ".join("–" if w[k][arm]["mean"] is None else f"{w[k][arm]['mean']:.2f}" for k in POSITION_KEYS)]
                     for arm in arms])
    c = s.get("completions") or {}
    if any(c[k][arm]["mean"] is not None for k in c for arm in arms):
        lines += ["", "## Completions during training", "",
                  f"TRL's completion statistics: each run's mean over all logged steps and over its last {LAST_STEPS}, "
                  f"then mean ± t half-width over seeds. `clipped_ratio`: the fraction of completions cut at "
                  f"max_completion_length before they ended (no answer box, reward 0), which grows with filler words. "
                  f"`entropy`: the policy's mean token entropy on its completions (nats), which falls as sampling "
                  f"sharpens: a gain in sampled accuracy with a faster fall may be sharper sampling, not better "
                  f"reasoning.", ""]
        lines += table(["arm", *(k.removeprefix("completions/") for k in c)],
                        [[arm, *(cell(c[k][arm], 1.0, 3) for k in c)] for arm in arms])
    t = s["timing"]
    lines += ["", "## Wall time", "",
              f"Seconds per run, mean [min, max] over the runs that were not resumed (a run resumed in training "
              f"or in evaluation has a clock that covers only its last part); {jobs} run(s) at a time"
              f"{'' if jobs == 1 else ', sharing the machine, so each ran slower than it would alone'}:", ""]
    step = t.get("step_seconds") or {arm: {"mean": None, "n": 0} for arm in arms}  # a report.json of earlier versions
    lines += table(["arm", "runs timed", "training wall time (s)", "median s/step", "evaluation (s)",
                     "sum of step times (s), every run"],
                    [[arm, str(t["train_seconds"][arm]["n"]), spread(t["train_seconds"][arm], 1),
                      spread(t["seconds_per_step"][arm], 3), spread(t["eval_seconds"][arm], 1),
                      spread(step[arm], 1) + (f" ({step[arm]['n']})" if step[arm]["mean"] is not None else "")]
                     for arm in arms])
    ratios = {arm: r for arm, r in (t.get("step_ratio") or {}).items() if r["ratio"]["n"]}
    if ratios:  # a report.json of earlier versions has none
        lines += ["", "Training step time against the reference arm, paired by seed (the sum of TRL's step times of "
                      "each run): the ratio, and the share of the arm's step time the reference's step does not spend "
                      "(its token weights and any extra work in the loss), mean [min, max] over seeds"
                      f"{'' if jobs == 1 else '; runs that shared the machine make both noisy'}:", ""]
        lines += table(["arm", "reference", "seeds", "step time ÷ reference's", "share beyond the reference's step"],
                        [[arm, r["reference"], str(r["ratio"]["n"]), spread(r["ratio"], 2),
                          spread(r["extra_share"], 2)] for arm, r in ratios.items()])
    shares = t.get("weights_share") or {}  # a report.json of earlier versions has none
    if any(shares[arm]["n"] for arm in shares):
        lines += ["", "The token weights' share of each run's training step time (the trainer's own timer around the "
                      "weights, summed over the run's steps, ÷ the sum of TRL's step times), percent, mean [min, max] "
                      "over seeds:", ""]
        lines += table(["arm", "runs", "weights' share of step time (%)"],
                        [[arm, str(shares[arm]["n"]), _percent_spread(shares[arm])] for arm in arms])
    phases = t.get("eval_phase_seconds") or {}
    if phases:
        lines += ["", "Where the evaluation's time went, seconds per run, mean [min, max] over the same runs: each "
                      "accuracy evaluation's sampling and grading, loading the model and writing, and the evaluations "
                      "after it (the saliency AUROC where the plan asks for it):", ""]
        lines += table(["arm", *phases], [[arm, *(spread(phases[k][arm], 1) for k in phases)] for arm in arms])
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
        lines += table(["grail-rl commit", "attempts"], [[key, str(n)] for key, n in c["commits"].items()])
        lines += ["", "Versions: " + "; ".join(f"{name} {', '.join(seen)}" for name, seen in c["versions"].items())
                  + "."]
    return lines


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
    first_errors = first_error_summary(plan, out_dir, runs, start)
    if first_errors:  # chain task only: other reports stay as earlier versions rendered them (--check-report)
        summary["first_errors"] = first_errors
    sharpening = sharpening_summary(plan, runs, start)
    if sharpening:  # a start and runs evaluated greedy and sampled
        summary["sharpening"] = sharpening
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


def _percent_spread(stat: dict) -> str:
    """spread() of a fraction's per-arm stat, in percent with one decimal."""
    if stat["mean"] is None:
        return "–"
    return spread({"mean": 100 * stat["mean"], "values": [100 * v for v in stat["values"]]}, 1)
