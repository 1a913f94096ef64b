"""`GRAILConfig`: TRL's `GRPOConfig` plus the fields grail-rl adds. Each field's help is its only documentation.

Device-dependent defaults are resolved in `__post_init__`, never guessed elsewhere:
  * no CUDA device (or `use_cpu=True`)  → `use_cpu=True`, `bf16=False` (bf16 is ~1.7x slower on CPU); under a
    DeepSpeed launch on CPU processes, `use_cpu` stays False and `ddp_backend` defaults to gloo (`_cpu_engine`);
  * `activation_checkpointing` (transformers 5's name for `gradient_checkpointing`) left unset → on for GPU
    training of real models, off on CPU and for the embedded tiny model (recomputation doubles the step time
    of a model that fits anyway).
An explicit value from the user always wins.
"""

from __future__ import annotations

import functools
import os
import typing
from dataclasses import dataclass, field, fields
from typing import Literal

import torch
from trl import GRPOConfig

from grail.methods.spec import SCOPED_OPTIONS, MethodSpec
from grail.methods.table import check_combination, method_spec, own_options, unread_options
from grail.options.choices import OAR_VARIANT_DEFAULTS, WeightingOptions
from grail.options.fields import TINY_MODEL, GRAILFields

__all__ = ["GRAILConfig", "field_types", "literal_choices"]


