"""perf/phase_times.py: a comparison's time per phase from its runs' file times, on a hand-written comparison whose
file times are set, with a run resumed in training and one evaluated after a restart."""

import json
import os

import pytest

from grail.analysis.compare import plan as compare
from grail.analysis.compare.summary import RESULT_FILE, run_path
from perf_loading import load_perf_script

phases = load_perf_script("phase_times")
FILES = ("compare_trained.json", "eval/final/greedy/results.json", "eval/final/sampled/results.json", RESULT_FILE)


def _comparison(tmp_path, runs: dict[int, tuple[tuple[float, ...], dict]]) -> None:
    """runs: seed → (the times FILES were last written, compare_result.json's timing keys), one arm."""
    arms = compare.parse_arms("none", [])
    plan = {"seeds": len(runs), "seed_fields": ["seed"], "base": {},
            "protocol": {"kind": "synthetic held-out", "primary": "m", "description": "hand-written"},
            "arms": [{"label": a.label, "slug": a.slug, "method": a.method, "fields": a.fields} for a in arms]}
    (tmp_path / compare.PLAN_FILE).write_text(json.dumps(plan))
    for seed, (times, timing) in runs.items():
        run = run_path(tmp_path, "none", seed)
        for name, when in zip(FILES, times, strict=True):
            (run / name).parent.mkdir(parents=True, exist_ok=True)
            (run / name).write_text(json.dumps({"metrics": {"m": 0.1}, **timing}) if name == RESULT_FILE else "{}")
            os.utime(run / name, (when, when))


def test_the_gaps_between_file_times_leave_out_what_an_interruption_could_hold(tmp_path, capsys, monkeypatch):
    whole = {"wall_seconds": 1000.0, "eval_seconds": 400.0, "train_seconds": 550.0}
    _comparison(tmp_path, {
        0: ((100.0, 190.0, 430.0, 590.0), whole),
        1: ((100.0, 200.0, 440.0, 600.0), {**whole, "wall_seconds": 1200.0, "train_seconds": 700.0}),
        # resumed from a checkpoint: its clock (the last 200 s of training, then the evaluation) is partial, its
        # evaluation (one process) counts
        2: ((100.0, 210.0, 450.0, 610.0), {**whole, "resumed": True, "wall_seconds": 650.0, "train_seconds": 200.0}),
        # trained before a restart, evaluated after it: neither its clock nor its gaps count (the first holds the cut)
        3: ((100.0, 5000.0, 5100.0, 5200.0), {**whole, "trained_earlier": True, "wall_seconds": 450.0}),
        # an older result without trained_earlier: 20 s before its evaluation, 550 s of training, so the same case
        4: ((100.0, 6000.0, 6100.0, 6200.0), {**whole, "wall_seconds": 420.0}),
    })
    summary = phases.phase_times(tmp_path)
    assert summary["greedy"] == {"n": 3, "median": 100.0, "min": 90.0, "max": 110.0}
    assert summary["sampled"]["median"] == 240.0 and summary["auroc and extra"]["max"] == 160.0
    assert summary["run"] == {"n": 2, "median": 1100.0, "min": 1000.0, "max": 1200.0}
    assert summary["training"]["median"] == 625.0

    monkeypatch.setattr("sys.argv", ["phase_times.py", str(tmp_path), "--json", str(tmp_path / "out.json")])
    phases.main()
    assert "greedy: median 100 s [90, 110] over 3 runs" in capsys.readouterr().out
    assert json.loads((tmp_path / "out.json").read_text()) == summary


def test_a_directory_without_a_comparison_or_a_finished_run_is_refused(tmp_path):
    with pytest.raises(ValueError, match="give the --output_dir of a grail compare"):
        phases.phase_times(tmp_path)
    _comparison(tmp_path, {})
    with pytest.raises(ValueError, match="no run has finished"):
        phases.phase_times(tmp_path)
