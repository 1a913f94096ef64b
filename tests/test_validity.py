"""grail.evaluation.validity (the table, on hand-built evaluations), `grail eval --response-prefix` (where the prefix
goes and what is graded) and `grail validity` end to end on the tiny model."""

import json
import math
import statistics
from collections import Counter
from dataclasses import fields, replace

import pytest

from grail.cli import main
from grail.evaluation.benchmarks import LoadedBenchmark, Problem
from grail.evaluation.harness import EvalSpec, read_samples, run_evaluation
from grail.evaluation.validity import (
    LEGS,
    Thresholds,
    best_constant,
    format_markdown,
    leg_result,
    length_stats,
    mixed_share,
    read_leg,
    validity_table,
)
from grail.options.prompts import (
    ANSWER_ONLY_PREFIX,
    PLAIN_ASSISTANT,
    PromptFormat,
    resolve_response_prefix,
)
from grail.options.sampling import Sample, SamplingParams

BENCH = "bench"


def _leg(counts_P, n, tokens=None, reasons=None, max_new_tokens=16, interval=(0.01, 0.02)):
    """A LegResult of P problems, n samples each, sample j of problem p correct iff j < counts_P[p]; acc@n and its
    interval as results.json would hold them."""
    records = [{"benchmark": BENCH, "problem_id": str(p), "sample_index": j, "correct": j < c,
                "tokens": 4 if tokens is None else tokens[p * n + j],
                "reason": "ok" if reasons is None else reasons[p * n + j]}
               for p, c in enumerate(counts_P) for j in range(n)]
    value = sum(counts_P) / (len(counts_P) * n)
    results = {"benchmarks": [{"name": BENCH, "acc_at_n": {"value": value, "low": interval[0], "high": interval[1]}}]}
    return leg_result(records, results, {"sampling": {"n": n, "max_new_tokens": max_new_tokens}})


def _references(answers):
    return {(BENCH, str(p)): a for p, a in enumerate(answers)}


# A regime on the default thresholds' boundaries (all but the sampled accuracy's): 100 problems, n = 8.
#   sampled: 60 problems with 4 of 8 right, 40 with none → accuracy 240/800 = 0.30, mixed 60/100 = 0.60
#   greedy: 30 right → 0.30; answer-only greedy 15 right → 0.15 = half; answer-only sampled 120/800 = 0.15 = half
#   references: 97 distinct answers and one shared by 3 problems → best constant 3/100 = 0.03
P, N = 100, 8
SAMPLED_P = [4] * 60 + [0] * 40
GREEDY_P = [1] * 30 + [0] * 70
AO_GREEDY_P = [1] * 15 + [0] * 85
AO_SAMPLED_P = [2] * 60 + [0] * 40
ANSWERS = ["7", "7", "7"] + [str(100 + p) for p in range(P - 3)]


def _boundary_legs(ao_greedy_P=AO_GREEDY_P):
    return {"sampled": _leg(SAMPLED_P, N), "greedy": _leg(GREEDY_P, 1), "answer-only-greedy": _leg(ao_greedy_P, 1),
            "answer-only-sampled": _leg(AO_SAMPLED_P, N)}


def test_a_regime_on_the_boundaries_qualifies_and_one_more_answer_only_hit_does_not():
    table = validity_table(_boundary_legs(), _references(ANSWERS))
    by_name = {c["criterion"]: c for c in table["criteria"]}
    assert by_name["sampled accuracy"]["value"] == sum(SAMPLED_P) / (P * N)
    assert by_name["mixed groups"]["value"] == sum(0 < c < N for c in SAMPLED_P) / P == Thresholds().mixed_min
    assert by_name["best constant"]["value"] == max(Counter(ANSWERS).values()) / P == Thresholds().constant_max
    assert by_name["answer-only greedy accuracy"]["value"] == Thresholds().answer_only_ratio_max * sum(GREEDY_P) / P
    assert all(c["pass"] for c in table["criteria"]) and table["qualifies"]
    one_more = [1] * (sum(AO_GREEDY_P) + 1) + [0] * (P - sum(AO_GREEDY_P) - 1)
    table = validity_table(_boundary_legs(one_more), _references(ANSWERS))
    assert [c["criterion"] for c in table["criteria"] if not c["pass"]] == ["answer-only greedy accuracy"]
    assert not table["qualifies"]


@pytest.mark.parametrize("field, step", [("sampled_min", +1), ("sampled_max", -1), ("mixed_min", +1),
                                         ("constant_max", -1), ("answer_only_ratio_max", -1)])
