"""`grail compare --resume DIR --pairs a:b` and `--pilot-seeds ARM` (grail.analysis.compare.pairs and .planning):
two arms of a finished comparison paired by seed (GRAIL against a null), with the report's statistics (the
t-interval over the seeds both finished, the exact sign-flip p, the bootstrap interval) and Holm over the pairs;
and the seeds a pilot implies, by the rule fixed before it ran (the smallest S whose 95% t-interval half-width at
the pilot's sd is within the target, at least the minimum), and the scale-matched arm."""

import json
import math
import statistics

import pytest
from scipy.stats import t as student_t

from grail.analysis.compare.pairs import paired_arms, with_holm
from grail.analysis.compare.planning import pilot_seeds
from grail.cli import main

METRIC = "sampled/synthetic/acc@4"


def _report(per_arm: dict[str, dict[int, float]]) -> dict:
    """The parts of a grail compare report.json the script reads (fractions, seeds beside their values)."""
    return {"primary_metric": METRIC,
            "metrics": {METRIC: {"per_arm": {arm: {"seeds": sorted(v), "values": [v[s] for s in sorted(v)]}
                                             for arm, v in per_arm.items()}}}}


def test_the_difference_is_taken_seed_by_seed_over_the_seeds_both_arms_finished():
    grail = {0: 0.30, 1: 0.25, 2: 0.40, 3: 0.20, 4: 0.35, 5: 0.31, 6: 0.9}
    random = {0: 0.20, 1: 0.22, 2: 0.30, 3: 0.19, 4: 0.30, 5: 0.21}  # seed 6 unfinished: left out
    out = paired_arms(_report({"grail": grail, "random": random}), "grail", "random",
                                                      METRIC)
    d = [grail[s] - random[s] for s in range(6)]
    half = student_t.ppf(0.975, 5) * statistics.stdev(d) / math.sqrt(6)
    assert out["seeds"] == list(range(6)) and out["n"] == 6
    assert out["mean"] == pytest.approx(statistics.mean(d))
    assert (out["low"], out["high"]) == pytest.approx((statistics.mean(d) - half, statistics.mean(d) + half))
    assert out["sign_flip_p"] == pytest.approx(2 / 64)  # every difference positive: 2 of the 64 sign assignments
    assert out["bootstrap"][0] >= min(d) and out["bootstrap"][1] <= max(d)


def test_a_pairing_the_report_cannot_give_is_refused_by_name(tmp_path, capsys):
    report = _report({"grail": {0: 0.3, 1: 0.2}, "random": {1: 0.1, 2: 0.2}})
    with pytest.raises(ValueError, match="no arm 'position'"):
        paired_arms(report, "grail", "position", METRIC)
    with pytest.raises(ValueError, match="share 1 finished seed"):
        paired_arms(report, "grail", "random", METRIC)
    with pytest.raises(ValueError, match="no metric 'greedy"):
        paired_arms(report, "grail", "random", "greedy/synthetic/acc@1")
    comparison = _comparison(tmp_path, {"grail": {0: 0.3, 1: 0.2, 2: 0.4}, "random": {0: 0.1, 1: 0.25, 2: 0.3}})
    assert main(["compare", "--resume", str(comparison), "--pairs", "grail:random"]) == 0
    table = capsys.readouterr().out
    assert "| grail − random | sampled/synthetic/acc@4 | 3 | +8.3 ±" in table  # (20 − 5 + 10) / 3 points
    assert "| Holm p |" in table


def test_several_pairs_get_holm_adjusted_p_values_within_each_metric():
    rows = [{"metric": "m1", "sign_flip_p": 0.01}, {"metric": "m1", "sign_flip_p": 0.04},
            {"metric": "m2", "sign_flip_p": 0.04}]
    out = with_holm(rows)
    assert [r["holm_p"] for r in out] == pytest.approx([0.02, 0.04, 0.04])  # m2's one pair is its own family
    assert "holm_p" not in rows[0]  # the rows given are left as they were


def _comparison(tmp_path, per_arm: dict[str, dict[int, float]]):
    """A directory the analysis flags accept: a plan (compare.json) and a report.json (only its read parts)."""
    from grail.analysis.compare import plan as compare

    arms = compare.parse_arms(",".join(per_arm), [])
    plan = {"seeds": 3, "seed_fields": ["seed"], "base": {},
            "protocol": {"kind": "synthetic held-out", "primary": METRIC, "description": "hand-written"},
            "arms": [{"label": a.label, "slug": a.slug, "method": a.method, "fields": a.fields} for a in arms]}
    (tmp_path / compare.PLAN_FILE).write_text(json.dumps(plan))
    (tmp_path / "report.json").write_text(json.dumps(_report(per_arm)))
    return tmp_path


