"""`grail compare --resume DIR --eval-noise a:b` (grail.analysis.compare.noise): the share of a comparison's
seed-to-seed variance that is its evaluation's own sampling. Checked on simulated evaluations whose truth is known
(Bernoulli samples from fixed per-problem accuracies, drawn independently or with the two arms sharing their random
numbers, with and without a training effect per seed), and on a hand-written comparison directory. And `--phase-times`
(grail.analysis.compare.planning): the time per phase from the runs' file times, on a hand-written comparison whose
file times are set, with a run resumed in training and one evaluated after a restart."""

import json
import os
import random

import pytest

from grail.analysis.compare import noise
from grail.analysis.compare import plan as compare
from grail.analysis.compare.planning import phase_times
from grail.analysis.compare.summary import RESULT_FILE, run_path
from grail.cli import main

N = 4
P_TRUE = [0.05 * (i % 12) for i in range(64)]  # 0 .. 0.55: problems of every difficulty, as on the real task


def _evaluate(uniforms: list[list[float]], p: list[float]) -> dict[str, list[float]]:
    """One evaluation: per problem, N samples correct where the uniform draw falls below its accuracy."""
    return {str(i): [float(u < q) for u in row] for i, (row, q) in enumerate(zip(uniforms, p, strict=True))}


def _draws(rng: random.Random) -> list[list[float]]:
    return [[rng.random() for _ in range(N)] for _ in P_TRUE]


def test_without_a_training_effect_the_evaluation_explains_the_whole_spread():
    rng = random.Random(0)
    seeds = range(1500)
    first = {s: _evaluate(_draws(rng), P_TRUE) for s in seeds}
    second = {s: _evaluate(_draws(rng), P_TRUE) for s in seeds}
    out = noise.decompose(first, second)
    assert out["n"] == N and out["eval_share"] == pytest.approx(1.0, abs=0.1)
    assert out["eval_var_independent"] == pytest.approx(out["eval_var"], rel=0.05)  # nothing shared: they agree
    assert out["projected"][N]["sd"] == pytest.approx(out["sd"], rel=0.06)


def test_arms_that_share_their_random_numbers_are_credited_with_less_evaluation_noise():
    rng = random.Random(3)
    seeds = range(1500)
    draws = {s: _draws(rng) for s in seeds}  # the same uniforms for both arms of a seed, as same-seed evaluations
    first = {s: _evaluate(draws[s], [q + 0.05 for q in P_TRUE]) for s in seeds}
    second = {s: _evaluate(draws[s], P_TRUE) for s in seeds}
    out = noise.decompose(first, second)
    truth = 0.05 * 0.95 / N / len(P_TRUE)  # δ_ij is 1 with probability 0.05, else 0, for every problem
    assert out["eval_var"] == pytest.approx(truth, rel=0.1) and out["var"] == pytest.approx(truth, rel=0.1)
    assert out["eval_var_independent"] > 5 * out["eval_var"]  # the independent formula would overstate it


def test_a_training_effect_per_seed_is_what_remains():
    rng = random.Random(1)
    seeds = range(1500)
    shift = {s: 0.1 if s % 2 else -0.1 for s in seeds}  # the trained model differs by seed: variance 0.01
    first = {s: _evaluate(_draws(rng), [q + 0.2 + shift[s] for q in P_TRUE]) for s in seeds}
    second = {s: _evaluate(_draws(rng), [q + 0.2 for q in P_TRUE]) for s in seeds}
    out = noise.decompose(first, second)
    assert out["rest_var"] == pytest.approx(0.01, rel=0.2)
    true_eval = sum((q + 0.3) * (0.7 - q) / 2 + (q + 0.1) * (0.9 - q) / 2 + (q + 0.2) * (0.8 - q)
                    for q in P_TRUE) / (N * len(P_TRUE) ** 2)  # the first arm at ±0.1 half the time each
    assert out["eval_var"] == pytest.approx(true_eval, rel=0.05)
    assert out["eval_share"] == pytest.approx(true_eval / (true_eval + 0.01), rel=0.2)


