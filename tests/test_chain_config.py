"""The chain task as a training task (`task_style: chains`): the config's fields, the rows training and evaluation
read, the prompt format, the AUROC rows, and the refusals."""

from __future__ import annotations

import typing
from dataclasses import fields

import pytest

from grail.analysis.compare.auroc import AurocPlan, auroc_rows
from grail.analysis.saliency.token_labels import check_row
from grail.evaluation.benchmarks import SYNTHETIC, SYNTHETIC_CHAINS, load_benchmark
from grail.models.sft_cache import MARKER, base_identity, entry_dir
from grail.models.tiny import build_tokenizer
from grail.options.fields import CHAIN_ONLY_FIELDS, SFT_MODEL_PREFIX, GRAILFields, TaskStyleChoice
from grail.options.presets import PRESETS
from grail.options.sft import SFTFields
from grail.tasks.arithmetic import TASK_STYLES, TaskConfig
from grail.tasks.chain_problems import ChainConfig
from grail.tasks.chains import ChainSet, ChainSplits
from grail.tasks.synthetic import SyntheticSet
from grail.training.config import GRAILConfig
from grail.training.data import load_prompts, load_train_dataset
from grail.training.heldout import eval_specs
from grail.training.overrides import parse_flags
from grail.training.run import resolve_model_path
from grail.training.sft import chain_set_of

CHAT_MODEL = "a-chat-model"  # any name but `tiny`: the config does not load the model
SMALL = {"task_style": "chains", "model_name_or_path": CHAT_MODEL, "task_num_sft": 12, "task_num_train": 16,
         "task_num_heldout": 10}


def _cfg(tmp_path, **kwargs) -> GRAILConfig:
    return GRAILConfig(output_dir=str(tmp_path / "run"), **{**SMALL, **kwargs})


def test_the_style_choices_are_the_arithmetic_styles_and_the_chain_task():
    assert typing.get_args(TaskStyleChoice) == (*TASK_STYLES, ChainConfig.style)


def test_defaults_come_from_each_styles_own_classes():
    chains = GRAILFields(task_style="chains").synthetic_set()
    assert chains == ChainSet()  # every None field took ChainConfig's / ChainSet's default
    assert GRAILFields().synthetic_set() == SyntheticSet() and GRAILFields().task_config() == TaskConfig()
    # the fields with one default for both styles: it must be each class's own
    for name, arithmetic, chain in [("task_filler_rate", TaskConfig, ChainConfig),
                                    ("task_num_train", SyntheticSet, ChainSet), ("task_seed", SyntheticSet, ChainSet)]:
        default = next(f.default for f in fields(GRAILFields) if f.name == name)
        assert default == getattr(arithmetic, name[5:]) == getattr(chain, name[5:]), name


def test_the_run_record_holds_the_task_values_that_ran_not_none(tmp_path):
    record = _cfg(tmp_path, task_num_steps=4).to_dict()  # resolved_config.json
    assert record["task_num_steps"] == 4 and record["task_operand_max"] == ChainConfig.operand_max
    assert record["task_num_heldout"] == SMALL["task_num_heldout"]  # given, so recorded as given
    symbolic = GRAILConfig(output_dir=str(tmp_path)).to_dict()  # as before the style defaults: TaskConfig's own values
    assert (symbolic["task_num_steps"], symbolic["task_max_value"]) == (TaskConfig.num_steps, TaskConfig.max_value)
    assert symbolic["task_num_heldout"] == SyntheticSet.num_heldout


def test_chain_fields_reach_the_chain_set(tmp_path):
    cfg = _cfg(tmp_path, task_num_steps=4, task_operand_min=5, task_operand_max=30, task_max_value=150,
               task_operations="add, subtract,multiply", task_factor_max=4, task_filler_rate=0.5, task_seed=3)
    task = ChainConfig(num_steps=4, operand_min=5, operand_max=30, operations=("add", "subtract", "multiply"),
                       factor_max=4, max_value=150, filler_rate=0.5)
    assert cfg.synthetic_set() == ChainSet(task=task, num_sft=12, num_train=16, num_heldout=10, seed=3)


