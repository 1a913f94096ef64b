"""perf/pilot_seeds.py: the seeds a pilot implies, by the rule fixed before it ran (the smallest S whose 95%
t-interval half-width at the pilot's sd is within the target, at least the minimum), and the scale-matched arm."""

import json
import math
import statistics

import pytest

from grail.analysis.compare.stats import t_quantile
from perf_loading import load_perf_script


def _report(differences, scale=1.0, arm="grail"):
    """The parts of a grail compare report.json the rule reads (fractions, as the report stores them)."""
    d = [v / 100 for v in differences]
    sd = statistics.stdev(d) if len(d) > 1 else None
    return {"primary_metric": "sampled/synthetic/acc@4",
            "metrics": {"sampled/synthetic/acc@4": {"paired": {arm: {"n": len(d), "sd": sd, "values": d,
                                                                     "reference": "none"}}}},
            "weights": {"weights/adv_scale_ratio": {arm: {"mean": scale}}}}


def _by_hand(sd, target, least):
    s = 2
    while t_quantile(0.975, s - 1) * sd / math.sqrt(s) > target:
        s += 1
    return max(s, least)


@pytest.mark.parametrize("differences", [[1.0, 2.0, 1.5], [-6.0, 4.0, 9.0], [0.0, 12.5, -10.9]])
def test_the_seeds_are_the_smallest_whose_half_width_fits_and_at_least_the_minimum(differences):
    out = load_perf_script("pilot_seeds").pilot_seeds(_report(differences), half_width=2.5, min_seeds=6)
    sd = statistics.stdev(differences)
    assert out["sd_points"] == pytest.approx(sd)
    assert out["seeds"] == _by_hand(sd, 2.5, 6)
    assert out["expected_half_width_points"] <= 2.5 + 1e-9
    assert out["pilot_differences_points"] == pytest.approx(differences)
    if sd > 5:  # a wide pilot needs more than the minimum
        assert out["seeds"] > 6


def test_the_scale_matched_arm_joins_only_above_the_threshold():
    rule = load_perf_script("pilot_seeds").pilot_seeds
    assert rule(_report([1.0, 2.0, 3.0], scale=1.2))["add_scale_matched_arm"] is True
    assert rule(_report([1.0, 2.0, 3.0], scale=1.1))["add_scale_matched_arm"] is False  # "more than 10%"


def test_a_pilot_without_the_arm_or_an_sd_is_refused_and_the_script_reads_a_directory(tmp_path, capsys):
    module = load_perf_script("pilot_seeds")
    with pytest.raises(ValueError, match="no paired difference for arm 'oar_g'"):
        module.pilot_seeds(_report([1.0, 2.0]), arm="oar_g")
    with pytest.raises(ValueError, match="1 paired seed"):
        module.pilot_seeds(_report([1.0]))
    (tmp_path / "report.json").write_text(json.dumps(_report([-6.0, 4.0, 9.0], scale=1.3)))
    import sys
    argv, sys.argv = sys.argv, ["pilot_seeds.py", str(tmp_path), "--json", str(tmp_path / "out.json")]
    try:
        module.main()
    finally:
        sys.argv = argv
    text = capsys.readouterr().out
    assert "S = " in text and "joins" in text
    assert json.loads((tmp_path / "out.json").read_text())["seeds"] == _by_hand(statistics.stdev([-6, 4, 9]), 2.5, 6)
