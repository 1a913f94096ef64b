"""Config merging: precedence, typing of strings, unknown keys and bad values named."""

import pytest

from grail.training.overrides import ConfigError, build_config, merge, parse_flags


def _yaml(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return str(path)


def test_precedence_defaults_preset_file_flags(tmp_path):
    path = _yaml(tmp_path, "preset: tiny-cpu\nlearning_rate: 1e-5\nmax_steps: 7\n")
    values = merge(path, parse_flags(["--max_steps", "3", "--seed=5"]))
    assert values["learning_rate"] == 1e-5 and isinstance(values["learning_rate"], float)  # file beats preset
    assert values["max_steps"] == 3 and values["seed"] == 5  # flags beat file
    assert values["num_generations"] == 8  # from the preset
    cfg = build_config({**values, "output_dir": str(tmp_path)})
    assert cfg.max_steps == 3 and cfg.learning_rate == 1e-5 and cfg.adam_beta1 == 0.9  # untouched default


def test_flag_preset_beats_file_preset(tmp_path):
    path = _yaml(tmp_path, "preset: paper\n")
    assert merge(path, parse_flags(["--preset", "tiny-cpu"]))["model_name_or_path"] == "tiny"


def test_strings_become_field_types():
    flags = parse_flags(["--bf16", "false", "--mask_truncated_completions", "--epsilon_high", "none",
                         "--chat_template_kwargs", "{enable_thinking: false}", "--report_to", "none"])
    values = merge(None, flags)
    assert values["bf16"] is False and values["mask_truncated_completions"] is True
    assert values["epsilon_high"] is None and values["chat_template_kwargs"] == {"enable_thinking": False}


@pytest.mark.parametrize("source", ["file", "flag"])
def test_unknown_key_is_named_with_a_suggestion(tmp_path, source):
    if source == "file":
        call = lambda: merge(_yaml(tmp_path, "learning_rat: 1.0\n"), {})  # noqa: E731
    else:
        call = lambda: merge(None, parse_flags(["--learning_rat", "1.0"]))  # noqa: E731
    with pytest.raises(ConfigError, match=r"unknown config key 'learning_rat'.*learning_rate"):
        call()


@pytest.mark.parametrize("flags, named", [
    (["--learning_rate", "fast"], "learning_rate"),
    (["--max_steps", "2.5"], "max_steps"),
    (["--bf16", "maybe"], "bf16"),
    (["--preset", "huge"], "huge"),
])
def test_unparsable_values_are_named(flags, named):
    with pytest.raises(ConfigError, match=named):
        merge(None, parse_flags(flags))


def test_typed_yaml_values_are_checked(tmp_path):
    with pytest.raises(ConfigError, match="max_steps: expected an integer"):
        merge(_yaml(tmp_path, "max_steps: 2.5\n"), {})


def test_bad_files_give_clear_errors(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        merge(str(tmp_path / "missing.yaml"), {})
    with pytest.raises(ConfigError, match="not valid YAML"):
        merge(_yaml(tmp_path, "a: [1,\n"), {})
    with pytest.raises(ConfigError, match="must hold a mapping"):
        merge(_yaml(tmp_path, "- 1\n- 2\n"), {})


def test_stray_positional_argument_is_rejected():
    with pytest.raises(ConfigError, match="unexpected argument 'oops'"):
        parse_flags(["oops"])


@pytest.mark.parametrize("flag, yaml_text, expected", [
    ("none", "report_to: none", []),
    ("all", "report_to: all", "all"),  # transformers expands it to the integrations installed
    ("tensorboard", "report_to: tensorboard", ["tensorboard"]),
    ("tensorboard,codecarbon", "report_to: [tensorboard, codecarbon]", ["tensorboard", "codecarbon"]),
    (None, "report_to: null", []),  # YAML's null: no integration, as "none"
])
def test_report_to_takes_hugging_faces_words_from_flags_and_yaml(tmp_path, flag, yaml_text, expected):
    """`--report_to none` must mean no integration: the generic conversion made it Python None, which transformers
    refuses ("None is not supported")."""
    from transformers.integrations import get_available_reporting_integrations

    expected = get_available_reporting_integrations() if expected == "all" else expected
    sources = [merge(_yaml(tmp_path, yaml_text + "\n"), {})]
    if flag is not None:
        sources.append(merge(None, parse_flags(["--report_to", flag])))
    for values in sources:
        assert build_config({**values, "output_dir": str(tmp_path)}).report_to == expected


def test_model_is_an_alias_of_model_name_or_path_in_flags_and_files(tmp_path):
    assert merge(None, parse_flags(["--model", "some/model"]))["model_name_or_path"] == "some/model"
    assert "model" not in merge(None, parse_flags(["--model", "some/model"]))
    assert merge(_yaml(tmp_path, "model: from/file\n"), {})["model_name_or_path"] == "from/file"
    assert merge(_yaml(tmp_path, "model: from/file\n"), parse_flags(["--model_name_or_path", "flag/wins"]))[
        "model_name_or_path"] == "flag/wins"  # the usual precedence between sources
    assert merge(None, parse_flags(["--model", "same", "--model_name_or_path", "same"]))["model_name_or_path"] == "same"
    with pytest.raises(ConfigError, match=r"both model='a' and model_name_or_path='b'.*give one of them"):
        merge(None, parse_flags(["--model", "a", "--model_name_or_path", "b"]))


def test_conversational_takes_true_false_or_auto(tmp_path):
    for text, value in (("true", True), ("false", False), ("auto", "auto")):
        values = merge(None, parse_flags(["--conversational", text]))
        assert build_config({**values, "output_dir": str(tmp_path)}).conversational == value
    assert build_config({"output_dir": str(tmp_path)}).conversational == "auto"  # the default
    with pytest.raises(ConfigError, match="conversational='maybe'.*true, false or auto"):
        build_config({**merge(None, parse_flags(["--conversational", "maybe"])), "output_dir": str(tmp_path)})
