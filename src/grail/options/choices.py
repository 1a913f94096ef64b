"""The options of grail-rl's lower layers, without torch or TRL: the choices (one Literal per option), the
token-weighting options and the tiny model's warm-start settings (`WarmStartConfig`).

Each token-weighting option is declared once, in `WeightingFields`: its type, default (the released value) and help
(its only documentation: `grail train --help`, docs/reference/weighting-fields.md). Two classes take their fields
from it: `grail.options.fields.GRAILFields` (the config fields a user sets; `GRAILConfig` inherits them) and
`WeightingOptions`, the frozen object the methods take, which resolves what the fields leave open (OAR's variant
values) and checks every value, once.

This module sits at the bottom of the package (docs/reference/layers.md): it imports nothing heavier than the
standard library and the torch-free `grail.tasks.arithmetic` / `grail.options.sampling` defaults, so that
`grail --help`, `grail presets`, the config loader's checks and the evaluation layer can read options without
loading torch, transformers or TRL.
"""

from __future__ import annotations

import functools
import hashlib
import json
import typing
from dataclasses import FrozenInstanceError, asdict, dataclass, field, fields
from typing import Literal

from grail.tasks.arithmetic import TaskConfig

__all__ = [
    "AnswerBox", "AnswerNllSpan", "CpuBf16Generation", "Distribution", "EVERY_METHOD", "Leaf", "Method",
    "OAR_VARIANT_DEFAULTS", "OarScope", "OarVariant", "RewardName", "RolloutSymmetry", "SaliencyPath", "ScoringName",
    "UNIVERSAL_OPTIONS", "WEIGHTING_FIELDS", "WarmStartConfig", "WeightRescale", "WeightingFields", "WeightingOptions",
    "WeightsFrom", "ZscoreScope",
]

# ---- the choices: one Literal per option; the registries they name check against them in the tests ----------
# A token_weighting name: any method of the table (grail.methods.table.METHODS, which checks it; plug-ins add names)
Method = str
AnswerBox = Literal["first", "last"]  # which complete box is the answer span (first: the GRAIL release)
AnswerNllSpan = Literal["box", "content"]  # which tokens of that box the probes explain
Leaf = Literal["embeddings", "first", "middle", "last"]  # where GRAIL's saliency is measured (grail.methods.probes)
RolloutSymmetry = Literal["wrong", "correct", "both"]
OarScope = Literal["reasoning", "completion"]
Distribution = Literal["last_position", "answer_mean"]  # OAR's answer distribution P_final
OarVariant = Literal["oar_excerpt", "grail_release"]
WeightsFrom = Literal["current_policy", "rollout_policy"]
SaliencyPath = Literal["auto", "fused", "separate"]
# how CPU bf16 runs generation: from bf16 weights (grail.models.bf16_weights) or under autocast over the fp32 ones
CpuBf16Generation = Literal["weights", "autocast"]
# grail.evaluation.rewards.REWARDS (+ auto)
RewardName = Literal["auto", "exact_int", "math_verify", "math_verify_all_boxes"]
ScoringName = Literal["grail", "grail_all_boxes", "release"]  # grail.evaluation.release_scoring.SCORINGS
# opt-in scale matching (not the release): grail.methods.core.row_mean_rescaled
WeightRescale = Literal["none", "row_mean"]
ZscoreScope = Literal["completion", "to_answer"]  # tokens GRAIL's z-score uses (to_answer: opt-in, not the release)
# Per OAR variant, the values that `None` in the scope / quantile / beta fields stands for (docs/methods/oar_g.md):
# the OAR release's excerpt, and the GRAIL release's own OAR-G baseline (`qwen3_oar_g.yaml`).
OAR_VARIANT_DEFAULTS: dict[str, dict[str, object]] = {
    "oar_excerpt": {"oar_scope": "reasoning", "oar_quantile": 0.25, "oar_beta": 1.0},
    "grail_release": {"oar_scope": "completion", "oar_quantile": 0.4, "oar_beta": 2.0},
}


# metadata key of the options every method reads or may meet (`grail.methods.spec.UNIVERSAL_OPTIONS`); the others are
# owned by the methods that declare them in `MethodSpec.reads`
EVERY_METHOD = "every_method"