def test_the_estimates_and_the_projection_by_hand():
    first = {0: {"a": [1, 0, 1, 0], "b": [1, 1, 1, 1]}, 1: {"a": [0, 0, 0, 0], "b": [1, 0, 0, 0]}}
    second = {0: {"a": [1, 0, 0, 0], "b": [1, 1, 0, 1]}, 1: {"a": [1, 1, 0, 0], "b": [0, 0, 0, 0]}}
    out = noise.decompose(first, second, samples=(4, 16))
    assert out["var"] == pytest.approx(((0.75 - 0.5) - (0.125 - 0.25)) ** 2 / 2)  # two seeds: (d0 − d1)² / 2
    # seed 0: δ_a = (0, 0, 1, 0), δ_b = (0, 0, 1, 0): var 0.25 each; seed 1: δ_a = (−1, −1, 0, 0): var 1/3,
    # δ_b = (1, 0, 0, 0): var 0.25; each / n / P²
    assert out["eval_var"] == pytest.approx(((0.25 + 0.25) + (1 / 3 + 0.25)) / 2 / 4 / 4)
    indep = [(0.25 + 0 + 0.1875 + 0.1875), (0 + 0.1875 + 0.25 + 0)]  # Σ a(1 − a) over both arms' problems
    assert out["eval_var_independent"] == pytest.approx(sum(v / 3 / 4 for v in indep) / 2)
    assert out["projected"][16]["sd"] ** 2 == pytest.approx(out["rest_var"] + out["eval_var"] / 4)


def test_what_cannot_be_paired_is_refused():
    one = {"a": [1.0, 0.0]}
    with pytest.raises(ValueError, match="at least 2"):
        noise.decompose({0: one}, {0: one, 1: one})
    with pytest.raises(ValueError, match="greedy has no sampling"):
        noise.paired_sampling_variance({"a": [1.0]}, {"a": [0.0]})
    with pytest.raises(ValueError, match="different problems"):
        noise.paired_sampling_variance(one, {"b": [1.0, 0.0]})


def _comparison(tmp_path, seeds: int, rows, timing=lambda arm, seed: {}) -> None:
    metric = "sampled/synthetic/acc@4"
    arms = compare.parse_arms("none,grail", [])
    plan = {"seeds": seeds, "seed_fields": ["seed", "data_seed"], "base": {},
            "protocol": {"kind": "synthetic held-out", "primary": metric, "description": "hand-written"},
            "arms": [{"label": a.label, "slug": a.slug, "method": a.method, "fields": a.fields} for a in arms]}
    (tmp_path / compare.PLAN_FILE).write_text(json.dumps(plan))
    for arm in ("none", "grail"):
        for seed in range(seeds):
            run = run_path(tmp_path, arm, seed)
            (run / "eval/final/sampled").mkdir(parents=True)
            (run / RESULT_FILE).write_text(json.dumps({"metrics": {metric: 0.1}, **timing(arm, seed)}))
            (run / "eval/final/sampled/samples.jsonl").write_text("".join(
                json.dumps({"benchmark": b, "problem_id": pid, "sample_index": j, "correct": bool(x)}) + "\n"
                for b, pid, j, x in rows(arm, seed)))


def test_it_reads_a_comparison_directory_and_keeps_the_seeds_asked_for(tmp_path):
    def rows(arm, seed):  # samples written out of order, and another benchmark's, which is ignored
        return [("synthetic", "1", 1, seed % 2), ("synthetic", "1", 0, 1), ("synthetic", "0", 0, 0),
                ("synthetic", "0", 1, arm == "grail"), ("other", "0", 0, 1)]
    _comparison(tmp_path, 3, rows)
    table = noise.load_samples(tmp_path, "sampled/synthetic/acc@4", keep={0, 2})
    assert table["grail"] == {0: {"0": [0.0, 1.0], "1": [1.0, 0.0]}, 2: {"0": [0.0, 1.0], "1": [1.0, 0.0]}}
    assert set(table["none"]) == {0, 2} and table["none"][0]["0"] == [0.0, 0.0]
    with pytest.raises(ValueError, match="give a sampled accuracy"):
        noise.load_samples(tmp_path, "sampled/synthetic/pass@2")
    with pytest.raises(ValueError, match="name an evaluation the runs sampled"):
        noise.load_samples(tmp_path, "greedy/synthetic/acc@1")
    with pytest.raises(ValueError, match="no samples of benchmark 'gsm8k'"):
        noise.load_samples(tmp_path, "sampled/gsm8k/acc@4")
    assert noise.seed_set("0-2,5") == {0, 1, 2, 5} and noise.seed_set(None) is None
    with pytest.raises(ValueError, match="give seeds as 0-5 or 0,2,4"):
        noise.seed_set("first")


