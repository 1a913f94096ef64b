"""The run data behind the results pages (results/README.md): no run data in the documentation site, every
comparison archive within its size budget and listed in the README, and (slow) each archive's report is the one its
runs give (`grail compare --resume ARCHIVE --check-report`)."""

from pathlib import Path

import pytest

from grail.analysis.compare.packed import SUFFIX, read_plan
from grail.cli import main

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "results"
BUDGET_BYTES = 2_000_000  # per comparison: a clone carries every archive, and each new comparison adds one
# what a page shows or embeds; anything else under docs/ that a run or a measurement wrote belongs in results/
PAGE_FILES = {".md", ".png", ".py"}  # .py: docs/hooks/, the site's own code
ARCHIVES = sorted(RESULTS.glob(f"*{SUFFIX}"))


def test_there_is_an_archive_to_check():
    assert ARCHIVES, f"no {SUFFIX} under {RESULTS}: the results pages link to at least one"


@pytest.mark.parametrize("archive", ARCHIVES, ids=lambda p: p.name)
def test_each_archive_is_within_its_budget_and_listed(archive):
    size = archive.stat().st_size
    assert size <= BUDGET_BYTES, (f"{archive.name} is {size / 1e6:.2f} MB, over the {BUDGET_BYTES / 1e6:.0f} MB budget "
                                  f"of a comparison: archive fewer samples, or split the comparison")
    plan = read_plan(archive)  # a comparison's archive, readable without unpacking it
    assert plan["arms"] and plan["seeds"] >= 1
    listed = (RESULTS / "README.md").read_text()
    assert f"`{archive.name}`" in listed, f"say what {archive.name} is in results/README.md"


def test_the_docs_hold_no_run_data():
    data = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "docs").rglob("*")
                  if p.is_file() and p.suffix not in PAGE_FILES and "__pycache__" not in p.parts)
    assert not data, f"run data or measurements under docs/ (move them to results/, list them in its README): {data}"


@pytest.mark.slow
@pytest.mark.parametrize("archive", ARCHIVES, ids=lambda p: p.name)
def test_each_archive_s_report_is_its_runs(archive, capsys):
    assert main(["compare", "--resume", str(archive), "--check-report"]) == 0, capsys.readouterr().out[-3000:]
