"""`grail compare` across kills and restarts: a comparison killed mid-way resumes without redoing finished runs, its
worker processes end with it, a finished run's checkpoints are dropped (also one killed before the deletion), and
the status line does not show a restarted run's previous attempt. The report's numbers: tests/test_compare.py."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from comparing import FAST, compare_argv
from grail.analysis.compare.summary import RESULT_FILE
from grail.cli import main


def test_a_killed_comparison_resumes_without_redoing_finished_runs(tmp_path, warm_cache):
    cache, _ = warm_cache
    out = tmp_path / "cmp"
    argv = compare_argv(cache, out, "none,grail", "1")
    process = subprocess.Popen([sys.executable, "-m", "grail", *argv], env={**os.environ, "OMP_NUM_THREADS": "1"},
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    first = out / "runs/none/seed0"
    deadline = time.monotonic() + 300
    while not (first / RESULT_FILE).exists():
        assert process.poll() is None, process.stderr.read().decode()
        assert time.monotonic() < deadline, "the first run did not finish in 300 s"
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (out / "runs/grail/seed0" / RESULT_FILE).exists()
    files = [first / name for name in (RESULT_FILE, "compare_trained.json", "final/model.safetensors",
                                       "eval/final/sampled/samples.jsonl")]
    before = {p: p.stat().st_mtime_ns for p in files}

    assert main(argv) == 0
    assert {p: p.stat().st_mtime_ns for p in files} == before
    assert (out / "runs/grail/seed0" / RESULT_FILE).is_file()
    text = (out / "report.md").read_text()
    assert "With one seed there is no interval" in text and "(1 seed)" in text


def test_drop_checkpoints_deletes_a_finished_run_s_checkpoints_and_keeps_its_final_model(warm_cache, tmp_path, capsys):
    cache, _ = warm_cache
    out = tmp_path / "cmp"
    argv = ["compare", "--arms", "none", "--seeds", "1", *FAST, "--auroc-rows", "0", "--cache_dir", str(cache),
            "--output_dir", str(out), "--drop-checkpoints"]
    assert main(argv) == 0
    run_dir = out / "runs" / "none" / "seed0"
    # --save_steps 1 over 2 steps saved two; the run's own log says so
    assert "dropped 2 checkpoint folder(s)" in (run_dir / "compare.log").read_text()
    assert (run_dir / RESULT_FILE).is_file() and (run_dir / "final" / "config.json").is_file()
    assert not list(run_dir.glob("checkpoint-*"))
    assert json.loads((out / "compare.json").read_text())["drop_checkpoints"] is True
    (run_dir / "checkpoint-2").mkdir()  # killed between the finished marker and the deletion: the rerun drops it
    assert main(["compare", "--resume", str(out)]) == 0
    assert not list(run_dir.glob("checkpoint-*"))
    assert main(argv[:-1]) == 2  # the stored plan drops them: a rerun must say so too
    assert "drop_checkpoints" in capsys.readouterr().err


def _workers_of(out) -> list[int]:
    """Live worker processes of the comparison in `out` (Linux: read from /proc)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if b"grail.analysis.compare.cli" in cmdline and str(out).encode() in cmdline and state != "Z":
            found.append(int(pid))
    return found


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the workers through /proc")
def test_jobs_run_in_worker_processes_that_end_with_their_comparison(tmp_path, warm_cache):
    """--jobs 2: two worker processes train at once; killing the comparison ends them (no orphan keeps training);
    a rerun finishes every run with the workers again, archiving each as it finishes (--archive-each: the parent's
    loop calls the archive, not the workers)."""
    cache, _ = warm_cache
    out = tmp_path / "cmp"
    argv = compare_argv(cache, out, "none,grail", "2", "--jobs", "2")
    process = subprocess.Popen([sys.executable, "-m", "grail", *argv], env={**os.environ, "OMP_NUM_THREADS": "2"},
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while len(_workers_of(out)) < 2:
        assert process.poll() is None, process.stderr.read().decode()
        assert time.monotonic() < deadline, "the two workers did not start in 300 s"
        time.sleep(0.1)
    process.send_signal(signal.SIGKILL)
    process.wait()
    deadline = time.monotonic() + 30
    while _workers_of(out):
        assert time.monotonic() < deadline, "workers outlived their comparison by 30 s"
        time.sleep(0.2)

    each = tmp_path / "each"
    assert main([*argv, "--archive-each", str(each)]) == 0
    for slug in ("none", "grail"):
        for seed in range(2):
            run = out / "runs" / slug / f"seed{seed}"
            assert (run / RESULT_FILE).is_file() and "step 2/2" in (run / "compare.log").read_text()
            assert (each / "runs" / slug / f"seed{seed}" / RESULT_FILE).read_text() == (run / RESULT_FILE).read_text()
    report = json.loads((out / "report.json").read_text())
    assert report["metrics"]["sampled/synthetic/acc@4"]["per_arm"]["none"]["n"] == 2
    assert (each / "report.md").read_text() == (out / "report.md").read_text()


def test_the_status_line_ignores_a_restarted_runs_previous_steps(tmp_path):
    """A run restarted from checkpoint-10 still holds its killed attempt's step 17 until the trainer cuts the file
    back: the status line shows no step until the file is written again."""
    from grail.analysis.compare.progress import latest_step

    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in range(1, 18)))
    os.utime(path, (time.time() - 60, time.time() - 60))
    started = time.time()
    assert latest_step(tmp_path) == 17 and latest_step(tmp_path, since=started) is None
    time.sleep(0.05)  # file times come from a coarser clock than time.time()
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in range(1, 11)))  # cut back on resume
    assert latest_step(tmp_path, since=started) == 10


