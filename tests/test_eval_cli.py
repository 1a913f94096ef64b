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

    from grail.config_fields import GRAILFields
    from grail.eval_cli import add_parsers

    sub = argparse.ArgumentParser().add_subparsers()
    add_parsers(sub)
    flags = {option for action in sub.choices["eval"]._actions for option in action.option_strings}
    fields = [f.name for f in dataclasses.fields(GRAILFields) if f.name.startswith("eval_")]
    assert len(fields) >= 6
    for name in fields:
        assert "--" + name.removeprefix("eval_").replace("_", "-") in flags, name
