"""The method table: every `token_weighting` choice, its `MethodSpec`, and how a method joins it.

`METHODS` maps a name to its entry. It starts with the built-in methods (`grail.methods.builtin`), then the
entry points of the `grail.methods` group (docs/guides/plugins.md): grail-rl's own methods from the literature
(`grail.methods.literature`) are registered that way, as any other package's are. A script adds one with
`register_method(spec)`. Every list of methods in the code, the help and the tests is read from here: a method
added here is accepted by `grail train/compare/explain/demo`, the functional API (`weights_for`), the diagnostics
and the saliency AUROC.

Rows whose weights cannot change the loss are not probed: a row with A_i = 0 has Â = 0 whatever its weights, and
(GRAIL, controls) a row outside `rollout_symmetry` or without a box gets uniform weights anyway.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import NamedTuple

import torch

from grail.methods import core
from grail.methods.builtin import BUILTIN, OAR_P_FLOOR, oar_p_floor, scored_tokens, uniform_pipeline, zscore_tokens
from grail.methods.spans import AnswerSpans
from grail.methods.spec import SCOPED_OPTIONS, MethodOption, MethodSpec, ProbeBatch, TokenWeights
from grail.options.choices import WeightingOptions

__all__ = ["ENTRY_POINT_GROUP", "FIX_UNREAD", "METHODS", "OAR_P_FLOOR", "MethodOption", "MethodSpec", "ProbeBatch",
           "ResolvedMethod", "TokenWeights", "check_combination", "checked", "describe", "method_names",
           "method_option", "method_spec", "oar_p_floor", "options_for", "own_options", "parse_methods", "probed_rows",
           "read_by_any", "refuse_unread", "register_method", "scored_tokens", "scoped_values", "unread_options",
           "unregister_method", "zscore_tokens"]

ENTRY_POINT_GROUP = "grail.methods"  # a package's `[project.entry-points."grail.methods"]`: name = "module:SPEC"
BUILTIN_SOURCE = "built-in"


def _config_fields() -> frozenset[str]:
    """Every config field name (grail-rl's and TRL's): a method option must not shadow one."""
    from dataclasses import fields

    from grail.options.fields import GRAILFields
    from grail.options.trl_fields import TRL_CONFIG_FIELDS

    return frozenset({f.name for f in fields(GRAILFields)} | set(WeightingOptions.__dataclass_fields__)
                     | TRL_CONFIG_FIELDS)


class _Table(Mapping):
    """name → MethodSpec. The entry points are loaded on first use, so that importing grail stays cheap and a
    plug-in may import grail itself."""

    def __init__(self):
        self._specs: dict[str, MethodSpec] = {spec.name: spec for spec in BUILTIN}
        self.source: dict[str, str] = {spec.name: BUILTIN_SOURCE for spec in BUILTIN}  # name → where it came from
        self._loaded = False
        self.failed: dict[str, str] = {}  # entry point → why it did not load

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        from importlib.metadata import entry_points

        for point in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda p: p.name):
            where = f"entry point {point.name} = {point.value!r}" + (f" of {point.dist.name}" if point.dist else "")
            try:
                spec = point.load()
                spec = spec() if callable(spec) and not isinstance(spec, MethodSpec) else spec
                if not isinstance(spec, MethodSpec):
                    raise TypeError(f"it gives a {type(spec).__name__}, not a grail MethodSpec")
                if spec.name != point.name:
                    raise ValueError(f"its spec is named {spec.name!r}, not {point.name!r}")
                if self._specs.get(spec.name) is not spec:
                    _add(self._specs, spec, replace=False)
                self.source[spec.name] = point.dist.name if point.dist else f"entry point {point.value}"
            except Exception as err:  # a broken plug-in must not stop grail; its method is reported as missing
                self.failed[point.name] = f"{where}: {type(err).__name__}: {err}"
                warnings.warn(f"grail: the method plug-in {where} did not load ({err}); its method is unavailable.",
                              stacklevel=2)

    def __getitem__(self, name: str) -> MethodSpec:
        self._load()
        return self._specs[name]

    def __iter__(self) -> Iterator[str]:
        self._load()
        return iter(list(self._specs))

    def __len__(self) -> int:
        self._load()
        return len(self._specs)


METHODS = _Table()


def _add(specs: dict[str, MethodSpec], spec: MethodSpec, replace: bool) -> None:
    """Registration's checks (each refusal names the fix), then `spec` joins `specs`."""
    if not isinstance(spec, MethodSpec):
        raise TypeError(f"register_method: expected a grail MethodSpec, got {type(spec).__name__}.")
    if spec.name in specs and not replace:
        raise ValueError(f"register_method: a method named {spec.name!r} is already registered; choose another name "
                         f"(or pass replace=True to replace it on purpose).")
    if spec.rows == "none" and spec.pipeline is not uniform_pipeline:
        raise ValueError(f"register_method: {spec.name} has rows='none', so no row is ever selected: its pipeline "
                         f"would see rows_B all False on every batch and the method would train as GRPO. Give it a "
                         f"probe (calls_model=False when the signal needs no model call) and rows='advantaged'.")
    taken = {o.name: name for name, other in specs.items() if name != spec.name for o in other.options}
    reserved = _config_fields()
    for option in spec.options:
        if option.name in reserved:
            raise ValueError(f"register_method: option {option.name!r} of {spec.name} is the name of a config field "
                             f"(grail-rl's or TRL's), which it would shadow; rename it.")
        if option.name in taken:
            raise ValueError(f"register_method: option {option.name!r} of {spec.name} is already an option of "
                             f"{taken[option.name]}.")
    specs[spec.name] = spec


