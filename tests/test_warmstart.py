"""grail.models.warmstart: the cache key covers every warm-start setting, a cached checkpoint is reused without
training, an interrupted or damaged entry is never handed out, and a real (2-step) warm start is a loadable checkpoint.

Most tests replace the training with a stub that writes a file (the cache logic does not need a trained model);
one trains for real on tiny settings."""

import json
import os
from dataclasses import asdict, fields, replace

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import grail.models.warmstart
import grail.options.choices
from grail.models.warmstart import default_cache_dir, warm_start
from grail.options.choices import WarmStartConfig
from grail.options.fields import CHAIN_ONLY_FIELDS, GRAILFields
from grail.tasks.arithmetic import TASK_STYLES, TaskConfig

SMALL = WarmStartConfig(steps=2, batch_size=4, num_examples=8, warmup_steps=1, hidden_size=32, num_layers=1)
# the run's task settings that shape the RL data set (train / held-out prompts), not the supervised warm start
NOT_WARM_START = {"task_num_train", "task_num_heldout", "task_seed"}


def _changed(value):
    """A different valid value of the same type (bool before int: a bool is an int)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value + 0.25
    if value in TASK_STYLES:  # a choice (task style): another one
        return next(style for style in TASK_STYLES if style != value)
    raise TypeError(f"no rule to change a {type(value).__name__}: extend _changed")


@pytest.fixture
def trainings(monkeypatch):
    """Replaces the SFT with a stub that writes a recognisable file; returns the list of directories it wrote."""
    calls = []

    def fake_train(config, out_dir, log=print):
        calls.append(out_dir)
        (out_dir / "config.json").write_text(json.dumps({"steps": config.steps}))
        return out_dir

    monkeypatch.setattr(grail.models.warmstart, "train_warm_start", fake_train)
    return calls


# ---- the key ------------------------------------------------------------------------------------------------------
def test_every_setting_changes_the_key():
    base = WarmStartConfig()
    variants = {f.name: replace(base, **{f.name: _changed(getattr(base, f.name))}) for f in fields(base)
                if f.name != "task"}
    for f in fields(TaskConfig):
        task = replace(base.task, **{f.name: _changed(getattr(base.task, f.name))})
        variants[f"task.{f.name}"] = replace(base, task=task)
    keys = {name: config.cache_key() for name, config in variants.items()}
    assert base.cache_key() not in keys.values(), [n for n, k in keys.items() if k == base.cache_key()]
    assert len(set(keys.values())) == len(keys)  # no two settings collide either


def test_identical_settings_give_the_same_key():
    a = WarmStartConfig(task=TaskConfig(num_steps=3), steps=7, lr=1e-3)
    b = WarmStartConfig(task=TaskConfig(num_steps=3), steps=7, lr=1e-3)
    assert a is not b and a.cache_key() == b.cache_key()
    assert len(a.cache_key()) == 16 and int(a.cache_key(), 16) >= 0  # hex: a safe directory name


def test_a_new_recipe_version_changes_every_key(monkeypatch):
    before = WarmStartConfig().cache_key()
    monkeypatch.setattr(grail.options.choices, "RECIPE_VERSION", grail.options.choices.RECIPE_VERSION + 1)
    assert WarmStartConfig().cache_key() != before


def test_every_warm_start_field_of_a_run_reaches_the_key():
    """The run's task_*, warmstart_* and tiny_* fields: each one the warm start depends on changes the key (a field
    that is not forwarded would silently reuse a checkpoint trained with other settings); the data-set ones do not."""
    base = GRAILFields()
    # the chain task's own fields never reach the tiny model's warm start: a symbolic config refuses them
    # (tests/test_chain_config.py), and the chain task is warm-started by `grail sft`
    names = [f.name for f in fields(base) if f.name.startswith(("task_", "warmstart_", "tiny_"))
             and f.name not in CHAIN_ONLY_FIELDS]
    assert NOT_WARM_START < set(names)  # the list above names real fields
    key = base.warm_start_config().cache_key()
    for name in names:
        value = getattr(base, name)
        if value is None:  # a task_* field left to its style's default: the value it stands for
            value = getattr(base.synthetic_set(), name[5:], None) or getattr(base.task_config(), name[5:])
        changed = replace(base, **{name: _changed(value)})
        assert (changed.warm_start_config().cache_key() != key) == (name not in NOT_WARM_START), name


@pytest.mark.parametrize("kwargs, named", [({"steps": 0}, "steps=0"), ({"batch_size": 0}, "batch_size=0"),
                                           ({"hidden_size": 0}, "hidden_size=0"), ({"lr": 0.0}, "lr=0.0")])
def test_bad_settings_are_refused_naming_them(kwargs, named):
    with pytest.raises(ValueError, match=named):
        WarmStartConfig(**kwargs)


# ---- the cache ----------------------------------------------------------------------------------------------------
def test_a_cached_checkpoint_is_reused_without_training(tmp_path, trainings):
    messages = []
    first = warm_start(SMALL, tmp_path, log=messages.append)
    assert first == tmp_path / f"tiny-warmstart-{SMALL.cache_key()}" and len(trainings) == 1
    assert json.loads((first / "warmstart.json").read_text()) == json.loads(json.dumps(asdict(SMALL)))
    assert warm_start(SMALL, tmp_path, log=messages.append) == first
    assert len(trainings) == 1 and "reusing cached checkpoint" in messages[-1]
    other = replace(SMALL, steps=3)
    assert warm_start(other, tmp_path, log=messages.append) != first and len(trainings) == 2  # another key: trained
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"tiny-warmstart-{c.cache_key()}"
                                                                for c in (SMALL, other))  # no staging left behind


def test_the_default_cache_is_grail_cache_then_home(cache_dir, monkeypatch, tmp_path, trainings):
    assert default_cache_dir() == cache_dir  # the fixture set $GRAIL_CACHE
    assert warm_start(SMALL, log=lambda s: None).parent == cache_dir
    monkeypatch.delenv("GRAIL_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "grail-rl"


def test_an_interrupted_training_leaves_nothing_trusted_and_the_next_run_builds_it(tmp_path, monkeypatch):
    def killed(config, out_dir, log=print):
        (out_dir / "model.safetensors").write_bytes(b"half a checkpoint")
        raise KeyboardInterrupt

    monkeypatch.setattr(grail.models.warmstart, "train_warm_start", killed)
    with pytest.raises(KeyboardInterrupt):
        warm_start(SMALL, tmp_path, log=lambda s: None)
    assert not (tmp_path / f"tiny-warmstart-{SMALL.cache_key()}").exists()  # only a staging directory
    done = []
    monkeypatch.setattr(grail.models.warmstart, "train_warm_start", lambda config, out_dir, log: done.append(out_dir))
    path = warm_start(SMALL, tmp_path, log=lambda s: None)
    assert len(done) == 1 and (path / "warmstart.json").is_file()
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())  # the same process cleared its staging


def test_when_another_process_finishes_first_its_checkpoint_is_kept(tmp_path, monkeypatch):
    final = tmp_path / f"tiny-warmstart-{SMALL.cache_key()}"

    def racing(config, out_dir, log=print):  # meanwhile, another process renames its finished entry into place
        final.mkdir()
        (final / "config.json").write_text("theirs")
        (final / "warmstart.json").write_text("{}")
        (out_dir / "config.json").write_text("ours")

    monkeypatch.setattr(grail.models.warmstart, "train_warm_start", racing)
    assert warm_start(SMALL, tmp_path, log=lambda s: None) == final
    assert (final / "config.json").read_text() == "theirs"
    assert [p.name for p in tmp_path.iterdir()] == [final.name]  # our staging copy is gone


def test_an_entry_without_its_marker_is_rebuilt(tmp_path, trainings):
    final = tmp_path / f"tiny-warmstart-{SMALL.cache_key()}"
    final.mkdir()
    (final / "model.safetensors").write_bytes(b"cut short")  # e.g. a copy of the cache that was interrupted
    path = warm_start(SMALL, tmp_path, log=lambda s: None)
    assert (path / "warmstart.json").is_file() and (path / "config.json").is_file()  # the rebuilt checkpoint
    warm_start(SMALL, tmp_path, log=lambda s: None)
    assert len(trainings) == 1  # and it is reused from then on


def test_a_real_warm_start_is_a_checkpoint_loadable_by_path(tmp_path, monkeypatch):
    path = warm_start(SMALL, tmp_path, log=lambda s: None)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.config.hidden_size == SMALL.hidden_size and model.config.num_hidden_layers == SMALL.num_layers
    ids = torch.tensor([tokenizer("Q: 1+2\nA:")["input_ids"]])
    assert torch.isfinite(model(ids).logits).all()
    mtimes = {p.name: os.stat(p).st_mtime_ns for p in path.iterdir()}

    def fail(*args, **kwargs):
        raise AssertionError("retrained a cached warm start")

    monkeypatch.setattr(grail.models.warmstart, "train_warm_start", fail)
    assert warm_start(SMALL, tmp_path, log=lambda s: None) == path
    assert {p.name: os.stat(p).st_mtime_ns for p in path.iterdir()} == mtimes  # nothing rewritten


def test_a_process_other_than_rank_0_writes_a_complete_cache_entry(tmp_path, monkeypatch):
    """In a launch of several processes each warm-starts into its own staging folder and the first to finish
    publishes it; transformers 5 writes `save_pretrained`'s files on rank 0 only, so the entry of another rank
    must not depend on it (seen: a cache entry with a tokenizer and no weights, 'Unrecognized model')."""
    from transformers import PreTrainedModel

    reference = tmp_path / "reference"
    grail.models.warmstart.build_tiny_model(grail.models.warmstart.build_tokenizer(), hidden_size=SMALL.hidden_size,
                                            num_layers=SMALL.num_layers).save_pretrained(reference)
    monkeypatch.setattr(PreTrainedModel, "should_save_on_this_rank", lambda self, is_main_process: False)
    path = warm_start(SMALL, tmp_path, log=lambda _: None)
    saved, expected = (json.loads((p / "config.json").read_text()) for p in (path, reference))
    assert saved.keys() == expected.keys() and saved["architectures"] == ["Qwen3ForCausalLM"]  # TRL loads by it
    model = AutoModelForCausalLM.from_pretrained(path)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in path.iterdir()}
    assert model.lm_head.weight is model.model.embed_tokens.weight  # ties survive the save
    from safetensors import safe_open

    keys = [set(safe_open(str(p / "model.safetensors"), "pt").keys()) for p in (path, reference)]
    assert keys[0] == keys[1]  # the tensor names save_pretrained writes (a tied weight once, by its first name)