def test_training_reads_the_train_split_and_evaluation_the_heldout_split(tmp_path):
    cfg = _cfg(tmp_path)
    expected = ChainSet(num_sft=12, num_train=16, num_heldout=10)
    train = load_prompts(cfg).to_list()
    assert train == expected.rows("train")
    heldout = load_benchmark(SYNTHETIC, synthetic_set=cfg.synthetic_set(), size=None)  # what a run's checkpoints use
    assert [p.problem for p in heldout.problems] == [r["prompt"] for r in expected.rows("heldout")]
    assert [p.answer for p in heldout.problems] == [r["answer"] for r in expected.rows("heldout")]
    # the rows above are these examples: their identities (the arithmetic) are three disjoint sets
    sft, train_ids, heldout_ids = ({e.expression for e in expected.examples(split)} for split in ("sft", "train",
                                                                                                "heldout"))
    assert len(sft) == 12 and len(train_ids) == 16 and len(heldout_ids) == 10
    assert not (sft & train_ids or sft & heldout_ids or train_ids & heldout_ids)
    splits = ChainSplits()
    assert {splits.split_of(identity) for identity in heldout_ids} == {"heldout"}


def test_the_chain_benchmark_is_the_default_chain_sets_heldout_split():
    loaded = load_benchmark(SYNTHETIC_CHAINS, size=None)
    rows = ChainSet().rows("heldout")
    assert [(p.problem, p.answer) for p in loaded.problems] == [(r["prompt"], r["answer"]) for r in rows]


def test_chain_prompts_are_one_user_turn_through_the_chat_template(tmp_path):
    cfg = _cfg(tmp_path)
    tokenizer = build_tokenizer()  # the tiny tokenizer has a ChatML template
    prompt = load_train_dataset(cfg, tokenizer)[0]["prompt"]
    assert [m["role"] for m in prompt] == ["user"] and "Example" not in prompt[0]["content"]
    assert prompt == ChainSet(num_sft=12, num_train=16, num_heldout=10).rows("train")[0]["prompt"]  # no suffix
    spec = eval_specs(cfg, tokenizer)["greedy"]  # grail compare's and grail demo's held-out evaluation
    assert spec.prompt.chat and spec.prompt.suffix == ""
    text = spec.prompt.render(tokenizer, prompt)
    assert text.startswith("<|im_start|>user\n" + prompt[0]["content"]) and text.endswith("<|im_start|>assistant\n")


def test_a_tokenizer_without_a_template_gets_the_plain_rendering(tmp_path):
    tokenizer = build_tokenizer()
    tokenizer.chat_template = None
    prompt = load_train_dataset(_cfg(tmp_path), tokenizer)[0]["prompt"]
    assert prompt.startswith("Question: ") and prompt.endswith("\n\nAnswer:")


@pytest.mark.parametrize("kwargs, named", [
    ({"task_operations": "add,divide"}, "operations"),
    ({"task_operations": "add,total"}, "operations"),
    ({"task_max_value": 20}, "max_value"),
    ({"task_num_steps": 0}, "num_steps"),
    ({"task_factor_max": 1}, "factor_max"),
    ({"task_num_sft": 0}, "num_sft"),
    ({"task_num_heldout": 0}, "num_heldout"),
])
def test_bad_chain_settings_name_the_field(tmp_path, kwargs, named):
    with pytest.raises(ValueError, match=named) as err:
        _cfg(tmp_path, **kwargs)
    assert "task_" in str(err.value)  # the message points at the config's prefixed names


@pytest.mark.parametrize("name", CHAIN_ONLY_FIELDS)
def test_chain_only_fields_are_refused_by_the_other_styles(tmp_path, name):
    value = {"task_operations": "add,subtract", "task_factor_max": 5, "task_num_sft": 7}[name]
    with pytest.raises(ValueError, match=f"{name}=.*task_style chains"):
        GRAILConfig(output_dir=str(tmp_path), **{name: value})


def test_the_tiny_model_is_refused_on_the_chain_task(tmp_path):
    # the tiny tokenizer could render the prompts (it has a chat template), but its warm start is symbolic only
    with pytest.raises(ValueError, match="tiny model is warm-started on the symbolic style only"):
        _cfg(tmp_path, model_name_or_path="tiny")


def test_auroc_task_rows_are_the_chain_examples(tmp_path):
    cfg = _cfg(tmp_path, token_weighting="grail")
    rows = auroc_rows(cfg, AurocPlan(rows=6))
    assert len(rows) == 6
    for index, row in enumerate(rows):
        check_row(row, index)
    heldout = {e.solution for e in ChainSet(task=ChainConfig(filler_rate=0.6), num_heldout=6).examples("heldout")}
    assert {row["solution"] for row in rows} == heldout  # filler 0.6 where the run has none, as for arithmetic
    assert any(row["filler_spans"] for row in rows)


# ---- the chain presets: a run from a `grail sft` warm start that is missing names the command ---------------------
def test_a_chain_preset_without_its_base_model_names_the_fetch(tmp_path, cache_dir):
    values = {k: v for k, v in PRESETS["smollm-chains"].items() if k not in ("bf16", "optim")}
    cfg = GRAILConfig(output_dir=str(tmp_path / "run"), **values)
    with pytest.raises(FileNotFoundError, match="grail models fetch smollm2-135m"):
        resolve_model_path(cfg)


