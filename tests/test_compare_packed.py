"""A comparison's archive as one .tar.xz file (grail.analysis.compare.packed): `--archive DEST.tar.xz` writes it
without weights and atomically, `--check-report` reads it as it reads the folder, `--archive DIR` from it unpacks
it, and every command that would write into it is refused with the command that unpacks it. Built from hand-written
run files (no training): two arms × three seeds, one run's weights, report rendered by `--report-only`."""

import json
import tarfile

import pytest

from grail.analysis.compare import packed
from grail.analysis.compare import plan as compare
from grail.analysis.compare.archive import archive_comparison
from grail.analysis.compare.summary import RESULT_FILE, run_path
from grail.cli import main

PRIMARY = "sampled/synthetic/acc@4"
ACC = {"none": [0.50, 0.60, 0.40], "grail": [0.55, 0.70, 0.45]}


def _comparison(root, base=None):
    arms = compare.parse_arms("none,grail", [])
    plan = {"seeds": 3, "seed_fields": ["seed", "data_seed"], "base": base or {},
            "protocol": {"kind": "synthetic held-out", "primary": PRIMARY, "description": "hand-written"},
            "arms": [{"label": a.label, "slug": a.slug, "method": a.method, "fields": a.fields} for a in arms]}
    root.mkdir()
    (root / compare.PLAN_FILE).write_text(json.dumps(plan))
    for arm, values in ACC.items():
        for seed, acc in enumerate(values):
            run = run_path(root, arm, seed)
            (run / "final").mkdir(parents=True)
            (run / "final" / "model.safetensors").write_bytes(b"w" * 1000)  # weights: never archived
            (run / "metrics.jsonl").write_text("".join(json.dumps({"step": t, "reward": 0.5}) + "\n"
                                                       for t in range(1, 11)))
            (run / RESULT_FILE).write_text(json.dumps({"metrics": {PRIMARY: acc}, "train_seconds": 10.0,
                                                       "seconds_per_step": 1.0, "eval_seconds": 1.0}))
    return root


@pytest.fixture
def finished(tmp_path):
    out = _comparison(tmp_path / "cmp")
    assert main(["compare", "--resume", str(out), "--report-only"]) == 0
    return out


def _names(path):
    with tarfile.open(path, "r:xz") as tar:
        return sorted(tar.getnames())


def test_archive_writes_the_tar_xz_and_check_report_reads_it(finished, tmp_path, capsys):
    dest = tmp_path / "kept" / "cmp-1.tar.xz"
    assert main(["compare", "--resume", str(finished), "--archive", str(dest)]) == 0
    assert "6 finished run(s) into" in capsys.readouterr().out
    names = _names(dest)
    assert {n.split("/")[0] for n in names} == {"cmp-1"}  # one folder, named as the file: tar xJf unpacks it
    assert "cmp-1/report.json" in names and f"cmp-1/runs/grail/seed2/{RESULT_FILE}" in names
    assert not [n for n in names if "/final" in n or n.endswith(".safetensors")]
    before = dest.read_bytes()

    assert main(["compare", "--resume", str(dest), "--check-report"]) == 0  # from a temporary folder elsewhere
    out = capsys.readouterr().out
    assert "report.json the same" in out and "report.md the same" in out
    assert dest.read_bytes() == before  # read, not written

    # a run that changed after the report was written: the archive of it checks as different, so the check reads
    # the runs inside the file, not the report alone
    result = run_path(finished, "none", 1) / RESULT_FILE
    result.write_text(json.dumps({**json.loads(result.read_text()), "metrics": {PRIMARY: 0.90}}))
    assert main(["compare", "--resume", str(finished), "--archive", str(dest)]) == 0
    capsys.readouterr()
    assert main(["compare", "--resume", str(dest), "--check-report"]) == 1
    assert "report.json differs in " in capsys.readouterr().out


def test_check_report_of_an_archive_without_a_report_says_how_to_render_one(tmp_path, capsys):
    out, dest = _comparison(tmp_path / "cmp"), tmp_path / "early.tar.xz"  # as --archive-each leaves it before a report
    archive_comparison(out, dest, log=lambda line: None)
    assert main(["compare", "--resume", str(dest), "--check-report"]) == 2
    assert (f"{dest} has no report.json to check; unpack it (grail compare --resume {dest} --archive DIR) and render "
            "it there") in capsys.readouterr().err


def test_archive_into_a_folder_unpacks_it_to_resume_there(finished, tmp_path):
    packed_file, plain, unpacked = tmp_path / "a.tar.xz", tmp_path / "plain", tmp_path / "unpacked"
    assert main(["compare", "--resume", str(finished), "--archive", str(plain)]) == 0
    assert main(["compare", "--resume", str(finished), "--archive", str(packed_file)]) == 0
    assert main(["compare", "--resume", str(packed_file), "--archive", str(unpacked)]) == 0
    files = sorted(p.relative_to(plain).as_posix() for p in plain.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(unpacked).as_posix() for p in unpacked.rglob("*") if p.is_file())
    assert all((plain / f).read_bytes() == (unpacked / f).read_bytes() for f in files)
    report = (unpacked / "report.md").read_text()
    assert main(["compare", "--resume", str(unpacked), "--report-only"]) == 0  # a folder again: it writes there
    assert (unpacked / "report.md").read_text() == report