def test_each_threshold_passes_at_the_value_and_fails_just_beyond_it(field, step):
    """Thresholds set to the measured values: every criterion passes (bounds are inclusive); one moved a hair past
    its value fails that criterion alone."""
    legs = _boundary_legs()
    table = validity_table(legs, _references(ANSWERS))
    sampled = table["accuracy"]["sampled"]["value"]
    ratio = table["accuracy"]["answer-only-sampled"]["value"] / sampled  # = greedy's ratio here
    at = Thresholds(sampled_min=sampled, sampled_max=sampled, mixed_min=table["mixed_share"],
                    constant_max=table["best_constant"]["accuracy"], answer_only_ratio_max=ratio)
    assert validity_table(legs, _references(ANSWERS), at)["qualifies"]
    beyond = replace(at, **{field: getattr(at, field) + step * 1e-9})
    table = validity_table(legs, _references(ANSWERS), beyond)
    failed = [c["criterion"] for c in table["criteria"] if not c["pass"]]
    expected = {"sampled_min": ["sampled accuracy"], "sampled_max": ["sampled accuracy"],
                "mixed_min": ["mixed groups"], "constant_max": ["best constant"],
                "answer_only_ratio_max": ["answer-only greedy accuracy", "answer-only sampled accuracy"]}[field]
    assert failed == expected and not table["qualifies"]
    assert table["thresholds"][field] == getattr(beyond, field)  # the table prints the thresholds it used


def test_the_table_reports_the_interval_results_json_holds_and_every_threshold():
    legs = _boundary_legs()
    legs["greedy"] = _leg(GREEDY_P, 1, interval=(0.21, 0.39))
    table = validity_table(legs, _references(ANSWERS))
    assert table["accuracy"]["greedy"] == {"value": sum(GREEDY_P) / P, "low": 0.21, "high": 0.39}
    assert set(table["thresholds"]) == {f.name for f in fields(Thresholds)}


def test_mixed_share_counts_groups_neither_all_right_nor_all_wrong():
    correct_PN = {0: [True, False], 1: [True, True], 2: [False, False], 3: [False, True]}
    assert mixed_share(correct_PN) == 2 / 4  # problems 0 and 3


def test_best_constant_is_the_most_frequent_reference_and_its_share():
    assert best_constant(["12", "5", "12", " 12", "9"]) == ("12", 3 / 5)  # " 12" is the answer 12


def test_completion_lengths_no_box_and_truncated():
    # 20 completions of 1..20 tokens: mean = median = 10.5; p95 = the ⌈0.95·20⌉ = 19th smallest = 19
    tokens = list(range(1, 21))
    reasons = ["no_box"] * 3 + ["ok"] * 17
    stats = length_stats(_leg([0] * 5, 4, tokens=tokens, reasons=reasons, max_new_tokens=18))
    assert stats["mean"] == statistics.fmean(tokens) and stats["median"] == statistics.median(tokens)
    assert stats["p95"] == sorted(tokens)[math.ceil(0.95 * len(tokens)) - 1]
    assert stats["no_box"] == 3 / 20 and stats["truncated"] == sum(t >= 18 for t in tokens) / 20


def test_evaluations_on_other_problems_and_unfinished_directories_are_refused(tmp_path):
    legs = _boundary_legs()
    legs["greedy"] = _leg(GREEDY_P[:-1], 1)
    with pytest.raises(ValueError, match="not on the same problems .*greedy"):
        validity_table(legs, _references(ANSWERS))
    with pytest.raises(ValueError, match="no result for answer-only-sampled"):
        validity_table({k: v for k, v in _boundary_legs().items() if k != "answer-only-sampled"},
                       _references(ANSWERS))
    (tmp_path / "run.json").write_text("{}")
    with pytest.raises(ValueError, match="no samples.jsonl, results.json.*grail validity"):
        read_leg(tmp_path)


# ---- --response-prefix ----------------------------------------------------------------------------------------
class PromptRecorder:
    """A fake backend that records the prompts it is given and answers `42}` (so that `\\boxed{` + it is correct)."""

    name = "recorder"

    def __init__(self):
        self.prompts = []

    def generate(self, prompts, params, seed):
        self.prompts += prompts
        return [[Sample("42}", 3)] * params.n for _ in prompts]


MESSAGES = [{"role": "user", "content": "Ava has 40 + 2 stamps. How many?"}]