@dataclass
class WeightingFields:
    """The token-weighting options a user sets (config fields, flags, YAML keys, compare arm fields), in the order
    `grail train --help` lists them."""

    # ---- token weighting (docs/methods/; defaults = the released values) ---------------------------------
    token_weighting: Method = field(
        default="none",
        metadata={EVERY_METHOD: True,
                  "help": "How each completion token's share of the advantage is chosen (Â = w·A): a method of the "
                  "method table. `none` is plain GRPO (w = 1). `grail methods` lists every method (the built-in ones, "
                  "the literature methods shipped as plug-ins, and any installed plug-in) with what it computes, its "
                  "cost and its own options; docs/methods/table.md is the same list."},
    )
    answer_box: AnswerBox = field(
        default="first",
        metadata={EVERY_METHOD: True,
                  "help": "Which complete \\boxed{...} is the answer span 𝒜 of GRAIL (and of OAR's answer_mean): "
                  "`first` (the GRAIL release) or `last` (the box the reward reads)."},
    )
    answer_nll_span: AnswerNllSpan = field(
        default="box",
        metadata={"help": "Which tokens of the answer box the probes explain: `box` (the GRAIL release: the "
                  "whole `\\boxed{...}` string, i.e. the marker tokens, the content and the closing brace) or "
                  "`content` (only the tokens inside the braces). It is the span of GRAIL's answer NLL ℓ and of "
                  "OAR's `answer_mean` distribution. The weight overrides do not change: content → weight_max, "
                  "marker, closing brace and after → weight_mean."},
    )
    saliency_leaf: Leaf = field(
        default="embeddings",
        metadata={"help": "GRAIL's leaf h, where ‖∂ℓ/∂h ⊙ h‖ is measured: `embeddings` (release), or the hidden "
                  "state after layer 1 (`first`), after layer L//2 (`middle`), after layer L-1 (`last`)."},
    )
    rollout_symmetry: RolloutSymmetry = field(
        default="wrong",
        metadata={"help": "Rows that get saliency weights (GRAIL and both controls): `wrong` (release: A ≤ 0), "
                  "`correct` (A > 0), `both`. Other rows get w = 1; the answer-span overrides (w_max inside the "
                  "box, w_mean from the box marker on) apply to every row with a box."},
    )
    weight_mean: float = field(default=1.0, metadata={"help": "GRAIL w_mean: w = clip(w_mean + "
                               "w_std·z, w_min, w_max), z = per-row z-score of log(saliency). Release 1.0."})
    weight_std: float = field(default=0.5, metadata={"help": "GRAIL w_std (spread of the weights "
                              "around w_mean). Release 0.5."})
    weight_min: float = field(default=0.5, metadata={"help": "GRAIL w_min (lower clip). Release 0.5."})
    weight_max: float = field(default=5.0, metadata={"help": "GRAIL w_max (upper clip; also the "
                              "weight of the tokens inside the answer box). Release 5.0."})
    weight_rescale: WeightRescale = field(
        default="none",
        metadata={EVERY_METHOD: True,
                  "help": "Scale matching, opt-in (neither release has it). `none` (release): the weights as "
                  "computed. GRAIL's mean weight exceeds 1, mostly because the answer tokens get weight_max, so "
                  "its mean |Â| exceeds GRPO's |A| (weights/adv_scale_ratio): at a learning rate tuned for GRPO it "
                  "takes larger steps. `row_mean`: each row's final weights (after the answer-span overrides and "
                  "the random control's permutation, which does not change a row's mean) are divided by their "
                  "mean over the row's real tokens. Every row's mean weight is then 1 and its mean |Â| is |A|, so "
                  "the method only moves GRPO's advantage between tokens. Applies to every method. Uniform rows "
                  "stay as they are. OAR's reshaping already preserves mass, so only rounding changes there. "
                  "weights/clip_* still count the clipping before the rescale."},
    )
    permute_weights: bool = field(
        default=False,
        metadata={EVERY_METHOD: True,
                  "help": "A method's own permutation null, opt-in: each row's final weights (after the method's "
                  "pipeline and answer-span overrides, before weight_rescale) are shuffled at random over the row's "
                  "reasoning tokens (before the answer box), as the `random` control shuffles GRAIL's. The row keeps "
                  "its multiset of weights, so its mass and the distribution of its credit, and loses where the "
                  "credit goes: a method that beats its own permuted weights gains from the placement, not the "
                  "spread (`oar_p@permute_weights=true` is OAR-P's null in `grail compare`). "
                  "`grail@permute_weights=true` gives exactly `random`'s weights. Refused with `random` (already "
                  "permuted) and with methods without a signal (none, top_entropy)."},
    )
    zscore_scope: ZscoreScope = field(
        default="completion",
        metadata={"help": "The tokens GRAIL's per-row z-score of log(signal) is taken over (grail, random, "
                  "entropy). `to_answer` is opt-in, not the release. `completion` (release): every real token. "
                  "That includes the tokens after the answer box: ℓ cannot depend on them, so their saliency is "
                  "exactly 0 and log(1e-8) ≈ −18.4 pulls the mean down and the std up, which squeezes the "
                  "reasoning tokens' weights together (on short completions GRAIL nears 'GRPO with the answer "
                  "tokens × weight_max'; see weights/reasoning_std). `to_answer`: only the tokens up to and "
                  "including the last token of the answer NLL span (answer_nll_span: the closing brace for `box`, "
                  "the last content token for `content`). The tokens after it get z = 0 (weight_mean), and the "
                  "answer-span overrides give them that anyway. Rows without a box are unchanged. Not for "
                  "oar_g/oar_p: they have no z-score, and oar_scope picks their scored tokens."},
    )
    oar_variant: OarVariant = field(
        default="oar_excerpt",
        metadata={"help": "Which OAR to run. `oar_excerpt` (Li et al. 2026, as docs/methods/oar_g.md states it): noise "
                  "on, and importance read at, each token's own position with the clean embedding; P_final "
                  "divided by the sampling temperature; τ an interpolated quantile. `grail_release`: the GRAIL "
                  "release's OAR-G baseline (`qwen3_oar_g.yaml`), exactly: P_0 = softmax of the mean clean logits "
                  "over the positions predicting the answer box, no temperature; noise and importance at the "
                  "position that predicts each token, with the noisy embedding; τ = sorted Î at index floor(T·q); "
                  "oar_g only. Its defaults for oar_scope/oar_quantile/oar_beta: "
                  + "; ".join(f"{v}: " + ", ".join(f"{k[4:]} {x}" for k, x in d.items())
                              for v, d in OAR_VARIANT_DEFAULTS.items()) + "."},
    )
    oar_scope: OarScope | None = field(
        default=None,
        metadata={"help": "OAR's scored tokens: `reasoning` (OAR release: the text before the box) or "
                  "`completion` (every token; GRAIL's OAR-G baseline). Unscored tokens keep w = 1. None = "
                  "oar_variant's value."},
    )
    oar_distribution: Distribution = field(
        default="answer_mean",
        metadata={"help": "OAR's answer distribution P_final: `answer_mean` (softmax of the mean logits over the "
                  "positions that predict the answer span, see answer_nll_span; rows without a box get w = 1) or "
                  "`last_position` (next-token distribution after the row's last real token; on a finished "
                  "answer it is near-certain, so every reasoning token's importance is at rounding level)."},
    )
    oar_quantile: float | None = field(default=None, metadata={"help": "OAR q: τ = q-quantile of the "
                                       "normalised importance; tokens below τ are damped. OAR release 0.25; "
                                       "GRAIL's OAR-G baseline 0.4. None = oar_variant's value."})
    oar_beta: float | None = field(default=None, metadata={"help": "OAR β: tokens above τ get "
                                   "1 + β(Î-τ)/(1-τ). OAR release 1.0; GRAIL's OAR-G baseline 2.0. None = "
                                   "oar_variant's value."})
    oar_floor: float = field(default=0.1, metadata={"help": "OAR: smallest weight of a token below τ "
                             "(before the mass-preserving rescale). Release 0.1."})
    oar_noise_std: float = field(default=1e-3, metadata={"help": "OAR-G σ: Gaussian noise on the "
                                 "scored embeddings (at zero noise the KL has zero gradient). Release 1e-3."})
    oar_min_importance: float | None = field(
        default=None,
        metadata={"help": "OAR-P rounding floor (nats): KL values below it are taken as 0, and a row whose "
                  "largest KL is below it is uninformative (uniform weights, counted in weights/fallback_rows). "
                  "None = by the model's dtype: 1e-8 for float32 (measured rounding 2.4e-9), 1e-4 for bf16/fp16 "
                  "(grail.methods.table.OAR_P_FLOOR); 0 turns it off."},
    )
    perturbation_chunk_tokens: int = field(
        default=32768,
        metadata={"help": "OAR-P memory bound: at most this many tokens (copies × sequence length) per batched "
                  "forward of pad-substituted copies. Larger is faster until memory runs out."},
    )