def test_a_clock_that_covers_part_of_a_run_is_told_apart_from_a_whole_one():
    """A run resumed in training, or trained by an earlier process and only evaluated by the last one, has a clock
    that covers its last part: it is left out of the wall-time table and the ETA. Results written before
    `trained_earlier` existed show the second case as less time before the evaluation than the training took."""
    from grail.analysis.compare.summary import clock_complete, trained_here

    whole = {"wall_seconds": 1200.0, "eval_seconds": 450.0, "train_seconds": 700.0, "resumed": False}
    assert clock_complete(whole) and clock_complete({**whole, "trained_earlier": False})
    assert not clock_complete({**whole, "resumed": True})
    assert trained_here({**whole, "resumed": True})  # resumed in training, then evaluated in one go
    assert not clock_complete({**whole, "trained_earlier": True})
    evaluated_only = {**whole, "wall_seconds": 460.0}  # an older file: 10 s before the evaluation, 700 s of training
    assert not clock_complete(evaluated_only) and not trained_here(evaluated_only)
    assert clock_complete({"wall_seconds": 10.0})  # nothing to tell by: counted, as before


def test_the_eta_comes_from_whole_runs_and_says_when_it_is_a_lower_bound(tmp_path):
    from grail.analysis.compare.progress import Progress, run_cost

    plan = {"arms": [{"slug": "none", "label": "none"}]}
    lines = []
    evaluated_only = run_cost({"wall_seconds": 100.0, "trained_earlier": True})  # no step time recorded: a part
    whole = Progress(plan, tmp_path, 4, {"none/seed0": run_cost({"wall_seconds": 1000.0}),
                                          "none/seed1": evaluated_only}, 1, lines.append)
    assert whole._line().endswith("eta 0:33:20")  # 2 left × 1000 s: the evaluation-only 100 s is not averaged in
    partial = Progress(plan, tmp_path, 4, {"none/seed1": evaluated_only}, 1, lines.append)
    assert partial._line().endswith("eta ≥ 0:05:00")  # 3 left × 100 s, known to be short


def test_a_resumed_run_is_costed_from_its_step_time_and_a_running_one_from_its_steps_left(tmp_path):
    """After a resume the wall clocks cover parts of runs; the median step time × steps + the evaluation covers a
    whole one, and a run resumed at step 4 of 60 still has 56 steps to go (not the mean less the minutes since the
    restart, which told a two-hour wait as twelve minutes)."""
    from grail.analysis.compare.progress import Progress, run_cost

    resumed = {"wall_seconds": 700.0, "trained_earlier": True, "seconds_per_step": 100.0, "steps": 60,
               "eval_seconds": 600.0}
    assert run_cost(resumed) == {"seconds": 6600.0, "per_step": 100.0, "eval": 600.0, "whole": True}
    plan = {"arms": [{"slug": "none", "label": "none", "resolved": {"max_steps": 60}},
                     {"slug": "grail", "label": "grail", "resolved": {"max_steps": 60}}]}
    progress = Progress(plan, tmp_path, 4, {"none/seed0": run_cost(resumed)}, 2, [].append)
    for name, step in (("none/seed1", 4), ("grail/seed1", 10)):
        run_dir = tmp_path / "runs" / name
        run_dir.mkdir(parents=True)
        progress.running[name], progress.wall_start[name] = time.perf_counter(), time.time() - 5
        (run_dir / "metrics.jsonl").write_text(json.dumps({"step": step}) + "\n")
    line = progress._line()
    # 1 left × 6600 s + (56 + 50) steps × 100 s (grail has no finished run: none's step time) + 2 evaluations of 600 s,
    # over 2 jobs: 9200 s
    assert " | eta 2:33:20 | " in line and line.endswith("none/seed1 step 4/60, grail/seed1 step 10/60")


