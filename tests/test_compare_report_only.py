"""`grail compare --resume DIR --report-only`: the report of the runs finished so far, training nothing, also while
the comparison holds its lock. Built from hand-written run files (no training): one run of five is unfinished
(half its steps logged, no marker), and every number the report shows is checked against values chosen here."""

import json

import pytest

from grail.analysis.compare import check, report
from grail.analysis.compare import plan as compare
from grail.analysis.compare.run import lock
from grail.analysis.compare.summary import RESULT_FILE, run_path
from grail.cli import main

PRIMARY = "sampled/synthetic/acc@4"
ACC = {"none": [0.50, 0.60, 0.40], "grail": [0.55, 0.70, None]}  # grail/seed2 has not finished


def write_plan(out_dir) -> None:
    """A three-seed plan of the arms none and grail in out_dir, as `grail compare` writes it."""
    arms = compare.parse_arms("none,grail", [])
    plan = {"seeds": 3, "seed_fields": ["seed", "data_seed"], "base": {},
            "protocol": {"kind": "synthetic held-out", "primary": PRIMARY, "description": "hand-written"},
            "arms": [{"label": a.label, "slug": a.slug, "method": a.method, "fields": a.fields} for a in arms]}
    (out_dir / compare.PLAN_FILE).write_text(json.dumps(plan))


def write_run(out_dir, arm, seed, log_lines, accuracy=None) -> None:
    """The run arm/seed as `grail compare` leaves it: its metrics.jsonl of `log_lines` and, if it finished (an
    `accuracy`), its result file."""
    run = run_path(out_dir, arm, seed)
    run.mkdir(parents=True, exist_ok=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in log_lines))
    if accuracy is not None:
        (run / RESULT_FILE).write_text(json.dumps({"metrics": {PRIMARY: accuracy}, "train_seconds": 10.0,
                                                   "seconds_per_step": 1.0, "eval_seconds": 1.0}))


@pytest.fixture
def partial(tmp_path):
    write_plan(tmp_path)
    for arm, values in ACC.items():
        for seed, acc in enumerate(values):
            steps = range(1, 11 if acc is not None else 5)
            write_run(tmp_path, arm, seed, [{"step": t, "reward": 0.5} for t in steps], acc)
    return tmp_path


def test_it_reports_the_finished_runs_and_trains_nothing_while_the_comparison_holds_its_lock(partial, monkeypatch):
    plotted = []
    real_plots = report.write_plots
    monkeypatch.setattr(report, "write_plots", lambda s, runs, out: plotted.extend(runs) or real_plots(s, runs, out))
    unfinished = run_path(partial, "grail", 2)
    before = sorted(p.name for p in unfinished.iterdir())
    with lock(partial / ".compare.lock", wait=False):  # as a running comparison holds it
        assert main(["compare", "--resume", str(partial), "--report-only"]) == 0
    assert sorted(p.name for p in unfinished.iterdir()) == before  # nothing trained, evaluated or written there
    summary = json.loads((partial / "report.json").read_text())
    assert "first_errors" not in summary  # not the chain task: the report is as earlier versions rendered it
    stats = summary["metrics"][PRIMARY]
    assert stats["per_arm"]["grail"]["seeds"] == [0, 1] and stats["per_arm"]["none"]["seeds"] == [0, 1, 2]
    assert stats["per_arm"]["none"]["mean"] == pytest.approx(0.50)
    paired = stats["paired"]["grail"]
    assert paired["seeds"] == [0, 1] and paired["values"] == pytest.approx([0.05, 0.10])
    text = (partial / "report.md").read_text()
    assert "**Partial**: 5 of 6 runs finished" in text and "Not finished (left out): grail/seed2." in text
    assert "peeking" in text
    assert plotted and all(r.result is not None for r in plotted)  # the half-trained run is in no plot either


def test_a_finished_comparison_is_not_called_partial(partial):
    run = run_path(partial, "grail", 2)
    (run / RESULT_FILE).write_text(json.dumps({"metrics": {PRIMARY: 0.45}}))
    assert main(["compare", "--resume", str(partial), "--report-only"]) == 0
    assert "Partial" not in (partial / "report.md").read_text()
    assert json.loads((partial / "report.json").read_text())["metrics"][PRIMARY]["paired"]["grail"]["n"] == 3


@pytest.mark.parametrize("extra, message", [
    ([], "no run of"),                                   # nothing finished yet
    (["--seeds", "4"], "drop --seeds"),
    (["--save_steps", "5"], "drop --save_steps 5"),
    (["--archive", "elsewhere"], "drop --report-only"),
])
def test_what_it_refuses_names_the_fix(partial, capsys, extra, message):
    if not extra:
        for path in partial.glob(f"runs/*/seed*/{RESULT_FILE}"):
            path.unlink()
    assert main(["compare", "--resume", str(partial), "--report-only", *extra]) == 2
    assert message in capsys.readouterr().err
    assert not (partial / "report.md").exists()


