"""`grail compare --resume DIR --archive DEST`: the results without weights re-render the same report without
training, a run that had not finished is left out and trains from the archive as it did in DIR, and an archive of
another comparison is refused."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from comparing import compare_argv
from grail.analysis.compare.archive import (
    ARCHIVE_EACH_FILE,
    WEIGHT_SUFFIXES,
    remember_destination,
    remembered_destination,
)
from grail.analysis.compare.summary import RESULT_FILE
from grail.cli import main


def _files(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_an_archive_re_renders_the_report_and_trains_only_the_runs_it_lacks(tmp_path, warm_cache, capsys):
    cache, _ = warm_cache
    out, each = tmp_path / "cmp", tmp_path / "each"
    assert main(compare_argv(cache, out, "none,grail", "1", "--archive-each", str(each))) == 0
    report = (out / "report.md").read_text()
    assert any(name.endswith(".safetensors") for name in _files(out))  # there are weights to leave out
    logged = capsys.readouterr().out  # --archive-each: once the plan is written, after each run, with the report
    assert [line.split(" finished run(s)")[0].rsplit(" ", 1)[-1] for line in logged.splitlines()
            if line.startswith("compare: archived ")] == ["0", "1", "2", "2"]
    # the comparison keeps DEST: a resume goes on archiving there without the flag, until --no-archive-each
    assert remembered_destination(out) == str(each.resolve()) and ARCHIVE_EACH_FILE not in _files(each)
    assert main(["compare", "--resume", str(out)]) == 0
    logged = capsys.readouterr().out
    assert f"archiving into {each.resolve()} as each run finishes" in logged and "compare: archived 2" in logged
    assert main(["compare", "--resume", str(out), "--no-archive-each"]) == 0
    assert "compare: archived" not in capsys.readouterr().out and remembered_destination(out) is None
    assert main(["compare", "--resume", str(out), "--archive-each", str(each), "--no-archive-each"]) == 2
    assert "give one" in capsys.readouterr().err
    remember_destination(out, each)

    dest = tmp_path / "archive"
    assert main(["compare", "--resume", str(out), "--archive", str(dest)]) == 0
    archived = _files(dest)
    assert _files(each) == archived  # archiving as it went left what archiving afterwards does
    assert "runs/grail/seed0/" + RESULT_FILE in archived and "runs/none/seed0/metrics.jsonl" in archived
    assert "before_rl.json" in archived and "runs/none/seed0/eval/final/sampled/samples.jsonl" in archived
    assert not [n for n in archived if n.endswith(WEIGHT_SUFFIXES) or n.startswith(("runs/none/seed0/final/",
                "runs/grail/seed0/final/")) or "checkpoint-" in n or n.endswith(".lock")]

    # nothing to train: the report again, from the files; it still says the runs trained one at a time
    assert main(["compare", "--resume", str(dest), "--jobs", "2"]) == 0
    assert (dest / "report.md").read_text() == report and "1 run(s) at a time" in report
    assert remembered_destination(dest) is None  # the archive does not carry where its source was archived
    assert not (dest / "runs/none/seed0/final").exists()

    # a run that had not finished is not archived; from the archive it trains, to the same numbers
    finished = json.loads((out / "runs/grail/seed0" / RESULT_FILE).read_text())
    (out / "runs/grail/seed0" / RESULT_FILE).unlink()
    partial = tmp_path / "partial"
    assert main(["compare", "--resume", str(out), "--archive", str(partial)]) == 0
    logged = capsys.readouterr().out
    assert "1 unfinished not archived" in logged and f"grail compare --resume {partial} --report-only" in logged
    assert not (partial / "runs/grail").exists()
    assert main(["compare", "--resume", str(partial), "--report-only"]) == 0  # what it holds, training nothing
    assert not (partial / "runs/grail").exists() and "**Partial**: 1 of 2" in (partial / "report.md").read_text()
    assert main(["compare", "--resume", str(partial)]) == 0
    again = json.loads((partial / "runs/grail/seed0" / RESULT_FILE).read_text())
    assert again["metrics"] == finished["metrics"] and again["evaluations"] == finished["evaluations"]
    assert (partial / "runs/grail/seed0/final").is_dir()  # trained there

    # archiving into the first archive again replaces its runs and keeps its plan; another comparison is refused
    plan = json.loads((dest / "compare.json").read_text())
    plan["base"]["learning_rate"] = 0.5
    (dest / "compare.json").write_text(json.dumps(plan))
    assert main(["compare", "--resume", str(out), "--archive", str(dest)]) == 2
    assert "config field learning_rate differs" in capsys.readouterr().err
    assert main(["compare", "--resume", str(out), "--archive", str(dest), "--arms", "none"]) == 2
    assert "drop --arms" in capsys.readouterr().err
    # --archive-each refuses a destination holding another comparison before anything runs
    fresh = tmp_path / "fresh"
    assert main(compare_argv(cache, fresh, "none,grail", "1", "--archive-each", str(dest))) == 2  # dest: lr 0.5
    assert "config field learning_rate differs" in capsys.readouterr().err and not (fresh / "runs").exists()
    assert main(["compare", "--resume", str(out), "--archive", str(dest), "--archive-each", str(each)]) == 2
    assert "drop --archive" in capsys.readouterr().err


def test_a_failed_archive_while_the_comparison_runs_is_logged_and_the_runs_go_on(tmp_path):
    from grail.analysis.compare.schedule import _archiver

    out = tmp_path / "cmp"
    out.mkdir()
    (out / "compare.json").write_text(json.dumps({"arms": [], "seeds": 1, "base": {}}))
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the archive should go")
    lines = []
    _archiver(out, blocked, lines.append)()  # does not raise
    assert len(lines) == 1 and lines[0].startswith(f"compare: WARNING: archiving into {blocked} failed (")
    assert f"grail compare --resume {out} --archive {blocked}" in lines[0]
    _archiver(out, None, lines.append)()  # no destination: nothing
    assert len(lines) == 1


def test_archiving_again_copies_only_the_runs_that_changed(tmp_path):
    from grail.analysis.compare import plan as compare
    from grail.analysis.compare.archive import archive_comparison
    from grail.analysis.compare.summary import run_path

    out, dest = tmp_path / "cmp", tmp_path / "archive"
    arms = compare.parse_arms("none,grail", [])
    plan = {"seeds": 2, "seed_fields": ["seed", "data_seed"], "base": {}, "protocol": {"primary": "m"},
            "arms": [{"label": a.label, "slug": a.slug, "method": a.method, "fields": a.fields} for a in arms]}
    out.mkdir()
    (out / "compare.json").write_text(json.dumps(plan))
    for arm in ("none", "grail"):
        for seed in range(2):
            run = run_path(out, arm, seed)
            (run / "final").mkdir(parents=True)
            (run / "final" / "model.safetensors").write_bytes(b"w" * 1000)
            (run / RESULT_FILE).write_text(json.dumps({"metrics": {"m": 0.1 * seed}}))
            (run / "metrics.jsonl").write_text("x" * 100 + "\n")
    first = archive_comparison(out, dest, log=lambda s: None)
    assert len(first["finished"]) == 4 and first["bytes"] > 4 * 100
    plan_bytes = (out / "compare.json").stat().st_size
    assert archive_comparison(out, dest, log=lambda s: None)["bytes"] == plan_bytes  # the comparison's own files only
    (run_path(out, "grail", 1) / "metrics.jsonl").write_text("y" * 300 + "\n")  # one run changed
    (run_path(out, "none", 0) / "auroc_checkpoints.json").write_text("{}")  # one gained a file
    again = archive_comparison(out, dest, log=lambda s: None)
    assert (run_path(dest, "grail", 1) / "metrics.jsonl").read_text().startswith("y")
    assert (run_path(dest, "none", 0) / "auroc_checkpoints.json").is_file()
    run_bytes = {(arm, seed): sum(f.stat().st_size for f in run_path(out, arm, seed).glob("*") if f.is_file())
                 for arm in ("none", "grail") for seed in range(2)}
    assert again["bytes"] == plan_bytes + run_bytes["grail", 1] + run_bytes["none", 0]  # those two runs alone
    assert not (run_path(dest, "none", 1) / "final").exists()  # weights never


def test_the_repository_keeps_an_archived_comparison_and_ignores_the_default_run_directories():
    root = Path(__file__).resolve().parents[1]
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("not a git checkout")
    archived = "results/credit-pays/archive/runs/none/seed10/compare_result.json"
    ignored = subprocess.run(["git", "check-ignore", "--no-index", archived, "runs/demo-1/metrics.jsonl"],
                             cwd=root, capture_output=True, text=True).stdout.split()
    assert ignored == ["runs/demo-1/metrics.jsonl"]  # an archive's runs/ folder is committed; the root's is not
