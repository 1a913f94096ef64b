"""The sharpening-or-learning tables of `grail compare`'s report (grail.analysis.compare.sharpening), from
hand-written per-problem results (as run.py records each evaluation's): 10 held-out problems, the start solving 0-3
greedily; each run's values are what its results were written to give, paired with the reference arm per seed; a
comparison without a greedy evaluation has none."""

import json

import pytest

from grail.analysis.compare import plan as compare
from grail.analysis.compare.report import write_report
from grail.analysis.compare.summary import BEFORE_RL_FILE, RESULT_FILE, run_path

PRIMARY = "sampled/synthetic/acc@4"
PROBLEMS = 10
SOLVED = {"0", "1", "2", "3"}  # the start's greedy answer is right on these
BEFORE_SAMPLED = 0.25  # every problem: 1 of its 4 samples right before RL
# per arm, per seed: (right samples of 4 on each solved problem, on each unsolved one, greedy gained, greedy lost)
RUNS = {"none": [(3, 1, 1, 2), (4, 1, 2, 1)], "grail": [(2, 2, 3, 0), (3, 2, 4, 1)]}


def evaluation(right_of, greedy: bool = False) -> list[dict]:
    """One evaluation's per-problem record (run.py's shape) with right_of(problem id) of its samples correct (1
    sample when greedy, else 4)."""
    n = 1 if greedy else 4
    ids = [str(p) for p in range(PROBLEMS)]
    return [{"name": "synthetic", "n": n, "problem_ids": ids, "per_problem_acc": [right_of(p) / n for p in ids],
             "per_problem_pass": {}}]


def write_comparison(out, evaluations=("greedy", "sampled")) -> dict:
    arms = compare.parse_arms("none,grail", [])
    plan = {"seeds": 2, "seed_fields": ["seed", "data_seed"], "base": {},
            "protocol": {"kind": "synthetic held-out", "primary": PRIMARY, "description": "hand-written"},
            "arms": [{"label": a.label, "slug": a.slug, "method": a.method, "fields": a.fields} for a in arms]}
    (out / compare.PLAN_FILE).write_text(json.dumps(plan))
    before = {"greedy": evaluation(lambda p: int(p in SOLVED), greedy=True), "sampled": evaluation(lambda p: 1)}
    unsolved = sorted(set(map(str, range(PROBLEMS))) - SOLVED)
    for arm, per_seed in RUNS.items():
        for seed, (on_solved, on_unsolved, gained, lost) in enumerate(per_seed):
            run = run_path(out, arm, seed)
            run.mkdir(parents=True)
            now_solved = (SOLVED - set(sorted(SOLVED)[:lost])) | set(unsolved[:gained])
            after = {"greedy": evaluation(lambda p, s=now_solved: int(p in s), greedy=True),
                     "sampled": evaluation(lambda p, a=on_solved, b=on_unsolved: a if p in SOLVED else b)}
            (run / "metrics.jsonl").write_text("")
            (run / RESULT_FILE).write_text(json.dumps({"metrics": {PRIMARY: 0.5}, "train_seconds": 1.0,
                                                       "seconds_per_step": 1.0, "eval_seconds": 1.0,
                                                       "evaluations": {e: after[e] for e in evaluations}}))
    start = {"model_path": "m", "seed": 0, "metrics": {}, "evaluations": {e: before[e] for e in evaluations}}
    (out / BEFORE_RL_FILE).write_text(json.dumps({"version": 1, "arms": {"none": "start-x", "grail": "start-x"},
                                                  "starts": {"start-x": start}}))
    return plan


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("sharpening")
    return out, write_report(out, write_comparison(out))


def test_each_runs_values_are_what_its_samples_were_written_to_give(report):
    _, summary = report
    stats = summary["sharpening"]["stats"]
    assert summary["sharpening"]["split"] == {"start-x": {"solved": 4, "unsolved": 6}}
    for arm, per_seed in RUNS.items():
        expected = {"sampled change, solved": [a / 4 - BEFORE_SAMPLED for a, _, _, _ in per_seed],
                    "sampled change, unsolved": [b / 4 - BEFORE_SAMPLED for _, b, _, _ in per_seed],
                    "greedy gained": [float(g) for _, _, g, _ in per_seed],
                    "greedy lost": [float(w) for _, _, _, w in per_seed]}
        for quantity, values in expected.items():
            got = stats[quantity]["per_arm"][arm]
            assert got["seeds"] == [0, 1] and got["values"] == pytest.approx(values), (arm, quantity)


def test_the_paired_difference_is_per_seed_against_the_reference(report):
    _, summary = report
    paired = summary["sharpening"]["stats"]["sampled change, unsolved"]["paired"]["grail"]
    assert paired["reference"] == "none" and paired["values"] == pytest.approx([0.25, 0.25])  # (2 − 1) / 4 each
    gained = summary["sharpening"]["stats"]["greedy gained"]["paired"]["grail"]
    assert gained["values"] == pytest.approx([2.0, 2.0])


def test_the_section_says_how_the_problems_split_and_renders_both_tables(report):
    out, _ = report
    text = (out / "report.md").read_text()
    section = text.split("## Sharpening or learning")[1].split("\n## ")[0]
    assert "start-x: 4 solved, 6 unsolved" in section
    assert "| none | 2 | 62.5 ± " in section  # solved: (3/4 + 4/4)/2 − 1/4 = 0.625
    assert "| grail | 2 | 3.5 ± " in section  # gained: (3 + 4)/2


def test_no_section_without_a_greedy_evaluation(tmp_path):
    summary = write_report(tmp_path, write_comparison(tmp_path, evaluations=("sampled",)))
    assert "sharpening" not in summary
    assert "## Sharpening or learning" not in (tmp_path / "report.md").read_text()
