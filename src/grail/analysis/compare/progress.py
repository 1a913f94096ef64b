"""`grail compare`'s progress lines: one per run started, finished or stopped, and a status line every
STATUS_EVERY_S with runs done / running / left, elapsed time, an ETA, and each running run's latest step (read from
its metrics.jsonl). Used by grail.analysis.compare.schedule."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from grail.analysis.compare.plan import STATUS_EVERY_S
from grail.analysis.compare.run import Log, run_values
from grail.analysis.compare.summary import RESULT_FILE, clock_complete, run_path

__all__ = ["Progress", "latest_step", "recent_steps", "run_cost"]


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def latest_step(run_dir: Path, since: float = 0.0) -> int | None:
    """The step of the last complete line of metrics.jsonl; None if the file was last written before `since` (a
    wall-clock time): a restarted run's file still holds its previous attempt's steps until the trainer starts over or
    cuts it back to the checkpoint it resumes from."""
    return recent_steps(run_dir, since)[0]


def recent_steps(run_dir: Path, since: float = 0.0) -> tuple[int | None, float | None]:
    """(the latest step, the median `step_time` of the last complete lines) of metrics.jsonl, read from its last
    16 KB (about ten steps); (None, None) as `latest_step` says, and a None median when no line has a step time."""
    path = run_dir / "metrics.jsonl"
    try:
        if path.stat().st_mtime < since:
            return None, None
        with path.open("rb") as f:
            start = max(0, f.seek(0, os.SEEK_END) - 16384)
            f.seek(start)
            lines = f.read().split(b"\n")[:-1]  # the last is unfinished (or empty)
        records = [json.loads(line) for line in lines[1 if start else 0:] if line.strip()]  # a window cuts the first
        steps = [r for r in records if "step" in r]
        if not steps:
            return None, None
        times = sorted(float(r["step_time"]) for r in steps if isinstance(r.get("step_time"), (int, float)))
        return int(steps[-1]["step"]), (times[len(times) // 2] if times else None)
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None, None


def run_cost(result: dict) -> dict:
    """What a finished run (its compare_result.json) took, for the ETA: `seconds`, the whole run (its wall clock when
    that covers all of it, else its median training step × its steps + its evaluation); `per_step` and `eval`, those
    parts (None when not recorded); `whole`: False when `seconds` covers only a part (a resumed run whose result lacks
    the step time), so an ETA from it is a lower bound."""
    wall, per_step, steps = result.get("wall_seconds", 0.0), result.get("seconds_per_step"), result.get("steps")
    evaluation = result.get("eval_seconds")
    cost = {"seconds": wall, "per_step": per_step, "eval": evaluation, "whole": clock_complete(result)}
    if not cost["whole"] and per_step and steps and evaluation is not None:
        cost.update(seconds=per_step * steps + evaluation, whole=True)
    return cost


def _mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


class Progress:
    """One line per start and finish, and a status line every STATUS_EVERY_S: done / running / left, elapsed, ETA
    and each running run's latest step. The ETA: each run not started costs the mean of the finished runs (run_cost);
    each running one, `_remaining`; the sum over the jobs. Before any run has finished, a run not started costs the
    running runs' steps (max_steps × their own recent seconds a step), evaluations left out. It says `≥` when a
    finished run's time covers only part of it or no evaluation is timed. `done`: run name → run_cost of its
    result."""

    def __init__(self, plan: dict, out_dir: Path, total: int, done: dict[str, dict], jobs: int,
                 log: Log, on_finished=lambda: None):
        self.plan, self.out_dir, self.total, self.jobs, self.log = plan, out_dir, total, jobs, log
        self.on_finished = on_finished  # called after each run that finished well (run_comparison: the archive)
        self.costs = dict(done)  # run name → run_cost
        self.running: dict[str, float] = {}  # run name → start time
        self.wall_start: dict[str, float] = {}  # run name → its start, wall clock (file times)
        self.failed = 0
        self.start = self.last = time.perf_counter()

    def _arm(self, name: str) -> tuple[dict, int]:
        slug, seed = name.rsplit("/seed", 1)
        return next(a for a in self.plan["arms"] if a["slug"] == slug), int(seed)

    def _remaining(self, name: str, step: int | None, own_per_step: float | None, max_steps, now: float,
                   mean: float | None) -> tuple[float, bool] | None:
        """(seconds left of a running run, whether they cover all of it); None when nothing tells. Its steps left ×
        the seconds a step of its arm's finished runs took (else its own recent steps', else any arm's), plus an
        evaluation as its arm's (else any arm's) took; with no evaluation timed yet, the steps alone: a lower
        bound. Without a step: the mean run less the time it has run."""
        arm, _ = self._arm(name)
        own = [c for n, c in self.costs.items() if self._arm(n)[0]["slug"] == arm["slug"]]
        per_step = (_mean([c["per_step"] for c in own]) or own_per_step
                    or _mean([c["per_step"] for c in self.costs.values()]))
        evaluation = _mean([c["eval"] for c in own]) or _mean([c["eval"] for c in self.costs.values()])
        if step is None or per_step is None or not isinstance(max_steps, int):
            return None if mean is None else (max(0.0, mean - (now - self.running[name])), True)
        return max(0, max_steps - step) * per_step + (evaluation or 0.0), evaluation is not None

    def _line(self) -> str:
        now = time.perf_counter()
        left = self.total - len(self.costs) - len(self.running)
        failed = f" ({self.failed} failed)" if self.failed else ""
        text = (f"{len(self.costs)}/{self.total} done, {len(self.running)} running, {left} left{failed} | "
                f"elapsed {_duration(now - self.start)}")
        steps, remaining, known, lower, fresh_runs = [], 0.0, True, False, []
        whole = [c["seconds"] for c in self.costs.values() if c["whole"]]
        timed = whole or [c["seconds"] for c in self.costs.values()]
        mean = _mean(timed)
        for name in self.running:
            arm, seed = self._arm(name)
            step, own_per_step = recent_steps(run_path(self.out_dir, arm["slug"], seed), since=self.wall_start[name])
            max_steps = None
            if step is not None:  # the arm's record, or an earlier plan's raw values
                values = arm.get("resolved") or run_values(self.plan, arm, seed, self.out_dir)
                max_steps = values.get("max_steps")
                steps.append(f"{arm['label']}/seed{seed} step {step}/{max_steps or '?'}")
                if own_per_step is not None and isinstance(max_steps, int):
                    fresh_runs.append(max_steps * own_per_step)
            part = self._remaining(name, step, own_per_step, max_steps, now, mean)
            known, remaining = known and part is not None, remaining + (part[0] if part else 0.0)
            lower = lower or (part is not None and not part[1])
        if mean is None and fresh_runs:  # nothing finished (so `whole` is empty: a lower bound): a run not started
            mean = _mean(fresh_runs)      # costs the running ones' steps
        if mean is not None and known:  # from the runs whose time covers all of them; else a lower bound
            remaining += left * mean
            bound = "≥ " if lower or not whole else ""
            note = " (steps only: no evaluation timed yet)" if not self.costs else ""
            text += f" | eta {bound}{_duration(remaining / self.jobs)}{note}"
        return text + (f" | {', '.join(steps)}" if steps else "")

    def started(self, name: str) -> None:
        self.running[name], self.wall_start[name] = time.perf_counter(), time.time()
        self.log(f"compare: started {name} | {self._line()}")

    def finished(self, name: str, ok: bool = True) -> None:
        seconds = time.perf_counter() - self.running.pop(name)
        if ok:
            arm, seed = self._arm(name)
            self.costs[name] = _run_cost_of(run_path(self.out_dir, arm["slug"], seed), seconds)
        else:
            self.failed += 1
        self.log(f"compare: {'finished' if ok else 'FAILED'} {name} in {_duration(seconds)} | {self._line()}")
        if ok:
            self.on_finished()
        self.last = time.perf_counter()

    def stopped(self, name: str) -> None:
        """A run a stop signal ended before it finished (it resumes): neither done nor failed."""
        seconds = time.perf_counter() - self.running.pop(name)
        self.log(f"compare: stopped {name} after {_duration(seconds)} | {self._line()}")
        self.last = time.perf_counter()

    def tick(self) -> None:
        if time.perf_counter() - self.last >= STATUS_EVERY_S:
            self.last = time.perf_counter()
            self.log(f"compare: {self._line()}")


def _run_cost_of(run_dir: Path, seconds: float) -> dict:
    """run_cost of a run that just finished; `seconds` (its time in this process) when its result cannot be read."""
    try:
        return run_cost(json.loads((run_dir / RESULT_FILE).read_text()))
    except (OSError, ValueError):
        return {"seconds": seconds, "per_step": None, "eval": None, "whole": False}
