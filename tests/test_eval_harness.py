"""grail.evaluation.harness and `grail eval`: outputs, resuming after an interruption, refusing mixed arguments."""

import json
from pathlib import Path

import pytest

from grail.cli import main
from grail.evaluation.benchmarks import LoadedBenchmark, Problem
from grail.evaluation.harness import EvalSpec, read_samples, run_evaluation
from grail.options.prompts import PromptFormat
from grail.options.sampling import Sample, SamplingParams

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "benchmarks"


class ScriptedSampler:
    """Deterministic fake backend: sample j of a prompt answers correctly iff (len(prompt) + j + seed) % 3 == 0.
    `fail_after` batches, it raises (an interrupted run)."""

    name = "scripted"

    def __init__(self, answers: dict[str, str], fail_after: int | None = None):
        self.answers, self.fail_after, self.calls = answers, fail_after, 0

    def generate(self, prompts, params, seed):
        if self.fail_after is not None and self.calls >= self.fail_after:
            raise KeyboardInterrupt("simulated kill")
        self.calls += 1
        out = []
        for prompt in prompts:
            right = self.answers[prompt]
            out.append([Sample(f"so \\boxed{{{right if (len(prompt) + j + seed) % 3 == 0 else right + '1'}}}",
                               5 + j) for j in range(params.n)])
        return out


def _loaded():
    problems_a = tuple(Problem(str(i), f"problem a{i}", str(i), "bench_a") for i in range(5))
    problems_b = tuple(Problem(str(i), f"problem b{i} longer", str(2 * i), "bench_b") for i in range(3))
    return [LoadedBenchmark("bench_a", problems_a, 5, (), "all"), LoadedBenchmark("bench_b", problems_b, 4,
                                                                                  (("9", "no answer"),), "all")]


def _spec():
    return EvalSpec(benchmarks=("bench_a", "bench_b"), sampling=SamplingParams(n=2, max_new_tokens=8), batch_size=3,
                    prompt=PromptFormat())


def _answers(loaded):
    return {p.problem: p.answer for b in loaded for p in b.problems}


def test_outputs_and_metrics(tmp_path):
    loaded = _loaded()
    report = run_evaluation(ScriptedSampler(_answers(loaded)), None, _spec(), tmp_path, workers=1, log=lambda s: None,
                            progress=False, loaded=loaded)
    records = read_samples(tmp_path / "samples.jsonl")
    assert len(records) == (5 + 3) * 2 and report.new_samples == 16
    assert all(r["correct"] == (r["extracted"] == _answers(loaded)[f"problem {r['benchmark'][-1]}{r['problem_id']}"
                                + (" longer" if r["benchmark"] == "bench_b" else "")]) for r in records.values())
    results = json.loads((tmp_path / "results.json").read_text())
    by_name = {b["name"]: b for b in results["benchmarks"]}
    expected_a = sum(r["correct"] for k, r in records.items() if k[0] == "bench_a") / 10
    assert by_name["bench_a"]["acc_at_n"]["value"] == pytest.approx(expected_a)
    assert {a["kind"] for a in results["averages"]} == {"unweighted", "size_weighted"}
    assert results["benchmarks_loaded"][1]["skipped"] == [["9", "no answer"]]
    assert "average (size-weighted over problems)" in (tmp_path / "results.md").read_text()
    assert json.loads((tmp_path / "run.json").read_text())["batch_size"] == 3


def test_run_json_records_only_the_sampling_settings_that_apply(tmp_path):
    """Greedy decoding (temperature 0) uses no top_p or top_k: run.json leaves them out; sampling records them."""
    loaded = _loaded()
    greedy = EvalSpec(benchmarks=("bench_a", "bench_b"), prompt=PromptFormat(),
                      sampling=SamplingParams(n=1, temperature=0.0, top_p=0.5, top_k=7, max_new_tokens=8))
    run_evaluation(ScriptedSampler(_answers(loaded)), None, greedy, tmp_path / "greedy", workers=1,
                   log=lambda s: None, progress=False, loaded=loaded)
    sampling = json.loads((tmp_path / "greedy" / "run.json").read_text())["sampling"]
    assert sampling == {"n": 1, "temperature": 0.0, "max_new_tokens": 8}
    assert set(_spec().record()["sampling"]) == {"n", "temperature", "top_p", "top_k", "max_new_tokens"}