WEIGHTING_FIELDS = tuple(f.name for f in fields(WeightingFields))


@dataclass(unsafe_hash=True)
class WeightingOptions(WeightingFields):
    """Every option of the token-weighting methods, resolved and checked: `WeightingFields` (whose help documents
    each), TRL's sampling temperature and the method's own options. Frozen once built (`dataclasses.replace` makes
    another). `oar_scope`, `oar_quantile` and `oar_beta` left at None take `oar_variant`'s values
    (`OAR_VARIANT_DEFAULTS`); an explicit value wins.
    """

    # Frozen by hand: a `frozen=True` dataclass cannot extend WeightingFields, which the (mutable) config extends too.
    # The flag is set once the options are checked; a slot, not an entry of __dict__ (which plug-ins read as fields).
    __slots__ = ("_frozen",)

    temperature: float = field(default=1.0, metadata={EVERY_METHOD: True, "help": "TRL's sampling temperature: every "
                               "distribution a probe forms divides the logits by it (except the GRAIL release's OAR-G, "
                               "which does not)."})
    method_options: dict = field(default_factory=dict, hash=False, metadata={
        EVERY_METHOD: True, "help": "the method's own options (grail.methods.spec.MethodOption), every one resolved by "
        "the method's table entry"})

    def __post_init__(self):
        for name, choices in _choices().items():
            if getattr(self, name) not in choices:
                raise ValueError(f"{name}={getattr(self, name)!r} is not a valid choice; set {name} to one of "
                                 f"{', '.join(map(repr, choices))}.")
        for name, value in OAR_VARIANT_DEFAULTS[self.oar_variant].items():
            if getattr(self, name) is None:
                setattr(self, name, value)
        release = self.oar_variant == "grail_release"
        checks = [
            (self.weight_std >= 0, "weight_std", "must be >= 0"),
            (0 <= self.weight_min <= self.weight_mean <= self.weight_max, "weight_min/weight_mean/weight_max",
             "must satisfy 0 <= weight_min <= weight_mean <= weight_max (release: 0.5, 1.0, 5.0)"),
            (0 < self.oar_quantile < 1, "oar_quantile", "must be in (0, 1) (OAR release 0.25)"),
            (self.oar_beta >= 0, "oar_beta", "must be >= 0 (OAR release 1.0)"),
            (0 <= self.oar_floor <= 1, "oar_floor", "must be in [0, 1] (OAR release 0.1)"),
            (self.oar_noise_std > 0, "oar_noise_std", "must be > 0: at zero noise the KL has zero gradient "
             "(OAR release 1e-3)"),
            (self.oar_min_importance is None or self.oar_min_importance >= 0, "oar_min_importance",
             "must be >= 0 (0 turns the rounding floor off; None picks it by the model's dtype)"),
            (not (release and self.oar_distribution != "answer_mean"), "oar_variant/oar_distribution",
             "the GRAIL release's OAR-G reads the mean logits over the answer box; use "
             "oar_distribution='answer_mean' or oar_variant='oar_excerpt'"),
            (self.perturbation_chunk_tokens >= 1, "perturbation_chunk_tokens", "must be >= 1"),
            (self.temperature > 0, "temperature", "must be > 0"),
        ]
        for ok, name, why in checks:
            if not ok:
                values = ", ".join(f"{n}={getattr(self, n)!r}" for n in name.split("/"))
                raise ValueError(f"{values}: {why}.")
        object.__setattr__(self, "_frozen", True)

    def __setattr__(self, name, value):
        if getattr(self, "_frozen", False):
            raise FrozenInstanceError(f"WeightingOptions are resolved once and frozen: cannot assign {name}; make "
                                      f"another with dataclasses.replace(options, {name}=...).")
        object.__setattr__(self, name, value)

    def __delattr__(self, name):
        raise FrozenInstanceError(f"WeightingOptions are frozen: cannot delete {name}.")


