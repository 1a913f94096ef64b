"""Config values from presets, YAML files and `--field value` flags, merged and typed.

Precedence: GRAILConfig defaults < preset < YAML file < flags. Every key must be a GRAILConfig field (or
`preset`, or `model`, the alias of `model_name_or_path` that `grail eval` and `grail explain` use); an unknown key
is an error naming it and the closest field names. Strings are converted to the field's annotated type (so
`--learning_rate 1e-6` and `learning_rate: 1e-6` in YAML, which PyYAML reads as a string, both become floats).
`report_to` keeps Hugging Face's words: "none", "all", an integration, or several (a comma list or a YAML list).
A registered method's own option (`grail methods`) is a key too: `--ktae_top 0.5` is folded into `method_options`, and
parsed (once) when the config is built, which also refuses an option field the chosen method does not read.
"""

from __future__ import annotations

import difflib
import types
import typing
from pathlib import Path

import yaml

from grail.methods.table import method_option
from grail.options.presets import preset
from grail.training.config import GRAILConfig, field_types

__all__ = ["build_config", "coerce", "ConfigError", "fold_method_options", "load_yaml", "merge", "parse_flags",
           "PRESET_KEY"]

PRESET_KEY = "preset"
ALIASES = {"model": "model_name_or_path"}  # alias → field, one name for the model in every command
_TRUE, _FALSE, _NONE = ("true", "yes", "1", "on"), ("false", "no", "0", "off"), ("none", "null", "~")


class ConfigError(ValueError):
    """A configuration problem the user can fix; the message names the key and the fix."""


def _option_names() -> list[str]:
    from grail.methods.table import METHODS

    return [option.name for spec in METHODS.values() for option in spec.options]


def _unknown_key(key: str, source: str) -> ConfigError:
    close = difflib.get_close_matches(key, list(field_types()) + [PRESET_KEY, *ALIASES, *_option_names()], n=3)
    hint = f" Did you mean {', '.join(close)}?" if close else " See `grail train --help` for the fields."
    return ConfigError(f"unknown config key {key!r} ({source}).{hint}")


def _from_string(hint, text: str):
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if type(None) in args and text.strip().lower() in _NONE:
            return None
        errors = []
        for arg in sorted((a for a in args if a is not type(None)), key=lambda a: a is str):
            try:
                return _from_string(arg, text)
            except (ValueError, TypeError) as err:
                errors.append(str(err))
        raise ValueError("; ".join(errors))
    if hint is bool:
        low = text.strip().lower()
        if low in _TRUE or low in _FALSE:
            return low in _TRUE
        raise ValueError(f"expected true or false, got {text!r}")
    if hint is int:
        return int(text)
    if hint is float:
        return float(text)
    if hint is dict or origin is dict:
        value = yaml.safe_load(text)
        if not isinstance(value, dict):
            raise ValueError(f"expected a mapping such as '{{key: value}}', got {text!r}")
        return value
    if hint is list or origin is list:
        value = yaml.safe_load(text)
        return value if isinstance(value, list) else [v.strip() for v in text.split(",")]
    return text  # str, Literal and enum-or-str fields: validated by GRAILConfig.__post_init__


def _report_to(value):
    """TrainingArguments.report_to as Hugging Face spells it: "none" (no integration), "all", a name, or a list of
    names. Not the generic conversion, which reads the word none as Python None (transformers rejects None)."""
    if value is None:  # YAML `report_to: null`
        return "none"
    if isinstance(value, str):
        if value.strip().startswith("["):
            value = yaml.safe_load(value)
        else:
            names = [v.strip() for v in value.split(",") if v.strip()]
            return names[0] if len(names) == 1 else names or "none"
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"expected none, all, an integration name or a list of them, got {value!r}")
    return value


_CONVERTERS = {"report_to": _report_to}  # fields whose values the generic, type-driven conversion would misread