@pytest.mark.parametrize("chat", [True, False])
def test_the_response_prefix_follows_the_generation_prompt_and_is_graded(tmp_path, tokenizer, chat):
    fmt = PromptFormat(chat=chat)
    prefix = resolve_response_prefix("answer-only")
    assert prefix == ANSWER_ONLY_PREFIX
    if chat:
        generation_prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    else:
        generation_prompt = fmt.render(tokenizer, MESSAGES)
        assert generation_prompt.endswith(PLAIN_ASSISTANT)  # the plain format's answer start
    start = generation_prompt + ("" if chat else " ")  # plain answers follow "Answer:" after a space (render_plain)
    assert fmt.render(tokenizer, MESSAGES, prefix) == start + prefix
    loaded = [LoadedBenchmark(BENCH, (Problem("0", MESSAGES, "42", BENCH),), 1, (), "all")]
    spec = EvalSpec(benchmarks=(BENCH,), sampling=SamplingParams(n=2, max_new_tokens=8), prompt=fmt,
                    response_prefix=prefix)
    sampler = PromptRecorder()
    run_evaluation(sampler, tokenizer, spec, tmp_path, workers=1, log=lambda s: None, progress=False, loaded=loaded)
    assert sampler.prompts == [start + prefix]
    records = list(read_samples(tmp_path / "samples.jsonl").values())
    assert [(r["completion"], r["correct"], r["tokens"]) for r in records] == [(prefix + "42}", True, 3)] * 2
    assert json.loads((tmp_path / "run.json").read_text())["response_prefix"] == prefix


def test_an_evaluation_recorded_before_the_response_prefix_resumes_and_a_prefix_is_refused(tmp_path):
    loaded = [LoadedBenchmark(BENCH, (Problem("0", "What is 40+2?", "42", BENCH),), 1, (), "all")]
    spec = EvalSpec(benchmarks=(BENCH,), sampling=SamplingParams(n=1, temperature=0.0, max_new_tokens=8))
    run = {k: v for k, v in spec.record().items() if k != "response_prefix"}  # run.json as older versions wrote it
    (tmp_path / "run.json").write_text(json.dumps(run))
    run_evaluation(PromptRecorder(), None, spec, tmp_path, workers=1, log=lambda s: None, progress=False,
                   loaded=loaded)
    with pytest.raises(ValueError, match="other arguments .*response_prefix"):
        run_evaluation(PromptRecorder(), None, replace(spec, response_prefix="\\boxed{"), tmp_path, workers=1,
                       log=lambda s: None, progress=False, loaded=loaded)


# ---- grail validity end to end --------------------------------------------------------------------------------
def _validity_argv(tiny_dir, out):
    return ["validity", "--model", str(tiny_dir), "--size", "3", "--samples", "2", "--max-new-tokens", "6",
            "--batch-size", "2", "--workers", "1", "--output-dir", str(out)]


def test_grail_validity_reuses_a_grail_eval_directory_writes_the_table_and_recomputes_nothing(
        tmp_path, tiny_dir, monkeypatch, capsys):
    out = tmp_path / "validity"
    # the sampled evaluation made beforehand by `grail eval` with the flags the command documents
    eval_argv = ["eval", "--model", str(tiny_dir), "--benchmarks", "synthetic_chains", "--size", "3", "--samples",
                 "2", "--temperature", "1.0", "--top-p", "1.0", "--top-k", "0", "--max-new-tokens", "6",
                 "--batch-size", "2", "--workers", "1", "--output-dir", str(out / "sampled")]
    assert main(eval_argv) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert main(_validity_argv(tiny_dir, out)) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert "sampled: 0 new samples" in printed and "greedy: 3 new samples" in printed
    assert "answer-only-sampled: 6 new samples" in printed and "| criterion | value | threshold | result |" in printed
    for leg in LEGS:
        assert (out / leg.name / "results.json").is_file(), leg.name
    table = json.loads((out / "validity.json").read_text())
    assert table["problems"] == 3 and table["samples"] == 2 and len(table["criteria"]) == 5
    assert (out / "validity.md").read_text().strip() in printed
    completions = [json.loads(line)["completion"]
                   for line in (out / "answer-only-greedy" / "samples.jsonl").read_text().splitlines()]
    assert all(c.startswith(ANSWER_ONLY_PREFIX) for c in completions)
    samples = {leg.name: (out / leg.name / "samples.jsonl").read_text() for leg in LEGS}

    def refuse(*args, **kwargs):
        raise AssertionError("a finished validity run loaded the model's weights")

    monkeypatch.setattr("grail.models.warmstart.load_inference_model", refuse)
    assert main(_validity_argv(tiny_dir, out)) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.count(": 0 new samples") == len(LEGS)
    assert {leg.name: (out / leg.name / "samples.jsonl").read_text() for leg in LEGS} == samples
    (out / "validity.json").unlink()
    assert main(["validity", "--from", str(out)]) == 0
    assert json.loads((out / "validity.json").read_text()) == table
    assert main(["validity", "--from", str(out), "--model", str(tiny_dir)]) == 2
    assert "drop --model" in capsys.readouterr().err