@functools.cache
def _choices() -> dict[str, tuple]:
    """The allowed values of each `Literal` option (None included for an optional one)."""
    out = {}
    for name, hint in typing.get_type_hints(WeightingOptions).items():
        args = typing.get_args(hint)
        if typing.get_origin(hint) is Literal:
            out[name] = args
        elif type(None) in args and any(typing.get_origin(a) is Literal for a in args):
            out[name] = (*typing.get_args(next(a for a in args if typing.get_origin(a) is Literal)), None)
    return out


UNIVERSAL_OPTIONS = tuple(f.name for f in fields(WeightingOptions) if f.metadata.get(EVERY_METHOD))


RECIPE_VERSION = 1  # bump when grail.models.warmstart's training loop changes, so old caches are not reused


@dataclass(frozen=True)
class WarmStartConfig:
    # Default 2-step problems + 300 steps: 51.0% sampled acc@4 (T=1) / 61.0% greedy on 200 held-out problems
    # (grail demo), ~60 s on 2 cores (450 steps overshoot to ~81%; 3-step problems reach ~13% in 300 steps).
    task: TaskConfig = field(default_factory=TaskConfig)
    steps: int = 300
    batch_size: int = 64
    lr: float = 3e-3
    warmup_steps: int = 30
    num_examples: int = 4000  # distinct train-split traces drawn for SFT (held-out split is never seen)
    seed: int = 0
    hidden_size: int = 192
    num_layers: int = 4

    def __post_init__(self):
        for name in ("steps", "batch_size", "num_examples", "hidden_size", "num_layers"):
            if getattr(self, name) < 1:
                raise ValueError(f"warm start: {name}={getattr(self, name)} must be >= 1.")
        if not self.lr > 0:
            raise ValueError(f"warm start: lr={self.lr} must be > 0.")

    def cache_key(self) -> str:
        settings = asdict(self)
        if self.task.style == "symbolic":  # the default style leaves the key as it was before styles existed
            del settings["task"]["style"]
        payload = json.dumps({"recipe": RECIPE_VERSION, **settings}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]