def test_it_needs_a_comparison_directory(tmp_path, capsys):
    assert main(["compare", "--report-only"]) == 2
    assert "give it with --resume DIR" in capsys.readouterr().err
    assert main(["compare", "--resume", str(tmp_path), "--report-only"]) == 2
    assert f"no {compare.PLAN_FILE} there" in capsys.readouterr().err


def test_check_report_renders_again_elsewhere_and_names_what_differs(partial, capsys):
    """--check-report: the same report from the same runs (exit 0, nothing in DIR touched); a run whose result changed
    after the report was written makes it differ (exit 1), and the log says where."""
    assert main(["compare", "--resume", str(partial), "--check-report"]) == 2  # no report yet
    assert "has no report.json to check" in capsys.readouterr().err
    assert main(["compare", "--resume", str(partial), "--report-only"]) == 0
    files = {p: p.stat().st_mtime_ns for p in partial.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert main(["compare", "--resume", str(partial), "--check-report"]) == 0
    out = capsys.readouterr().out
    assert "report.json the same" in out and "report.md the same" in out
    assert {p: p.stat().st_mtime_ns for p in partial.rglob("*") if p.is_file()} == files  # DIR left as it was

    result = run_path(partial, "none", 1) / RESULT_FILE
    result.write_text(json.dumps({**json.loads(result.read_text()), "metrics": {PRIMARY: 0.90}}))
    assert main(["compare", "--resume", str(partial), "--check-report"]) == 1
    out = capsys.readouterr().out
    assert "report.json differs in " in out and "metrics" in out.split("report.json differs in ")[1].splitlines()[0]
    assert "report.md differs (" in out and "+| none | " in out  # the accuracy table's changed row


@pytest.mark.parametrize("extra, message", [
    (["--archive-each", "elsewhere"], "drop --archive-each"),
    (["--report-only"], "drop --check-report"),
    (["--jobs", "2"], "drop --jobs"),
])
def test_check_report_refuses_what_would_train_or_write(partial, capsys, extra, message):
    assert main(["compare", "--resume", str(partial), "--check-report", *extra]) == 2
    assert message in capsys.readouterr().err


def _nudged(value, by):
    """value with every float (not int or bool) multiplied by 1 + by."""
    if isinstance(value, dict):
        return {k: _nudged(v, by) for k, v in value.items()}
    if isinstance(value, list):
        return [_nudged(v, by) for v in value]
    return value * (1 + by) if isinstance(value, float) else value


def test_check_report_takes_another_machines_rounding_as_the_same_and_no_more(partial, capsys):
    """A report rendered elsewhere differs from this machine's in floats' last digits (seen: 9e-15 between an H200
    machine and this CPU): the same to rounding, exit 0, with the largest relative difference; a change of one part
    in a million is a different report."""
    assert main(["compare", "--resume", str(partial), "--report-only"]) == 0
    stored = partial / "report.json"
    rendered = json.loads(stored.read_text())
    stored.write_text(json.dumps(_nudged(rendered, 3e-15)))
    capsys.readouterr()
    assert main(["compare", "--resume", str(partial), "--check-report"]) == 0
    line = capsys.readouterr().out.splitlines()[-2]
    assert line.startswith("compare: report.json the same to rounding (") and "metrics" in line
    assert float(line.split("largest relative difference ")[1].split(":")[0]) == pytest.approx(3e-15, rel=0.1)

    stored.write_text(json.dumps(_nudged(rendered, 1e-6)))
    assert main(["compare", "--resume", str(partial), "--check-report"]) == 1
    assert "report.json differs in " in capsys.readouterr().out


def test_rounding_is_the_largest_relative_difference_of_otherwise_equal_values():
    assert check.rounding({"a": [1.0, 2.0], "b": "x"}, {"a": [1.0, 2.0 * (1 + 1e-12)], "b": "x"}) == \
        pytest.approx(1e-12, rel=1e-3)
    assert check.rounding(0.0, 1e-17) == pytest.approx(1e-14)  # near zero: against SMALL, not itself
    assert check.rounding(float("nan"), float("nan")) == 0.0 and check.rounding(3, 3.0) == 0.0
    for a, b in [({"a": 1.0}, {"b": 1.0}), ([1.0], [1.0, 2.0]), ("x", "y"), (True, 1), (None, 0.0),
                 (float("nan"), 1.0), (float("inf"), 1e308)]:
        assert check.rounding(a, b) is None, (a, b)