def test_before_any_run_finishes_the_eta_is_the_running_runs_steps_left_and_says_it_is_a_lower_bound(tmp_path):
    """Hours into a first seed nothing has finished: the ETA comes from each running run's own recent step times
    (the median of its last lines, so one slow step does not move it) and leaves the evaluations out."""
    from grail.analysis.compare.progress import Progress, recent_steps

    plan = {"arms": [{"slug": "none", "label": "none", "resolved": {"max_steps": 120}}]}
    progress = Progress(plan, tmp_path, 3, {}, 2, [].append)
    assert " | eta" not in progress._line()  # nothing runs: nothing to tell by
    for seed, times in ((0, [200.0, 190.0, 900.0, 210.0]), (1, [100.0, 100.0, 100.0, 100.0])):
        run_dir = tmp_path / "runs" / "none" / f"seed{seed}"
        run_dir.mkdir(parents=True)
        name = f"none/seed{seed}"
        progress.running[name], progress.wall_start[name] = time.perf_counter(), time.time() - 5
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": i + 1, "step_time": t}) + "\n"
                                                       for i, t in enumerate(times)) + '{"step": 5, "step_ti')
    assert recent_steps(tmp_path / "runs" / "none" / "seed0") == (4, 210.0)  # the unfinished line is not read
    line = progress._line()
    # seed0: 116 steps × 210 s; seed1: 116 × 100 s; the one left: the mean run, 120 × (210 + 100) / 2; over 2 jobs
    assert " | eta ≥ 7:34:40 (steps only: no evaluation timed yet) | " in line
    assert line.endswith("none/seed0 step 4/120, none/seed1 step 4/120")


def test_a_metrics_window_skips_the_line_it_cuts(tmp_path):
    from grail.analysis.compare.progress import recent_steps

    rows = [{"step": i, "step_time": float(i), "pad": "x" * 1500} for i in range(1, 41)]  # about 60 KB
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"eval": 1}\n')
    step, median = recent_steps(tmp_path)
    assert step == 40 and 34 <= median <= 36  # the median of the last ten or so complete lines


def test_the_weights_share_of_step_time_sums_both_timers_over_the_steps_that_log_them():
    from grail.analysis.compare.timing import weights_share

    log = [{"step": 1, "step_time": 10.0, "weights/seconds": 1.0}, {"step": 2, "step_time": 30.0,
           "weights/seconds": 3.0}, {"step": 3, "step_time": 50.0}, {"eval": 1}]  # step 3 logged no weights time
    assert weights_share(log) == pytest.approx(4.0 / 40.0)
    assert weights_share([{"step": 1, "step_time": 10.0}]) is None and weights_share([]) is None


_WAITS_FOR_USR1 = ("import signal, sys, time; signal.signal(signal.SIGUSR1, lambda *a: sys.exit(75)); "
                   "print('ready', flush=True); time.sleep(60); sys.exit(1)")


def test_a_stop_signal_to_the_scheduler_reaches_every_running_worker_once():
    """The scheduler passes SIGUSR1 / SIGTERM on to its workers (each then checkpoints and stops), records which
    signal asked, and puts its own handlers back after the workers have ended."""
    from grail.analysis.compare.schedule import _forwarding_stops

    workers = [subprocess.Popen([sys.executable, "-c", _WAITS_FOR_USR1], stdout=subprocess.PIPE, text=True)
               for _ in range(2)]
    for worker in workers:
        assert worker.stdout.readline().strip() == "ready"
    slots, asked = {i: (f"none/seed{i}", w) for i, w in enumerate(workers)}, []
    before = signal.getsignal(signal.SIGUSR1)
    with _forwarding_stops(slots, asked):
        os.kill(os.getpid(), signal.SIGUSR1)
        codes = [worker.wait(timeout=30) for worker in workers]
    assert codes == [75, 75] and asked == ["SIGUSR1"]
    assert signal.getsignal(signal.SIGUSR1) is before


