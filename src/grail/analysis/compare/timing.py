"""Where a comparison's training time went, from each run's training log (metrics.jsonl): the sum of TRL's step
times, each arm's step time against its reference's, and the share of it the token weights took (their own timer).
Pure functions of the logged lines; grail.analysis.compare.summary tabulates them per arm over seeds."""

from __future__ import annotations

from dataclasses import asdict

from grail.analysis.compare.stats import t_interval
from grail.analysis.compare.sweep import Layout

__all__ = ["step_ratios", "step_seconds", "weights_share"]


def _summed(log: list[dict], key: str) -> float | None:
    values = [line[key] for line in log if isinstance(line.get(key), int | float)]
    return sum(values) if values else None


def step_seconds(log: list[dict]) -> float | None:
    """The sum of TRL's `step_time` (generation and loss of one optimiser step) over the run's logged steps: its
    training time as if it had run uninterrupted, also for a resumed run (grail.training.resume cuts metrics.jsonl
    back to the checkpoint, so no step is counted twice; work lost to a kill is not counted)."""
    return _summed(log, "step_time")


def weights_share(log: list[dict]) -> float | None:
    """The share of the run's training step time its token weights took: Σ `weights/seconds` (the trainer's own
    timer around the weights: the probe's forward and backward, or the fused saliency's extra work, and the
    reshaping) ÷ Σ `step_time`, over the steps that log both. Unlike step_ratios it needs no reference run, so it is
    not made noisy by two runs that shared the machine differently. None when the log has neither."""
    steps = [line for line in log if isinstance(line.get("step_time"), int | float)
             and isinstance(line.get("weights/seconds"), int | float)]
    total = sum(line["step_time"] for line in steps)
    return sum(line["weights/seconds"] for line in steps) / total if total > 0 else None


def step_ratios(step_seconds_by_arm: dict[str, dict[int, float]], lay: Layout) -> dict:
    """Each paired arm's training step time against its reference's, paired by seed: the t-interval over seeds of
    ratio = Σ steps' time (arm) / Σ steps' time (reference), and of extra = 1 − 1 / ratio, the share of the arm's
    step time that the reference's step does not spend (its token weights: their forward and backward, and any
    extra work in the loss). A share measured on runs that shared the machine is as noisy as their clocks."""
    out = {}
    for arm in lay.paired:
        mine, base = step_seconds_by_arm[arm], step_seconds_by_arm[lay.baseline[arm]]
        seeds = sorted(s for s in set(mine) & set(base) if base[s] > 0 and mine[s] > 0)
        ratios = [mine[s] / base[s] for s in seeds]
        out[arm] = {"reference": lay.baseline[arm], "seeds": seeds, "ratio": asdict(t_interval(ratios)),
                    "extra_share": asdict(t_interval([1 - 1 / r for r in ratios]))}
    return out
