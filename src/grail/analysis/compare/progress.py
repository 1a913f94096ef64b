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

__all__ = ["Progress", "latest_step", "run_cost"]


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def latest_step(run_dir: Path, since: float = 0.0) -> int | None:
    """The step of the last complete line of metrics.jsonl (reads its last 4 KB); None if the file was last written
    before `since` (a wall-clock time): a restarted run's file still holds its previous attempt's steps until the
    trainer starts over or cuts it back to the checkpoint it resumes from."""
    path = run_dir / "metrics.jsonl"
    try:
        if path.stat().st_mtime < since:
            return None
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            lines = f.read().split(b"\n")[:-1]
        return int(json.loads(lines[-1])["step"]) if lines else None
    except (OSError, ValueError, KeyError, IndexError):
        return None


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
    each running one, its steps left × its arm's seconds per step (any arm's when its own has not finished a run)
    plus an evaluation, or when its step is unknown, the mean less the time it has run; the sum over the jobs. It
    says `≥` when a finished run's time covers only part of it. `done`: run name → run_cost of its result."""

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

    def _remaining(self, name: str, step: int | None, max_steps, now: float, mean: float) -> float:
        arm, _ = self._arm(name)
        own = [c for n, c in self.costs.items() if self._arm(n)[0]["slug"] == arm["slug"]]
        per_step = _mean([c["per_step"] for c in own]) or _mean([c["per_step"] for c in self.costs.values()])
        evaluation = _mean([c["eval"] for c in own]) or _mean([c["eval"] for c in self.costs.values()])
        if step is None or per_step is None or evaluation is None or not isinstance(max_steps, int):
            return max(0.0, mean - (now - self.running[name]))
        return max(0, max_steps - step) * per_step + evaluation

    def _line(self) -> str:
        now = time.perf_counter()
        left = self.total - len(self.costs) - len(self.running)
        failed = f" ({self.failed} failed)" if self.failed else ""
        text = (f"{len(self.costs)}/{self.total} done, {len(self.running)} running, {left} left{failed} | "
                f"elapsed {_duration(now - self.start)}")
        steps, remaining = [], 0.0
        whole = [c["seconds"] for c in self.costs.values() if c["whole"]]
        timed = whole or [c["seconds"] for c in self.costs.values()]
        mean = _mean(timed)
        for name in self.running:
            arm, seed = self._arm(name)
            step = latest_step(run_path(self.out_dir, arm["slug"], seed), since=self.wall_start[name])
            max_steps = None
            if step is not None:  # the arm's record, or an earlier plan's raw values
                values = arm.get("resolved") or run_values(self.plan, arm, seed, self.out_dir)
                max_steps = values.get("max_steps")
                steps.append(f"{arm['label']}/seed{seed} step {step}/{max_steps or '?'}")
            if mean is not None:
                remaining += self._remaining(name, step, max_steps, now, mean)
        if mean is not None:  # from the runs whose time covers all of them; else a lower bound
            remaining += left * mean
            text += f" | eta {'' if whole else '≥ '}{_duration(remaining / self.jobs)}"
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
