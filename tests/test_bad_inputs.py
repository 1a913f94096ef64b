"""Bad input, one row each: `grail train` exits 2 before any work, with a message naming the key, row or file and
the fix, no traceback, and no run output that claims success (README "Bad input")."""

import json

import pytest

from grail.cli import main


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _big_file_with_a_bad_last_row(path):
    rows = [{"prompt": f"Q{i}", "answer": str(i)} for i in range(50_000)] + [{"prompt": "Q", "answer": ""}]
    return _jsonl(path, rows)


CASES = [  # (name, files to write: name -> function(path), argv, what the message must name)
    ("empty file", {"data": lambda p: p.write_text("")}, ["--dataset", "{data}"], "data.jsonl"),
    ("not UTF-8", {"data": lambda p: p.write_bytes(b'\xff\xfe{"prompt": "a"}\n')}, ["--dataset", "{data}"],
     "data.jsonl"),
    ("a number as prompt", {"data": lambda p: _jsonl(p, [{"prompt": 5, "answer": "1"}])},
     ["--dataset", "{data}"], "row 0: 'prompt' is a int"),
    ("a missing answer in row 50,000", {"data": _big_file_with_a_bad_last_row}, ["--dataset", "{data}"],
     "row 50000: empty 'prompt' or 'answer'"),
    ("no answer column", {"data": lambda p: _jsonl(p, [{"prompt": "a", "solution": "1"}])},
     ["--dataset", "{data}"], "no column 'answer'"),
    ("num_generations not dividing the batch", {}, ["--num_generations", "3", "--per_device_train_batch_size", "4"],
     "divisible by num_generations (3)"),
    ("a value out of range", {}, ["--weight_min", "2.0"], "weight_min"),
    ("a wrong type", {}, ["--max_steps", "ten"], "max_steps"),
    ("an unknown benchmark", {}, ["--eval_benchmarks", "math501"], "'math501'"),
    ("a bad evaluation size", {}, ["--eval_benchmarks", "synthetic", "--eval_size", "-3"], "-3"),
    ("a missing benchmark file", {}, ["--eval_benchmarks", "math500", "--eval_data_dir", "{nowhere}",
                                      "--eval_size", "all"], "math500/test.jsonl"),
    ("a resume without a checkpoint", {}, ["--resume_from_checkpoint", "true"], "no complete checkpoint"),
]


@pytest.mark.parametrize("name, files, argv, named", CASES, ids=[c[0] for c in CASES])
def test_bad_input_exits_2_naming_it_before_any_work(tmp_path, capsys, name, files, argv, named):
    paths = {key: tmp_path / f"{key}.jsonl" for key in files}
    for key, write in files.items():
        write(paths[key])
    values = {key: str(path) for key, path in paths.items()} | {"nowhere": str(tmp_path / "nowhere")}
    run = tmp_path / "run"
    assert main(["train", "--max_steps", "1", "--output_dir", str(run), *(a.format(**values) for a in argv)]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith("grail: error:") and named in err and "Traceback" not in err
    assert not (run / "final").exists() and not (run / "metrics.jsonl").exists()