def test_on_a_subset_the_best_constant_is_counted_on_the_whole_split():
    """Gemma's 128-problem table: one answer covered 5 of them (3.9%), none more than 2.0% of the 256."""
    legs = _boundary_legs()
    subset = ["7"] * 4 + [str(100 + p) for p in range(P - 4)]  # 4 of the 100 evaluated: 4%, over the 3% bar
    whole = subset + [str(1000 + p) for p in range(100)]  # the same 4 among 200: 2%
    on_subset = validity_table(legs, _references(subset))
    on_split = validity_table(legs, _references(subset), split_references=whole)
    assert on_subset["best_constant"]["accuracy"] == 4 / P and not on_subset["qualifies"]
    assert on_split["best_constant"] == {"answer": "7", "accuracy": 4 / len(whole), "problems": len(whole),
                                         "evaluated": {"answer": "7", "accuracy": 4 / P}}
    assert on_split["qualifies"]
    assert f"on the whole split of {len(whole)} problems" in format_markdown(on_split)


def test_chain_problems_get_their_first_errors_and_other_problems_none():
    """The sampled and greedy completions are read against the reference solutions given: each share is what the
    completions were written to be; without solutions the table has no first errors."""
    from grail.tasks.chain_errors import FIRST_ERRORS

    reference = "Tom has 23 + 15 = 38 apples. Ava has 38 - 8 = 30 apples. \\boxed{30}"
    slip, setup = reference.replace("= 38", "= 39"), reference.replace("- 8", "- 9")
    legs = _boundary_legs()
    legs["sampled"] = replace(legs["sampled"], completions_PN={
        (BENCH, str(p)): [reference] * 4 + [slip] * 3 + [setup] for p in range(P)})
    legs["greedy"] = replace(legs["greedy"], completions_PN={
        (BENCH, str(p)): [slip if p < 25 else reference] for p in range(P)})
    solutions = {(BENCH, str(p)): (reference, "30") for p in range(P)}
    table = validity_table(legs, _references(ANSWERS), solutions=solutions)
    sampled, greedy = table["first_errors"]["sampled"], table["first_errors"]["greedy"]
    assert list(sampled) == list(FIRST_ERRORS)
    assert (sampled["none"], sampled["arithmetic"], sampled["setup"]) == (4 / 8, 3 / 8, 1 / 8)
    assert (greedy["none"], greedy["arithmetic"]) == (0.75, 0.25)
    assert "| sampled | 50.0% | 37.5% | 12.5% | 0.0% | 0.0% | 0.0% |" in format_markdown(table)
    without = validity_table(legs, _references(ANSWERS))
    assert "first_errors" not in without and "first error" not in format_markdown(without)


def test_leg_result_keeps_each_problems_completions_in_sample_order():
    records = [{"benchmark": BENCH, "problem_id": "0", "sample_index": j, "correct": False, "tokens": 3,
                "reason": "ok", "completion": f"c{j}"} for j in (1, 0)]
    results = {"benchmarks": [{"name": BENCH, "acc_at_n": {"value": 0.0, "low": 0.0, "high": 0.0}}]}
    leg = leg_result(records, results, {"sampling": {"n": 2, "max_new_tokens": 8}})
    assert leg.completions_PN == {(BENCH, "0"): ["c0", "c1"]}


def test_grail_validity_reads_chain_benchmarks_against_the_chain_tasks_solutions():
    from grail.evaluation.benchmarks import load_benchmarks
    from grail.evaluation.cli import _chain_solutions
    from grail.tasks.chain_errors import first_error
    from grail.tasks.chains import ChainSet

    loaded = load_benchmarks(["synthetic_chains"], size=5, seed=0)
    solutions = _chain_solutions(loaded)
    examples = ChainSet().examples("heldout")
    for problem in loaded[0].problems:  # the id the harness records is the index of the held-out example
        solution, answer = solutions["synthetic_chains", problem.id]
        assert answer == problem.answer and solution == examples[int(problem.id)].solution
        assert first_error(solution, answer, solution) == "none"
    assert _chain_solutions(load_benchmarks(["synthetic"], size=5, seed=0)) is None
