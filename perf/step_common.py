"""What the step benchmarks share (perf/step_overhead.py times methods side by side, perf/step_memory.py profiles
one step's memory by phase): the methods and variants they know, a trainer built for one of them with completions
forced to a length, a process-RSS peak sampler, and glibc told to hand freed memory back (step_overhead's docstring,
4, says why)."""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import os
import platform
import sys
import threading

# Variants measured besides the method table's entries (each table method runs as {"token_weighting": name}, GRAIL's
# with its fused saliency); benchmark name → the config fields that differ from GRPO's.
VARIANTS = {
    "grail": {"token_weighting": "grail", "saliency_path": "fused"},
    "grail_separate": {"token_weighting": "grail", "saliency_path": "separate"},
    "grail_rollout": {"token_weighting": "grail", "weights_from": "rollout_policy"},  # once per rollout (μ > 1)
    "oar_g_release": {"token_weighting": "oar_g", "oar_variant": "grail_release"},
    # each prompt computed once for the rows that share it, in the loss (grail.training.shared_prompt)
    "none_shared": {"token_weighting": "none", "shared_prompt": True},
    "grail_shared": {"token_weighting": "grail", "saliency_path": "fused", "shared_prompt": True},
}


def _benchmarks() -> dict[str, dict]:
    """Every benchmark name → its config fields: each method of the table (plug-ins included), then VARIANTS."""
    from grail.methods.table import METHODS as TABLE

    return {**{name: {"token_weighting": name} for name in TABLE}, **VARIANTS}


METHODS = _benchmarks()
CHECKPOINTING = {"off": {"activation_checkpointing": False},
                 "non_reentrant": {"activation_checkpointing": True,
                                   "activation_checkpointing_kwargs": {"use_reentrant": False}},
                 "reentrant": {"activation_checkpointing": True,
                               "activation_checkpointing_kwargs": {"use_reentrant": True}}}
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameter numbers (malloc.h)
MMAP_THRESHOLD_BYTES = 65536
MB = 2**20


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def tune_glibc_malloc() -> str | None:
    """Make glibc return freed memory to the OS (see the module docstring, 4); None where it is not glibc."""
    if platform.system() != "Linux":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        ok = libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1 and libc.mallopt(M_TRIM_THRESHOLD, 0) == 1
    except (OSError, AttributeError):
        return None
    return f"mallopt(M_MMAP_THRESHOLD={MMAP_THRESHOLD_BYTES}, M_TRIM_THRESHOLD=0)" if ok else None


class RssPeakSampler:
    """Context manager: peak resident set size (bytes) of this process, sampled by a thread every ~1 ms."""

    def __init__(self, interval_s: float = 0.001):
        self.interval_s = interval_s
        self.page_bytes = os.sysconf("SC_PAGE_SIZE")
        self.start_bytes = self.peak_bytes = 0
        self._stop = threading.Event()
        self._fd = -1

    def _rss(self) -> int:
        return int(os.pread(self._fd, 128, 0).split()[1]) * self.page_bytes  # statm: size resident shared ...

    def _sample(self) -> None:  # one reading; a subclass may keep more than the peak
        self.peak_bytes = max(self.peak_bytes, self._rss())

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> RssPeakSampler:
        self._fd = os.open("/proc/self/statm", os.O_RDONLY)
        self.start_bytes = self.peak_bytes = self._rss()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_bytes = max(self.peak_bytes, self._rss())
        os.close(self._fd)


def coin_reward(seed: int):
    """A reward of fair coin flips from random.Random(seed): each trainer gets its own generator, so every method
    sees the same sequence of rewards."""
    import random

    rng = random.Random(seed)

    def coin(completions, **kwargs) -> list[float]:
        return [float(rng.random() < 0.5) for _ in completions]

    return coin


def build_trainer(method: str, args: argparse.Namespace, use_cpu: bool, output_dir: str):
    from grail.methods.table import method_spec, scoped_values
    from grail.options.presets import TINY_CPU
    from grail.training.config import GRAILConfig
    from grail.training.data import load_train_dataset
    from grail.training.overrides import coerce
    from grail.training.run import resolve_model_path, reward_function
    from grail.training.trainer import GRAILTrainer

    values = {**TINY_CPU, "per_device_train_batch_size": args.rows, "num_generations": args.generations,
              "gradient_accumulation_steps": 1, "num_iterations": args.num_iterations,
              "max_completion_length": args.completion_tokens, **CHECKPOINTING[args.checkpointing],
              "generation_kwargs": {"min_new_tokens": args.completion_tokens}, "mask_truncated_completions": False,
              "seed": args.seed, "use_cpu": use_cpu, "bf16": args.bf16, "report_to": "none",
              "output_dir": os.path.join(output_dir, method), "cache_dir": args.cache_dir,
              "oar_scope": args.oar_scope, "model_name_or_path": args.model, **METHODS[method]}
    for key in ("max_steps", "save_steps", "logging_steps"):
        values.pop(key)
    if args.perturbation_chunk_tokens is not None:
        values["perturbation_chunk_tokens"] = args.perturbation_chunk_tokens
    if args.warmstart_steps is not None:
        values["warmstart_steps"] = args.warmstart_steps
    for key, text in args.fields.items():
        values[key] = coerce(key, text, "--set")
    cfg = GRAILConfig(**scoped_values(values, method_spec(values.get("token_weighting", "none"))))  # its options
    reward = coin_reward(args.seed) if args.reward == "coin" else reward_function(cfg)
    trainer = GRAILTrainer(model=resolve_model_path(cfg, log), reward_funcs=[reward], args=cfg,
                           train_dataset=load_train_dataset(cfg))
    return trainer, cfg




def prepare_for_steps(trainer):
    """The trainer prepared as `Trainer.train()` prepares it (optimizer, activation checkpointing, accelerate), for
    steps driven by hand; returns (the wrapped model, the train dataloader)."""
    trainer.create_optimizer()
    if trainer.args.activation_checkpointing:  # as Trainer.train() turns it on
        trainer.model.activation_checkpointing_enable(
            activation_checkpointing_kwargs=trainer.args.activation_checkpointing_kwargs)
    model, trainer.optimizer = trainer.accelerator.prepare(trainer.model, trainer.optimizer)
    trainer.model_wrapped = model
    trainer.current_gradient_accumulation_steps = 1
    return model, trainer.get_train_dataloader()
