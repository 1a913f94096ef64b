"""What the benchmarks of perf/benchmarks/ share: the one table of methods and variants they measure (`METHODS`), the
one way a trainer is built for one of them (`make_trainer`; `build_trainer` for a run of the tiny-cpu preset with
completions forced to a length), the goals the cost figures are judged against (`GOALS`), the growth exponent and
plot of a cost curve, GRAIL's probe floor, a process-RSS peak sampler, and glibc told to hand freed memory back.

A script of this folder run as `python perf/benchmarks/x.py` finds this module because Python puts the script's folder
first on sys.path (the tests find it through pytest's `pythonpath`).

Memory on the CPU. The RSS sampler reads /proc/self/statm from a thread about every 1 ms (it needs the GIL, so during
pure-Python stretches a sample can wait up to the interpreter's switch interval, 5 ms; torch kernels release the GIL).
glibc keeps freed memory by default, which hides a step's allocations behind the previous step's freed pages:
`tune_glibc_malloc` (mallopt(M_MMAP_THRESHOLD, 65536) and mallopt(M_TRIM_THRESHOLD, 0), the parameters of the
MALLOC_MMAP_THRESHOLD_=65536 and MALLOC_TRIM_THRESHOLD_=0 environment variables; process-wide, before any model is
loaded) maps blocks of 64 KiB and more and returns them on free and trims the heap top on every free; small blocks
that fragment the heap can still be reused unseen, so the figure is a lower bound on a step's extra memory. The tuning
costs time, and not evenly (malloc_cost.py: on SmolLM2, 2-core CPU, generation 1.67x slower, a forward
+ backward 1.16x), so it shrinks a probe's share of a step and pulls every time ratio towards 1: step_overhead.py and
cost_curves.py time with glibc as a user's run has it and tune it only when asked (`--malloc tuned`, for memory);
step_memory.py and oar_p_memory.py, which measure memory alone, always tune it.

GRAIL's probe floor (`input_only_backward`): the least its fused probe could cost. The fused path reads the saliency
from the loss's own forward, so what it adds to a step is one backward from the answer NLL to the leaf (the
embeddings' output), with no parameter gradients, plus the weighting pipeline. Its floor is that backward alone, on
the probed rows alone: a forward (TRL's log-prob method) of the rows `probe_rows` selects, untimed, then, timed,
d(answer NLL) / d(leaf output) by torch.autograd.grad. The fused probe runs its backward on the whole micro-batch and
then the pipeline, so probe / floor > 1 measures both."""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import math
import os
import platform
import sys
import threading
import time

# Variants measured besides the method table's entries (each table method runs as {"token_weighting": name}, GRAIL's
# with its fused saliency); benchmark name → the config fields that differ from GRPO's.
VARIANTS = {
    "entropy_separate": {"token_weighting": "entropy", "saliency_path": "separate"},
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


def builtin_methods() -> list[str]:
    """The built-in methods (grail.methods.builtin.BUILTIN), GRPO's `none` first: what the benchmarks run by default."""
    from grail.methods.builtin import BUILTIN

    return [spec.name for spec in BUILTIN]
CHECKPOINTING = {"off": {"activation_checkpointing": False},
                 "non_reentrant": {"activation_checkpointing": True,
                                   "activation_checkpointing_kwargs": {"use_reentrant": False}},
                 "reentrant": {"activation_checkpointing": True,
                               "activation_checkpointing_kwargs": {"use_reentrant": True}}}
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameter numbers (malloc.h)
MMAP_THRESHOLD_BYTES = 65536
MB = 2**20
# The goals the cost figures are judged against (informational: a benchmark's exit code is 0 either way): GRAIL's step
# at most 1.15x GRPO's and its probe at most 1.1x its floor, OAR-G's step at most 1.15x, OAR-P's at most 3x (at
# T = 1024 on a curve), every method's memory at most 1.05x GRPO's.
GOALS = {"grail_time": 1.15, "grail_probe_to_floor": 1.10, "oar_g_time": 1.15, "oar_p_time": 3.0, "memory": 1.05}


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


def make_trainer(method: str, values: dict, *, reward=None, model=None, processing_class=None, train_dataset=None):
    """A `GRAILTrainer` for `method` (a `METHODS` name): `values` (config fields shared by every method of a benchmark)
    with the method's own fields over them, less the option fields the method does not read (scoped_values, as
    `grail compare` hands each arm its share). The model, reward and dataset are the config's unless given."""
    from grail.methods.table import method_spec, scoped_values
    from grail.training.config import GRAILConfig
    from grail.training.data import load_train_dataset
    from grail.training.run import resolve_model_path, reward_function
    from grail.training.trainer import GRAILTrainer

    values = {**values, **METHODS[method]}
    cfg = GRAILConfig(**scoped_values(values, method_spec(values.get("token_weighting", "none"))))
    trainer = GRAILTrainer(model=resolve_model_path(cfg, log) if model is None else model,
                           processing_class=processing_class, reward_funcs=[reward or reward_function(cfg)], args=cfg,
                           train_dataset=load_train_dataset(cfg) if train_dataset is None else train_dataset)
    return trainer, cfg


def build_trainer(method: str, args: argparse.Namespace, use_cpu: bool, output_dir: str):
    """`make_trainer` on the tiny-cpu preset with every completion forced to `args.completion_tokens`, one
    micro-batch of `args.rows` (step_overhead's docstring lists what departs from a training run)."""
    from grail.options.presets import TINY_CPU
    from grail.training.overrides import coerce

    values = {**TINY_CPU, "per_device_train_batch_size": args.rows, "num_generations": args.generations,
              "gradient_accumulation_steps": 1, "num_iterations": args.num_iterations,
              "max_completion_length": args.completion_tokens, **CHECKPOINTING[args.checkpointing],
              "generation_kwargs": {"min_new_tokens": args.completion_tokens}, "mask_truncated_completions": False,
              "seed": args.seed, "use_cpu": use_cpu, "bf16": args.bf16, "report_to": "none",
              "output_dir": os.path.join(output_dir, method), "cache_dir": args.cache_dir,
              "oar_scope": args.oar_scope, "model_name_or_path": args.model}
    for key in ("max_steps", "save_steps", "logging_steps"):
        values.pop(key)
    if args.perturbation_chunk_tokens is not None:
        values["perturbation_chunk_tokens"] = args.perturbation_chunk_tokens
    if args.warmstart_steps is not None:
        values["warmstart_steps"] = args.warmstart_steps
    for key, text in args.fields.items():
        values[key] = coerce(key, text, "--set")
    return make_trainer(method, values, reward=coin_reward(args.seed) if args.reward == "coin" else None)


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


def input_only_backward(trainer, model, batch: dict, clock=time.perf_counter) -> dict | None:
    """Seconds of GRAIL's probe floor (module docstring) on the probed rows of `batch` (a rollout's output, as the
    loss receives it), and how many rows; None when no row is probed, or with `shared_prompt` (its forward runs the
    leaf once for the prompt and once for the completions, and the floor is defined on one forward of whole rows)."""
    import torch

    if getattr(trainer.args, "shared_prompt", False):
        return None

    from grail.methods import probes
    from grail.methods.weighting import probe_rows

    mask_BT = trainer.real_token_mask(batch)
    spans = trainer._spans(batch, mask_BT)
    options = trainer.weighting
    rows_B = probe_rows(batch["advantages"], spans, mask_BT, options, spec=trainer.method)
    if not bool(rows_B.any()):
        return None
    ids_PL = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)[rows_B]
    mask_PL = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)[rows_B]
    leaf = probes.leaf_module(trainer.accelerator.unwrap_model(model), options.saliency_leaf)
    with probes.output_of(leaf) as captured:
        logps_PT = trainer._get_per_token_logps_and_entropies(model, ids_PL, mask_PL,
                                                              batch["completion_ids"].shape[1])[0]
    if len(captured) != 1:
        raise RuntimeError(f"probe floor: the leaf module ran {len(captured)} times in one forward (expected 1).")
    nll = -(logps_PT * spans.probe_span(options.answer_nll_span)[rows_B]).sum()
    start = clock()
    probes.leaf_gradient(nll, captured[0])
    return {"seconds": clock() - start, "rows": int(rows_B.sum())}