def test_the_analysis_flags_read_a_comparison_and_train_nothing(tmp_path, capsys):
    comparison = _comparison(tmp_path, {"grail": {0: 0.3, 1: 0.2, 2: 0.4}, "random": {0: 0.1, 1: 0.25, 2: 0.3}})
    assert main(["compare", "--pairs", "grail:random"]) == 2  # no --resume DIR
    assert "give it with --resume DIR" in capsys.readouterr().err
    assert main(["compare", "--resume", str(comparison), "--pairs", "grail:random", "--seeds", "9"]) == 2
    assert "drop --seeds" in capsys.readouterr().err
    assert main(["compare", "--resume", str(comparison), "--pairs", "grail-random"]) == 2
    assert "give each pair as a:b" in capsys.readouterr().err
    assert main(["compare", "--resume", str(comparison), "--pairs", "grail:random", "--report-only"]) == 2
    assert sorted(p.name for p in comparison.iterdir()) == ["compare.json", "report.json"]  # nothing written


def _pilot_report(differences, scale=1.0, arm="grail"):
    """The parts of a grail compare report.json the rule reads (fractions, as the report stores them)."""
    d = [v / 100 for v in differences]
    sd = statistics.stdev(d) if len(d) > 1 else None
    return {"primary_metric": "sampled/synthetic/acc@4",
            "metrics": {"sampled/synthetic/acc@4": {"paired": {arm: {"n": len(d), "sd": sd, "values": d,
                                                                     "reference": "none"}}}},
            "weights": {"weights/adv_scale_ratio": {arm: {"mean": scale}}}}


def _by_hand(sd, target, least):
    s = 2
    while student_t.ppf(0.975, s - 1) * sd / math.sqrt(s) > target:
        s += 1
    return max(s, least)


@pytest.mark.parametrize("differences", [[1.0, 2.0, 1.5], [-6.0, 4.0, 9.0], [0.0, 12.5, -10.9]])
def test_the_seeds_are_the_smallest_whose_half_width_fits_and_at_least_the_minimum(differences):
    out = pilot_seeds(_pilot_report(differences), half_width=2.5, min_seeds=6)
    sd = statistics.stdev(differences)
    assert out["sd_points"] == pytest.approx(sd)
    assert out["seeds"] == _by_hand(sd, 2.5, 6)
    assert out["expected_half_width_points"] <= 2.5 + 1e-9
    assert out["pilot_differences_points"] == pytest.approx(differences)
    if sd > 5:  # a wide pilot needs more than the minimum
        assert out["seeds"] > 6


def test_the_scale_matched_arm_joins_only_above_the_threshold():
    rule = pilot_seeds
    assert rule(_pilot_report([1.0, 2.0, 3.0], scale=1.2))["add_scale_matched_arm"] is True
    assert rule(_pilot_report([1.0, 2.0, 3.0], scale=1.1))["add_scale_matched_arm"] is False  # "more than 10%"


def test_a_pilot_without_the_arm_or_an_sd_is_refused_and_the_script_reads_a_directory(tmp_path, capsys):
    with pytest.raises(ValueError, match="no paired difference for arm 'oar_g'"):
        pilot_seeds(_pilot_report([1.0, 2.0]), arm="oar_g")
    with pytest.raises(ValueError, match="1 paired seed"):
        pilot_seeds(_pilot_report([1.0]))
    comparison = _comparison(tmp_path, {"grail": {0: 0.3, 1: 0.2, 2: 0.4}, "none": {0: 0.36, 1: 0.16, 2: 0.31}})
    report = json.loads((comparison / "report.json").read_text())
    report.update(_pilot_report([-6.0, 4.0, 9.0], scale=1.3))
    (comparison / "report.json").write_text(json.dumps(report))
    out_json = tmp_path / "out.json"
    assert main(["compare", "--resume", str(comparison), "--pilot-seeds", "grail", "--analysis-json",
                 str(out_json)]) == 0
    text = capsys.readouterr().out
    assert "S = " in text and "joins" in text
    assert json.loads(out_json.read_text())["pilot_seeds"]["seeds"] == _by_hand(statistics.stdev([-6, 4, 9]), 2.5, 6)
