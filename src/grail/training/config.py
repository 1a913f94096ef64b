"""`GRAILConfig`: TRL's `GRPOConfig` plus the fields grail-rl adds. Each field's help is its only documentation.

Device-dependent defaults are resolved in `__post_init__`, never guessed elsewhere:
  * no CUDA device (or `use_cpu=True`)  → `use_cpu=True`, and `bf16` by the machine (`grail.models.precision`):
    bf16 mixed precision where this CPU's bf16 matmul measures at least 1.5x its fp32 one, fp32 elsewhere and for
    the tiny model (`precision_reason` says which and why); under a DeepSpeed launch on CPU processes, `use_cpu`
    stays False and `ddp_backend` defaults to gloo (`_cpu_engine`);
  * `activation_checkpointing` (transformers 5's name for `gradient_checkpointing`) left unset → on for GPU
    training of real models, off on CPU and for the embedded tiny model (recomputation doubles the step time
    of a model that fits anyway).
An explicit value from the user always wins.
"""

from __future__ import annotations

import functools
import os
import typing
import warnings
from dataclasses import dataclass, field, fields
from typing import Literal

import torch
from trl import GRPOConfig

from grail.methods.spec import SCOPED_OPTIONS, MethodSpec
from grail.methods.table import ResolvedMethod, check_combination, method_spec, own_options, unread_options
from grail.options import trl_matrix
from grail.options.choices import WEIGHTING_FIELDS, WeightingOptions
from grail.options.fields import SFT_MODEL_PREFIX, TINY_MODEL, GRAILFields
from grail.options.sft import parse_sft_model