def test_an_interrupted_evaluation_resumes_to_the_same_metrics(tmp_path):
    loaded = _loaded()
    whole = run_evaluation(ScriptedSampler(_answers(loaded)), None, _spec(), tmp_path / "whole", workers=1,
                           log=lambda s: None, progress=False, loaded=loaded)
    part = tmp_path / "part"
    with pytest.raises(KeyboardInterrupt):
        run_evaluation(ScriptedSampler(_answers(loaded), fail_after=1), None, _spec(), part, workers=1,
                       log=lambda s: None, progress=False, loaded=loaded)
    assert len(read_samples(part / "samples.jsonl")) == 6  # one batch of 3 problems × 2 samples recorded
    with (part / "samples.jsonl").open("a") as f:  # and a torn line, as a kill in mid-write leaves
        f.write('{"benchmark": "bench_a", "probl')
    sampler = ScriptedSampler(_answers(loaded))
    resumed = run_evaluation(sampler, None, _spec(), part, workers=1, log=lambda s: None, progress=False,
                             loaded=loaded)
    assert sampler.calls == 2 and resumed.new_samples == 10  # the recorded batch was not sampled again
    assert resumed.results["benchmarks"] == whole.results["benchmarks"]
    assert resumed.results["averages"] == whole.results["averages"]
    lines = (part / "samples.jsonl").read_text().splitlines()
    assert len(lines) == 16 and all(json.loads(line) for line in lines)  # the torn line is gone


def test_other_arguments_in_the_same_directory_are_refused(tmp_path):
    loaded = _loaded()
    run_evaluation(ScriptedSampler(_answers(loaded)), None, _spec(), tmp_path, workers=1, log=lambda s: None,
                   progress=False, loaded=loaded)
    other = EvalSpec(benchmarks=("bench_a", "bench_b"), sampling=SamplingParams(n=3, max_new_tokens=8), batch_size=3)
    with pytest.raises(ValueError, match="other arguments .*sampling"):
        run_evaluation(ScriptedSampler(_answers(loaded)), None, other, tmp_path, workers=1, log=lambda s: None,
                       progress=False, loaded=loaded)


def test_a_damaged_samples_file_is_named(tmp_path):
    (tmp_path / "samples.jsonl").write_text('{"benchmark": "a"}\n')
    with pytest.raises(ValueError, match="line 1 .*damaged"):
        read_samples(tmp_path / "samples.jsonl")


@pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data/benchmarks is not present")
def test_grail_eval_end_to_end_on_two_benchmarks(tmp_path, tiny_dir, capsys):
    out = tmp_path / "eval"
    argv = ["eval", "--model", str(tiny_dir), "--benchmarks", "math500,synthetic", "--data-dir", str(DATA),
            "--size", "3", "--n", "2", "--max-new-tokens", "8", "--workers", "1", "--output-dir", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    for name in ("run.json", "samples.jsonl", "results.json", "results.md"):
        assert (out / name).is_file(), name
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(records) == 2 * 3 * 2
    assert set(records[0]) == {"benchmark", "problem_id", "sample_index", "completion", "extracted", "correct",
                               "reason", "tokens"}
    assert all(0 < r["tokens"] <= 8 for r in records)
    results = json.loads((out / "results.json").read_text())
    assert [b["name"] for b in results["benchmarks"]] == ["math500", "synthetic"]
    assert set(results["benchmarks"][0]["pass_at_k"]) == {"1", "2"}
    assert "math500" in capsys.readouterr().out
    assert results["timing"]["new_samples"] == len(records) and results["timing"]["seconds"] > 0
    assert main(argv) == 0  # a rerun resumes: nothing left to sample, same results
    rerun = json.loads((out / "results.json").read_text())
    assert rerun["benchmarks"] == results["benchmarks"]
    assert rerun["timing"]["new_samples"] == 0  # the timing is this call's, which sampled nothing


@pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data/benchmarks is not present")
def test_grail_grader_check_prints_agreement_per_benchmark(capsys):
    assert main(["grader-check", "--data-dir", str(DATA), "--benchmarks", "aime24,amc23", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "aime24" in out and "amc23" in out
    assert "28/30" in out  # two AIME24 solutions disagree with their answer field (README: id 60 and id 75)
    assert "40/40" in out  # every AMC23 reference survives the round trip


# ---- scoring ----------------------------------------------------------------------------------------------------
class BoxOrNotSampler:
    """Sample 0 has no box and 100 tokens; sample 1 boxes the problem's grail answer in 10 tokens."""

    name = "box-or-not"

    def __init__(self, answers: dict[str, str]):
        self.answers = answers

    def generate(self, prompts, params, seed):
        return [[Sample("I give up.", 100), Sample(f"so \\boxed{{{self.answers[p]}}}", 10)] for p in prompts]


def _olympiad_like():
    # release_answer as the release reads OlympiadBench's ["$2n$"] and ["108"] (grail.evaluation.release_scoring, rule
    # 2)
    problems = (Problem("1620", "p1620", "2n", "olympiadbench", release_answer="['$2n$']"),
                Problem("2910", "p2910", "108", "olympiadbench", release_answer="['108']"))
    return [LoadedBenchmark("olympiadbench", problems, 2, (), "all")]


@pytest.mark.parametrize(("scoring", "acc", "tokens"), [
    ("grail", (0 + 1) / 2, (100 + 10) / 2),  # each problem: sample 1 right; tokens over both samples
    # "$['$2n$']$" cannot match 2n, "$['108']$" matches 108 (test_release_scoring); tokens: boxed samples only
    ("release", (0 + 1 / 2) / 2, 10),
])
def test_the_scoring_decides_grading_and_tokens_and_is_named(tmp_path, scoring, acc, tokens):
    loaded = _olympiad_like()
    spec = EvalSpec(benchmarks=("olympiadbench",), sampling=SamplingParams(n=2, max_new_tokens=8), scoring=scoring)
    report = run_evaluation(BoxOrNotSampler(_answers(loaded)), None, spec, tmp_path, workers=1, log=lambda s: None,
                            progress=False, loaded=loaded)
    bench = report.results["benchmarks"][0]
    assert bench["acc_at_n"]["value"] == pytest.approx(acc)
    assert bench["mean_completion_tokens"] == pytest.approx(tokens)
    assert report.results["scoring"]["name"] == scoring
    assert (tmp_path / "results.md").read_text().startswith(f"Scoring: {scoring} (grail.")
    assert json.loads((tmp_path / "run.json").read_text())["scoring"] == scoring


def test_release_scoring_needs_loader_built_problems_and_a_known_name(tmp_path):
    spec = EvalSpec(benchmarks=("bench_a", "bench_b"), sampling=SamplingParams(n=2, max_new_tokens=8),
                    scoring="release")
    sampler = ScriptedSampler(_answers(_loaded()))
    with pytest.raises(ValueError, match="no release_answer"):
        run_evaluation(sampler, None, spec, tmp_path, workers=1, log=lambda s: None, progress=False, loaded=_loaded())
    assert sampler.calls == 0  # refused before any sampling
    with pytest.raises(ValueError, match="scoring='paper'; choose from 'grail', 'grail_all_boxes', 'release'"):
        EvalSpec(benchmarks=("bench_a",), scoring="paper")


def test_grail_eval_release_subsets_need_the_identity_lists(capsys):
    """From the Hub, --size release (the default) needs the lists' folder: the error says so before any download
    or model load."""
    assert main(["eval", "--model", "no/such-model", "--benchmarks", "olympiadbench"]) == 2
    err = capsys.readouterr().err
    assert "olympiadbench/release_subset_ids.txt" in err and "--release-subsets-dir" in err and "--data-dir" in err


def test_checkpoint_evaluation_defaults_to_the_protocols_token_limit(tmp_path):
    from grail.training.config import GRAILConfig

    cfg = GRAILConfig(output_dir=str(tmp_path))
    assert cfg.eval_max_new_tokens == SamplingParams().max_new_tokens != cfg.max_completion_length


def test_checkpoint_evaluation_of_synthetic_uses_the_runs_task(tmp_path):
    from grail.tasks.arithmetic import TaskConfig
    from grail.tasks.synthetic import SyntheticSet
    from grail.training.config import GRAILConfig
    from grail.training.run import CheckpointEval

    cfg = GRAILConfig(output_dir=str(tmp_path), eval_benchmarks="synthetic", eval_size="all", task_num_steps=3,
                      task_num_heldout=7, task_seed=5, task_operand_max=7, eval_scoring="release")
    checkpoint_eval = CheckpointEval(cfg, tmp_path, log=lambda _: None)
    assert checkpoint_eval.spec.scoring == "release"  # the same setting as `grail eval --scoring`
    (loaded,) = checkpoint_eval.loaded
    task = TaskConfig(num_steps=3, operand_max=7)
    expected = SyntheticSet(task=task, num_heldout=7, seed=5).rows("heldout")
    assert [p.problem for p in loaded.problems] == [r["prompt"] for r in expected]
    assert [p.answer for p in loaded.problems] == [str(r["answer"]) for r in expected]
    assert len(loaded.problems) == 7 and "the run's task settings" in loaded.origin


def test_grail_eval_release_subsets_and_scoring_without_the_shared_data(tmp_path, tiny_dir, capsys):
    """The CLI on a fresh clone without ../shared: a data dir made here, the release's identity lists included."""
    data = tmp_path / "data"
    (data / "olympiadbench").mkdir(parents=True)
    rows = [{"id": i, "question": f"q{i}", "final_answer": [f"${i}$"], "context": None} for i in (5, 6, 7)]
    (data / "olympiadbench" / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (data / "olympiadbench" / "release_subset_ids.txt").write_text("7\n5\n")  # the release's order, not the file's
    out = tmp_path / "eval"
    argv = ["eval", "--model", str(tiny_dir), "--benchmarks", "olympiadbench", "--data-dir", str(data), "--size",
            "release", "--scoring", "release", "--n", "1", "--max-new-tokens", "4", "--workers", "1",
            "--output-dir", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert [r["problem_id"] for r in records] == ["7", "5"]  # exactly the listed problems
    assert (out / "results.md").read_text().startswith("Scoring: release")
    assert json.loads((out / "results.json").read_text())["scoring"]["name"] == "release"
    (data / "olympiadbench" / "release_subset_ids.txt").write_text("7\n9\n")  # a listed problem the data lacks
    assert main([*argv[:-1], str(tmp_path / "eval2")]) == 2
    assert "9" in capsys.readouterr().err
