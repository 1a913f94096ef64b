"""What a token-weighting method is: `MethodSpec` (one entry of the method table), its declared options
(`MethodOption`), the rows a probe sees (`ProbeBatch`) and the weights it yields (`TokenWeights`).

A method is a probe (a model call, or none, that gives a per-token signal on the rows whose weights can change the
loss) and a pipeline (pure tensor code that turns the signal into weights). `grail.methods.table` holds the entries
and `register_method` adds one from outside the package (docs/guides/plugins.md); `grail.methods.weighting` runs
them, and nothing above the table branches on a method's name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal, NamedTuple

import torch

from grail.options.choices import WeightingOptions

__all__ = ["MethodOption", "MethodSpec", "ProbeBatch", "Rows", "TokenWeights"]


@dataclass
class TokenWeights:
    """Weights for one batch and what the diagnostics need to describe them. All (B, T) / (B,) tensors."""

    weights_BT: torch.Tensor  # float32, detached, 0 on padding
    reasoning_BT: torch.Tensor  # bool: real tokens before the answer box (every real token of a row with no box)
    normalised_BT: torch.Tensor  # bool: tokens whose weight came from GRAIL's normalisation (clip fractions)
    has_box_B: torch.Tensor  # bool: the row has a complete box with at least one answer token
    fallback_B: torch.Tensor  # bool: the probe's signal was zero/NaN/inf on the row → uniform weights
    probed_B: torch.Tensor  # bool: rows the probe ran on (weights that can change the loss)
    clip_BT: torch.Tensor  # int8: GRAIL's pre-override clipping, −1 low / +1 high (`core.SaliencyWeights.clip_BT`)
    reweighted_BT: torch.Tensor  # bool: real tokens of the rows GRAIL's normalisation ran on (release clip fractions)
    path: str = "none"  # "fused" (signal from the training forward), "separate", "skipped", "rollout", "none"
    seconds: float = 0.0  # wall time spent computing these weights

    BATCH_PREFIX = "grail_tw_"  # key prefix of the tensors stored in a TRL batch dict (`as_batch_entries`)

    @classmethod
    def tensor_fields(cls) -> list[str]:
        return [f.name for f in fields(cls) if f.name not in ("path", "seconds")]

    def as_batch_entries(self) -> dict[str, torch.Tensor]:
        """The tensors, for storing in a TRL batch dict (split and shuffled with it by row)."""
        return {self.BATCH_PREFIX + name: getattr(self, name) for name in self.tensor_fields()}

    @classmethod
    def in_batch(cls, inputs: dict) -> bool:
        return cls.BATCH_PREFIX + "weights_BT" in inputs

    @classmethod
    def from_batch(cls, inputs: dict, path: str) -> TokenWeights:
        """Rebuild from `as_batch_entries` entries of a batch dict."""
        return cls(**{name: inputs[cls.BATCH_PREFIX + name] for name in cls.tensor_fields()}, path=path)

    @classmethod
    def concat(cls, parts: Sequence[TokenWeights], path: str) -> TokenWeights:
        """Row-wise concatenation of the weights of consecutive chunks of one batch; seconds add up."""
        return cls(**{name: torch.cat([getattr(p, name) for p in parts]) for name in cls.tensor_fields()},
                   path=path, seconds=sum(p.seconds for p in parts))

    @staticmethod
    def finite_signal(signal_BT: torch.Tensor, mask_BT: torch.Tensor, rows_B: torch.Tensor):
        """(signal with 0 off the real tokens, rows whose signal is finite on every real token, fallback rows): a
        probed row with a NaN/inf signal falls back to uniform weights, as the built-in pipelines' rows do."""
        real_BT = mask_BT.bool()
        finite_B = (torch.isfinite(signal_BT) | ~real_BT).all(1)
        clean_BT = torch.where(real_BT & torch.isfinite(signal_BT), signal_BT, torch.zeros_like(signal_BT))
        return clean_BT, rows_B & finite_B, rows_B & ~finite_B

    @classmethod
    def simple(cls, weights_BT: torch.Tensor, spans, rows_B: torch.Tensor,
               fallback_B: torch.Tensor | None = None) -> TokenWeights:
        """Weights with no GRAIL normalisation or clipping to describe (what most pipelines return)."""
        false_BT = torch.zeros(weights_BT.shape, dtype=torch.bool, device=weights_BT.device)
        return cls(weights_BT, spans.reasoning_BT, false_BT, spans.has_box_B,
                   torch.zeros_like(rows_B) if fallback_B is None else fallback_B & rows_B, rows_B,
                   torch.zeros(weights_BT.shape, dtype=torch.int8, device=weights_BT.device), false_BT)