__all__ = ["GRAILConfig", "RESOLVED_FROM", "field_types", "literal_choices"]


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
                             f"messages); the tiny model is warm-started on the symbolic style only. Give a chat "
                             f"model, e.g. --model_name_or_path smollm2-135m (task_style chains: its `grail sft` "
                             f"warm start), or use task_style symbolic.")
        base = self.model_name_or_path.removeprefix(SFT_MODEL_PREFIX)
        if base != self.model_name_or_path and (self.task_style != "chains" or not base):
            raise ValueError(f"model_name_or_path={self.model_name_or_path!r} is a `grail sft` warm start on the chain "
                             f"task: it needs task_style chains (not {self.task_style!r}) and a model after "
                             f"{SFT_MODEL_PREFIX!r}, e.g. {SFT_MODEL_PREFIX}smollm2-135m.")
        if base != self.model_name_or_path:
            parse_sft_model(base)  # its settings, checked before any work
        self._resolve_method()
        if self.eval_benchmarks:
            from grail.evaluation.benchmarks import parse_benchmark_list
            from grail.evaluation.harness import parse_size

            parse_benchmark_list(self.eval_benchmarks)
            parse_size(self.eval_size)
        on_gpu = torch.cuda.is_available() and not self.use_cpu
        if not on_gpu:
            self._cpu_engine()
            self._cpu_precision()
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

    def _cpu_precision(self) -> None:
        """`bf16` left unset on CPU: chosen by the machine (`grail.models.precision.choose_cpu_precision`); set to
        true where bf16 is not faster: kept, with a warning naming the measured slowdown. `precision_reason` (not a
        field) is the sentence `grail train` prints."""
        from grail.models import precision

        if self.bf16 is None:
            choice = precision.choose_cpu_precision(self.model_name_or_path, self.cache_dir)
            self.bf16 = choice.bf16
            self.__dict__["precision_reason"] = choice.reason
            return
        self.__dict__["precision_reason"] = f"{'bf16 mixed precision' if self.bf16 else 'fp32'}: bf16={self.bf16} given"
        if self.bf16:
            slower = precision.forced_bf16_warning(self.model_name_or_path, self.cache_dir)
            if slower:
                warnings.warn(f"grail: {slower}", stacklevel=3)

    def _resolve_method(self) -> None:
        """The one place a config meets the method table: `token_weighting` is looked up once; the config values it
        comes with (`MethodSpec.config`, read by TRL or the trainer) are set where the field is at its default (an
        explicit other value stays, and the method's check judges it); its own options are parsed and the
        `WeightingOptions` built and checked once; an option field it does not read is refused. The result is one
        frozen `ResolvedMethod` (`resolved`); nothing downstream looks the method up or re-parses its options, and the
        weighting fields are not written back: they keep what the user gave (None for OAR's variant values), and
        `to_dict` (resolved_config.json) records what ran."""
        spec = method_spec(self.token_weighting)
        defaults = {f.name: f.default for f in fields(GRAILConfig)}
        for name, value in {**spec.config, **({"weights_from": "rollout_policy"} if spec.groups else {})}.items():
            if getattr(self, name) == defaults.get(name):
                setattr(self, name, value)
        options = WeightingOptions(**{name: getattr(self, name) for name in WEIGHTING_FIELDS},
                                   temperature=self.temperature, method_options=own_options(spec, self.method_options))
        if spec.groups and self.weights_from != "rollout_policy":
            raise ValueError(f"token_weighting={spec.name!r} reads every rollout of a group, which only the rollout "
                             f"batch holds; set weights_from='rollout_policy' (or leave it unset).")
        problem = unread_options(spec, {name: getattr(self, name) for name in SCOPED_OPTIONS},
                                 {name: defaults[name] for name in SCOPED_OPTIONS})
        if problem:
            raise ValueError(problem)
        problem = trl_matrix.refusal({"loss_type": self.loss_type,
                                      "importance_sampling_level": self.importance_sampling_level}, spec.name)
        if problem:
            raise ValueError(f"{problem}.")
        check_combination(spec, options, self)
        self._resolved = ResolvedMethod(spec, options)

    @property
    def resolved(self) -> ResolvedMethod:
        """The method and its options, resolved once when the config was built. After unpickling (TRL saves the
        config with every checkpoint without the spec, whose functions need not pickle) the spec is looked up by
        name again; the options travel with the config."""
        resolved = self.__dict__.get("_resolved")
        if resolved is None:
            if "_options" not in self.__dict__:
                raise RuntimeError("GRAILConfig: the token-weighting options were not resolved (a config built "
                                   "without __post_init__); build it with GRAILConfig(...).")
            resolved = self.__dict__["_resolved"] = ResolvedMethod(method_spec(self.token_weighting),
                                                                   self.__dict__["_options"])
        return resolved

    @property
    def method(self) -> MethodSpec:
        """The `token_weighting` method's table entry (`resolved.spec`)."""
        return self.resolved.spec

    def weighting_options(self) -> WeightingOptions:
        """The token-weighting options as they run (`resolved.options`)."""
        return self.resolved.options

    def __setattr__(self, name, value):
        """A field the resolved options were built from cannot change afterwards: they would no longer say what
        runs."""
        if name in RESOLVED_FROM and self.__dict__.keys() & {"_resolved", "_options"}:
            raise AttributeError(f"GRAILConfig.{name}={value!r}: the token-weighting options were resolved when the "
                                 f"config was built, so a change now would not run; build a new config with the value "
                                 f"(GRAILConfig(..., {name}={value!r}), or grail.training.overrides.build_config).")
        super().__setattr__(name, value)

    def to_dict(self) -> dict:
        """TRL's `to_dict`, with the values that run where a field stands for a default: the weighting fields the
        method reads (OAR's variant values where left None, the method's own options with their defaults) and the
        task fields whose default is the style's own (resolved_config.json records this)."""
        if not self.__dict__.keys() & {"_resolved", "_options"}:  # TRL's own __post_init__, before the resolution
            return super().to_dict()
        spec, options = self.resolved
        read = {*spec.reads, "method_options"} & {f.name for f in fields(options)}
        return {**super().to_dict(), **self.resolved_task_fields(),
                **{name: getattr(options, name) for name in sorted(read)}}

    def __getstate__(self) -> dict:
        """Pickled without the method's spec (see `resolved`)."""
        state = dict(self.__dict__)
        resolved = state.pop("_resolved", None)
        if resolved is not None:
            state["_options"] = resolved.options
        return state

    def _check_choices(self) -> None:
        """Each `Literal` field's value is one of its choices (the weighting fields' are checked where the options are
        built, `WeightingOptions`)."""
        for f in fields(GRAILConfig):
            choices = () if f.name in WEIGHTING_FIELDS else literal_choices(f.name)
            if choices and getattr(self, f.name) not in choices:
                raise ValueError(f"{f.name}={getattr(self, f.name)!r} is not a valid choice; "
                                 f"set {f.name} to one of {', '.join(map(repr, choices))}.")

    def _check_positive(self, *names: str) -> None:
        for name in names:  # None: a task_* field left to its style's default
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r} must be >= 1.")


# the fields the resolved method is built from (`GRAILConfig._resolve_method`)
RESOLVED_FROM = frozenset((*WEIGHTING_FIELDS, "method_options", "temperature", "weights_from", "saliency_path"))


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