@pytest.mark.parametrize("settings", ["", ":sft_steps=7:sft_learning_rate=0.0001"])
def test_a_missing_warm_start_names_the_sft_command_that_makes_it(tmp_path, tiny_dir, cache_dir, settings):
    cfg = _cfg(tmp_path, model_name_or_path=f"{SFT_MODEL_PREFIX}{tiny_dir}{settings}", task_num_steps=4,
               task_num_sft=9)
    with pytest.raises(FileNotFoundError, match="grail sft --base_model") as err:
        resolve_model_path(cfg)
    message = str(err.value)
    command = message.split("`")[1]
    assert command.startswith("grail sft") and "--task_num_steps 4" in command and "--task_num_sft 9" in command
    # the command, run, would write exactly the entry the run looked for
    flags = parse_flags(command.split()[2:])
    values = {k: int(v) if v.isdigit() else float(v) if k == "sft_learning_rate" else v for k, v in flags.items()}
    assert ("--sft_steps 7" in command) == bool(settings)  # the settings the run named, as flags
    settings = SFTFields(**{k: v for k, v in values.items() if not k.startswith("task_")}, cache_dir=None)
    entry = entry_dir(settings, base_identity(str(tiny_dir), tiny_dir),
                      chain_set_of({k: v for k, v in values.items() if k.startswith("task_")}))
    assert f"looked for {entry})" in message
    entry.mkdir(parents=True)
    (entry / MARKER).write_text("{}")
    assert resolve_model_path(cfg) == str(entry)


@pytest.mark.parametrize("spec, named", [
    ("smollm2-135m:steps=20", "'steps=20' is not FIELD=VALUE"),  # not a field name
    ("smollm2-135m:cache_dir=/x", "'cache_dir=/x' is not FIELD=VALUE"),  # does not shape the model
    ("smollm2-135m:sft_steps", "is not FIELD=VALUE"),
    ("smollm2-135m:sft_steps=ten", "sft_steps='ten' is not an integer"),
    ("smollm2-135m:sft_steps=0", "sft_steps=0 must be >= 1"),
    (":sft_steps=20", "names no model"),
])
def test_bad_sft_settings_in_a_model_name_are_refused_before_any_work(tmp_path, spec, named):
    with pytest.raises(ValueError, match=named):
        _cfg(tmp_path, model_name_or_path=f"{SFT_MODEL_PREFIX}{spec}")


def test_sft_models_need_the_chain_task(tmp_path):
    with pytest.raises(ValueError, match="needs task_style chains"):
        GRAILConfig(output_dir=str(tmp_path), model_name_or_path="sft:smollm2-135m")


def test_a_comparison_keys_a_sft_start_by_its_task(tmp_path):
    from grail.analysis.compare.start import _start_key, describe_start

    one, other = _cfg(tmp_path, model_name_or_path="sft:smollm2-135m"), _cfg(
        tmp_path, model_name_or_path="sft:smollm2-135m", task_num_steps=4)
    assert _start_key(one) != _start_key(other)  # fine-tuned on other problems: another start
    described = describe_start(one)
    assert described["source"] == "sft" and described["warm_start"] is True
    assert "smollm2-135m warm-started by `grail sft`" in described["text"] and "3-step chains" in described["text"]
    longer = _cfg(tmp_path, model_name_or_path="sft:smollm2-135m:sft_steps=100")
    assert _start_key(longer) != _start_key(one) and "(sft_steps 100)" in describe_start(longer)["text"]


def test_the_smollm_preset_is_the_budget_the_grpo_check_measured():
    """`smollm-chains` holds the start and RL values of the GRPO check that showed learning on SmolLM2 (the plan in
    its archive, as the comparison recorded it); only what a comparison sets per run or for its own bookkeeping may
    differ."""
    from pathlib import Path

    from grail.analysis.compare.packed import read_plan
    from grail.training.overrides import merge

    archive = Path(__file__).resolve().parent.parent / "results" / "regime" / "grpo-smollm-sft30-lr5e6.tar.xz"
    measured = read_plan(archive)["base"]
    preset = merge(None, {"preset": "smollm-chains"})
    bookkeeping = {"output_dir", "save_steps", "save_total_limit", "disable_tqdm", "seed", "data_seed"}
    differing = {k: (preset.get(k), measured.get(k)) for k in set(preset) | set(measured)
                 if k not in bookkeeping and preset.get(k) != measured.get(k)}
    assert not differing, differing
