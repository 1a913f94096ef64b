"""Running a `grail compare` plan (grail.analysis.compare.plan): every run of it trained, evaluated and checked,
then the report over seeds (grail.analysis.compare.report).

Resuming: a finished run (compare_result.json) is skipped; a trained one is only evaluated (the harness resumes its
samples); a half-trained one resumes from its last complete checkpoint (`resume_from_checkpoint=true`), or starts
over (`overwrite_output_dir`) when it has none.

Running: with jobs=1 the runs train one after another in this process; with jobs=N, N worker processes
(`python -m grail.analysis.compare.cli OUT SLUG SEED THREADS PARENT_PID`), each with cpu_count // N threads
(OMP_NUM_THREADS and torch.set_num_threads) and, with several visible GPUs, one GPU each (CUDA_VISIBLE_DEVICES, round
robin over the N slots). A worker exits when its parent dies, so a killed comparison leaves no orphan training.

Per-run evaluations beyond the protocol: grail.analysis.compare.run.EXTRA_EVALUATIONS (re-exported by
grail.analysis.compare.plan).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from grail.analysis.compare.auroc import AurocPlan, run_auroc
from grail.analysis.compare.plan import PLAN_FILE, STATUS_EVERY_S, check_plan
from grail.analysis.compare.report import write_report
from grail.analysis.compare.run import (
    LOG_FILE,
    Log,
    arm_config,
    checkpoint_auroc,
    drop_checkpoints,
    lock,
    run_one,
    run_values,
    write_json,
)
from grail.analysis.compare.summary import (
    RESULT_FILE,
    WARMSTART_AUROC_FILE,
    clock_complete,
    plan_seeds,
    run_path,
)
from grail.options.fields import SYNTHETIC_DATASET
from grail.training.stop import SAME_REQUEST_S, STOP_SIGNALS, STOPPED_EXIT_CODE, TrainingStopped

__all__ = ["ComparisonStopped", "report_only", "reported_jobs", "run_comparison", "run_worker"]

# ---- the comparison ------------------------------------------------------------------------------------------------

def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def _latest_step(run_dir: Path, since: float = 0.0) -> int | None:
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


class _Progress:
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
            step = _latest_step(run_path(self.out_dir, arm["slug"], seed), since=self.wall_start[name])
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


def _gpu_ids() -> list[str]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [g.strip() for g in visible.split(",") if g.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def _prepare(plan: dict, out_dir: Path, log: Log) -> None:
    """Before the runs: read each distinct training set once (a bad path stops everything now, not in every run);
    resolve each distinct starting model (grail.analysis.compare.start: the tiny model is warm-started here, or found in
    the cache, so that no two runs train it concurrently); evaluate each start before RL, once (before_rl.json). With
    auroc_rows: the saliency AUROC of each arm's start (arms that share a start, task and weighting options share the
    computation), as {arm label: {name: value}} in auroc_warmstart.json. Whatever those files already hold is kept,
    so a rerun of a finished comparison computes nothing here."""
    from grail.analysis.compare.start import evaluate_starts, start_groups
    from grail.training.data import load_prompts
    from grail.training.run import resolve_model_path

    auroc_path = out_dir / WARMSTART_AUROC_FILE
    warm_auroc = json.loads(auroc_path.read_text()) if auroc_path.is_file() else {}
    if not all(isinstance(v, dict) for v in warm_auroc.values()):
        warm_auroc = {}  # the one-warm-start format of earlier versions: recompute, per arm
    configs = {arm["label"]: arm_config(plan, arm, out_dir) for arm in plan["arms"]}
    seen = set()
    for cfg in configs.values():
        data = ("data", cfg.dataset, cfg.dataset_config, cfg.dataset_split, cfg.prompt_column, cfg.answer_column,
                repr(cfg.synthetic_set()) if cfg.dataset == SYNTHETIC_DATASET else None)
        if data not in seen:
            seen.add(data)
            load_prompts(cfg)  # the rows, checked (the prompt format needs the model's tokenizer: each run's own)
    computed, paths, auroc = {}, {}, AurocPlan.of(plan)
    for sid, (_, labels) in start_groups(plan, out_dir).items():
        for label in labels:
            cfg = configs[label]
            if sid not in paths:
                paths[sid] = resolve_model_path(cfg, log)
            if auroc.rows and label not in warm_auroc:  # the start each arm's AUROC moves from
                key = (sid, repr(cfg.synthetic_set()), repr(cfg.weighting_options()), tuple(auroc.methods_for(cfg)))
                if key not in computed:
                    computed[key] = run_auroc(paths[sid], cfg, auroc)
                warm_auroc[label] = computed[key]
    if computed:
        write_json(auroc_path, warm_auroc)
    evaluate_starts(plan, out_dir, paths, log)


def reported_jobs(out_dir: Path, jobs: int) -> int:
    """The runs at a time that the comparison's last report recorded (report.json), else `jobs`."""
    try:
        recorded = json.loads((out_dir / "report.json").read_text()).get("jobs")
    except (OSError, ValueError):
        return jobs
    return recorded if isinstance(recorded, int) and recorded >= 1 else jobs