@pytest.mark.slow
def test_a_comparison_stopped_by_a_signal_checkpoints_its_runs_and_resumes(tmp_path, warm_cache):
    """SIGUSR1 to `grail compare --jobs 2` while both runs train: each saves a checkpoint at the end of its step, the
    comparison exits with STOPPED_EXIT_CODE and starts nothing more, and `--resume` finishes it from there."""
    from grail.analysis.compare.progress import latest_step
    from grail.training.resume import complete_checkpoints
    from grail.training.stop import STOPPED_EXIT_CODE

    cache, _ = warm_cache
    out = tmp_path / "cmp"
    argv = compare_argv(cache, out, "none,grail", "1", "--jobs", "2", "--max_steps", "6", "--save_steps", "100")
    process = subprocess.Popen([sys.executable, "-m", "grail", *argv], env={**os.environ, "OMP_NUM_THREADS": "1"},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    runs = [out / "runs/none/seed0", out / "runs/grail/seed0"]
    deadline = time.monotonic() + 600
    while not all(latest_step(run) for run in runs):
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    process.send_signal(signal.SIGUSR1)
    out_text, err = process.communicate(timeout=600)
    assert process.returncode == STOPPED_EXIT_CODE, err[-2000:]
    assert "compare: SIGUSR1: stopped; 2 run(s)" in out_text and f"grail compare --resume {out}" in err
    for run in runs:
        (checkpoint,) = complete_checkpoints(run)  # save_steps 100: only the stop's
        assert 1 <= int(checkpoint.name.split("-")[1]) < 6 and not (run / RESULT_FILE).exists()
    assert main(["compare", "--resume", str(out), "--jobs", "2"]) == 0
    assert all((run / RESULT_FILE).is_file() for run in runs) and (out / "report.md").is_file()
    for run in runs:
        steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()
                 if "reward" in json.loads(line)]
        assert steps == [1, 2, 3, 4, 5, 6]


def test_a_run_stopped_in_process_stops_the_comparison_without_counting_it_done_or_failed(tmp_path, monkeypatch):
    """--jobs 1 trains in the scheduler's own process: a stop signal there ends the run's training with a checkpoint
    (TrainingStopped), and the comparison stops with it, starting no further run."""
    from grail.analysis.compare import schedule
    from grail.analysis.compare.progress import Progress
    from grail.training.stop import TrainingStopped

    started = []

    def stopped_run(plan, out_dir, slug, seed, log, grading_workers):
        started.append(seed)
        raise TrainingStopped(3, "checkpoint-3", "SIGUSR1")

    monkeypatch.setattr(schedule, "run_one", stopped_run)
    plan = {"arms": [{"slug": "none", "label": "none"}]}
    lines = []
    progress = Progress(plan, tmp_path, 2, {}, 1, lines.append)
    with pytest.raises(schedule.ComparisonStopped, match="none/seed0: stopped by SIGUSR1 after step 3"):
        schedule._in_process(plan, tmp_path, [("none", 0), ("none", 1)], 1, progress)
    assert started == [0] and not progress.costs and not progress.failed
    assert lines[-1].startswith("compare: stopped none/seed0 after ")


def test_a_signal_delivered_twice_is_one_request_and_a_later_second_one_stops_at_once(monkeypatch):
    """A job's whole process group signalled, and the scheduler passing the signal on, deliver it to a worker twice
    within moments: one request (a checkpoint, then a stop). A second signal later is a second request: at once."""
    from grail.training import stop

    killed = []
    monkeypatch.setattr(stop.os, "kill", lambda pid, signum: killed.append(signum))
    clock = [100.0]
    monkeypatch.setattr(stop.time, "monotonic", lambda: clock[0])
    callback = stop.StopOnSignal()
    callback._ask(signal.SIGUSR1, None)
    clock[0] += 0.1
    callback._ask(signal.SIGUSR1, None)  # the forwarded copy
    assert callback.signal_name == "SIGUSR1" and killed == []
    clock[0] += stop.SAME_REQUEST_S
    callback._ask(signal.SIGTERM, None)
    assert killed == [signal.SIGTERM]
