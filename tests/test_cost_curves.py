"""perf/benchmarks/cost_curves.py: step_overhead at each completion length in its own process, kept per T so that a
rerun resumes; the growth exponent and the goals computed from the points."""

import json
import math

import cost_curves
import pytest


def test_growth_exponent_recovers_a_power_law_and_skips_non_positive_extras():
    curves = cost_curves
    tokens = [128, 256, 512, 1024]
    assert curves.growth_exponent(tokens, [3e-6 * t**2 for t in tokens]) == pytest.approx(2.0)
    assert curves.growth_exponent(tokens, [0.01 * t for t in tokens]) == pytest.approx(1.0)
    # a method cheaper than GRPO at one T (noise) leaves that T out; one point is no slope
    assert curves.growth_exponent(tokens, [-0.1, 0.2, 0.4, 0.8]) == pytest.approx(1.0)
    assert curves.growth_exponent(tokens, [-0.1, None, 0.0, 0.8]) is None


def _point(tokens, rows, ratios, floor=None):
    def method(ratio, probe=None, floor=None):
        return {"median_step_s": 10.0 * ratio, "step_s": [10.0 * ratio], "time_ratio_to_grpo": ratio,
                "mem_ratio_to_grpo": 1.0, "peak_mem_increase_mb_median": 100.0, "weights_seconds_median": probe,
                "probe_floor_s_median": floor, "probe_to_floor": None if floor is None else probe / floor,
                "probed_rows_frac": 0.5}
    methods = {"none": method(1.0)}
    for name, ratio in ratios.items():
        methods[name] = method(ratio, 1.0, floor) if name == "grail" else method(ratio)
    return {"config": {"methods": list(methods), "rows": rows, "device": "cpu"}, "methods": methods}


def test_goals_are_read_at_every_length_and_oar_p_at_1024_only():
    curves = cost_curves
    args = curves.parse_args(["--out", "unused"])
    points = {128: _point(128, 8, {"grail": 1.10, "oar_p": 3.5}, floor=1.0),
              1024: _point(1024, 2, {"grail": 1.20, "oar_p": 2.9}, floor=0.5)}
    result = curves.assemble(args, points)
    goals = {g["goal"]: g for g in result["goals"]}
    assert goals["grail step / GRPO step, every T"]["met"] is False  # 1.20 at T = 1024
    assert goals["grail probe / its floor, every T"]["measured"] == {128: 1.0, 1024: 2.0}
    assert goals["oar_p step / GRPO step at T = 1024"] == {"goal": "oar_p step / GRPO step at T = 1024",
                                                           "at_most": 3.0, "measured": {1024: 2.9}, "met": True}
    oar_p = result["curves"]["oar_p"]
    # extra seconds per completion: (35 - 10) / 8 at 128, (29 - 10) / 2 at 1024
    assert [p["extra_s_per_completion"] for p in oar_p["points"]] == [25 / 8, 19 / 2]
    assert oar_p["growth_exponent"] == pytest.approx(math.log((19 / 2) / (25 / 8)) / math.log(8))
    assert result["curves"]["none"]["growth_exponent"] is None


def test_smoke_measures_each_length_in_its_own_process_and_resumes(warm_cache, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    curves = cost_curves
    cache, checkpoint = warm_cache
    steps = json.loads((checkpoint / "warmstart.json").read_text())["steps"]
    out = tmp_path / "curves"
    argv = ["--smoke", "--out", str(out), "--cache-dir", str(cache), "--warmstart-steps", str(steps),
            "--json", str(tmp_path / "curves.json"), "--plot", str(tmp_path / "curves.png")]
    assert curves.main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["tokens"] == [16, 32] and set(result["curves"]) == {"none", "grail"}
    for t in (16, 32):
        point = json.loads((out / f"T{t}.json").read_text())
        assert point["config"]["completion_tokens"] == t and point["config"]["reward"] == "coin"
        argv_t = point["cost_curves_argv"]
        assert argv_t[argv_t.index("--malloc") + 1] == "default"  # times as a user's run has them
    grail = result["curves"]["grail"]["points"]
    assert [p["tokens"] for p in grail] == [16, 32] and all(p["time_ratio_to_grpo"] > 0 for p in grail)
    assert all(p["mem_ratio_to_grpo"] is None for p in grail)  # glibc untuned: no step's own memory to compare
    assert (tmp_path / "curves.png").stat().st_size > 0
    assert json.loads((tmp_path / "curves.json").read_text()) == result

    # a rerun reads the points instead of measuring them again
    before = {t: (out / f"T{t}.json").stat().st_mtime_ns for t in (16, 32)}
    assert curves.main(argv) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out) == result and "T = 16: reusing" in captured.err
    assert {t: (out / f"T{t}.json").stat().st_mtime_ns for t in (16, 32)} == before
    # where the model is cached is not a setting of the measurement: the points are reused from another cache too
    moved = [*argv]
    moved[moved.index("--cache-dir") + 1] = str(tmp_path / "elsewhere")
    assert curves.main(moved) == 0 and "T = 32: reusing" in capsys.readouterr().err
    # other settings for a measured point are refused, naming the file
    with pytest.raises(SystemExit, match="T16.json was measured with other settings"):
        curves.main([*argv, "--rows", "2"])
