"""What a token-weighting method is: `MethodSpec` (one entry of the method table), its declared options
(`MethodOption`), the rows a probe sees (`ProbeBatch`) and the weights it yields (`TokenWeights`).

A method is a probe (a model call, or none, that gives a per-token signal on the rows whose weights can change the
loss) and a pipeline (pure tensor code that turns the signal into weights). `grail.methods.table` holds the entries
and `register_method` adds one from outside the package (docs/guides/plugins.md); `grail.methods.weighting` runs
them, and nothing above the table branches on a method's name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Literal, NamedTuple

import torch

from grail.options.choices import UNIVERSAL_OPTIONS, WeightingOptions

__all__ = ["FusedProbe", "MethodOption", "MethodSpec", "PIPELINE_ARGUMENTS", "PROBE_ARGUMENTS", "PROBE_BATCH_FIELDS",
           "ProbeBatch", "REASONING", "ROW_SELECTIONS", "Rows", "SCOPED_OPTIONS", "TokenWeights", "TrainingReads",
           "UNIVERSAL_OPTIONS"]


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
    """The probed rows of a batch, in TRL's layout (prompt left-padded, completion the last T columns); the fields
    are described in `PROBE_BATCH_FIELDS`."""

    input_ids_BL: torch.Tensor
    attention_mask_BL: torch.Tensor
    answer_BT: torch.Tensor  # bool: the answer tokens the probe explains (`AnswerSpans.probe_span`)
    scored_BT: torch.Tensor  # bool: OAR's scored tokens (`table.scored_tokens`)
    adv_B: torch.Tensor | None = None  # the rows' sequence advantages (methods that read the group's outcomes)
    reasoning_BT: torch.Tensor | None = None  # bool: the rows' reasoning tokens (`AnswerSpans.reasoning_BT`)
    tokenizer: Any = None  # the tokenizer of the ids (methods that read the text, e.g. to find reasoning steps)
    state: Any = None  # the method's per-run state (`MethodSpec.state`); None for a method that keeps none


Probe = Callable[[torch.nn.Module, ProbeBatch, WeightingOptions, "torch.Generator | None"], torch.Tensor]


class TrainingReads(NamedTuple):
    """What the trainer's fused path hands a `fuse="probe"` method from TRL's training forward, for the probed rows
    (in order), all detached: TRL's log-probs of the completion tokens and the entropies of the distributions they
    were drawn from (both at the sampling temperature), and the output of the leaf `MethodSpec.fused_leaf` names."""

    logps_BT: torch.Tensor
    entropies_BT: torch.Tensor
    hidden_BLD: torch.Tensor | None  # the leaf's output; None when the method names no leaf


# (model, rows, reads, options, generator) → signal on the rows: a probe that reads the training forward
FusedProbe = Callable[[torch.nn.Module, ProbeBatch, TrainingReads, WeightingOptions, "torch.Generator | None"],
                      torch.Tensor]
# (spec, signal_BT, adv_B, spans, mask_BT, rows_B, options, generator, min_importance) → TokenWeights
ToWeights = Callable[..., TokenWeights]
Rows = Literal["none", "saliency", "bilevel", "advantaged"]

# ---- the contract, in words: docs/guides/plugins.md's tables are generated from these ----------------------------
# Which rows the probe runs on and the pipeline may reweight (`table.probed_rows`). A row with A = 0 never is: its
# Â = 0 whatever its weights.
ROW_SELECTIONS: dict[str, str] = {
    "advantaged": "every row with A ≠ 0 and a real token (the usual choice for a new method)",
    "saliency": "GRAIL's: A ≠ 0, the sign chosen by `rollout_symmetry`, and a complete answer box",
    "bilevel": "OAR's: A ≠ 0 with a scored token (`oar_scope`), and a box when `oar_distribution='answer_mean'`",
    "none": "no row: the weights are w = 1 everywhere (GRPO, `top_entropy`); only for methods without a probe, whose "
            "pipeline is `builtin.uniform_pipeline` (anything else would silently train as GRPO, and is refused)",
}
PROBE_ARGUMENTS: dict[str, str] = {
    "model": "the unwrapped Hugging Face causal LM (not the DDP wrapper); None when `calls_model=False`",
    "rows": "a `ProbeBatch` holding only the selected rows (`rows`), see its fields below",
    "options": "the run's `WeightingOptions`; `options.method_options` holds every one of the method's own options, "
               "resolved (defaults filled in)",
    "generator": "a seeded `torch.Generator` for any randomness (the trainer seeds one per process); may be None (the "
                 "functional API): then use torch's global RNG",
    "returns": "a (rows, T) float tensor: the per-token signal (importance). Only real tokens are read; NaN or inf on "
               "a real token sends the row to uniform weights (`TokenWeights.finite_signal`). It must not require "
               "grad or write any parameter's `.grad`",
}
PROBE_BATCH_FIELDS: dict[str, str] = {
    "input_ids_BL": "(rows, L) prompt ⊕ completion ids, the prompt left-padded, the completion the last T columns",
    "attention_mask_BL": "(rows, L) 1 on real tokens",
    "answer_BT": "(rows, T) bool: the answer tokens the probe explains: the whole box or its content "
                 "(`answer_nll_span`)",
    "scored_BT": "(rows, T) bool: OAR's scored tokens: the reasoning or every real token (`oar_scope`)",
    "adv_B": "(rows,) the rows' sequence advantages A (methods that read the group's outcomes)",
    "reasoning_BT": "(rows, T) bool: the reasoning tokens (see `reasoning` below)",
    "tokenizer": "the tokenizer of the ids (methods that read the text)",
    "state": "the method's per-run state (`MethodSpec.state`; a fresh one outside a trainer), or None",
}
PIPELINE_ARGUMENTS: dict[str, str] = {
    "spec": "the method's own `MethodSpec` (one pipeline can serve several methods, e.g. `permutes`)",
    "signal_BT": "(B, T) float32: the probe's signal on the selected rows and exactly 1.0 on every other row (the "
                 "signal of a row with no information); for a method without a probe, 1.0 everywhere",
    "adv_B": "(B,) the sequence advantages A",
    "spans": "an `AnswerSpans`: (B, T) bool masks `answer_BT` (inside the box's braces), `after_BT` (the box's "
             "marker, closing brace and anything after it), `reasoning_BT` (see below), `box_BT` (the whole box), "
             "and (B,) `has_box_B`, `decoded_B`; answer, after and reasoning split the real tokens",
    "mask_BT": "(B, T) bool: the real completion tokens that enter the loss",
    "rows_B": "(B,) bool: the selected rows (`rows`): the only rows whose weights the pipeline should change; the "
              "others should get the weights of a row with no information (w = 1 for most methods)",
    "options": "as the probe's",
    "generator": "as the probe's (may be None)",
    "min_importance": "the signal's rounding floor from `min_importance` (0.0 when the spec has none)",
    "returns": "`TokenWeights` with (B, T) float32 `weights_BT`, detached, 0 on padding (`TokenWeights.simple` fills "
               "the diagnostics only GRAIL's pipeline has). With `weight_rescale='row_mean'`, grail-rl divides the "
               "weights by their row mean afterwards, whatever the method",
}
REASONING = ("A row's reasoning tokens are its real tokens before the chosen answer box (`answer_box`: the first "
             "complete `\\boxed{...}` with at least one answer token). A row with no such box has no answer: every "
             "real token is reasoning.")
# The option fields whose owners are declared by `MethodSpec.reads` (the config field saliency_path included): every
# WeightingOptions field but the ones every method reads or may meet (`UNIVERSAL_OPTIONS`, marked where each is
# declared: the method itself, the answer box, the opt-in row-mean rescale, TRL's temperature, its own options).
SCOPED_OPTIONS = tuple(f for f in WeightingOptions.__dataclass_fields__ if f not in UNIVERSAL_OPTIONS) + (
    "saliency_path",)
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


def _doc(default: Any = MISSING, help: str = "", **kwargs: Any):
    """A `MethodSpec` field with its documentation (`help`), from which docs/guides/plugins.md's table is generated."""
    if default is MISSING and "default_factory" not in kwargs:
        return field(metadata={"help": help})
    return field(default=default, metadata={"help": help}, **kwargs)


