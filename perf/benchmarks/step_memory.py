"""Where a step's memory peak comes from: one `GRAILTrainer` in this process (as a user's run holds), one method, its
resident set size (RSS) sampled about every millisecond through whole optimiser steps, each sample tagged with the
phase the step was in.

    python perf/benchmarks/step_memory.py --model smollm2-135m --set task_style=words --method grail \\
        --rows 8 --generations 4 --completion-tokens 256 [--warmup 1] [--steps 2] [--json out.json]

Phases, innermost first (a sample belongs to the innermost phase running when it was taken):
  generation     TRL's `_generate` (sampling the completions)
  rewards        TRL's `_calculate_rewards`
  rollout logps  TRL's `_get_per_token_logps_and_entropies` inside the rollout (old/reference log-probs)
  rollout other  the rest of `_generate_and_score_completions` (advantages, grail's answer spans)
  probe          the method's weights: grail's `token_weights` (separate path) or `fused_signal` + `weights_from_signal`
                 (fused path: the saliency's input-gradient and the pipeline)
  loss forward   TRL's `_get_per_token_logps_and_entropies` inside the loss (the policy forward; fused-LM-head)
  loss other     the rest of TRL's `_compute_loss` (ratios, clipping, the masked mean)
  backward       `accelerator.backward`
  optimizer      the optimiser's step (AdamW)
  step other     the rest (gradient clipping, zero_grad, TRL's `training_step` glue)
Per phase: seconds (exclusive), the highest RSS sampled in it, and that peak above the RSS at the step's start.
The step's peak is the highest sample of all; its phase is the one that sets the peak. As in step_overhead.py
(its docstring, 4), glibc is told to return freed memory, so a phase's peak is its own and not an earlier phase's
freed pages; what glibc keeps for small blocks still counts, so the figures are a lower bound on a phase's need.
The trainer is built as step_overhead.py builds it (the `tiny-cpu` preset's loss, completions forced to
--completion-tokens with min_new_tokens, one micro-batch of --rows unless `--set per_device_train_batch_size=M
--set gradient_accumulation_steps=K` with M x K = --rows split the loss into K micro-batches of M), each completion's
reward a fair coin flip (as step_overhead's `--reward coin`: groups are mixed, so the probe runs on the rows it would
reweight); `--set FIELD=VALUE` sets any config field.
`--smoke`: the tiny model (a 2-step warm start unless --warmstart-steps), 4 rows of 16 tokens unless given; the
test (tests/test_perf_scripts.py) gives a warm start that closes its boxes and 32 rows of 32 tokens.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import sys
import tempfile
import time

from harness import (
    MB,
    METHODS,
    RssPeakSampler,
    build_trainer,
    log,
    prepare_for_steps,
    tune_glibc_malloc,
)

PHASES = ("generation", "rewards", "rollout logps", "rollout other", "probe", "loss forward", "loss other",
          "backward", "optimizer", "step other")
SMOKE = {"model": "tiny", "rows": 4, "generations": 2, "completion_tokens": 16}


class PhaseTimeline(RssPeakSampler):
    """A stack of the phases running now, and RSS samples tagged with its top, taken by the sampler's thread every
    ~1 ms."""

    def __init__(self, interval_s: float = 0.001):
        super().__init__(interval_s)
        self.stack: list[str] = []
        self.samples: list[tuple[str, int]] = []
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self._since = 0.0

    def _sample(self) -> None:
        if self.stack:
            self.samples.append((self.stack[-1], self._rss()))

    def _switch(self) -> None:  # charge the time since the last switch to the phase on top
        now = time.perf_counter()
        if self.stack:
            self.seconds[self.stack[-1]] += now - self._since
        self._since = now

    @contextlib.contextmanager
    def phase(self, name: str):
        self._switch()
        self.stack.append(name)
        self._sample()
        try:
            yield
        finally:
            self._sample()
            self._switch()
            self.stack.pop()

    def wrap(self, function, name):
        """`function` run inside phase `name` (a string, or a callable of the stack giving it)."""
        def wrapped(*args, **kwargs):
            with self.phase(name(self.stack) if callable(name) else name):
                return function(*args, **kwargs)
        return wrapped


def instrument(trainer, timeline: PhaseTimeline):
    """Tag the trainer's phases: TRL's methods through a subclass (so the fused path's own instance-level shadowing
    of the log-prob method keeps working), grail's probe functions where the trainer module calls them, the
    accelerator's backward and the optimiser's step on their objects."""
    import grail.training.trainer as trainer_module

    def logps_phase(stack):
        return "rollout logps" if "rollout other" in stack else "loss forward"

    cls = type(trainer)
    wrapped = {"_generate_and_score_completions": "rollout other", "_generate": "generation",
               "_calculate_rewards": "rewards", "_get_per_token_logps_and_entropies": logps_phase,
               "_compute_loss": "loss other"}
    trainer.__class__ = type(f"Profiled{cls.__name__}", (cls,),
                             {name: timeline.wrap(getattr(cls, name), phase) for name, phase in wrapped.items()})
    originals = {name: getattr(trainer_module, name) for name in ("token_weights", "fused_signal",
                                                                    "weights_from_signal")}
    for name, function in originals.items():
        setattr(trainer_module, name, timeline.wrap(function, "probe"))
    trainer.accelerator.backward = timeline.wrap(trainer.accelerator.backward, "backward")
    trainer.optimizer.step = timeline.wrap(trainer.optimizer.step, "optimizer")

    def undo():  # the module's functions are process-wide: give them back (a caller in process, e.g. a test)
        for name, function in originals.items():
            setattr(trainer_module, name, function)
    return undo


def one_step(trainer, model, batch, timeline: PhaseTimeline) -> None:
    with timeline.phase("step other"):
        for _ in range(trainer.current_gradient_accumulation_steps):  # TRL generates on the first micro-batch
            trainer.training_step(model, batch, None)
        if trainer.args.max_grad_norm and trainer.args.max_grad_norm > 0:
            trainer.accelerator.clip_grad_norm_(model.parameters(), trainer.args.max_grad_norm)
        trainer.optimizer.step()
        model.zero_grad()
        trainer.state.global_step += 1
    trainer.reduce_weight_metrics("train")


def profile(samples: list[tuple[str, int]], seconds: dict[str, float], start_bytes: int) -> dict:
    """Per phase: seconds, peak RSS (MB) and peak above the step's start; the step's peak and the phase holding it."""
    phases = {}
    for name in PHASES:
        rss = [b for phase, b in samples if phase == name]
        phases[name] = {"seconds": seconds[name], "samples": len(rss),
                        "peak_mb": max(rss) / MB if rss else None,
                        "peak_above_start_mb": (max(rss) - start_bytes) / MB if rss else None}
    phase, peak = max(samples, key=lambda s: s[1])
    return {"start_mb": start_bytes / MB, "peak_mb": peak / MB, "peak_phase": phase,
            "seconds": sum(seconds.values()), "phases": phases}


def table(step: dict) -> str:
    lines = [f"step: {step['seconds']:.2f} s, RSS at start {step['start_mb']:.0f} MB, peak {step['peak_mb']:.0f} MB "
             f"in {step['peak_phase']}", "| phase | seconds | peak RSS (MB) | above the step's start (MB) |",
             "|---|---|---|---|"]
    for name, p in step["phases"].items():
        if p["samples"]:
            lines.append(f"| {name} | {p['seconds']:.2f} | {p['peak_mb']:.0f} | {p['peak_above_start_mb']:+.0f} |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="step_memory", description=__doc__.split("\n")[0],
                                     epilog="See the module docstring for the phases and what is measured.")
    parser.add_argument("--method", default="grail", choices=tuple(METHODS))
    parser.add_argument("--model", default="smollm2-135m", help="a real model's name, `tiny`, or a checkpoint")
    parser.add_argument("--rows", type=int, default=8, help="completions per step (default 8)")
    parser.add_argument("--generations", type=int, default=4, help="completions per prompt (default 4)")
    parser.add_argument("--completion-tokens", type=int, default=256, help="forced completion length (default 256)")
    parser.add_argument("--warmup", type=int, default=1, help="unprofiled steps first (default 1)")
    parser.add_argument("--steps", type=int, default=1, help="profiled steps, each reported (default 1)")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="any config field, e.g. --set task_style=words (repeatable)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--cache-dir", help="warm-start and model cache (default $GRAIL_CACHE or ~/.cache/grail-rl)")
    parser.add_argument("--warmstart-steps", type=int, help="the tiny model's warm-start steps (default: the config's)")
    parser.add_argument("--json", help="write the result here too")
    parser.add_argument("--smoke", action="store_true", help="the tiny model, 4 rows of 16 tokens")
    args = parser.parse_args(argv)
    args.fields = dict(item.partition("=")[::2] for item in args.set)
    if any("=" not in item for item in args.set):
        parser.error("--set takes FIELD=VALUE")
    if args.smoke:
        given = {a.lstrip("-").replace("-", "_").split("=")[0] for a in (argv or sys.argv[1:]) if a.startswith("--")}
        for key, value in SMOKE.items():
            if key not in given:
                setattr(args, key, value)
        if args.warmstart_steps is None:
            args.warmstart_steps = 2
    if args.rows % args.generations:
        parser.error(f"--rows {args.rows} must be a multiple of --generations {args.generations}.")
    # what harness.build_trainer reads besides the above
    args.num_iterations, args.checkpointing, args.bf16, args.oar_scope = 1, "off", False, "completion"
    args.perturbation_chunk_tokens, args.reward = None, "coin"
    return args


def run(args: argparse.Namespace, malloc_tuning: str | None) -> dict:
    import torch

    with tempfile.TemporaryDirectory(prefix="grail-step-memory-") as output_dir:
        trainer, cfg = build_trainer(args.method, args, use_cpu=True, output_dir=output_dir)
        model, dataloader = prepare_for_steps(trainer)
        trainer.current_gradient_accumulation_steps = cfg.gradient_accumulation_steps
        batches = iter(dataloader)
        timeline = PhaseTimeline()
        undo = instrument(trainer, timeline)
        torch.manual_seed(args.seed)
        steps = []
        with contextlib.ExitStack() as stack:
            stack.callback(undo)
            stack.enter_context(timeline)
            for i in range(args.warmup + args.steps):
                batch = next(batches)
                timeline.samples.clear()
                timeline.seconds = dict.fromkeys(PHASES, 0.0)
                start_bytes = timeline._rss()
                one_step(trainer, model, batch, timeline)
                if i >= args.warmup:
                    steps.append(profile(list(timeline.samples), timeline.seconds, start_bytes))
                    log(table(steps[-1]))
                else:
                    log(f"warm-up step {i + 1} done")
        metrics = {k: float(sum(v) / len(v)) for k, v in trainer._metrics["train"].items() if v}
        attention = getattr(trainer.model.config, "_attn_implementation", None)
    return {"benchmark": "step_memory", "method": args.method, "model": args.model, "rows": args.rows,
            "generations": args.generations, "completion_tokens": args.completion_tokens, "fields": args.fields,
            "per_device_train_batch_size": cfg.per_device_train_batch_size,
            "gradient_accumulation_steps": cfg.gradient_accumulation_steps, "reward": "coin",
            "attn_implementation": attention, "malloc_tuning": malloc_tuning, "torch_threads": torch.get_num_threads(),
            "python": platform.python_version(), "steps": steps, "last_step_metrics": metrics}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stdout = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):
        result = run(args, _malloc_tuning)
    text = json.dumps(result, indent=2)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text)
    print(text, file=stdout, flush=True)
    return 0


_malloc_tuning: str | None = None  # set only when run as a script (harness's docstring says why)

if __name__ == "__main__":
    _malloc_tuning = tune_glibc_malloc()
    sys.exit(main())