@dataclass
class GRAILConfig(GRPOConfig, GRAILFields):
    """TRL's `GRPOConfig` with grail-rl's fields (`grail.options.fields.GRAILFields`, where each is documented)."""

    # ---- TRL fields whose default grail resolves per device -------------------------------------------
    gradient_checkpointing: bool | None = field(
        default=None,
        metadata={"help": "Deprecated alias of activation_checkpointing (transformers 5). When neither is set, "
                  "grail turns activation checkpointing on for GPU training of real models and off on CPU and "
                  "for the tiny model (there it only doubles the step time)."},
    )

    def __post_init__(self):
        self._check_choices()
        if self.conversational not in (True, False, "auto"):
            raise ValueError(f"conversational={self.conversational!r}: set it to true, false or auto (the chat "
                             f"template iff the tokenizer has one).")
        self._check_positive("eval_samples", "task_num_train", "task_num_heldout", "warmstart_steps",
                             "tiny_hidden_size", "tiny_num_layers")
        if not self.warmstart_lr > 0:
            raise ValueError(f"warmstart_lr={self.warmstart_lr} must be > 0; try 3e-3.")
        self.synthetic_set()  # validates the task_* fields
        if self.task_style != "symbolic" and self.model_name_or_path == TINY_MODEL:
            raise ValueError(f"task_style={self.task_style!r} is for pretrained chat models (its prompts are chat "
                             f"messages with worked examples); the tiny model is warm-started on the symbolic style "
                             f"only. Give a chat model, e.g. --model_name_or_path smollm2-135m, or use task_style "
                             f"symbolic.")
        self._resolve_method()
        if self.eval_benchmarks:
            from grail.evaluation.benchmarks import parse_benchmark_list
            from grail.evaluation.harness import parse_size

            parse_benchmark_list(self.eval_benchmarks)
            parse_size(self.eval_size)
        on_gpu = torch.cuda.is_available() and not self.use_cpu
        if not on_gpu:
            self._cpu_engine()
            if self.bf16 is None:
                self.bf16 = False
        if self.gradient_checkpointing is None and self.activation_checkpointing is None:
            self.activation_checkpointing = on_gpu and self.model_name_or_path != TINY_MODEL
        super().__post_init__()

    def _cpu_engine(self) -> None:
        """CPU processes: `use_cpu=True`, except under a DeepSpeed launch (`accelerate launch` with a DeepSpeed config
        sets ACCELERATE_USE_DEEPSPEED=true). accelerate 1.15 takes DeepSpeed only when not told `cpu=True`
        (accelerate/state.py, `AcceleratorState.__init__`: `elif ... ACCELERATE_USE_DEEPSPEED ... and not cpu`); and
        without a backend named it initialises DeepSpeed's process group but counts one process
        (`PartialState.__init__`: `if self.backend is None: self.num_processes = 1`), so every process would think
        itself alone. There `ddp_backend` defaults to gloo, which DeepSpeed's CPU accelerator runs on."""
        if os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() in ("true", "1") and not self.use_cpu:
            if self.ddp_backend is None:
                self.ddp_backend = "gloo"
            return
        self.use_cpu = True

    def _resolve_method(self) -> None:
        """The one place a config meets the method table: `token_weighting` is looked up once, the config values
        it comes with (`MethodSpec.config`) are set where the field is at its default (an explicit other value stays,
        and the method's check judges it), an option field it does not read is refused, its own options are parsed
        once, and the `WeightingOptions` are built once. The trainer takes the spec and the options from here
        (`method`, `weighting_options`); nothing downstream looks the method up or re-parses its options."""
        spec = method_spec(self.token_weighting)
        defaults = {f.name: f.default for f in fields(GRAILConfig)}
        for name, value in {**spec.config, **({"weights_from": "rollout_policy"} if spec.groups else {})}.items():
            if getattr(self, name) == defaults.get(name):
                setattr(self, name, value)
        if spec.groups and self.weights_from != "rollout_policy":
            raise ValueError(f"token_weighting={spec.name!r} reads every rollout of a group, which only the rollout "
                             f"batch holds; set weights_from='rollout_policy' (or leave it unset).")
        problem = unread_options(spec, {name: getattr(self, name) for name in SCOPED_OPTIONS},
                                 {name: defaults[name] for name in SCOPED_OPTIONS})
        if problem:
            raise ValueError(problem)
        self.method_options = own_options(spec, self.method_options)  # the method's own options, parsed here only
        options = WeightingOptions.from_config(self)  # built here only
        check_combination(spec, options, self)
        for name in OAR_VARIANT_DEFAULTS[self.oar_variant]:  # None → the variant's value, recorded in the run dir
            if name in spec.reads:
                setattr(self, name, getattr(options, name))
        self._method, self._weighting = spec, options

    @property
    def method(self) -> MethodSpec:
        """The `token_weighting` method's table entry, looked up once when the config was built."""
        spec = self.__dict__.get("_method")
        if spec is None or spec.name != self.token_weighting:  # unpickled (the spec is not pickled), or changed
            self._fresh()
            spec = self.__dict__["_method"] = method_spec(self.token_weighting)
        return spec

    def weighting_options(self) -> WeightingOptions:
        """The token-weighting options, built once when the config was built (its own options resolved)."""
        self._fresh()
        return self._weighting

    def _fresh(self) -> None:
        """A weighting field changed after the config was built: the options built then would be stale."""
        options = self.__dict__.get("_weighting")
        if options is None:
            raise RuntimeError("GRAILConfig: the token-weighting options were not resolved (a config built without "
                               "__post_init__); build it with GRAILConfig(...).")
        changed = [name for name in WeightingOptions.__dataclass_fields__
                   if getattr(options, name) != getattr(self, name) and getattr(self, name) is not None]
        if changed:
            raise ValueError(f"GRAILConfig.{changed[0]} was changed after the config was built "
                             f"({getattr(self, changed[0])!r}; the config resolved {getattr(options, changed[0])!r}); "
                             f"build a new config instead, e.g. dataclasses.replace(cfg, {changed[0]}=...).")

    def __getstate__(self) -> dict:
        """Pickled (TRL saves the config with every checkpoint) without the method's spec, whose functions need not
        pickle (a plug-in registered from a script); `method` looks it up again after unpickling."""
        state = dict(self.__dict__)
        state.pop("_method", None)
        return state

    def _check_choices(self) -> None:
        for f in fields(GRAILConfig):
            choices = literal_choices(f.name)
            if choices and getattr(self, f.name) not in choices:
                raise ValueError(f"{f.name}={getattr(self, f.name)!r} is not a valid choice; "
                                 f"set {f.name} to one of {', '.join(map(repr, choices))}.")

    def _check_positive(self, *names: str) -> None:
        for name in names:
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r} must be >= 1.")


@functools.cache
def field_types() -> dict[str, object]:
    """Resolved type annotation of every GRAILConfig field (TRL's and ours)."""
    return typing.get_type_hints(GRAILConfig)


def literal_choices(name: str) -> tuple:
    """The allowed values of a `Literal` field, None included for an optional one (empty for other fields)."""
    hint = field_types().get(name)
    args = typing.get_args(hint)
    if typing.get_origin(hint) is not Literal and type(None) in args:  # `Literal[...] | None`
        literals = [a for a in args if typing.get_origin(a) is Literal]
        return (*typing.get_args(literals[0]), None) if len(literals) == 1 else ()
    return args if typing.get_origin(hint) is Literal else ()
