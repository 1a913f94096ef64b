"""code.jsonl (grail.training.provenance): which code trained a run, one line per start and resume."""

import json
import subprocess
from importlib import metadata
from pathlib import Path

import grail
from grail.training import provenance
from grail.training.provenance import CODE_FILE, code_versions, record_code


def test_the_versions_name_this_checkouts_commit_and_the_installed_libraries():
    versions = code_versions()
    root = Path(grail.__file__).resolve().parents[2]
    if (root / ".git").exists():  # an editable install from a clone (CI, development)
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True)
        assert versions["commit"] == head.stdout.strip() and len(versions["commit"]) == 40
        assert isinstance(versions["dirty"], bool)
    else:
        assert versions["commit"] is None and versions["dirty"] is None
    assert versions["grail_rl"] == grail.__version__ == metadata.version("grail-rl")  # package and metadata agree
    for name in ("torch", "transformers", "trl", "accelerate"):
        assert versions[name] == metadata.version(name)


def test_outside_a_git_checkout_commit_and_dirty_are_none(monkeypatch):
    monkeypatch.setattr(provenance, "_git", lambda root, *args: None)  # no git, or not a repository
    versions = code_versions()
    assert versions["commit"] is None and versions["dirty"] is None and versions["torch"] is not None


def test_a_source_tree_run_without_installed_metadata_still_records_a_line(monkeypatch, tmp_path):
    # seen on a GPU machine with no registry: PYTHONPATH=src, grail-rl not installed, so every run's worker died here
    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(provenance.metadata, "version", not_installed)
    line = record_code(tmp_path, 0)
    assert line["grail_rl"] == grail.__version__ and line["torch"] is None and line["trl"] is None


def test_without_metadata_or_a_checkout_the_version_is_none(monkeypatch, tmp_path):
    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(provenance.metadata, "version", not_installed)
    assert provenance._own_version(tmp_path) is None  # no pyproject.toml there
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "grail-rl"\nversion = "9.9"\n')
    assert provenance._own_version(tmp_path) == "9.9"


def test_each_attempt_appends_its_line(tmp_path):
    record_code(tmp_path, 0)
    record_code(tmp_path, 20)
    lines = [json.loads(x) for x in (tmp_path / CODE_FILE).read_text().splitlines()]
    assert [x["from_step"] for x in lines] == [0, 20] and lines[0]["time"] <= lines[1]["time"]
    assert lines[0].keys() == lines[1].keys() >= {"grail_rl", "commit", "dirty", "torch", "trl"}