@dataclass(frozen=True)
class MethodSpec:
    """One token-weighting method: see the module docstring; `weighting.token_weights` runs it. `check_method`
    (grail.analysis.checks) runs the checks every method of the table passes.

    The documentation fields (`title`, `summary`, `cost`, `reference`, `open_choices`) are the method's docs
    page (docs/methods/table.md is generated from them) and the functional API's docstring."""

    name: str = _doc(help="`token_weighting` value: a lower-case Python identifier")
    label: str = _doc(help="its name in tables (`grail demo`, reports)")
    probe: Probe | None = _doc(help="`(model, rows, options, generator) → (rows, T)` per-token signal on the rows it "
                                    "is given (`PROBE_ARGUMENTS`); `None`: the method has no signal and its weights "
                                    "are w = 1 (GRPO, `top_entropy`), which requires `rows='none'`")
    pipeline: ToWeights = _doc(help="signal → `TokenWeights` (`PIPELINE_ARGUMENTS`), pure tensor code, e.g. "
                                    "`builtin.saliency_pipeline` (GRAIL's normalisation) or `builtin.bilevel_pipeline`")
    rows: Rows = _doc("advantaged", help="the rows the probe runs on and the pipeline may reweight (`ROW_SELECTIONS`)")
    calls_model: bool = _doc(True, help="the probe calls the model. False: it reads only the batch (ids, masks, "
                                        "spans, advantages, tokenizer), e.g. a position rule or KTAE's counting; it "
                                        "then runs with `model=None`, without the collective that keeps sharded "
                                        "processes in step, and `grail.<name>_weights` accepts `model=None`")
    reads: tuple[str, ...] = _doc((), help="the `WeightingOptions` fields (and `saliency_path`) its probe, rows and "
                                           "pipeline read beyond those every method reads (`UNIVERSAL_OPTIONS`); "
                                           "another method's field set with this method is refused, and "
                                           "`check_method` verifies that undeclared fields leave the weights "
                                           "unchanged. Built-in pieces come with theirs: `builtin.SALIENCY_READS`, "
                                           "`builtin.BILEVEL_READS`")
    fuse: Literal["saliency", "entropy", "probe"] | None = _doc(
        None, help="what the fused path reads from TRL's training forward instead of running the probe: GRAIL's "
                   "saliency, TRL's token entropies, or (`probe`) whatever `fused_probe` reads from it (None: nothing)")
    fused_probe: FusedProbe | None = _doc(
        None, help="with fuse='probe': `(model, rows, reads: TrainingReads, options, generator) → signal`, the probe "
                   "computed from the training forward's reads instead of a forward of its own (it may still call "
                   "the model, e.g. for exact values on a few rows); it must give the probe's signal")
    fused_leaf: Callable[[WeightingOptions], str] | None = _doc(
        None, help="with fuse='probe': `options → leaf` (as `saliency_leaf` names one), the module whose output the "
                   "training forward hands `fused_probe` (None: no hidden state)")
    per_surprise: Callable[[torch.Tensor, torch.Tensor, WeightingOptions], torch.Tensor] | None = _doc(
        None, help="with fuse='saliency': `(saliency_BT, surprise_BT, options) → signal_BT`, the fused signal from "
                   "the saliency and TRL's −log π(token) (the probe computes the same). None: the saliency")
    permutes: bool = _doc(False, help="the pipeline permutes each row's weights over its reasoning tokens (the random "
                                      "control): the saliency AUROC scores its weights, not its signal")
    groups: bool = _doc(False, help="reads every rollout of a group (e.g. KTAE): weights are computed at rollout time "
                                    "on the whole batch (`weights_from='rollout_policy'` is set for it)")
    min_importance: Callable[..., float] | None = _doc(None, help="`(model, options) → float`: the signal's rounding "
                                                                  "floor handed to the pipeline (OAR-P); None: 0")
    unshardable: str = _doc("", help="why its probe cannot run on a model sharded over processes (ZeRO-3, FSDP); "
                                     "'' = it can. Training such a model with it is refused with this text")
    state: Callable[[], Any] | None = _doc(None, help="for a method that learns across steps: a factory of its "
                                                      "per-run state (`state_dict()`, `load_state_dict(d)`), which "
                                                      "the trainer hands the probe as `rows.state` and checkpoints")
    options: tuple[MethodOption, ...] = _doc((), help="options of its own (`MethodOption`), each a config field "
                                                      "named `<name>_...`")
    check: Callable[[WeightingOptions, Any], str | None] | None = _doc(
        None, help="`(options, config or None) → error or None`: refuses a bad combination of options")
    config: Mapping[str, Scalar] = _doc(default_factory=dict, help="config fields it needs, set where the user left "
                                                                   "them at their default (`top_entropy`)")
    preserves_mass: bool = _doc(True, help="a reweighted row's weights average 1 over its real tokens (Σ Â = Σ A per "
                                           "row, up to GRAIL's clipping); checked by `check_method`")
    preserves_sign: bool = _doc(True, help="every weight is > 0, so Â has A's sign on every token; checked by "
                                           "`check_method`")
    auroc: bool = _doc(True, help="scored by default by `grail compare`'s saliency AUROC (False: too slow for the "
                                  "default, e.g. OAR-P)")
    importance: Callable[[torch.Tensor], torch.Tensor] | None = _doc(None, help="signal → importance for the AUROC "
                                                                                "(None: the signal as is)")
    title: str = _doc("", help="one line: what it computes (`grail methods`, the method table)")
    summary: str = _doc("", help="a paragraph: how, in the project's words (the method table)")
    example: str = _doc("", help="an example override, shown in `grail.<name>_weights`' docstring")
    cost: str = _doc("", help="what it costs per step")
    reference: str = _doc("", help="the paper (and code) it follows")
    open_choices: tuple[str, ...] = _doc((), help="the choices the paper leaves open, and what this implementation "
                                                  "does")

    def __post_init__(self):
        if not self.name.isidentifier() or not self.name.islower():
            raise ValueError(f"method name {self.name!r}: use a lower-case Python identifier (e.g. 'my_method').")
        if not callable(self.pipeline):
            raise ValueError(f"method {self.name}: pipeline must be a function (spec, signal_BT, adv_B, spans, "
                             f"mask_BT, rows_B, options, generator, min_importance) → TokenWeights.")
        if self.rows not in ("none", "saliency", "bilevel", "advantaged"):
            raise ValueError(f"method {self.name}: rows={self.rows!r} is not one of none, saliency, bilevel, "
                             f"advantaged.")
        if self.probe is None and self.rows != "none":
            raise ValueError(f"method {self.name}: probe=None with rows={self.rows!r}: without a probe every selected "
                             f"row would get the signal of a row with no information. A method whose weights need no "
                             f"model call (a position rule, a count over the group) gives a probe that computes its "
                             f"signal from the batch and declares calls_model=False.")
        if self.probe is not None and self.rows == "none":
            raise ValueError(f"method {self.name}: rows='none' selects no row, so its probe would never run and every "
                             f"row would get w = 1 (GRPO); use rows='advantaged' (every row with A ≠ 0).")
        if self.fuse is not None and not self.calls_model:
            raise ValueError(f"method {self.name}: fuse={self.fuse!r} reads the training forward, which only a method "
                             f"whose probe calls the model has; set calls_model=True or fuse=None.")
        if (self.fuse == "probe") != (self.fused_probe is not None) or (
                self.fused_leaf is not None and self.fuse != "probe"):
            raise ValueError(f"method {self.name}: fuse='probe' and fused_probe come together (fused_leaf with them); "
                             f"got fuse={self.fuse!r}, fused_probe={'set' if self.fused_probe else None}, "
                             f"fused_leaf={'set' if self.fused_leaf else None}.")
        if self.per_surprise is not None and self.fuse != "saliency":
            raise ValueError(f"method {self.name}: per_surprise combines the fused saliency with the surprise; it "
                             f"needs fuse='saliency' (fuse={self.fuse!r}).")
        unknown = [name for name in self.reads if name not in SCOPED_OPTIONS]
        if unknown:
            raise ValueError(f"method {self.name}: reads={unknown!r}: not an option field a method can own; choose "
                             f"from {', '.join(SCOPED_OPTIONS)} (every method reads {', '.join(UNIVERSAL_OPTIONS)}; "
                             f"options of its own go in `options`).")
        names = [o.name for o in self.options]
        bad = [n for n in names if not n.startswith(self.name + "_")]
        if bad:
            raise ValueError(f"method {self.name}: option {bad[0]!r} must start with '{self.name}_' (options of "
                             f"different methods must not collide).")
        if len(set(names)) != len(names):
            raise ValueError(f"method {self.name}: an option is declared twice.")
        if self.state is not None and not callable(self.state):
            raise ValueError(f"method {self.name}: state must be a function () → an object with state_dict() and "
                             f"load_state_dict(), made once per run.")

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

    def rounding_floor(self, model, options) -> float:
        """The signal's rounding floor the pipeline gets as `min_importance`: the spec's `min_importance(model,
        options)`, or 0.0 when it has none."""
        return float(self.min_importance(model, options)) if self.min_importance is not None else 0.0
