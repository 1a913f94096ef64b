"""`grail eval` end to end through `grail.cli.main`, as on a fresh clone: two benchmarks written in the test as
DIR/<benchmark>/test.jsonl, the tiny model, grail's scoring; outputs, resuming, refusing other arguments.
Nothing here reads ../shared (the working directory is the test's own)."""

import json

import pytest

from grail.cli import main

MATH500 = [{"unique_id": f"test/algebra/{i}.json", "problem": f"What is {i}+{i}?", "answer": str(2 * i),
            "solution": "", "subject": "Algebra", "level": 1} for i in (1, 2, 3)]
AIME24 = [{"id": 60 + i, "problem": f"Find {i}*{i}.", "answer": str(i * i), "solution": ""} for i in (4, 5)]


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a relative ../shared, if any code looked for one, would not be found
    data = tmp_path / "data"
    for name, rows in (("math500", MATH500), ("aime24", AIME24)):
        (data / name).mkdir(parents=True)
        (data / name / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return data


def _argv(tiny_dir, data_dir, out, *extra):
    return ["eval", "--model", str(tiny_dir), "--benchmarks", "math500,aime24", "--data-dir", str(data_dir),
            "--size", "all", "--n", "2", "--max-new-tokens", "6", "--batch-size", "2", "--workers", "1",
            "--output-dir", str(out), *extra]


def test_grail_eval_writes_every_output_and_a_rerun_resumes(tmp_path, tiny_dir, data_dir, capsys):
    out = tmp_path / "eval"
    assert main(_argv(tiny_dir, data_dir, out)) == 0, capsys.readouterr().err
    assert "math500" in capsys.readouterr().out  # the results table
    for name in ("run.json", "samples.jsonl", "results.json", "results.md"):
        assert (out / name).is_file(), name
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert set(records[0]) == {"benchmark", "problem_id", "sample_index", "completion", "extracted", "correct",
                               "reason", "tokens"}
    keys = {(r["benchmark"], r["problem_id"], r["sample_index"]) for r in records}
    assert keys == {("math500", r["unique_id"], j) for r in MATH500 for j in (0, 1)} | {
        ("aime24", str(r["id"]), j) for r in AIME24 for j in (0, 1)}  # every problem × n, once each
    assert all(0 < r["tokens"] <= 6 and isinstance(r["correct"], bool) for r in records)
    results = json.loads((out / "results.json").read_text())
    assert [(b["name"], b["num_problems"]) for b in results["benchmarks"]] == [("math500", 3), ("aime24", 2)]
    assert all(set(b["pass_at_k"]) == {"1", "2"} for b in results["benchmarks"])
    assert results["scoring"]["name"] == "grail"
    samples = (out / "samples.jsonl").read_text()
    assert main(_argv(tiny_dir, data_dir, out)) == 0  # a rerun: nothing left to sample
    assert (out / "samples.jsonl").read_text() == samples
    assert json.loads((out / "results.json").read_text())["benchmarks"] == results["benchmarks"]


def test_grail_eval_refuses_other_arguments_in_a_used_directory(tmp_path, tiny_dir, data_dir, capsys):
    out = tmp_path / "eval"
    assert main(_argv(tiny_dir, data_dir, out)) == 0
    samples = (out / "samples.jsonl").read_text()
    capsys.readouterr()
    assert main(_argv(tiny_dir, data_dir, out, "--temperature", "0.9")) == 2
    err = capsys.readouterr().err
    assert "grail: error:" in err and "other arguments" in err  # (stderr also holds the loading progress bar)
    assert (out / "samples.jsonl").read_text() == samples  # nothing mixed into the first run's samples


def test_grail_eval_names_a_benchmark_missing_from_the_data_dir(tmp_path, tiny_dir, data_dir, capsys):
    argv = _argv(tiny_dir, data_dir, tmp_path / "eval")
    argv[argv.index("math500,aime24")] = "math500,amc23"
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "amc23" in err and str(data_dir) in err
    assert not (tmp_path / "eval").exists()  # stopped before any output


def test_every_checkpoint_evaluation_field_is_a_grail_eval_flag_of_the_same_name():
    """`grail train --eval_X` and `grail eval --X` name the same setting the same way."""
    import argparse
    import dataclasses

    from grail.evaluation.cli import add_parsers
    from grail.options.fields import GRAILFields

    sub = argparse.ArgumentParser().add_subparsers()
    add_parsers(sub)
    flags = {option for action in sub.choices["eval"]._actions for option in action.option_strings}
    fields = [f.name for f in dataclasses.fields(GRAILFields) if f.name.startswith("eval_")]
    assert len(fields) >= 6
    for name in fields:
        assert "--" + name.removeprefix("eval_").replace("_", "-") in flags, name


def _refuse_hf_weights(monkeypatch):
    """Make loading the HF model fail the test: the vllm backend must never load it (on a GPU it would take the
    memory vLLM is about to claim)."""
    import transformers

    def load(*args, **kwargs):
        raise AssertionError("the HF model weights were loaded for --backend vllm")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", load)


def test_vllm_backend_without_vllm_says_so_before_loading_any_model(tmp_path, tiny_dir, data_dir, monkeypatch,
                                                                    capsys):
    import sys

    _refuse_hf_weights(monkeypatch)
    resolved = []
    monkeypatch.setattr("grail.models.warmstart.resolve_model", lambda *a, **k: resolved.append(a) or str(tiny_dir))
    monkeypatch.setitem(sys.modules, "vllm", None)  # vLLM absent (as on this machine), even where it is installed
    assert main(_argv(tiny_dir, data_dir, tmp_path / "out", "--backend", "vllm")) == 2
    err = capsys.readouterr().err
    assert "--backend vllm needs vLLM" in err and "--backend hf" in err
    assert resolved == []  # not even resolved (`tiny` would train its warm start first)


def test_vllm_backend_loads_only_the_tokenizer(tmp_path, tiny_dir, data_dir, monkeypatch, capsys):
    """With a stand-in vllm module: the evaluation runs on it, and the HF weights are never loaded."""
    import sys
    import types

    _refuse_hf_weights(monkeypatch)
    made = []

    class LLM:
        def __init__(self, model):
            made.append(model)

        def generate(self, prompts, sampling, use_tqdm=False):
            completion = types.SimpleNamespace(text="so \\boxed{2}", token_ids=[1, 2, 3])
            return [types.SimpleNamespace(outputs=[completion] * sampling.n) for _ in prompts]

    fake = types.ModuleType("vllm")
    fake.LLM, fake.SamplingParams = LLM, lambda **kw: types.SimpleNamespace(**kw)
    monkeypatch.setitem(sys.modules, "vllm", fake)
    out = tmp_path / "out"
    assert main(_argv(tiny_dir, data_dir, out, "--backend", "vllm")) == 0, capsys.readouterr().err
    assert made == [str(tiny_dir)]
    results = json.loads((out / "results.json").read_text())
    math500 = next(b for b in results["benchmarks"] if b["name"] == "math500")
    assert math500["acc_at_n"]["value"] == pytest.approx(1 / 3)  # only "What is 1+1?" has the answer 2


@pytest.mark.parametrize("damage, named", [
    (lambda out: (out / "samples.jsonl").write_bytes(b'{"benchmark": "math500"\n'
                                                     + (out / "samples.jsonl").read_bytes()),
     "samples.jsonl, line 1 is not a sample record"),
    (lambda out: (out / "samples.jsonl").write_bytes((out / "samples.jsonl").read_bytes() + b"\xff\xfe\n"),
     "samples.jsonl, line 11 is not a sample record"),
    (lambda out: (out / "run.json").write_text("{not json"), "run.json is damaged"),
])
def test_a_resumed_evaluation_with_a_damaged_file_exits_2_and_keeps_it(tmp_path, tiny_dir, data_dir, capsys, damage,
                                                                        named):
    out = tmp_path / "eval"
    assert main(_argv(tiny_dir, data_dir, out)) == 0
    damage(out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    capsys.readouterr()
    assert main(_argv(tiny_dir, data_dir, out)) == 2
    err = capsys.readouterr().err
    assert "grail: error:" in err and named in err and "Traceback" not in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the damaged run is left as it was


def test_grail_eval_reads_where_chain_completions_first_go_wrong(tmp_path):
    """`grail eval` on the chain task writes first_errors.json: shares of its completions by first error, read
    against each problem's reference solution; rows of other benchmarks are not counted."""
    from grail.evaluation.cli import _write_first_errors

    ref = "Tom has 23 + 15 = 38 apples. Ava has 38 - 8 = 30 apples. \\boxed{30}"
    rows = [("synthetic_chains", "0", ref), ("synthetic_chains", "0", ref.replace("= 30", "= 31")),
            ("synthetic_chains", "1", ref.replace("38 - 8", "38 + 8")), ("synthetic_chains", "1", "\\boxed{30}"),
            ("math500", "0", "\\boxed{30}")]
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps({"benchmark": b, "problem_id": i, "completion": c})
                                                    + "\n" for b, i, c in rows))
    solutions = {("synthetic_chains", "0"): (ref, "30"), ("synthetic_chains", "1"): (ref, "30")}
    line = _write_first_errors(str(tmp_path), solutions)
    written = json.loads((tmp_path / "first_errors.json").read_text())
    assert written["completions"] == 4
    assert written["shares"] == {"none": 0.25, "arithmetic": 0.25, "setup": 0.25, "steps": 0.0, "answer": 0.0,
                                 "unparsed": 0.25}
    assert "none 25.0%, arithmetic 25.0%, setup 25.0%" in line and "first_errors.json" in line