def register_method(spec: MethodSpec, *, replace: bool = False) -> MethodSpec:
    """Add `spec` to the table (returns it, so it can decorate a module-level assignment). ValueError when the name
    is taken (unless `replace`) or an option collides with another method's or a `WeightingOptions` field."""
    METHODS._load()
    _add(METHODS._specs, spec, replace)
    METHODS.source[spec.name] = "register_method"
    return spec


def unregister_method(name: str) -> None:
    """Remove a method added by `register_method` (tests; the built-ins stay)."""
    if name in {spec.name for spec in BUILTIN}:
        raise ValueError(f"unregister_method: {name!r} is a built-in method.")
    METHODS._load()
    METHODS._specs.pop(name, None)
    METHODS.source.pop(name, None)


def method_spec(name: str) -> MethodSpec:
    """The entry of `token_weighting=name`; the error lists the names (and plug-ins that failed to load)."""
    try:
        return METHODS[name]
    except KeyError:
        why = f" The plug-in {METHODS.failed[name]}." if name in METHODS.failed else ""
        raise ValueError(f"token_weighting={name!r} is not a method; choose one of {', '.join(METHODS)} (`grail "
                         f"methods` lists them; a plug-in's method appears once its package is installed).{why}"
                         ) from None


def method_names(*, probed: bool = False, auroc: bool = False) -> tuple[str, ...]:
    """The registered names, in table order; `probed`: only methods with a per-token signal; `auroc`: only those
    the saliency AUROC scores by default (`MethodSpec.auroc`)."""
    return tuple(name for name, spec in METHODS.items()
                 if (not probed or spec.probe is not None) and (not auroc or (spec.probe is not None and spec.auroc)))


def method_option(name: str) -> tuple[MethodSpec, MethodOption] | None:
    """The method that declares option `name`, and the option; None if no method does."""
    for spec in METHODS.values():
        for option in spec.options:
            if option.name == name:
                return spec, option
    return None


def parse_methods(text: str | None, example: str = "none,grail") -> tuple[str, ...]:
    """`grail,oar_g` → ("grail", "oar_g"): a `--method` list (`grail demo`, `grail explain`); each name must be in
    the table, none twice. `example` is the fix the error message shows."""
    methods = tuple(m.strip() for m in (text or "").split(",") if m.strip())
    bad = [m for m in methods if m not in METHODS]
    if bad or not methods:
        raise ValueError(f"--method {text!r}: {'unknown method ' + ', '.join(bad) if bad else 'no method'}; give "
                         f"one or more of {', '.join(METHODS)}, comma-separated (e.g. --method {example}).")
    if len(set(methods)) != len(methods):
        raise ValueError(f"--method {text!r} names a method twice.")
    return methods


def own_options(spec: MethodSpec, given) -> dict:
    """`spec.resolve_options(given)` (each of its own options parsed, defaults for the rest), with an error that names
    the method an option belongs to when it is another method's."""
    try:
        return spec.resolve_options(given)
    except ValueError as err:
        owners = {name: found[0].name for name in (given or {})
                  if name not in {o.name for o in spec.options} and (found := method_option(name)) is not None}
        if owners:
            name, owner = next(iter(owners.items()))
            raise ValueError(f"{name} is an option of token_weighting={owner!r}; token_weighting={spec.name!r} does "
                             f"not read it, so it would do nothing. Remove it, or set token_weighting={owner}."
                             ) from None
        raise err


class ResolvedMethod(NamedTuple):
    """A method as it runs: its table entry and its options, resolved (its own options parsed, OAR's variant values
    filled in) and checked. Built once per configuration (`checked`, `GRAILConfig`) and passed along."""

    spec: MethodSpec
    options: WeightingOptions


def check_combination(spec: MethodSpec, options: WeightingOptions, config=None) -> None:
    """ValueError when the method's `check` refuses the combination of `options` (and the run's `config`)."""
    problem = spec.check(options, config) if spec.check is not None else None
    if options.permute_weights and (spec.permutes or spec.probe is None):
        problem = (f"permute_weights=true, token_weighting={spec.name!r}: "
                   + ("its weights are already permuted; use permute_weights=false" if spec.permutes else
                      "it gives every token w = 1, so permuting its weights does nothing; use permute_weights=false"))
    if problem:
        raise ValueError(f"{problem}.")