def report_only(plan: dict, out_dir: str | Path, jobs: int = 1, log: Log = print) -> dict:
    """The report from the runs finished so far, training and evaluating nothing (`--resume DIR --report-only`):
    of a comparison still running (it takes no lock; a run counts once its marker is written, every file whole),
    stopped, or archived part-way. `jobs`: the runs at a time the last report recorded, else this."""
    out_dir = Path(out_dir)
    keys = [(arm["slug"], seed) for seed in plan_seeds(plan) for arm in plan["arms"]]
    finished = sum((run_path(out_dir, slug, seed) / RESULT_FILE).is_file() for slug, seed in keys)
    if not finished:
        raise ValueError(f"--report-only: no run of {out_dir} has finished yet, so there is nothing to report; wait "
                         f"for one, or train with grail compare --resume {out_dir}.")
    summary = write_report(out_dir, plan, reported_jobs(out_dir, jobs))
    log(f"compare: report of {finished} of {len(keys)} finished run(s), nothing trained, in {out_dir / 'report.md'}")
    return summary


def _archiver(out_dir: Path, dest: Path | None, log: Log):
    """A function that archives the comparison into `dest` (grail.analysis.compare.archive) and logs, instead of
    raising, a copy that fails: the runs go on, and `--resume DIR --archive DEST` catches up later."""
    from grail.analysis.compare.archive import archive_comparison

    def archive() -> None:
        if dest is None:
            return
        try:
            archive_comparison(out_dir, dest, log)
        except (OSError, ValueError) as err:
            log(f"compare: WARNING: archiving into {dest} failed ({err}); the comparison goes on. Archive it later: "
                f"grail compare --resume {out_dir} --archive {dest}")
    return archive


