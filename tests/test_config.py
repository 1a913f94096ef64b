"""GRAILConfig: choices match dispatch tables, every field documented, device defaults, clear errors."""

import dataclasses

import pytest

from grail.evaluation.release_scoring import SCORINGS
from grail.evaluation.rewards import REWARDS
from grail.methods.core import ROLLOUT_SYMMETRIES
from grail.methods.probes import LEAVES
from grail.methods.spans import BOX_CHOICES
from grail.methods.table import METHODS, method_spec
from grail.options.choices import OAR_VARIANT_DEFAULTS, WeightingFields, WeightingOptions
from grail.options.fields import GRAILFields
from grail.options.presets import PAPER_NOTES, PRESETS
from grail.training.config import GRAILConfig, literal_choices

OWN_FIELDS = [*dataclasses.fields(GRAILFields),
              *(f for f in dataclasses.fields(GRAILConfig) if f.name in GRAILConfig.__annotations__)]


def test_literal_choices_equal_the_dispatch_tables():
    assert literal_choices("token_weighting") == ()  # any name of the method table (checked against it, below)
    assert literal_choices("saliency_leaf") == tuple(LEAVES)
    assert literal_choices("answer_box") == BOX_CHOICES
    assert literal_choices("rollout_symmetry") == ROLLOUT_SYMMETRIES
    assert set(literal_choices("oar_variant")) == set(OAR_VARIANT_DEFAULTS)
    assert literal_choices("answer_nll_span") == ("box", "content")
    assert literal_choices("oar_scope") == ("reasoning", "completion", None)  # None: the variant's value
    assert set(literal_choices("eval_scoring")) == set(SCORINGS)


def test_an_unknown_method_is_named_with_the_choices():
    with pytest.raises(ValueError, match="token_weighting='magic'.*" + ", ".join(METHODS)):
        method_spec("magic")


def test_weighting_options_mirror_the_config_fields(tmp_path):
    """One home for defaults: every WeightingOptions field is a GRAILConfig field with the same default."""
    cfg = GRAILConfig(output_dir=str(tmp_path))
    assert cfg.weighting_options() == WeightingOptions(temperature=cfg.temperature)
    for f in dataclasses.fields(WeightingOptions):
        assert f.name in {g.name for g in dataclasses.fields(GRAILConfig)}, f.name
    declared = {f.name: f for f in dataclasses.fields(WeightingFields)}  # one declaration, the same field in both
    for cls in (GRAILConfig, WeightingOptions):
        assert all(f is declared[f.name] for f in dataclasses.fields(cls) if f.name in declared), cls
    assert set(literal_choices("reward")) == set(REWARDS) | {"auto"}


def test_every_grail_field_has_help():
    assert len(OWN_FIELDS) >= 15
    for f in OWN_FIELDS:
        assert len(f.metadata.get("help", "")) > 15, f.name


def test_cpu_defaults_are_resolved(tmp_path):
    cfg = GRAILConfig(output_dir=str(tmp_path))
    assert cfg.use_cpu is True and cfg.bf16 is False
    assert cfg.activation_checkpointing is False and cfg.gradient_checkpointing is False


def test_explicit_user_values_win_over_resolved_defaults(tmp_path):
    assert GRAILConfig(output_dir=str(tmp_path), activation_checkpointing=True).activation_checkpointing is True
    with pytest.warns(FutureWarning):  # the old name still works, through transformers' alias
        assert GRAILConfig(output_dir=str(tmp_path), gradient_checkpointing=True).activation_checkpointing is True
    assert GRAILConfig(output_dir=str(tmp_path), bf16=True).bf16 is True