def test_the_command_prints_the_table(tmp_path, capsys):
    rng = random.Random(2)

    def rows(arm, seed):
        return [("synthetic", str(i), j, rng.random() < q) for i, q in enumerate(P_TRUE) for j in range(N)]
    _comparison(tmp_path, 4, rows)
    assert main(["compare", "--resume", str(tmp_path), "--eval-noise", "grail:none", "--samples", "4,16",
                 "--analysis-json", str(tmp_path / "out.json")]) == 0
    row = json.loads((tmp_path / "out.json").read_text())["eval_noise"][0]
    assert row["pair"] == "grail − none" and row["seeds"] == [0, 1, 2, 3] and row["n"] == N
    text = capsys.readouterr().out
    line = next(ln for ln in text.splitlines() if ln.startswith("| grail − none"))
    assert line.startswith(f"| grail − none | 4 | {100 * row['sd']:.2f} |")
    assert "No cost column" in text and " h" not in line  # these runs do not record their time


def test_the_cost_of_more_samples_is_the_sampled_part_scaled_times_the_seeds():
    row = {"n": 4, "projected": {4: {"sd": 0.039, "seeds": 13}, 16: {"sd": 0.034, "seeds": 10},
                                 32: {"sd": 0.03, "seeds": None}}}
    out = noise.add_costs(row, run_seconds=1223.0, sampled_seconds=246.0)
    assert out["projected"][4] == {"sd": 0.039, "seeds": 13, "seconds_per_run": 1223.0, "seconds_per_arm": 15899.0}
    assert out["projected"][16]["seconds_per_run"] == 1223.0 + 246.0 * 3 == 1961.0
    assert out["projected"][16]["seconds_per_arm"] == 19610.0
    assert out["projected"][32]["seconds_per_arm"] is None  # no seed count reaches the target
    assert "seconds_per_run" not in row["projected"][4]  # the row given is left as it was
    with pytest.raises(ValueError, match="cannot take longer than the whole run"):
        noise.add_costs(row, run_seconds=100.0, sampled_seconds=200.0)


def test_the_costs_are_the_runs_medians_and_the_command_marks_the_cheapest(tmp_path, capsys):
    rng = random.Random(3)

    def rows(arm, seed):
        return [("synthetic", str(i), j, rng.random() < q) for i, q in enumerate(P_TRUE) for j in range(N)]

    def timing(arm, seed):  # seed 3 resumed in training: its wall clock is partial, its evaluation whole; seed 4
        # trained by an earlier command and evaluated by a later one: both partial
        return {"wall_seconds": 1000.0 + 10 * seed, "eval_phase_seconds": {"sampled": 100.0 + seed, "greedy": 5.0},
                "resumed": seed == 3, "trained_earlier": seed == 4}
    _comparison(tmp_path, 5, rows, timing)
    assert noise.run_costs(tmp_path, "sampled") == (1010.0, 101.5)  # walls of seeds 0–2, sampled of seeds 0–3
    assert noise.run_costs(tmp_path, "sampled", keep={0}) == (1000.0, 100.0)
    assert noise.run_costs(tmp_path, "benchmarks") == (1010.0, None)  # an evaluation the runs did not time
    assert main(["compare", "--resume", str(tmp_path), "--eval-noise", "grail:none", "--samples", "4,16",
                 "--sampled-seconds", "50", "--analysis-json", str(tmp_path / "out.json")]) == 0
    text = capsys.readouterr().out
    row = json.loads((tmp_path / "out.json").read_text())["eval_noise"][0]
    at16 = row["projected"]["16"]
    assert at16["seconds_per_run"] == 1010.0 + 50.0 * 3 and at16["seconds_per_arm"] == at16["seeds"] * 1160.0
    assert "R = 1010 s a run (the runs' median), E = 50 s of sampled evaluation (given)" in text
    assert text.count("(cheapest)") == 1 and "hours per arm" in text


# ---- phase times

FILES = ("compare_trained.json", "eval/final/greedy/results.json", "eval/final/sampled/results.json", RESULT_FILE)


