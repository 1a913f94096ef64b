"""`SFTFields`: the settings of the supervised warm start of a real model on the chain task (`grail sft`,
`grail.training.sft`), with their help (their only documentation: `grail sft --help` prints it, the config reference
is generated from it), and the key its cache entry is stored under. No torch or TRL: `grail sft --help` stays light.

The task whose `sft` split is trained on is given by the chain task's `task_*` fields of `GRAILFields` (the same
fields and values `grail train --task_style chains` reads; `SFT_TASK_FIELDS` lists them), so one preset or YAML file
serves both stages.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import typing
from dataclasses import asdict, dataclass, field, fields

from grail.options.fields import SFT_MODEL_PREFIX, GRAILFields
from grail.options.presets import PRESETS, preset
from grail.tasks.chains import ChainSet

__all__ = ["add_parser", "parse_sft_model", "preset_values", "SFT_FIELD_NAMES", "SFT_RECIPE_VERSION",
           "SFT_TASK_FIELDS", "SFTFields", "sft_cache_key", "sft_settings_record"]

# bump when grail.training.sft's recipe (data, SFTTrainer options it sets) changes, so old cache entries are not reused
SFT_RECIPE_VERSION = 1
# the GRAILFields task_* fields that decide the sft split (task_num_train / task_num_heldout do not: a split's problems
# depend on the task, the seed and its own size only, grail.tasks.chains.chain_examples)
SFT_TASK_FIELDS = ("task_num_steps", "task_operand_min", "task_operand_max", "task_max_value", "task_operations",
                   "task_factor_max", "task_filler_rate", "task_num_sft", "task_seed")
# fields that do not change the trained model, so not in the cache key
_NOT_IN_KEY = ("cache_dir", "sft_save_steps", "sft_logging_steps")


@dataclass(frozen=True)
class SFTFields:
    """How the base model is fine-tuned on the chain task's worked solutions (TRL's SFTTrainer, loss on the solution
    tokens only). Values are untuned starting points: a measurement sets the length and learning rate per model.
    """

    base_model: str = field(
        default="smollm2-135m",
        metadata={"help": "The model to fine-tune: a built-in real model's name (`grail models list`; fetch it first "
                  "with `grail models fetch NAME`) or a save_pretrained directory (model and tokenizer)."})
    sft_steps: int = field(
        default=40,
        metadata={"help": "Optimizer steps of the supervised fine-tuning (TRL max_steps). With the default batch, "
                  "40 steps are 640 solutions, a third of the default 2000 sft problems: the length measured to "
                  "leave SmolLM2-135M-Instruct in the band RL needs (docs/results/regime.md); more steps solve more."})
    sft_learning_rate: float = field(
        default=5e-5, metadata={"help": "Peak learning rate (AdamW, linear warm-up then linear decay to 0)."})
    sft_batch_size: int = field(
        default=16, metadata={"help": "Solutions per device per micro-batch (TRL per_device_train_batch_size)."})
    sft_gradient_accumulation_steps: int = field(
        default=1, metadata={"help": "Micro-batches per optimizer step; the batch is sft_batch_size times this (times "
                             "the number of processes)."})
    sft_warmup_steps: int = field(default=4, metadata={"help": "Steps of linear learning-rate warm-up."})
    sft_max_length: int = field(
        default=512,
        metadata={"help": "Longest prompt + solution in tokens; longer ones are cut (TRL max_length). The default "
                  "chain problems take about 150 tokens with SmolLM2's chat template."})
    sft_seed: int = field(default=0, metadata={"help": "Seed of the data order and of the trainer's RNGs."})
    sft_save_steps: int = field(
        default=50,
        metadata={"help": "Save a resumable checkpoint (TRL's: model, optimizer, scheduler, RNG states) every this "
                  "many steps; `grail sft` run again with the same settings resumes from the last one. Not in the "
                  "cache key."})
    sft_logging_steps: int = field(
        default=10, metadata={"help": "Print the loss, the step and the time left after the first step and every "
                              "this many steps. Not in the cache key."})
    cache_dir: str | None = field(
        default=None,
        metadata={"help": "Where warm starts are cached, as <cache_dir>/sft/<model>-<key>/ (default: $GRAIL_CACHE or "
                  "~/.cache/grail-rl, where `grail models fetch` puts the base models)."})

    def __post_init__(self):
        for name in ("sft_steps", "sft_batch_size", "sft_gradient_accumulation_steps", "sft_max_length",
                     "sft_save_steps", "sft_logging_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r} must be >= 1.")
        if self.sft_warmup_steps < 0:
            raise ValueError(f"sft_warmup_steps={self.sft_warmup_steps!r} must be >= 0 (0: no warm-up).")
        if not self.sft_learning_rate > 0:
            raise ValueError(f"sft_learning_rate={self.sft_learning_rate!r} must be > 0; try 5e-5.")
        if not self.base_model:
            raise ValueError("base_model is empty; give a built-in model's name (smollm2-135m) or a model directory.")


def sft_settings_record(settings: SFTFields) -> dict:
    """The settings that shape the trained model (every field but `_NOT_IN_KEY`)."""
    return {k: v for k, v in asdict(settings).items() if k not in _NOT_IN_KEY}


def sft_cache_key(settings: SFTFields, base_identity: dict, chain_set: ChainSet) -> str:
    """16 hex digits of sha256 over everything the warm start depends on: the recipe version, the base model's
    identity (`grail.models.sft_cache.base_identity`: a built-in model's registry package and GGUF file, a directory's
    config and weight files), the problems of the sft split (the task, num_sft, seed and the split fractions) and the
    SFT settings (`sft_settings_record`; the base model enters by its identity, not its name)."""
    record = {k: v for k, v in sft_settings_record(settings).items() if k != "base_model"}
    payload = {"recipe": SFT_RECIPE_VERSION, "base": base_identity, "task": asdict(chain_set.task),
               "num_sft": chain_set.num_sft, "seed": chain_set.seed, "splits": asdict(chain_set.splits), "sft": record}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


SFT_FIELD_NAMES = tuple(f.name for f in fields(SFTFields))


def parse_sft_model(spec: str) -> tuple[str, dict]:
    """(base model, SFT settings) of the text after `sft:` in a model_name_or_path: `MODEL` (default settings) or
    `MODEL:FIELD=VALUE:...` with SFTFields fields that shape the model (e.g. `gemma3-270m:sft_steps=100`, the warm
    start `grail sft --base_model gemma3-270m --sft_steps 100` makes). ValueError naming the bad part and the fields."""
    base, *pairs = spec.split(":")
    hints, allowed = typing.get_type_hints(SFTFields), [n for n in SFT_FIELD_NAMES if n not in ("base_model",
                                                                                                *_NOT_IN_KEY)]
    settings = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep or name not in allowed:
            raise ValueError(f"model_name_or_path {SFT_MODEL_PREFIX}{spec}: {pair!r} is not FIELD=VALUE with a field "
                             f"of `grail sft` that shapes the model ({', '.join(allowed)}); e.g. "
                             f"{SFT_MODEL_PREFIX}{base or 'smollm2-135m'}:sft_steps=100.")
        try:
            settings[name] = hints[name](text)
        except ValueError:
            raise ValueError(f"model_name_or_path {SFT_MODEL_PREFIX}{spec}: {name}={text!r} is not "
                             f"{'an integer' if hints[name] is int else 'a number'}.") from None
    if not base:
        raise ValueError(f"model_name_or_path {SFT_MODEL_PREFIX}{spec} names no model; e.g. "
                         f"{SFT_MODEL_PREFIX}smollm2-135m.")
    SFTFields(base_model=base, **settings)  # the fields' own checks (steps >= 1, ...)
    return base, settings


def _sft_model(values: dict) -> str | None:
    """The text after `sft:` of a preset whose model_name_or_path is a `grail sft` warm start, else None."""
    name = str(values.get("model_name_or_path", ""))
    return name.removeprefix(SFT_MODEL_PREFIX) if name.startswith(SFT_MODEL_PREFIX) else None


def preset_values(name: str | None) -> dict:
    """`grail sft --preset NAME`'s defaults: the preset's SFT_TASK_FIELDS values, its `sft:MODEL` as base_model and the
    settings its `sft:MODEL:FIELD=VALUE` names ({} for None; ValueError for a preset that starts from no `grail sft`
    warm start)."""
    if name is None:
        return {}
    values = preset(name)
    model = _sft_model(values)
    if model is None:
        raise ValueError(f"preset {name!r} does not start from a `grail sft` warm start (its model_name_or_path is "
                         f"{values.get('model_name_or_path')!r}); use a chains preset, e.g. smollm-chains.")
    base, settings = parse_sft_model(model)
    return {"base_model": base, **settings, **{k: v for k, v in values.items() if k in SFT_TASK_FIELDS}}


def _converter(hint):
    """argparse's `type` for a field annotation: int, float, str, or one of them | None ("none" = None)."""
    args = typing.get_args(hint)
    if type(None) not in args:
        return hint
    inner = next(a for a in args if a is not type(None))
    return lambda text: None if text.strip().lower() in ("none", "null") else inner(text)