def checked(options: WeightingOptions, config=None, spec: MethodSpec | None = None) -> ResolvedMethod:
    """The method of `options` and the options with its own options resolved; ValueError when the method is unknown,
    an option of its own is bad or belongs to another method, or its `check` refuses the combination (`config`: the
    run's GRAILConfig, if any; `spec`: the method's entry when the caller has looked it up)."""
    spec = method_spec(options.token_weighting) if spec is None else spec
    options = replace(options, method_options=own_options(spec, options.method_options))
    check_combination(spec, options, config)
    return ResolvedMethod(spec, options)


def unread_options(spec: MethodSpec, values: Mapping, defaults: Mapping) -> str | None:
    """Why a config that sets an option field `spec` does not read (`MethodSpec.reads`) is refused, naming the methods
    that read it and the fix; None when every field in `values` (`SCOPED_OPTIONS` names) that differs from `defaults`
    is one it reads. (Multi-arm commands drop such values per arm instead: `scoped_values`.)"""
    unread = [name for name, value in values.items()
              if name in SCOPED_OPTIONS and name not in spec.reads and value != defaults.get(name)]
    if not unread:
        return None
    name = unread[0]
    readers = [other.name for other in METHODS.values() if name in other.reads]
    return (f"{name}={values[name]!r} is an option of {', '.join(readers) or 'no method'}; token_weighting="
            f"{spec.name!r} does not read it, so it would do nothing. Remove it"
            + (f", or set token_weighting to {' or '.join(readers)}." if readers else "."))


def scoped_values(values: Mapping, spec: MethodSpec) -> dict:
    """`values` (config keys) without the option fields and method options that `spec` does not read: what a
    multi-arm command (`grail compare`, `grail demo`) hands each arm of a shared configuration."""
    own = {o.name for o in spec.options}
    return {key: value for key, value in values.items()
            if not (key in SCOPED_OPTIONS and key not in spec.reads)
            and not (key not in own and method_option(key) is not None)}


def read_by_any(key: str, specs) -> bool:
    """Whether any of `specs` reads config key `key` (every key that is not an option field or method option)."""
    if key in SCOPED_OPTIONS:
        return any(key in spec.reads for spec in specs)
    if method_option(key) is not None:
        return any(key in {o.name for o in spec.options} for spec in specs)
    return True


FIX_UNREAD = "add a method that reads it to --method (`grail methods` lists each method's options)"


def refuse_unread(values, specs, whose: str, fix: str = FIX_UNREAD) -> None:
    """ValueError naming the first key of `values` that none of `specs` reads (it would do nothing): "--KEY is read by
    none of <whose>; remove it, or <fix>" (`fix` may name the key as {key})."""
    unread = [key for key in values if not read_by_any(key, specs)]
    if unread:
        raise ValueError(f"--{unread[0]} is read by none of {whose}; remove it, or {fix.format(key=unread[0])}.")


def options_for(spec: MethodSpec, options: WeightingOptions) -> WeightingOptions:
    """`options` for running `spec`: token_weighting set to it, its own options resolved (the ones `options`
    carries when they are this method's, else its defaults)."""
    own = options.method_options if options.token_weighting == spec.name else None
    return replace(options, token_weighting=spec.name, method_options=spec.resolve_options(own))


def describe(names: tuple[str, ...] | None = None) -> str:
    """The methods (all, or `names`) as text: name, what it computes, cost, its own options, reference (`grail
    methods`, the epilog of `grail train --help`)."""
    lines = []
    for name in names or tuple(METHODS):
        spec = method_spec(name)
        lines.append(f"  {name}: {spec.title}")
        lines.append(f"      cost: {spec.cost or 'not stated'}" + (f"; {spec.reference}" if spec.reference else ""))
        if spec.fuse:
            lines.append(f"      fuses with TRL's forward (its {spec.fuse}; saliency_path)")
        if spec.probe is not None and not spec.calls_model:
            lines.append("      no model call (calls_model=False)")
        for option in spec.options:
            lines.append(f"      --{option.name} (default {option.default!r}): {option.help}")
        if spec.config:
            lines.append("      sets " + ", ".join(f"{k}={v!r}" for k, v in spec.config.items()))
    failed = [f"  (not loaded: {why})" for why in METHODS.failed.values()]
    return "\n".join(lines + failed)


def probed_rows(spec: MethodSpec, adv_B: torch.Tensor, spans: AnswerSpans, mask_BT: torch.Tensor,
                options: WeightingOptions) -> torch.Tensor:
    """(B,) bool: rows whose weights can change the loss under `spec`, the only rows its probe needs."""
    rows_B = (adv_B != 0) & mask_BT.any(1)
    if spec.rows == "saliency":
        return rows_B & core.reweighted_rows(adv_B, options.rollout_symmetry) & spans.has_box_B
    if spec.rows == "bilevel":
        rows_B = rows_B & scored_tokens(spans, mask_BT, options).any(1)
        return rows_B & spans.has_box_B if options.oar_distribution == "answer_mean" else rows_B
    if spec.rows == "advantaged":
        return rows_B
    return torch.zeros_like(rows_B)
