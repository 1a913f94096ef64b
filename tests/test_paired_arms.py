"""perf/paired_arms.py: two arms of a finished comparison paired by seed (GRAIL against a null), with the report's
statistics: the t-interval over the seeds both finished, the exact sign-flip p, the bootstrap interval."""

import json
import math
import statistics
import sys

import pytest

from grail.analysis.compare.stats import t_quantile
from perf_loading import load_perf_script

METRIC = "sampled/synthetic/acc@4"


def _report(per_arm: dict[str, dict[int, float]]) -> dict:
    """The parts of a grail compare report.json the script reads (fractions, seeds beside their values)."""
    return {"primary_metric": METRIC,
            "metrics": {METRIC: {"per_arm": {arm: {"seeds": sorted(v), "values": [v[s] for s in sorted(v)]}
                                             for arm, v in per_arm.items()}}}}


def test_the_difference_is_taken_seed_by_seed_over_the_seeds_both_arms_finished():
    grail = {0: 0.30, 1: 0.25, 2: 0.40, 3: 0.20, 4: 0.35, 5: 0.31, 6: 0.9}
    random = {0: 0.20, 1: 0.22, 2: 0.30, 3: 0.19, 4: 0.30, 5: 0.21}  # seed 6 unfinished: left out
    out = load_perf_script("paired_arms").paired_arms(_report({"grail": grail, "random": random}), "grail", "random",
                                                      METRIC)
    d = [grail[s] - random[s] for s in range(6)]
    half = t_quantile(0.975, 5) * statistics.stdev(d) / math.sqrt(6)
    assert out["seeds"] == list(range(6)) and out["n"] == 6
    assert out["mean"] == pytest.approx(statistics.mean(d))
    assert (out["low"], out["high"]) == pytest.approx((statistics.mean(d) - half, statistics.mean(d) + half))
    assert out["sign_flip_p"] == pytest.approx(2 / 64)  # every difference positive: 2 of the 64 sign assignments
    assert out["bootstrap"][0] >= min(d) and out["bootstrap"][1] <= max(d)


def test_a_pairing_the_report_cannot_give_is_refused_by_name(tmp_path, capsys):
    module = load_perf_script("paired_arms")
    report = _report({"grail": {0: 0.3, 1: 0.2}, "random": {1: 0.1, 2: 0.2}})
    with pytest.raises(ValueError, match="no arm 'position'"):
        module.paired_arms(report, "grail", "position", METRIC)
    with pytest.raises(ValueError, match="share 1 finished seed"):
        module.paired_arms(report, "grail", "random", METRIC)
    with pytest.raises(ValueError, match="no metric 'greedy"):
        module.paired_arms(report, "grail", "random", "greedy/synthetic/acc@1")
    (tmp_path / "report.json").write_text(json.dumps(_report({"grail": {0: 0.3, 1: 0.2, 2: 0.4},
                                                              "random": {0: 0.1, 1: 0.25, 2: 0.3}})))
    argv, sys.argv = sys.argv, ["paired_arms.py", str(tmp_path), "--pairs", "grail:random"]
    try:
        module.main()
    finally:
        sys.argv = argv
    table = capsys.readouterr().out
    assert "| grail − random | sampled/synthetic/acc@4 | 3 | +8.3 ±" in table
    assert "| Holm p |" in table.splitlines()[0]


def test_several_pairs_get_holm_adjusted_p_values_within_each_metric():
    module = load_perf_script("paired_arms")
    rows = [{"metric": "m1", "sign_flip_p": 0.01}, {"metric": "m1", "sign_flip_p": 0.04},
            {"metric": "m2", "sign_flip_p": 0.04}]
    out = module.with_holm(rows)
    assert [r["holm_p"] for r in out] == pytest.approx([0.02, 0.04, 0.04])  # m2's one pair is its own family
    assert "holm_p" not in rows[0]  # the rows given are left as they were