def test_archiving_again_accumulates_the_runs_and_gives_the_same_bytes(tmp_path):
    out, dest = _comparison(tmp_path / "cmp"), tmp_path / "cmp.tar.xz"
    marker = run_path(out, "grail", 2) / RESULT_FILE
    kept = marker.read_text()
    marker.unlink()  # not finished yet
    done = archive_comparison(out, dest, log=lambda line: None)
    assert done["unfinished"] == ["grail/seed2"] and done["bytes"] == dest.stat().st_size
    assert f"cmp/runs/grail/seed2/{RESULT_FILE}" not in _names(dest)
    marker.write_text(kept)
    archive_comparison(out, dest, log=lambda line: None)
    assert {f"cmp/runs/grail/seed2/{RESULT_FILE}", f"cmp/runs/none/seed0/{RESULT_FILE}"} <= set(_names(dest))
    first = dest.read_bytes()
    archive_comparison(out, dest, log=lambda line: None)  # nothing changed: the same file, byte for byte
    assert dest.read_bytes() == first
    other = _comparison(tmp_path / "other", base={"learning_rate": 0.5})
    with pytest.raises(ValueError, match="config field learning_rate differs"):
        archive_comparison(other, dest, log=lambda line: None)
    assert dest.read_bytes() == first


def test_a_failed_write_keeps_the_earlier_archive(finished, tmp_path, monkeypatch):
    dest = tmp_path / "cmp.tar.xz"
    archive_comparison(finished, dest, log=lambda line: None)
    before = dest.read_bytes()
    (run_path(finished, "none", 0) / "metrics.jsonl").write_text("changed\n")
    real, calls = packed._entry, []

    def failing(path, name):
        calls.append(name)
        if len(calls) == 5:
            raise OSError("No space left on device")
        return real(path, name)

    monkeypatch.setattr(packed, "_entry", failing)
    with pytest.raises(OSError, match="No space left"):
        archive_comparison(finished, dest, log=lambda line: None)
    assert dest.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["cmp", "cmp.tar.xz"]


def test_archive_each_writes_the_tar_xz_and_refuses_another_comparison_first(finished, tmp_path):
    from grail.analysis.compare.archive import check_destination
    from grail.analysis.compare.schedule import _archiver

    dest, lines = tmp_path / "each.tar.xz", []
    _archiver(finished, dest, lines.append)()  # what --archive-each calls after each run
    assert lines[-1].startswith("compare: archived 6 finished run(s) into") and "--check-report" in lines[-1]
    plan = json.loads((finished / compare.PLAN_FILE).read_text())
    check_destination(plan, finished, dest, flag="--archive-each")  # the same comparison: taken
    with pytest.raises(ValueError, match="--archive-each .*config field learning_rate differs"):
        check_destination({**plan, "base": {"learning_rate": 0.5}}, finished, dest, flag="--archive-each")


@pytest.mark.parametrize("extra, message", [
    ([], "unpack it into a folder: grail compare --resume {a} --archive DIR"),  # would train or re-render into it
    (["--report-only"], "unpack it into a folder: grail compare --resume {a} --archive DIR"),
    (["--seeds", "5"], "unpack it into a folder"),
    (["--archive", "{a}"], "that is the comparison itself"),
])
def test_what_would_write_into_a_tar_xz_is_refused_with_how_to_unpack_it(finished, tmp_path, capsys, extra, message):
    archive = tmp_path / "a.tar.xz"
    archive_comparison(finished, archive, log=lambda line: None)
    before = archive.read_bytes()
    argv = ["compare", "--resume", str(archive), *[e.format(a=archive) for e in extra]]
    assert main(argv) == 2
    assert message.format(a=archive) in capsys.readouterr().err
    assert archive.read_bytes() == before


def test_a_path_neither_a_folder_nor_a_tar_xz_is_refused(finished, tmp_path, capsys):
    note = tmp_path / "notes.txt"
    note.write_text("not an archive")
    cases = [(["--resume", str(finished), "--archive", str(tmp_path / "cmp.zip")], "only .tar.xz archives"),
             (["--resume", str(finished), "--archive", str(note)], "neither a folder nor a .tar.xz archive"),
             (["--resume", str(note), "--check-report"], "neither a folder nor a .tar.xz archive"),
             (["--resume", str(tmp_path / "missing.tar.xz"), "--check-report"], "no such file")]
    for argv, message in cases:
        assert main(["compare", *argv]) == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "cmp.zip").exists()


def test_a_damaged_or_foreign_tar_xz_is_refused(tmp_path, capsys):
    cut = tmp_path / "cut.tar.xz"
    cut.write_bytes(b"\xfd7zXZ\x00" + b"\x00" * 40)
    assert main(["compare", "--resume", str(cut), "--check-report"]) == 2
    assert "not a readable .tar.xz archive" in capsys.readouterr().err
    escaping = tmp_path / "escaping.tar.xz"
    (tmp_path / "x").write_text("{}")
    with tarfile.open(escaping, "w:xz") as tar:
        tar.add(tmp_path / "x", arcname="cmp/compare.json")
        tar.add(tmp_path / "x", arcname="cmp/../../outside")
    assert main(["compare", "--resume", str(escaping), "--check-report"]) == 2
    assert "is not a plain file or folder inside cmp/" in capsys.readouterr().err
    assert not (tmp_path.parent / "outside").exists()


def test_the_analysis_flags_read_a_tar_xz_as_they_read_the_folder(finished, tmp_path, capsys):
    dest = tmp_path / "cmp.tar.xz"
    assert main(["compare", "--resume", str(finished), "--archive", str(dest)]) == 0
    capsys.readouterr()
    assert main(["compare", "--resume", str(finished), "--pairs", "grail:none"]) == 0
    from_folder = capsys.readouterr().out
    assert main(["compare", "--resume", str(dest), "--pairs", "grail:none"]) == 0
    from_archive = capsys.readouterr().out
    assert "| grail − none | sampled/synthetic/acc@4 | 3 |" in from_folder  # 3 paired seeds: +5, +10, +5 points
    assert from_archive == from_folder