def _timed_comparison(tmp_path, runs: dict[int, tuple[tuple[float, ...], dict]]) -> None:
    """runs: seed → (the times FILES were last written, compare_result.json's timing keys), one arm."""
    arms = compare.parse_arms("none", [])
    plan = {"seeds": len(runs), "seed_fields": ["seed"], "base": {},
            "protocol": {"kind": "synthetic held-out", "primary": "m", "description": "hand-written"},
            "arms": [{"label": a.label, "slug": a.slug, "method": a.method, "fields": a.fields} for a in arms]}
    (tmp_path / compare.PLAN_FILE).write_text(json.dumps(plan))
    for seed, (times, timing) in runs.items():
        run = run_path(tmp_path, "none", seed)
        for name, when in zip(FILES, times, strict=True):
            (run / name).parent.mkdir(parents=True, exist_ok=True)
            (run / name).write_text(json.dumps({"metrics": {"m": 0.1}, **timing}) if name == RESULT_FILE else "{}")
            os.utime(run / name, (when, when))


def test_the_gaps_between_file_times_leave_out_what_an_interruption_could_hold(tmp_path, capsys):
    whole = {"wall_seconds": 1000.0, "eval_seconds": 400.0, "train_seconds": 550.0}
    _timed_comparison(tmp_path, {
        0: ((100.0, 190.0, 430.0, 590.0), whole),
        1: ((100.0, 200.0, 440.0, 600.0), {**whole, "wall_seconds": 1200.0, "train_seconds": 700.0}),
        # resumed from a checkpoint: its clock (the last 200 s of training, then the evaluation) is partial, its
        # evaluation (one process) counts
        2: ((100.0, 210.0, 450.0, 610.0), {**whole, "resumed": True, "wall_seconds": 650.0, "train_seconds": 200.0}),
        # trained before a restart, evaluated after it: neither its clock nor its gaps count (the first holds the cut)
        3: ((100.0, 5000.0, 5100.0, 5200.0), {**whole, "trained_earlier": True, "wall_seconds": 450.0}),
        # an older result without trained_earlier: 20 s before its evaluation, 550 s of training, so the same case
        4: ((100.0, 6000.0, 6100.0, 6200.0), {**whole, "wall_seconds": 420.0}),
    })
    summary = phase_times(tmp_path)
    assert summary["greedy"] == {"n": 3, "median": 100.0, "min": 90.0, "max": 110.0}
    assert summary["sampled"]["median"] == 240.0 and summary["auroc and extra"]["max"] == 160.0
    assert summary["run"] == {"n": 2, "median": 1100.0, "min": 1000.0, "max": 1200.0}
    assert summary["training"]["median"] == 625.0

    assert main(["compare", "--resume", str(tmp_path), "--phase-times", "--analysis-json",
                 str(tmp_path / "out.json")]) == 0
    assert "greedy: median 100 s [90, 110] over 3 runs" in capsys.readouterr().out
    assert json.loads((tmp_path / "out.json").read_text())["phase_times"] == summary


def test_a_directory_without_a_comparison_or_a_finished_run_is_refused(tmp_path):
    with pytest.raises(ValueError, match="give the --output_dir of a grail compare"):
        phase_times(tmp_path)
    _timed_comparison(tmp_path, {})
    with pytest.raises(ValueError, match="no run has finished"):
        phase_times(tmp_path)


def test_file_times_that_a_copy_flattened_are_not_told_as_phases_of_no_time(tmp_path, capsys):
    # a git checkout (or an archive made from one) gives every file the same time: the gaps are 0, not the phases
    whole = {"wall_seconds": 1000.0, "eval_seconds": 400.0, "train_seconds": 550.0}
    _timed_comparison(tmp_path, {seed: ((100.0,) * 4, whole) for seed in range(3)})
    summary = phase_times(tmp_path)
    assert summary["greedy"] == {"n": 0, "median": None, "min": None, "max": None, "copied": 3}
    assert summary["run"]["median"] == 1000.0  # the recorded clocks are the runs' own and still count
    assert main(["compare", "--resume", str(tmp_path), "--phase-times"]) == 0
    assert "greedy: not told: the 3 runs' files do not keep the times they were written" in capsys.readouterr().out
