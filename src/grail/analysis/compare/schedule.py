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
from dataclasses import dataclass, field
from pathlib import Path

from grail.analysis.compare.auroc import AurocPlan, run_auroc
from grail.analysis.compare.plan import PLAN_FILE, check_plan
from grail.analysis.compare.progress import Progress, run_cost
from grail.analysis.compare.report import write_report
from grail.analysis.compare.run import (
    LOG_FILE,
    Log,
    arm_config,
    checkpoint_auroc,
    drop_checkpoints,
    lock,
    run_one,
    write_json,
)
from grail.analysis.compare.summary import (
    RESULT_FILE,
    WARMSTART_AUROC_FILE,
    plan_seeds,
    run_path,
)
from grail.options.fields import SYNTHETIC_DATASET
from grail.training.stop import SAME_REQUEST_S, STOP_SIGNALS, STOPPED_EXIT_CODE, TrainingStopped

__all__ = ["ComparisonStopped", "report_only", "reported_jobs", "run_comparison", "run_worker"]

# ---- the comparison ------------------------------------------------------------------------------------------------

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
        progress = Progress(plan, out_dir, len(keys), done, min(jobs, max(1, len(pending))), log, archive)
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


def _in_process(plan: dict, out_dir: Path, pending: list, jobs: int, progress: Progress) -> list[str]:
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


def _in_workers(plan: dict, out_dir: Path, pending: list, jobs: int, progress: Progress) -> list[str]:
    threads = max(1, (os.cpu_count() or 1) // jobs)
    if os.environ.get("OMP_NUM_THREADS", "").isdigit():
        threads = max(1, min(threads, int(os.environ["OMP_NUM_THREADS"])))
    workers = _Workers(out_dir, list(pending), jobs, progress, threads)  # each worker reads the plan's file
    try:
        with _forwarding_stops(workers.slots, workers.asked):
            workers.run()
    finally:
        workers.end()
    if workers.asked:
        progress.log(f"compare: {workers.asked[0]}: stopped; {len(workers.stopped)} run(s) saved a checkpoint or "
                     f"stopped in their evaluation ({', '.join(workers.stopped) or 'none'}), {len(workers.pending)} "
                     f"not started. Go on with: grail compare --resume {out_dir}")
        raise ComparisonStopped(f"stopped by {workers.asked[0]}; grail compare --resume {out_dir} goes on")
    return workers.failed


@dataclass
class _Workers:
    """The worker processes of one comparison: `jobs` slots, each running one run at a time, `threads` CPU threads
    a worker. `pending` runs start while slots are free, none after a failure or a stop signal; `failed` and
    `stopped` name the runs that ended so; `asked` holds the stop signal's name once one came
    (_forwarding_stops)."""

    out_dir: Path
    pending: list
    jobs: int
    progress: Progress
    threads: int
    slots: dict[int, tuple[str, subprocess.Popen]] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)
    asked: list[str] = field(default_factory=list)

    def run(self) -> None:
        """Start and collect workers until no run is pending or running (after a stop signal: none running)."""
        gpus = _gpu_ids()
        while self.pending or self.slots:
            while self.pending and len(self.slots) < self.jobs and not self.failed and not self.asked:
                self._start(*self.pending.pop(0), gpus)
            if self.asked and not self.slots:
                return
            time.sleep(0.2)
            self._collect()
            self.progress.tick()

    def end(self) -> None:
        """Interrupted: stop the workers (they save a checkpoint at the end of their step if training, else end at
        once, and resume on the next run) and wait for them."""
        for _, process in self.slots.values():
            process.terminate()
        for _, process in self.slots.values():
            process.wait()

    def _start(self, slug: str, seed: int, gpus: list[str]) -> None:
        slot = min(set(range(self.jobs)) - set(self.slots))
        env = {**os.environ, "OMP_NUM_THREADS": str(self.threads), "MKL_NUM_THREADS": str(self.threads)}
        if len(gpus) > 1:
            env["CUDA_VISIBLE_DEVICES"] = gpus[slot % len(gpus)]
        run_dir = run_path(self.out_dir, slug, seed)
        run_dir.mkdir(parents=True, exist_ok=True)
        with (run_dir / LOG_FILE).open("a") as handle:
            process = subprocess.Popen(
                [sys.executable, "-m", "grail.analysis.compare.cli", str(self.out_dir), slug, str(seed),
                 str(self.threads), str(os.getpid())], stdout=handle, stderr=subprocess.STDOUT, env=env)
        self.slots[slot] = (f"{slug}/seed{seed}", process)
        self.progress.started(f"{slug}/seed{seed}")

    def _collect(self) -> None:
        """The workers that ended: finished (exit 0), stopped (after a stop signal: a checkpoint saved, or ended in
        evaluation), or failed (with its log's last line)."""
        for slot, (name, process) in list(self.slots.items()):
            if process.poll() is None:
                continue
            del self.slots[slot]
            if process.returncode != 0 and self.asked:  # a stop signal ended it (or it failed as it stopped)
                self.progress.stopped(name)
                self.stopped.append(name)
                continue
            ok = process.returncode == 0
            self.progress.finished(name, ok)
            if not ok:
                slug, seed = name.rsplit("/seed", 1)
                log_path = run_path(self.out_dir, slug, int(seed)) / LOG_FILE
                tail = log_path.read_text().strip().splitlines()[-1:] if log_path.is_file() else []
                self.failed.append(f"{name} (exit {process.returncode}: {' '.join(tail)}; log {log_path})")


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