def run_comparison(plan: dict, out_dir: str | Path, jobs: int = 1, log: Log = print,
                   archive_to: str | Path | None = None) -> dict:
    """Every run of the plan (finished ones skipped), then the report; returns report.json's content. The plan is
    written to out_dir/compare.json once the data and the warm start are found, or must equal the one there.
    `archive_to`: archive the comparison there once the plan is written, after each run finishes and with the report
    (`--archive-each`), and keep it for the comparison's resumes; a destination that cannot take it is refused before
    anything runs."""
    from grail.analysis.compare.archive import check_destination, remember_destination
    from grail.training.run import quiet_libraries

    if jobs < 1:
        raise ValueError(f"--jobs {jobs}: give 1 or more runs at a time.")
    out_dir = Path(out_dir)
    check_plan(plan, out_dir)
    if archive_to is not None:
        check_destination(plan, out_dir, archive_to, flag="--archive-each")
    archive = _archiver(out_dir, None if archive_to is None else Path(archive_to), log)
    quiet_libraries()  # no loading bars in the comparison's log (warm starts, AUROC, in-process runs)
    with lock(out_dir / ".compare.lock", wait=False):
        check_plan(plan, out_dir)  # again: another comparison may have written it before this one took the lock
        _prepare(plan, out_dir, log)
        stored = out_dir / PLAN_FILE
        old = json.loads(stored.read_text()) if stored.is_file() else None
        if old is None or any(key not in old and key in plan for key in ("sweeps", "base_source")) or (
                old.get("sweeps") != plan.get("sweeps")):
            write_json(stored, plan)  # new, or written before sweeps / base_source were recorded (check_plan: the rest
            # is equal)
        if archive_to is not None:
            remember_destination(out_dir, archive_to)
        archive()
        keys = [(arm["slug"], seed) for seed in plan_seeds(plan) for arm in plan["arms"]]  # seed-major: pairs early
        done = {}
        for slug, seed in keys:
            marker = run_path(out_dir, slug, seed) / RESULT_FILE
            if marker.is_file():
                result = json.loads(marker.read_text())
                done[f"{slug}/seed{seed}"] = run_cost(result)
        pending = [(slug, seed) for slug, seed in keys if f"{slug}/seed{seed}" not in done]
        log(f"compare: {len(keys)} runs ({len(plan['arms'])} arms × {plan['seeds']} seeds), {len(done)} finished "
            f"earlier; {jobs} at a time; directory {out_dir}")
        if not pending:  # only the report again: it says how many runs trained at a time, not this command's --jobs
            jobs = reported_jobs(out_dir, jobs)
        progress = _Progress(plan, out_dir, len(keys), done, min(jobs, max(1, len(pending))), log, archive)
        failed = (_in_process if jobs == 1 else _in_workers)(plan, out_dir, pending, jobs, progress)
        if failed:
            raise RuntimeError(f"{len(failed)} run(s) failed: " + "; ".join(failed) + ". Fix the cause and rerun the "
                               "same command: finished runs are kept, the others resume.")
        for slug, seed in keys:
            if f"{slug}/seed{seed}" in done:
                if plan.get("auroc_rows"):  # runs finished by a grail-rl without auroc_checkpoints.json get it now
                    checkpoint_auroc(plan, out_dir, slug, seed, log)
                if plan.get("drop_checkpoints"):  # a run killed between its marker and the deletion
                    drop_checkpoints(run_path(out_dir, slug, seed), log)
        summary = write_report(out_dir, plan, jobs)
        archive()
    log(f"compare: report in {out_dir / 'report.md'} (and report.json, {', '.join(summary['plots']) or 'no plots'})")
    return summary


def _in_process(plan: dict, out_dir: Path, pending: list, jobs: int, progress: _Progress) -> list[str]:
    for slug, seed in pending:
        name = f"{slug}/seed{seed}"
        run_dir = run_path(out_dir, slug, seed)
        run_dir.mkdir(parents=True, exist_ok=True)
        progress.started(name)
        with (run_dir / LOG_FILE).open("a") as handle:
            def log(line: str, handle=handle) -> None:
                handle.write(line + "\n")
                handle.flush()
                progress.tick()

            try:
                run_one(plan, out_dir, slug, seed, log, grading_workers=None)
            except TrainingStopped as stopped:  # a stop signal while it trained (grail.training.stop)
                progress.stopped(name)
                raise ComparisonStopped(f"{name}: {stopped}") from None
        progress.finished(name)
    return []


class ComparisonStopped(Exception):
    """A stop signal ended the comparison early: its training runs saved checkpoints; `--resume` goes on."""


