"""perf/eval_noise.py: the share of a comparison's seed-to-seed variance that is its evaluation's own sampling.
Checked on simulated evaluations whose truth is known (Bernoulli samples from fixed per-problem accuracies, with and
without a training effect per seed), and on a hand-written comparison directory."""

import json
import random

import pytest

from grail.analysis.compare import plan as compare
from grail.analysis.compare.summary import RESULT_FILE, run_path
from perf_loading import load_perf_script

noise = load_perf_script("eval_noise")
N = 4
P_TRUE = [0.05 * (i % 12) for i in range(64)]  # 0 .. 0.55: problems of every difficulty, as on the real task


def _evaluate(rng: random.Random, p: list[float]) -> list[float]:
    """One evaluation: per problem, the mean of N Bernoulli samples."""
    return [sum(rng.random() < min(max(q, 0.0), 1.0) for _ in range(N)) / N for q in p]


def test_without_a_training_effect_the_evaluation_explains_the_whole_spread():
    rng = random.Random(0)
    seeds = range(1500)
    first = {s: _evaluate(rng, P_TRUE) for s in seeds}
    second = {s: _evaluate(rng, P_TRUE) for s in seeds}
    out = noise.decompose(first, second, N)
    assert out["eval_share"] == pytest.approx(1.0, abs=0.1)  # without the n/(n−1) correction it would be 0.75
    assert out["projected"][N]["sd"] == pytest.approx(out["sd"], rel=0.06)


def test_a_training_effect_per_seed_is_what_remains():
    rng = random.Random(1)
    seeds = range(1500)
    shift = {s: 0.1 if s % 2 else -0.1 for s in seeds}  # the trained model differs by seed: variance 0.01
    first = {s: _evaluate(rng, [q + 0.2 + shift[s] for q in P_TRUE]) for s in seeds}
    second = {s: _evaluate(rng, [q + 0.2 for q in P_TRUE]) for s in seeds}
    out = noise.decompose(first, second, N)
    assert out["rest_var"] == pytest.approx(0.01, rel=0.2)
    true_eval = sum((q + 0.3) * (0.7 - q) / 2 + (q + 0.1) * (0.9 - q) / 2 + (q + 0.2) * (0.8 - q)
                    for q in P_TRUE) / (N * len(P_TRUE) ** 2)  # the first arm at ±0.1 half the time each
    assert out["eval_var"] == pytest.approx(true_eval, rel=0.05)
    assert out["eval_share"] == pytest.approx(true_eval / (true_eval + 0.01), rel=0.2)


def test_the_projection_scales_only_the_evaluation_part():
    first = {0: [0.5, 0.25], 1: [0.75, 0.5], 2: [0.25, 0.0]}
    second = {0: [0.0, 0.0], 1: [0.25, 0.25], 2: [0.5, 0.5]}
    out = noise.decompose(first, second, 4, samples=(4, 16))
    d = [0.375, 0.375, -0.375]
    mean = sum(d) / 3
    assert out["var"] == pytest.approx(sum((x - mean) ** 2 for x in d) / 2)
    e = sum(sum(a * (1 - a) for a in first[s] + second[s]) / (3 * 4) for s in range(3)) / 3  # (n − 1) P² = 3 · 4
    assert out["eval_var"] == pytest.approx(e)
    assert out["projected"][16]["sd"] ** 2 == pytest.approx(out["rest_var"] + e / 4)


def test_fewer_than_two_paired_seeds_or_one_sample_is_refused():
    with pytest.raises(ValueError, match="at least 2"):
        noise.decompose({0: [0.5]}, {0: [0.5], 1: [0.5]}, 4)
    with pytest.raises(ValueError, match="greedy has none"):
        noise.sampling_variance([0.0, 1.0], 1)


def test_it_reads_a_comparison_directory_and_keeps_the_seeds_asked_for(tmp_path):
    metric = "sampled/synthetic/acc@4"
    arms = compare.parse_arms("none,grail", [])
    plan = {"seeds": 3, "seed_fields": ["seed", "data_seed"], "base": {},
            "protocol": {"kind": "synthetic held-out", "primary": metric, "description": "hand-written"},
            "arms": [{"label": a.label, "slug": a.slug, "method": a.method, "fields": a.fields} for a in arms]}
    (tmp_path / compare.PLAN_FILE).write_text(json.dumps(plan))
    for arm in ("none", "grail"):
        for seed in range(3):
            run = run_path(tmp_path, arm, seed)
            run.mkdir(parents=True)
            entry = {"name": "synthetic", "n": "4", "problem_ids": ["0", "1"],
                     "per_problem_acc": [0.25 * seed, 0.5], "per_problem_pass": {}}
            (run / RESULT_FILE).write_text(json.dumps({"metrics": {metric: 0.1},
                                                       "evaluations": {"sampled": [entry]}}))
    table, n = noise.per_problem(tmp_path, metric, keep={0, 2})
    assert n == 4 and table["grail"] == {0: [0.0, 0.5], 2: [0.5, 0.5]} and set(table["none"]) == {0, 2}
    with pytest.raises(ValueError, match="give a sampled accuracy"):
        noise.per_problem(tmp_path, "greedy/synthetic/pass@2")
    with pytest.raises(ValueError, match="no per-problem values"):
        noise.per_problem(tmp_path, "sampled/gsm8k/acc@4")
    assert noise._seed_set("0-2,5") == {0, 1, 2, 5}
    assert noise._seed_set(None) is None


def test_the_command_prints_the_table(tmp_path, monkeypatch, capsys):
    rng = random.Random(2)
    metric = "sampled/synthetic/acc@4"
    arms = compare.parse_arms("none,grail", [])
    plan = {"seeds": 4, "seed_fields": ["seed", "data_seed"], "base": {},
            "protocol": {"kind": "synthetic held-out", "primary": metric, "description": "hand-written"},
            "arms": [{"label": a.label, "slug": a.slug, "method": a.method, "fields": a.fields} for a in arms]}
    (tmp_path / compare.PLAN_FILE).write_text(json.dumps(plan))
    for arm in ("none", "grail"):
        for seed in range(4):
            run = run_path(tmp_path, arm, seed)
            run.mkdir(parents=True)
            entry = {"name": "synthetic", "n": "4", "problem_ids": [str(i) for i in range(64)],
                     "per_problem_acc": _evaluate(rng, P_TRUE), "per_problem_pass": {}}
            (run / RESULT_FILE).write_text(json.dumps({"metrics": {metric: 0.1},
                                                       "evaluations": {"sampled": [entry]}}))
    monkeypatch.setattr("sys.argv", ["eval_noise.py", str(tmp_path), "--pairs", "grail:none", "--samples", "4,16",
                                     "--json", str(tmp_path / "out.json")])
    noise.main()
    row = json.loads((tmp_path / "out.json").read_text())[0]
    assert row["pair"] == "grail − none" and row["seeds"] == [0, 1, 2, 3]
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| grail − none"))
    assert line.startswith(f"| grail − none | 4 | {100 * row['sd']:.2f} |")