def add_parser(sub) -> None:
    """`grail sft`'s flags: every SFTFields field and the task fields of SFT_TASK_FIELDS (GRAILFields' help), each
    absent from the parsed arguments unless given (the dataclasses' defaults apply)."""
    p = sub.add_parser("sft", help="supervised warm start of a real model on the chain task (TRL's SFTTrainer), "
                       "cached; then grail train --task_style chains from it",
                       description="Fine-tune a base model on the worked solutions of the chain task's sft split "
                       "(loss on the solutions only), resumable, cached under a key of every setting; prints the "
                       "model directory. docs/getting-started/warm-start.md.", argument_default=argparse.SUPPRESS)
    p.add_argument("--preset", choices=sorted(name for name in PRESETS if _sft_model(PRESETS[name])),
                   help="the warm start a `grail train --preset NAME` run looks for: the preset's task_* values and "
                   "its `sft:MODEL` as base_model (flags win)")
    for cls, names in ((SFTFields, SFT_FIELD_NAMES), (GRAILFields, SFT_TASK_FIELDS)):
        hints, by_name = typing.get_type_hints(cls), {f.name: f for f in fields(cls)}
        for name in names:
            f = by_name[name]
            p.add_argument(f"--{name}", type=_converter(hints[name]),
                           help=f"{f.metadata['help']} (default {f.default!r})".replace("%", "%%"))
