"""Bad input, one row each: `grail train` exits 2 before any work, with a message naming the key, row or file and
the fix, no traceback, and no run output that claims success (docs/reference/errors.md)."""

import json

import pytest

from grail.cli import main
from grail.models.tiny import build_tokenizer, save_tiny


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


def _no_tokenizer(path):
    save_tiny(path, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (path / name).unlink(missing_ok=True)


def _no_chat_template(path):
    save_tiny(path, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)
    (path / "chat_template.jinja").unlink()


def _no_pad_or_eos(path):
    save_tiny(path, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)
    tokenizer = build_tokenizer()
    tokenizer.pad_token = tokenizer.eos_token = None
    tokenizer.save_pretrained(path)


MODEL_CASES = [  # (name, how the model directory is made, extra argv, what the message must name)
    ("a missing tokenizer", _no_tokenizer, [], "no tokenizer could be loaded"),
    ("no pad and no EOS token", _no_pad_or_eos, [], "neither a pad token nor an EOS token"),
    ("a chat template required but absent", _no_chat_template, ["--conversational", "true"],
     "has none: use conversational=false"),
    ("no decoder layer for the chosen leaf",
     lambda p: save_tiny(p, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64),
     ["--token_weighting", "grail", "--saliency_leaf", "middle"], "leaf='middle'"),
]


@pytest.mark.parametrize("name, make, argv, named", MODEL_CASES, ids=[c[0] for c in MODEL_CASES])
def test_a_bad_model_exits_2_naming_it_before_any_work(tmp_path, capsys, name, make, argv, named):
    model = tmp_path / "model"
    make(model)
    run = tmp_path / "run"
    assert main(["train", "--max_steps", "1", "--output_dir", str(run), "--model_name_or_path", str(model), *argv]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith("grail: error:") and named in err and "Traceback" not in err
    assert not run.exists() or not any(run.iterdir())  # nothing written: a rerun after the fix is not refused


def test_a_model_without_input_embeddings_is_refused_when_the_trainer_is_built(tmp_path, capsys, monkeypatch):
    """A causal LM whose get_input_embeddings() gives nothing (a custom architecture) cannot be probed: refused
    before the first step, naming the accessor to add."""
    from transformers import Qwen3ForCausalLM

    save_tiny(tmp_path / "model", hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)
    monkeypatch.setattr(Qwen3ForCausalLM, "get_input_embeddings", lambda self: None)
    run = tmp_path / "run"
    argv = ["train", "--max_steps", "1", "--output_dir", str(run), "--model_name_or_path", str(tmp_path / "model"),
            "--token_weighting", "grail"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "get_input_embeddings() is missing or returned None" in err and "Traceback" not in err
    assert not run.exists() or not any(run.iterdir())