class ProbeBatch(NamedTuple):
    """The probed rows of a batch, in TRL's layout (prompt left-padded, completion the last T columns)."""

    input_ids_BL: torch.Tensor
    attention_mask_BL: torch.Tensor
    answer_BT: torch.Tensor  # bool: the answer tokens the probe explains (`AnswerSpans.probe_span`)
    scored_BT: torch.Tensor  # bool: OAR's scored tokens (`table.scored_tokens`)
    adv_B: torch.Tensor | None = None  # the rows' sequence advantages (methods that read the group's outcomes)
    reasoning_BT: torch.Tensor | None = None  # bool: the rows' reasoning tokens (`AnswerSpans.reasoning_BT`)
    tokenizer: Any = None  # the tokenizer of the ids (methods that read the text, e.g. to find reasoning steps)


Probe = Callable[[torch.nn.Module, ProbeBatch, WeightingOptions, "torch.Generator | None"], torch.Tensor]
# (spec, signal_BT, adv_B, spans, mask_BT, rows_B, options, generator, min_importance) → TokenWeights
ToWeights = Callable[..., TokenWeights]
# Which rows a probe runs on (`table.probed_rows`): none; GRAIL's (A ≠ 0, inside rollout_symmetry, with a box); OAR's
# (A ≠ 0 with a scored token, and a box for the answer_mean distribution); or every row with A ≠ 0.
Rows = Literal["none", "saliency", "bilevel", "advantaged"]
Scalar = bool | int | float | str


@dataclass(frozen=True)
class MethodOption:
    """One option a registered method declares: a config field of its own (`--NAME VALUE` on the command line, a
    key in YAML and in compare arms), validated here and recorded in resolved_config.json under method_options.
    Its name starts with the method's name and an underscore (`ktae_top`), so that options never collide."""

    name: str
    default: Scalar
    help: str
    choices: tuple[Scalar, ...] = ()
    minimum: float | None = None  # inclusive bounds for numbers
    maximum: float | None = None

    def __post_init__(self):
        if not self.name.isidentifier():
            raise ValueError(f"method option {self.name!r}: the name must be a Python identifier.")
        if self.choices and self.default not in self.choices:
            raise ValueError(f"method option {self.name}: default {self.default!r} is not one of {self.choices}.")

    def parse(self, value: Any) -> Scalar:
        """`value` (a command-line string or a YAML value) as this option's type, checked; ValueError names the
        option, the value and what is allowed."""
        kind = type(self.default)
        if isinstance(value, str) and kind is not str:
            text = value.strip().lower()
            if kind is bool:
                if text not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError(f"{self.name}={value!r}: expected true or false")
                value = text in ("true", "1", "yes")
            else:
                try:
                    value = kind(float(text)) if kind is int and float(text).is_integer() else kind(text)
                except ValueError:
                    expected = "an integer" if kind is int else "a number"
                    raise ValueError(f"{self.name}={value!r}: expected {expected}") from None
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if type(value) is not kind:
            raise ValueError(f"{self.name}={value!r}: expected a {kind.__name__}")
        if self.choices and value not in self.choices:
            raise ValueError(f"{self.name}={value!r}: choose one of {', '.join(map(repr, self.choices))}")
        if self.minimum is not None and value < self.minimum:
            raise ValueError(f"{self.name}={value!r}: must be >= {self.minimum}")
        if self.maximum is not None and value > self.maximum:
            raise ValueError(f"{self.name}={value!r}: must be <= {self.maximum}")
        return value


