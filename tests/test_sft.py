"""`grail sft` / grail.training.sft: the supervised warm start through TRL's SFTTrainer, on a tiny model built in the
test (its tokenizer has a ChatML template, so the conversational path runs; one test takes the template away)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file
from transformers import TrainerCallback

import grail.training.sft as sft_module
from grail.cli import main
from grail.models.sft_cache import MARKER, base_identity
from grail.models.tiny import save_tiny
from grail.models.warmstart import load_inference_model, resolve_model
from grail.options.presets import PRESETS
from grail.options.prompts import PromptFormat
from grail.options.sft import SFTFields, sft_cache_key
from grail.tasks.chains import ChainSet, ChainSplits
from grail.training.config import GRAILConfig
from grail.training.sft import make_trainer, sft_warm_start

SET = ChainSet(num_sft=16, num_train=8, num_heldout=8)


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("base"), seed=0, hidden_size=32, num_layers=1)


def _settings(tmp_path, **kwargs) -> SFTFields:
    values = dict(sft_steps=2, sft_batch_size=4, sft_learning_rate=1e-2, sft_warmup_steps=0, sft_save_steps=2,
                  sft_logging_steps=1, sft_max_length=512, cache_dir=str(tmp_path / "cache"))
    return SFTFields(**{**values, **kwargs})


def test_labels_cover_the_completion_only(tmp_path, base_dir):
    trainer, fmt = make_trainer(_settings(tmp_path, base_model=str(base_dir)), SET, base_dir, tmp_path / "ckpt")
    assert fmt.chat and fmt.suffix == ""  # the tiny tokenizer's ChatML template: the chat path
    # the tiny tokenizer merges "\nA" (its "\nA:" token): a solution starting with "A" would take the prompt's last
    # "\n" into its first token (TRL then starts the completion there and warns); the others split cleanly
    rows = [i for i, e in enumerate(SET.examples("sft")) if not e.solution.startswith("A")][:2]
    batch = trainer.data_collator([trainer.train_dataset[i] for i in rows])
    tokenizer = trainer.processing_class
    for row, example in enumerate(SET.examples("sft")[i] for i in rows):
        ids, labels = batch["input_ids"][row], batch["labels"][row]
        real = batch["attention_mask"][row].bool()
        trained = labels != -100
        assert torch.equal(labels[trained], ids[trained])
        # what the loss sees: the solution and the template's end of the assistant turn, nothing of the prompt
        assert tokenizer.decode(ids[trained]) == example.solution + "<|im_end|>\n"
        prompt = tokenizer.decode(ids[real & ~trained])
        assert prompt == fmt.render(tokenizer, example.prompt)


def test_a_tokenizer_without_a_template_trains_on_plain_text(tmp_path, base_dir):
    plain = tmp_path / "plain"
    save_tiny(plain, seed=0, hidden_size=32, num_layers=1)
    config = json.loads((plain / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (plain / "tokenizer_config.json").write_text(json.dumps(config))
    for name in plain.glob("chat_template.*"):
        name.unlink()
    trainer, fmt = make_trainer(_settings(tmp_path, base_model=str(plain)), SET, plain, tmp_path / "ckpt")
    assert not fmt.chat
    batch = trainer.data_collator([trainer.train_dataset[0]])
    ids, labels = batch["input_ids"][0], batch["labels"][0]
    example = SET.examples("sft")[0]
    assert trainer.processing_class.decode(ids[labels != -100]) == " " + example.solution + "<|endoftext|>"
    assert trainer.processing_class.decode(ids[labels == -100]).endswith("\n\nAnswer:")


def test_sft_trains_caches_and_gives_a_model_dir_train_and_eval_take(tmp_path, base_dir, monkeypatch):
    settings = _settings(tmp_path, base_model=str(base_dir))
    logs = []
    entry = sft_warm_start(settings, SET, logs.append)
    assert (entry / MARKER).is_file() and not list(entry.parent.glob(".*.work"))  # the work folder is gone
    record = json.loads((entry / MARKER).read_text())
    assert record["steps"] == 2 and record["key"] == sft_cache_key(settings, base_identity(str(base_dir), base_dir),
                                                                   SET)
    assert any("s left" in line for line in logs)  # progress with the time left
    before, after = load_file(base_dir / "model.safetensors"), load_file(entry / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before)  # the parameters moved
    # what grail train and grail eval load
    assert resolve_model(str(entry)) == str(entry)
    model = load_inference_model(entry, device="cpu")
    assert sum(p.numel() for p in model.parameters()) > 0
    assert PromptFormat.load(entry) == PromptFormat(chat=True, chat_template_kwargs={"enable_thinking": False})
    cfg = GRAILConfig(output_dir=str(tmp_path / "run"), model_name_or_path=str(entry), task_style="chains")
    assert cfg.synthetic_set().splits == ChainSplits()
    # a second call is a cache hit: no trainer is built
    monkeypatch.setattr(sft_module, "make_trainer", lambda *a, **k: pytest.fail("trained again on a cache hit"))
    assert sft_warm_start(settings, SET, logs.append) == entry
    assert "reusing" in logs[-1]


def test_the_first_step_prints_progress_before_the_first_logging_step(tmp_path, base_dir):
    logs = []
    sft_warm_start(_settings(tmp_path, base_model=str(base_dir), sft_steps=3, sft_logging_steps=10), SET, logs.append)
    progress = [line for line in logs if line.startswith("sft: step ")]
    assert len(progress) == 1 and progress[0].startswith("sft: step 1/3  loss ")  # not step 2 or 3: 10 never comes
    assert float(progress[0].split("about ")[1].split(" s left")[0]) >= 0  # the time left, from the first step's pace


class _Interrupt(TrainerCallback):
    """Stops the process (as a kill would) once step `at` is done; the trainer has saved what save_steps asked."""

    def __init__(self, at: int):
        self.at = at

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.at:
            raise KeyboardInterrupt


class _Steps(TrainerCallback):
    def __init__(self):
        self.steps = []

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append(state.global_step)


def test_an_interrupted_run_resumes_from_its_last_checkpoint(tmp_path, base_dir):
    settings = _settings(tmp_path, base_model=str(base_dir), sft_steps=4, sft_save_steps=2)
    with pytest.raises(KeyboardInterrupt):
        sft_warm_start(settings, SET, lambda s: None, callbacks=[_Interrupt(at=3)])
    work = next((tmp_path / "cache" / "sft").glob(".*.work"))
    assert sorted(p.name for p in (work / "checkpoints").glob("checkpoint-*")) == ["checkpoint-2"]
    steps, logs = _Steps(), []
    entry = sft_warm_start(settings, SET, logs.append, callbacks=[steps])
    assert "resuming from" in logs[0] and logs[0].split("resuming from ")[1].startswith(str(work))
    assert steps.steps == [3, 4]  # only the steps after the checkpoint ran
    assert json.loads((entry / MARKER).read_text())["steps"] == 4


def test_the_key_follows_every_setting_that_shapes_the_model(tmp_path, base_dir):
    settings = _settings(tmp_path, base_model=str(base_dir))
    identity = base_identity(str(base_dir), base_dir)
    key = sft_cache_key(settings, identity, SET)
    changed = [sft_cache_key(replace(settings, sft_steps=3), identity, SET),
               sft_cache_key(replace(settings, sft_learning_rate=1e-3), identity, SET),
               sft_cache_key(settings, {**identity, "config_sha256": "other"}, SET),
               sft_cache_key(settings, identity, replace(SET, num_sft=17)),
               sft_cache_key(settings, identity, replace(SET, seed=1)),
               sft_cache_key(settings, identity, replace(SET, task=replace(SET.task, num_steps=4)))]
    assert key not in changed and len(set(changed)) == len(changed)
    same = [sft_cache_key(replace(settings, sft_save_steps=7, sft_logging_steps=5, cache_dir="elsewhere"), identity,
                          SET), sft_cache_key(settings, identity, replace(SET, num_train=99, num_heldout=99))]
    assert same == [key, key]  # bookkeeping and the other splits' sizes do not change the sft split's model


def test_bad_base_models_and_overlapping_splits_are_refused(tmp_path, base_dir):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="no weights .*; no tokenizer.*save_pretrained"):
        sft_warm_start(_settings(tmp_path, base_model=str(empty)), SET)
    with pytest.raises(FileNotFoundError, match="grail models fetch smollm2-135m"):  # the session cache holds none
        sft_warm_start(_settings(tmp_path, base_model="smollm2-135m"), SET)
    other = replace(SET, splits=ChainSplits(heldout_fraction=0.2))
    with pytest.raises(ValueError, match="sft: .*same splits"):
        sft_warm_start(_settings(tmp_path, base_model=str(base_dir)), other)


@pytest.mark.parametrize("flags, named", [(["--sft_steps", "0"], "sft_steps=0"),
                                          (["--task_max_value", "20"], "max_value"),
                                          (["--base_model", "/no/such/dir"], "neither a built-in model")])
def test_the_command_names_bad_input(flags, named, capsys, tmp_path):
    assert main(["sft", "--cache_dir", str(tmp_path), *flags]) == 2
    assert named in capsys.readouterr().err


def test_the_command_runs_and_prints_the_model_dir(tmp_path, base_dir, capsys):
    argv = ["sft", "--base_model", str(base_dir), "--sft_steps", "1", "--sft_batch_size", "2", "--task_num_sft", "4",
            "--task_num_steps", "2", "--cache_dir", str(tmp_path), "--sft_logging_steps", "1"]
    assert main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    entry = next(line for line in out if line.startswith(str(tmp_path)))
    assert json.loads((tmp_path / "sft" / entry.rsplit("/", 1)[1] / MARKER).read_text())["num_sft"] == 4
    assert any(line.startswith("next: grail train --model_name_or_path") for line in out)


@pytest.mark.real
@pytest.mark.slow
def test_smollm2_takes_a_few_sft_steps(tmp_path, real_model_dir):
    settings = SFTFields(base_model="smollm2-135m", sft_steps=2, sft_batch_size=2, sft_logging_steps=1,
                         cache_dir=str(real_model_dir.parent.parent))
    small = replace(SET, num_sft=4)
    trainer, _ = make_trainer(settings, small, real_model_dir, tmp_path / "ckpt")
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(4)])
    for row, example in enumerate(small.examples("sft")):  # the template renders the prompt alone as a prefix
        labelled = batch["input_ids"][row][batch["labels"][row] != -100]
        assert trainer.processing_class.decode(labelled) == example.solution + "<|im_end|>\n"
    entry = sft_warm_start(settings, small, lambda s: None)
    assert PromptFormat.load(entry).chat  # SmolLM2-Instruct has a chat template
    assert json.loads((entry / MARKER).read_text())["base"]["model"] == "smollm2-135m"
    before, after = load_file(real_model_dir / "model.safetensors"), load_file(entry / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before if k in after)


def test_grail_train_and_grail_eval_run_from_the_warm_start(tmp_path, base_dir, capsys):
    entry = sft_warm_start(_settings(tmp_path, base_model=str(base_dir)), SET, lambda s: None)
    run = tmp_path / "run"
    assert main(["train", "--model_name_or_path", str(entry), "--task_style", "chains", "--task_num_train", "8",
                 "--max_steps", "1", "--per_device_train_batch_size", "4", "--num_generations", "4",
                 "--max_completion_length", "8", "--output_dir", str(run), "--report_to", "none"]) == 0
    assert PromptFormat.load(run / "final") == PromptFormat.load(entry)  # RL read the prompts as SFT rendered them
    out = tmp_path / "eval"
    assert main(["eval", "--model", str(entry), "--benchmarks", "synthetic_chains", "--size", "2", "--samples", "1",
                 "--max-new-tokens", "8", "--workers", "1", "--output-dir", str(out)]) == 0
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert [s["benchmark"] for s in samples] == ["synthetic_chains"] * 2
    assert json.loads((out / "first_errors.json").read_text())["completions"] == 2  # and where they first go wrong


def test_the_command_with_a_preset_makes_the_warm_start_its_runs_look_for(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(sft_module, "sft_warm_start", lambda settings, chain_set, log: seen.append(
        (settings, chain_set)) or tmp_path)
    assert main(["sft", "--preset", "gemma-chains", "--sft_steps", "7", "--task_seed", "2"]) == 0
    (settings, chain_set), = seen
    assert settings.base_model == "gemma3-270m" and settings.sft_steps == 7  # the preset's model; flags win
    run = GRAILConfig(output_dir=str(tmp_path), **{**PRESETS["gemma-chains"], "task_seed": 2})
    assert chain_set == run.synthetic_set()  # a `grail train --preset gemma-chains --task_seed 2` run's task
    with pytest.raises(SystemExit):  # not a chains preset: argparse refuses the choice
        main(["sft", "--preset", "smollm-words"])


def test_a_preset_that_names_sft_settings_makes_that_warm_start(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(sft_module, "sft_warm_start", lambda settings, chain, log: seen.append(settings) or tmp_path)
    monkeypatch.setitem(PRESETS, "longer-chains", {**PRESETS["smollm-chains"],
                                                   "model_name_or_path": "sft:smollm2-135m:sft_steps=100"})
    assert main(["sft", "--preset", "longer-chains"]) == 0
    assert main(["sft", "--preset", "longer-chains", "--sft_steps", "7"]) == 0  # flags still win
    assert [(s.base_model, s.sft_steps) for s in seen] == [("smollm2-135m", 100), ("smollm2-135m", 7)]
