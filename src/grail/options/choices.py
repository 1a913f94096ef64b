"""The options of grail-rl's lower layers, without torch or TRL: the choices (one Literal per option), the
token-weighting options (`WeightingOptions`) and the tiny model's warm-start settings (`WarmStartConfig`).
`grail.options.fields.GRAILFields` (the fields `GRAILConfig` adds to TRL's) builds on them.

This module sits at the bottom of the package (docs/reference/layers.md): it imports nothing heavier than the
standard library and the torch-free `grail.tasks.arithmetic` / `grail.options.sampling` defaults, so that
`grail --help`, `grail presets`, the config loader's checks and the evaluation layer can read options without
loading torch, transformers or TRL.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from typing import Literal, get_args

from grail.tasks.arithmetic import TaskConfig

__all__ = [
    "AnswerBox", "AnswerNllSpan", "Distribution", "Leaf", "Method", "OAR_VARIANT_DEFAULTS",
    "OarScope", "OarVariant", "RewardName", "RolloutSymmetry", "SaliencyPath", "ScoringName",
    "WarmStartConfig", "WeightRescale", "WeightingOptions", "WeightsFrom", "ZscoreScope",
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


@dataclass(frozen=True)
class WeightingOptions:
    """Every option of the token-weighting methods, with the released defaults (docs/methods/).

    Field names, defaults and meanings are those of the same-named `GRAILConfig` fields, whose help texts
    document them (`grail train --help`, docs/reference/weighting-fields.md). `temperature` is TRL's sampling
    temperature: every distribution a probe forms divides the logits by it (except the GRAIL release's OAR-G,
    which does not). `oar_scope`, `oar_quantile` and `oar_beta` left at None take `oar_variant`'s values
    (`OAR_VARIANT_DEFAULTS`); an explicit value wins.
    """

    token_weighting: Method = "none"
    answer_box: AnswerBox = "first"
    answer_nll_span: AnswerNllSpan = "box"
    saliency_leaf: Leaf = "embeddings"
    rollout_symmetry: RolloutSymmetry = "wrong"
    weight_mean: float = 1.0
    weight_std: float = 0.5
    weight_min: float = 0.5
    weight_max: float = 5.0
    weight_rescale: WeightRescale = "none"
    zscore_scope: ZscoreScope = "completion"
    oar_variant: OarVariant = "oar_excerpt"
    oar_scope: OarScope | None = None
    oar_distribution: Distribution = "answer_mean"
    oar_quantile: float | None = None
    oar_beta: float | None = None
    oar_floor: float = 0.1
    oar_noise_std: float = 1e-3
    oar_min_importance: float | None = None
    perturbation_chunk_tokens: int = 32768
    temperature: float = 1.0
    # the method's own options (grail.methods.spec.MethodOption), every one resolved by the method's table entry
    method_options: dict = field(default_factory=dict, hash=False)

    def __post_init__(self):
        if self.oar_variant not in OAR_VARIANT_DEFAULTS:
            raise ValueError(f"oar_variant={self.oar_variant!r}: choose one of {', '.join(OAR_VARIANT_DEFAULTS)}.")
        for name, value in OAR_VARIANT_DEFAULTS[self.oar_variant].items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)
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
            (self.weight_rescale in get_args(WeightRescale), "weight_rescale",
             f"choose one of {', '.join(map(repr, get_args(WeightRescale)))}"),
            (self.zscore_scope in get_args(ZscoreScope), "zscore_scope",
             f"choose one of {', '.join(map(repr, get_args(ZscoreScope)))}"),
            (self.perturbation_chunk_tokens >= 1, "perturbation_chunk_tokens", "must be >= 1"),
            (self.temperature > 0, "temperature", "must be > 0"),
        ]
        for ok, name, why in checks:
            if not ok:
                values = ", ".join(f"{n}={getattr(self, n)!r}" for n in name.split("/"))
                raise ValueError(f"{values}: {why}.")

    @classmethod
    def from_config(cls, config) -> WeightingOptions:
        """The options held by a config object with same-named attributes (GRAILConfig)."""
        values = {f.name: getattr(config, f.name) for f in fields(cls)}
        return cls(**{**values, "method_options": dict(values["method_options"] or {})})


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
