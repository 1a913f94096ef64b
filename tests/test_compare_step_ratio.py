"""The step time of each arm against its reference, paired by seed (`timing.step_ratio` of report.json and its table
in report.md), from hand-written run files whose step times are chosen here."""

import json

import pytest
from tests.test_compare_report_only import write_plan, write_run

from grail.cli import main

STEP = {"none": [1.0, 2.0, 1.5], "grail": [1.5, 2.5, None]}  # seconds a step; grail/seed2 never logged a step time


@pytest.fixture
def runs(tmp_path):
    write_plan(tmp_path)
    for arm, values in STEP.items():
        for seed, step in enumerate(values):
            timed = {} if step is None else {"step_time": step}
            write_run(tmp_path, arm, seed, [{"step": t, "reward": 0.5, **timed} for t in range(1, 5)], 0.5)
    return tmp_path


def test_each_arm_s_step_time_is_paired_by_seed_with_its_reference_s(runs):
    assert main(["compare", "--resume", str(runs), "--report-only"]) == 0
    ratio = json.loads((runs / "report.json").read_text())["timing"]["step_ratio"]
    assert set(ratio) == {"grail"} and ratio["grail"]["reference"] == "none"
    assert ratio["grail"]["seeds"] == [0, 1]  # seed 2 has no step time in the grail arm: not paired
    assert ratio["grail"]["ratio"]["values"] == pytest.approx([1.5, 1.25])  # sums of 4 steps cancel
    assert ratio["grail"]["extra_share"]["values"] == pytest.approx([1 / 3, 0.2])
    text = (runs / "report.md").read_text()
    assert "| grail | none | 2 | 1.38 [1.25, 1.50] | 0.27 [0.20, 0.33] |" in text


def test_a_report_without_step_times_has_no_ratio_table(runs):
    for arm in STEP:
        for seed in range(3):
            write_run(runs, arm, seed, [{"step": t, "reward": 0.5} for t in range(1, 5)])
    assert main(["compare", "--resume", str(runs), "--report-only"]) == 0
    assert "share beyond the reference's step" not in (runs / "report.md").read_text()