def coerce(key: str, value, source: str):
    """`value` converted to the type of field `key`; ConfigError naming key, value and source if impossible."""
    hints = field_types()
    if key not in hints:
        if method_option(key) is None:
            raise _unknown_key(key, source)
        return value  # a method's own option: parsed once, by the config (`MethodSpec.resolve_options`)
    if key in _CONVERTERS:
        try:
            return _CONVERTERS[key](value)
        except ValueError as err:
            raise ConfigError(f"{key}: cannot use {value!r} ({source}): {err}.") from err
    if not isinstance(value, str):
        hint = hints[key]
        if hint is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise ConfigError(f"{key}: expected an integer, got {value!r} ({source}).")
        if hint is float and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise ConfigError(f"{key}: expected a number, got {value!r} ({source}).")
        return value
    try:
        return _from_string(hints[key], value)
    except (ValueError, TypeError) as err:
        raise ConfigError(f"{key}: cannot use {value!r} ({source}): {err}.") from err


def parse_flags(tokens: list[str]) -> dict[str, str]:
    """`--key value`, `--key=value`, and a bare `--key` (= true) into a {key: raw string} dict."""
    flags, i = {}, 0
    while i < len(tokens):
        token = tokens[i]
        if not token.startswith("--") or len(token) == 2:
            raise ConfigError(f"unexpected argument {token!r}; flags look like --field value.")
        key, eq, value = token[2:].partition("=")
        key = key.replace("-", "_")
        if not eq:
            has_value = i + 1 < len(tokens) and not tokens[i + 1].startswith("--")
            value = tokens[i + 1] if has_value else "true"
            i += has_value
        flags[key] = value
        i += 1
    return flags


def load_yaml(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} not found; pass an existing YAML file to --config.")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {err}") from err
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping of field: value, "
                          f"not a {type(data).__name__}.")
    return data


def merge(file_path: str | None, flags: dict[str, str], base: dict | None = None) -> dict:
    """Typed values: `base` < preset < file < flags. A `preset` named in flags beats one named in the file."""
    file_values = load_yaml(file_path) if file_path else {}
    flags = dict(flags)
    preset_name = flags.pop(PRESET_KEY, None) or file_values.pop(PRESET_KEY, None)
    file_values.pop(PRESET_KEY, None)
    layers = [(base or {}, "built-in default")]
    if preset_name:
        try:
            layers.append((preset(str(preset_name)), f"preset {preset_name}"))
        except ValueError as err:
            raise ConfigError(str(err)) from err
    layers += [(file_values, f"config file {file_path}"), (flags, "command line")]
    merged: dict = {}
    for values, source in layers:
        for key, value in _without_aliases(values, source).items():
            merged[key] = coerce(key, value, source)
    return merged


def _without_aliases(values: dict, source: str) -> dict:
    """`values` with each alias (ALIASES: `model`) renamed to its field; ConfigError when both are given and differ."""
    values = dict(values)
    for alias, name in ALIASES.items():
        if alias not in values:
            continue
        value = values.pop(alias)
        if name in values and values[name] != value:
            raise ConfigError(f"both {alias}={value!r} and {name}={values[name]!r} are given ({source}); {alias} is "
                              f"another name for {name}: give one of them.")
        values[name] = value
    return values


def fold_method_options(values: dict) -> dict:
    """`values` with each key that is not a config field moved into `method_options`: the method options given as
    keys of their own (`ktae_top`; `merge` let only those through). The config checks them against its method."""
    hints = field_types()
    own = {k: v for k, v in values.items() if k not in hints}
    if not own:
        return values
    given = dict(values.get("method_options") or {})
    clash = sorted(k for k in own if k in given and given[k] != own[k])
    if clash:
        raise ConfigError(f"{clash[0]} is given both as its own key and inside method_options, with different values; "
                          f"give it once.")
    return {**{k: v for k, v in values.items() if k not in own}, "method_options": {**given, **own}}


def build_config(values: dict) -> GRAILConfig:
    """GRAILConfig(**values), with validation errors re-raised as ConfigError; method options given as keys of
    their own are folded into `method_options` first."""
    try:
        return GRAILConfig(**fold_method_options(values))
    except (ValueError, TypeError) as err:
        raise ConfigError(f"invalid configuration: {err}") from err