@pytest.mark.parametrize("kwargs, named", [
    ({"token_weighting": "magic"}, "token_weighting"),
    ({"weight_min": 2.0}, "weight_min"),
    ({"oar_quantile": 1.5}, "oar_quantile"),
    ({"oar_noise_std": 0.0}, "oar_noise_std"),
    ({"oar_variant": "grail_release", "token_weighting": "oar_p"}, "oar_variant"),
    ({"oar_variant": "grail_release", "oar_distribution": "last_position", "token_weighting": "oar_g"},
     "oar_distribution"),
    ({"oar_quantile": 0.3, "token_weighting": "grail"}, "oar_quantile=0.3 is an option of oar_g, oar_p"),
    ({"answer_nll_span": "marker"}, "answer_nll_span"),
    ({"oar_scope": "answer"}, "oar_scope"),
    ({"oar_min_importance": -1.0}, "oar_min_importance"),
    ({"reward": "exact"}, "reward"),
    ({"task_num_steps": 0}, "num_steps"),
    ({"task_filler_rate": 1.5}, "filler_rate"),
    ({"warmstart_steps": 0}, "warmstart_steps"),
    ({"warmstart_lr": -1.0}, "warmstart_lr"),
    ({"num_generations": 3, "per_device_train_batch_size": 8}, "num_generations"),
])
def test_bad_values_raise_naming_the_field(tmp_path, kwargs, named):
    with pytest.raises(ValueError, match=named):
        GRAILConfig(output_dir=str(tmp_path), **kwargs)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_build_valid_configs(tmp_path, name):
    values = {k: v for k, v in PRESETS[name].items() if k not in ("bf16", "optim")}  # GPU-only on this machine
    cfg = GRAILConfig(output_dir=str(tmp_path), **values)
    assert cfg.loss_type == "dr_grpo" and cfg.scale_rewards == "none" and cfg.beta == 0.0


def test_paper_preset_matches_methods_section_1():
    p = PRESETS["paper"]
    assert (p["epsilon"], p["epsilon_high"], p["num_generations"], p["num_iterations"]) == (0.2, 0.28, 8, 4)
    assert (p["learning_rate"], p["max_steps"], p["seed"], p["top_k"], p["max_completion_length"]) == (
        1e-6, 200, 42, 50, 4096)
    assert p["per_device_train_batch_size"] * p["gradient_accumulation_steps"] * 4 == 32 * 8
    assert p["prompt_suffix"] == " Please reason step by step, and put your final answer within \\boxed{}."
    # the release's numerics: policy loaded in bf16, dropout off, one seeded shuffle of the training set
    assert p["model_init_kwargs"] == {"dtype": "bfloat16"}
    assert (p["disable_dropout"], p["dataset_shuffle_seed"]) == (True, 42)
    assert set(PAPER_NOTES) == set(p)  # `grail presets paper` says what every value is for


def test_oar_variant_values_are_resolved_into_the_record_not_onto_the_config(tmp_path):
    cfg = GRAILConfig(output_dir=str(tmp_path), token_weighting="oar_g", oar_variant="grail_release")
    ran = cfg.weighting_options()
    assert (ran.oar_scope, ran.oar_quantile, ran.oar_beta) == ("completion", 0.4, 2.0)
    assert (cfg.oar_scope, cfg.oar_quantile, cfg.oar_beta) == (None, None, None)  # the config keeps what was given
    record = cfg.to_dict()  # resolved_config.json: what ran
    assert (record["oar_scope"], record["oar_quantile"], record["oar_beta"]) == ("completion", 0.4, 2.0)
    cfg = GRAILConfig(output_dir=str(tmp_path), token_weighting="oar_p", oar_beta=1.5)
    assert (cfg.to_dict()["oar_quantile"], cfg.to_dict()["oar_beta"]) == (0.25, 1.5)
    assert GRAILConfig(output_dir=str(tmp_path), token_weighting="oar_g").to_dict()["oar_scope"] == "reasoning"
    assert GRAILConfig(output_dir=str(tmp_path)).to_dict()["oar_scope"] is None  # GRPO reads no OAR field


def test_a_weighting_field_cannot_change_after_the_config_is_built(tmp_path):
    """The resolved options are what runs: a later change would silently not run, so it is refused, naming the fix."""
    cfg = GRAILConfig(output_dir=str(tmp_path), token_weighting="grail")
    with pytest.raises(AttributeError, match=r"weight_std=2.0: .*build a new config"):
        cfg.weight_std = 2.0
    with pytest.raises(dataclasses.FrozenInstanceError, match="dataclasses.replace"):
        cfg.weighting_options().weight_std = 2.0
    cfg.learning_rate = 1e-4  # any other field stays TRL's to set
    assert cfg.weighting_options().weight_std == 0.5


def test_a_pickled_config_keeps_its_resolved_options(tmp_path):
    import pickle

    cfg = GRAILConfig(output_dir=str(tmp_path), token_weighting="oar_g")
    back = pickle.loads(pickle.dumps(cfg))  # as TRL saves it with every checkpoint; the spec is looked up again
    assert back.weighting_options() == cfg.weighting_options() and back.method is cfg.method