def growth_exponent(tokens: list[int], extra: list[float | None]) -> float | None:
    """Least-squares slope of log(extra) on log(T) over the positive extras; None with fewer than two."""
    points = [(math.log(t), math.log(e)) for t, e in zip(tokens, extra, strict=True) if e is not None and e > 0]
    if len(points) < 2:
        return None
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / sxx if sxx > 0 else None


def goal_entry(name: str, limit: float, measured: list[tuple[int, float | None]]) -> dict:
    """One goal's record: the values measured (by T; None where none was) and whether every one is within limit."""
    values = [(t, v) for t, v in measured if v is not None]
    return {"goal": name, "at_most": limit, "measured": dict(values) if values else None,
            "met": all(v <= limit for _, v in values) if values else None}


def plot_curves(curves: dict, path, title: str, memory_title: str, log_time: bool = False) -> None:
    """Three panels of {method: {"points": [...], "growth_exponent": x}}: the time ratio to GRPO, the extra seconds per
    completion (log-log, with the fitted exponent) and the memory ratio, one colour per method in every panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_time, ax_extra, ax_mem) = plt.subplots(1, 3, figsize=(15, 4.2))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for number, (method, curve) in enumerate(curves.items()):
        style = {"marker": "o", "color": colours[number % len(colours)]}
        tokens = [p["tokens"] for p in curve["points"]]
        ax_time.plot(tokens, [p["time_ratio_to_grpo"] for p in curve["points"]], label=method, **style)
        memory = [(t, p["mem_ratio_to_grpo"]) for t, p in zip(tokens, curve["points"], strict=True)
                  if p["mem_ratio_to_grpo"] is not None]
        if memory:
            ax_mem.plot([t for t, _ in memory], [m for _, m in memory], label=method, **style)
        extra = [(t, p["extra_s_per_completion"]) for t, p in zip(tokens, curve["points"], strict=True)
                 if p["extra_s_per_completion"] > 0]
        if method != "none" and extra:
            exponent = curve["growth_exponent"]
            label = f"{method} (T^{exponent:.2f})" if exponent is not None else method
            ax_extra.plot([t for t, _ in extra], [e for _, e in extra], label=label, **style)
    ax_time.axhline(GOALS["grail_time"], color="grey", ls=":", lw=1)
    ax_mem.axhline(GOALS["memory"], color="grey", ls=":", lw=1)
    for ax, name in ((ax_time, "step time / GRPO's"), (ax_extra, "extra seconds per completion (log-log)"),
                     (ax_mem, memory_title)):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("completion tokens T")
        ax.set_title(name, fontsize=10)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    if log_time:
        ax_time.set_yscale("log")
    ax_extra.set_yscale("log")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