@dataclass(frozen=True)
class MethodSpec:
    """One token-weighting method: see the module docstring; `weighting.token_weights` runs it.

    The documentation fields (`title`, `summary`, `cost`, `reference`, `open_choices`) are the method's docs
    page (docs/methods/table.md is generated from them) and the functional API's docstring."""

    name: str
    label: str  # its name in tables (`grail demo`)
    probe: Probe | None  # (model, rows, options, generator) → (rows, T) signal; None: no probe
    pipeline: ToWeights  # signal → weights (pure tensor code), e.g. `builtin.saliency_pipeline`
    rows: Rows = "advantaged"  # the rows its probe runs on (see `Rows`)
    fuse: Literal["saliency", "entropy"] | None = None  # what the fused path reads from TRL's forward (None: nothing)
    permutes: bool = False  # the weights are randomly permuted over each row's reasoning tokens (the random control)
    groups: bool = False  # reads every rollout of a group: weights at rollout time, on the whole batch at once
    min_importance: Callable[..., float] | None = None  # (model, options) → the signal's rounding floor (OAR-P)
    unshardable: str = ""  # why its probe cannot run on a sharded model (ZeRO-3, FSDP); "" = it can
    options: tuple[MethodOption, ...] = ()  # options of its own (see `MethodOption`)
    check: Callable[[WeightingOptions, Any], str | None] | None = None  # (options, config or None) → error or None
    config: Mapping[str, Scalar] = field(default_factory=dict)  # config fields it needs, set where left at default
    preserves_mass: bool = True  # a probed row's weights average 1 over its real tokens (Σ Â = Σ A per row)
    preserves_sign: bool = True  # every weight is >= 0, so Â has A's sign on every token
    auroc: bool = True  # scored by default in `grail compare`'s AUROC (False: too slow for the default; OAR-P)
    importance: Callable[[torch.Tensor], torch.Tensor] | None = None  # signal → importance for the AUROC (None: as is)
    title: str = ""  # one line: what it computes
    summary: str = ""  # a paragraph: how, in the project's words
    example: str = ""  # an example override (the functional API's docstring)
    cost: str = ""  # what it costs per step
    reference: str = ""  # the paper (and code) it follows
    open_choices: tuple[str, ...] = ()  # the choices the paper leaves open, and what this implementation does

    def __post_init__(self):
        if not self.name.isidentifier() or not self.name.islower():
            raise ValueError(f"method name {self.name!r}: use a lower-case Python identifier (e.g. 'my_method').")
        if not callable(self.pipeline):
            raise ValueError(f"method {self.name}: pipeline must be a function (spec, signal_BT, adv_B, spans, "
                             f"mask_BT, rows_B, options, generator, min_importance) → TokenWeights.")
        if self.rows not in ("none", "saliency", "bilevel", "advantaged"):
            raise ValueError(f"method {self.name}: rows={self.rows!r} is not one of none, saliency, bilevel, "
                             f"advantaged.")
        if (self.probe is None) != (self.rows == "none"):
            raise ValueError(f"method {self.name}: a method without a probe has rows='none', and only such a method.")
        names = [o.name for o in self.options]
        bad = [n for n in names if not n.startswith(self.name + "_")]
        if bad:
            raise ValueError(f"method {self.name}: option {bad[0]!r} must start with '{self.name}_' (options of "
                             f"different methods must not collide).")
        if len(set(names)) != len(names):
            raise ValueError(f"method {self.name}: an option is declared twice.")

    def resolve_options(self, given: Mapping[str, Any] | None) -> dict[str, Scalar]:
        """Every declared option's value: `given` parsed and checked, defaults for the rest. ValueError for a key
        that is not one of this method's options (naming the options it has)."""
        given = dict(given or {})
        declared = {o.name: o for o in self.options}
        unknown = sorted(set(given) - set(declared))
        if unknown:
            has = ", ".join(declared) or "none"
            raise ValueError(f"method_options {', '.join(unknown)}: not an option of token_weighting={self.name!r} "
                             f"(its options: {has}); set token_weighting to the method they belong to, or remove "
                             f"them.")
        return {name: option.parse(given[name]) if name in given else option.default
                for name, option in declared.items()}