@contextmanager
def _forwarding_stops(slots: dict, asked: list[str]):
    """While the workers run: a STOP_SIGNALS signal to the scheduler is passed on to every worker (each saves a
    checkpoint at the end of its step and stops: grail.training.stop) and no further run starts; `asked` gets the
    signal's name. Workers that got the signal too (a whole process group signalled) take the forwarded copy for
    the same request (grail.training.stop.SAME_REQUEST_S). A second request ends the scheduler at once (its workers
    then end with it). Outside the main thread nothing is installed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def forward(signum, frame):
        if asked:  # a second request (not the first delivered again): as without this handler
            if time.monotonic() - asked_at[0] >= SAME_REQUEST_S:
                for s, h in previous.items():
                    signal.signal(s, h)
                os.kill(os.getpid(), signum)
            return
        asked.append(signal.Signals(signum).name)
        asked_at.append(time.monotonic())
        for _, process in slots.values():
            if process.poll() is None:
                process.send_signal(signum)

    asked_at: list[float] = []
    previous = {s: signal.signal(s, forward) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def _in_workers(plan: dict, out_dir: Path, pending: list, jobs: int, progress: _Progress) -> list[str]:
    threads = max(1, (os.cpu_count() or 1) // jobs)
    if os.environ.get("OMP_NUM_THREADS", "").isdigit():
        threads = max(1, min(threads, int(os.environ["OMP_NUM_THREADS"])))
    slots: dict[int, tuple[str, subprocess.Popen]] = {}
    failed: list[str] = []
    stopped: list[str] = []  # runs a stop signal ended before they finished
    asked: list[str] = []  # the stop signal's name, once one came (_forwarding_stops)
    pending = list(pending)
    try:
        with _forwarding_stops(slots, asked):
            _run_slots(plan, out_dir, pending, jobs, progress, threads, slots, failed, stopped, asked)
    finally:
        for _, process in slots.values():  # interrupted: stop the workers (they save a checkpoint at the end of
            process.terminate()  # their step if training, else end at once, and resume on the next run)
        for _, process in slots.values():
            process.wait()
    if asked:
        progress.log(f"compare: {asked[0]}: stopped; {len(stopped)} run(s) saved a checkpoint or stopped in their "
                     f"evaluation ({', '.join(stopped) or 'none'}), {len(pending)} not started. Go on with: "
                     f"grail compare --resume {out_dir}")
        raise ComparisonStopped(f"stopped by {asked[0]}; grail compare --resume {out_dir} goes on")
    return failed


def _run_slots(plan: dict, out_dir: Path, pending: list, jobs: int, progress: _Progress, threads: int, slots: dict,
               failed: list[str], stopped: list[str], asked: list[str]) -> None:
    """Start workers while runs are pending and slots free (none after a failure or a stop signal), and collect the
    ones that end: finished (exit 0), stopped (after a stop signal: a checkpoint saved, or ended in evaluation), or
    failed."""
    gpus = _gpu_ids()
    while pending or slots:
        while pending and len(slots) < jobs and not failed and not asked:
            slug, seed = pending.pop(0)
            slot = min(set(range(jobs)) - set(slots))
            env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
            if len(gpus) > 1:
                env["CUDA_VISIBLE_DEVICES"] = gpus[slot % len(gpus)]
            run_dir = run_path(out_dir, slug, seed)
            run_dir.mkdir(parents=True, exist_ok=True)
            with (run_dir / LOG_FILE).open("a") as handle:
                process = subprocess.Popen(
                    [sys.executable, "-m", "grail.analysis.compare.cli", str(out_dir), slug, str(seed),
                     str(threads), str(os.getpid())], stdout=handle, stderr=subprocess.STDOUT, env=env)
            slots[slot] = (f"{slug}/seed{seed}", process)
            progress.started(f"{slug}/seed{seed}")
        if asked and not slots:
            return
        time.sleep(0.2)
        for slot, (name, process) in list(slots.items()):
            if process.poll() is None:
                continue
            del slots[slot]
            if process.returncode != 0 and asked:  # a stop signal ended it (or it failed as it stopped): resumes
                progress.stopped(name)
                stopped.append(name)
                continue
            ok = process.returncode == 0
            progress.finished(name, ok)
            if not ok:
                slug, seed = name.rsplit("/seed", 1)
                log_path = run_path(out_dir, slug, int(seed)) / LOG_FILE
                tail = log_path.read_text().strip().splitlines()[-1:] if log_path.is_file() else []
                failed.append(f"{name} (exit {process.returncode}: {' '.join(tail)}; log {log_path})")
        progress.tick()


# ---- worker process (started by grail.analysis.compare.cli's worker entry)
# ------------------------------------------------

def run_worker(out_dir: Path, slug: str, seed: int, threads: int) -> int:
    """One run of the plan in out_dir/compare.json, in a worker process with `threads` CPU threads."""
    import torch

    from grail.training.run import quiet_libraries

    torch.set_num_threads(threads)
    quiet_libraries()
    try:
        plan = json.loads((out_dir / PLAN_FILE).read_text())
        run_one(plan, out_dir, slug, seed, lambda line: print(line, flush=True), grading_workers=1)
    except TrainingStopped as stopped:  # the scheduler passed a stop signal on: the checkpoint is saved
        print(f"grail compare: {stopped}", flush=True)
        return STOPPED_EXIT_CODE
    except (ValueError, OSError) as err:
        if os.environ.get("GRAIL_DEBUG"):
            raise
        print(f"grail compare: error: {err}", file=sys.stderr, flush=True)
        return 2
    return 0
