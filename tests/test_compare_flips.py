"""`grail compare --resume DIR --greedy-flips` (grail.analysis.compare.flips) on a hand-written comparison: 10
held-out problems whose start got k of 4 samples right (K below) and solved some greedily (SOLVED); two seeds whose
greedy answers after RL are written to gain and lose chosen problems, so every count and rate below is worked out by
hand from them."""

import json

import pytest

from grail.analysis.compare import plan as compare
from grail.analysis.compare.flips import greedy_flips
from grail.analysis.compare.summary import BEFORE_RL_FILE, RESULT_FILE, run_path
from grail.cli import main

K = [0, 0, 0, 0, 1, 1, 2, 3, 4, 4]  # problem p: the start's right samples of 4
SOLVED = {0, 4, 6, 8, 9}  # the start's greedy answer is right on these
AFTER = [{1, 4, 6, 7, 8, 9},  # seed 0: gains 1 (k 0) and 7 (k 3), loses 0 (k 0)
         {0, 2, 3, 8}]  # seed 1: gains 2 and 3 (k 0), loses 4 (k 1), 6 (k 2) and 9 (k 4)


def _evaluation(value_of, n: int) -> list[dict]:
    ids = [str(p) for p in range(len(K))]
    return [{"name": "synthetic", "n": n, "problem_ids": ids, "per_problem_acc": [value_of(p) for p in range(len(K))],
             "per_problem_pass": {}}]


def _comparison(out, evaluations=("greedy", "sampled")) -> None:
    arms = compare.parse_arms("none", [])
    plan = {"seeds": 2, "seed_fields": ["seed", "data_seed"], "base": {},
            "protocol": {"kind": "synthetic held-out", "primary": "sampled/synthetic/acc@4", "description": "hand"},
            "arms": [{"label": a.label, "slug": a.slug, "method": a.method, "fields": a.fields} for a in arms]}
    (out / compare.PLAN_FILE).write_text(json.dumps(plan))
    before = {"greedy": _evaluation(lambda p: float(p in SOLVED), 1), "sampled": _evaluation(lambda p: K[p] / 4, 4)}
    for seed, solved in enumerate(AFTER):
        run = run_path(out, "none", seed)
        run.mkdir(parents=True)
        after = {"greedy": _evaluation(lambda p, s=solved: float(p in s), 1),
                 "sampled": _evaluation(lambda p: 0.5, 4)}
        (run / "metrics.jsonl").write_text("")
        (run / RESULT_FILE).write_text(json.dumps({"metrics": {}, "evaluations": {e: after[e] for e in evaluations}}))
    start = {"model_path": "m", "seed": 0, "metrics": {}, "evaluations": {e: before[e] for e in evaluations}}
    (out / BEFORE_RL_FILE).write_text(json.dumps({"version": 1, "arms": {"none": "start-x"},
                                                  "starts": {"start-x": start}}))


def test_each_row_counts_the_gains_and_losses_written_into_its_problems(tmp_path):
    _comparison(tmp_path)
    flips = greedy_flips(tmp_path, json.loads((tmp_path / compare.PLAN_FILE).read_text()))
    assert list(flips) == ["none"] and flips["none"]["seeds"] == [0, 1] and flips["none"]["start"] == "start-x"
    rows = {r["right"]: r for r in flips["none"]["rows"]}
    assert list(rows) == ["0/4", "1/4", "2/4", "3/4", "4/4"]
    assert [(r["problems"], r["greedy_solved"]) for r in rows.values()] == [(4, 1), (2, 1), (1, 1), (1, 0), (2, 2)]
    assert rows["0/4"]["gained_by_seed"] == [1, 2] and rows["0/4"]["lost_by_seed"] == [1, 0]
    assert rows["0/4"]["gain_rate"] == pytest.approx(1.5 / 3) and rows["0/4"]["loss_rate"] == pytest.approx(0.5)
    assert rows["1/4"]["gained"] == 0 and rows["1/4"]["lost"] == 0.5 and rows["1/4"]["gain_rate"] == 0
    assert rows["2/4"]["gain_rate"] is None and rows["2/4"]["loss_rate"] == 0.5  # nothing there to gain
    assert rows["3/4"]["gained_by_seed"] == [1, 0] and rows["3/4"]["loss_rate"] is None
    assert rows["4/4"]["lost_by_seed"] == [0, 1] and rows["4/4"]["loss_rate"] == pytest.approx(0.25)
    # the rows add up to greedy accuracy's change per seed: +1 and −1 problems
    for seed, change in enumerate([1, -1]):
        assert sum(r["gained_by_seed"][seed] - r["lost_by_seed"][seed] for r in rows.values()) == change


def test_the_command_prints_the_table_and_writes_the_json(tmp_path, capsys):
    _comparison(tmp_path)
    out_json = tmp_path / "flips.json"
    assert main(["compare", "--resume", str(tmp_path), "--greedy-flips", "--analysis-json", str(out_json)]) == 0
    text = capsys.readouterr().out
    assert "| 0/4 | 4 | 1 | 1.5 | 0.5 | +1.0 | 50% | 50% |" in text
    assert "| 2/4 | 1 | 1 | 0.0 | 0.5 | -0.5 | – | 50% |" in text
    assert "Gained 2.0, lost 2.0 a seed; 75% of the gains on problems none of the start's samples solved." in text
    assert json.loads(out_json.read_text())["greedy_flips"]["none"]["rows"][0]["gained_by_seed"] == [1, 2]


def test_a_comparison_without_greedy_evaluations_is_refused_with_the_reason(tmp_path, capsys):
    _comparison(tmp_path, evaluations=("sampled",))
    assert main(["compare", "--resume", str(tmp_path), "--greedy-flips"]) == 2
    assert "no finished run whose start was evaluated greedily and sampled" in capsys.readouterr().err
