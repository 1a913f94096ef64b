"""Warm start: a short supervised pre-training of the tiny model on synthetic-task traces, cached on disk.

GRPO learns only from groups whose rewards differ; a randomly initialised model never gets a reward, so
RL needs a policy that already succeeds sometimes. This module fits the tiny model to reference traces
(loss on completion tokens only) for a fixed number of steps, chosen so that held-out sampled accuracy
lands roughly in 20-60 %, and caches the result under a key made from every setting that affects it.
The cached directory is a normal `save_pretrained` checkpoint (model + tokenizer), loadable by path.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch

from grail.models.pretrained import REAL_MODELS, check_not_gguf_dir, default_cache_dir
from grail.models.pretrained import resolve as resolve_real_model
from grail.models.tiny import build_tiny_model, build_tokenizer
from grail.options.choices import WarmStartConfig
from grail.options.fields import TINY_MODEL
from grail.tasks.synthetic import generate

__all__ = ["default_cache_dir", "load_inference_model", "resolve_model", "save_on_this_process", "train_warm_start",
           "warm_start"]


def _batches(tokenizer, examples, batch_size: int, generator: torch.Generator):
    """Endless shuffled batches of (input_ids_BL, labels_BL, attention_mask_BL), right-padded."""
    prompt_ids = [tokenizer(e.prompt, add_special_tokens=False)["input_ids"] for e in examples]
    full_ids = [
        p + tokenizer(e.solution, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        for p, e in zip(prompt_ids, examples, strict=True)
    ]
    while True:
        order = torch.randperm(len(examples), generator=generator).tolist()
        for start in range(0, len(order) - batch_size + 1, batch_size):
            idx = order[start : start + batch_size]
            width = max(len(full_ids[i]) for i in idx)
            ids_BL = torch.full((batch_size, width), tokenizer.pad_token_id)
            labels_BL = torch.full((batch_size, width), -100)
            mask_BL = torch.zeros((batch_size, width), dtype=torch.long)
            for row, i in enumerate(idx):
                seq, n_prompt = full_ids[i], len(prompt_ids[i])
                ids_BL[row, : len(seq)] = torch.tensor(seq)
                labels_BL[row, n_prompt : len(seq)] = torch.tensor(seq[n_prompt:])  # completion + eos only
                mask_BL[row, : len(seq)] = 1
            yield ids_BL, labels_BL, mask_BL


def train_warm_start(config: WarmStartConfig, out_dir: Path, log: Callable[[str], None] = print) -> Path:
    """Run the SFT and `save_pretrained` model + tokenizer into `out_dir` (no caching here)."""
    tokenizer = build_tokenizer()
    model = build_tiny_model(tokenizer, seed=config.seed, hidden_size=config.hidden_size,
                             num_layers=config.num_layers)
    examples = generate(config.task, config.num_examples, "train", seed=config.seed)
    generator = torch.Generator().manual_seed(config.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.0)

    def lr_factor(step: int) -> float:  # linear warm-up, cosine decay to 10 %
        if step < config.warmup_steps:
            return (step + 1) / config.warmup_steps
        progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    model.train()
    batches = _batches(tokenizer, examples, config.batch_size, generator)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        for step in range(config.steps):
            ids_BL, labels_BL, mask_BL = next(batches)
            loss = model(input_ids=ids_BL, attention_mask=mask_BL, labels=labels_BL).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            if (step + 1) % 50 == 0 or step + 1 == config.steps:
                log(f"warm start: step {step + 1}/{config.steps}  loss {loss.item():.3f}")
    save_on_this_process(model, out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def save_on_this_process(model, out_dir: Path) -> None:
    """`save_pretrained`'s files (config, generation config, safetensors weights) written by THIS process. Under an
    initialised process group (any `accelerate launch` of several processes, where each process warm-starts into
    its own staging folder) transformers 5 writes them on rank 0 only (`PreTrainedModel.should_save_on_this_rank`),
    so another rank's folder would hold no weights, and published first it would poison the cache."""
    from safetensors.torch import save_file

    model.config.architectures = [type(model).__name__]  # as save_pretrained records it (TRL loads by it)
    model.config.save_pretrained(out_dir)
    model.generation_config.save_pretrained(out_dir)
    state, seen = {}, set()
    for name, tensor in model.state_dict().items():  # a tied tensor under its first name, as save_pretrained keeps it
        if tensor.data_ptr() not in seen:
            seen.add(tensor.data_ptr())
            state[name] = tensor.contiguous()
    save_file(state, str(Path(out_dir) / "model.safetensors"), metadata={"format": "pt"})


def warm_start(
    config: WarmStartConfig, cache_dir: str | Path | None = None, log: Callable[[str], None] = print
) -> Path:
    """Path of the warm-started tiny checkpoint for `config`, training it on a cache miss.

    Written to a temporary directory and renamed into place, so an interrupted run never leaves a
    half-written checkpoint that a later run would trust.
    """
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    final = root / f"tiny-warmstart-{config.cache_key()}"
    if (final / "warmstart.json").exists():
        log(f"warm start: reusing cached checkpoint {final}")
        return final
    log(f"warm start: training the tiny model ({config.steps} steps); cached at {final}")
    staging = root / f".{final.name}.tmp-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    train_warm_start(config, staging, log)
    (staging / "warmstart.json").write_text(json.dumps(asdict(config), indent=2, sort_keys=True))
    if final.exists() and not (final / "warmstart.json").exists():  # an unmarked entry (interrupted copy): replace it
        log(f"warm start: replacing the incomplete cache entry {final}")
        shutil.rmtree(final, ignore_errors=True)
    try:
        staging.rename(final)
    except OSError:
        if not (final / "warmstart.json").exists():
            raise
        shutil.rmtree(staging, ignore_errors=True)  # another process finished first: keep theirs
    return final


def resolve_model(name: str, warm: WarmStartConfig | None = None, cache_dir: str | Path | None = None,
                  log: Callable[[str], None] = print) -> str:
    """The one place a model name becomes something `from_pretrained` loads: `tiny` → the cached warm-started
    checkpoint for `warm` (trained on a miss; default settings when None); a real model's name (`smollm2-135m`,
    grail.models.pretrained.REAL_MODELS) → its cached conversion (`grail models fetch NAME` first); a local path →
    itself, if it is a checkpoint directory; anything else → as given (a Hub id)."""
    if name == TINY_MODEL:
        return str(warm_start(warm or WarmStartConfig(), cache_dir, log))
    if name in REAL_MODELS:
        return str(resolve_real_model(name, cache_dir))
    path = Path(name).expanduser()
    if name.startswith((".", "/", "~")) and not path.is_dir():
        raise FileNotFoundError(f"model directory {name!r} does not exist; give an existing save_pretrained "
                                f"directory, a Hub id such as Qwen/Qwen3-4B, `tiny` or {', '.join(REAL_MODELS)}.")
    check_not_gguf_dir(path)
    return name


def load_inference_model(path: str | Path, device: str | None = None, dtype: torch.dtype | None = None):
    """The one way a resolved model is loaded for sampling and probing (`grail eval`, `grail explain`, the saliency
    AUROC): on `device` (default cuda if available, else cpu) in `dtype` (default bfloat16 on cuda, float32 on
    cpu)."""
    from transformers import AutoModelForCausalLM

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = dtype or (torch.bfloat16 if str(device).startswith("cuda") else torch.float32)
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
