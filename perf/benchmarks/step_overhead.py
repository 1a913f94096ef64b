"""Step overhead of each token-weighting method relative to GRPO: median step time and peak memory, as ratios.

What one "step" is: one optimiser step of `GRAILTrainer` through TRL's own code path, driven by this script so that
the methods can be interleaved in one process:
    trainer.training_step(model, batch, None)   # TRL: generate, score, (weights), loss, backward
    clip the gradient norm to max_grad_norm; optimizer.step(); model.zero_grad()
With gradient_accumulation_steps = 1 and num_iterations = 1, TRL regenerates on every step, so every timed step
includes generation. With `--num-iterations μ` (the release reuses each rollout μ = 4 times) one timed step is one
rollout and its μ optimiser steps; `grail_rollout` (weights_from rollout_policy) computes its weights once per
rollout where `grail` recomputes them on every pass.

Setup (one trainer per method, identical except for the method):
  * the warm-started tiny model (`model_name_or_path="tiny"`, cached; see grail.models.warmstart), so completions
    contain `\\boxed{}` answers and the probes really run; the synthetic task; the `tiny-cpu` preset (the
    paper's loss: dr_grpo, scale_rewards none, beta 0, asymmetric clip; num_iterations 1; lr 5e-5; AdamW);
  * `--rows` completions per step (default 16 = 2 prompts × `--generations` 8), one micro-batch, each exactly
    `--completion-tokens` N long (default 128: min_new_tokens = max_completion_length = N);
  * methods (`--methods`): harness.METHODS, every one but grail_rollout by default; none (GRPO) is always run,
    the baseline every ratio divides by. OAR's scored tokens: `--oar-scope` (default completion, departure 2).
  * CPU in fp32, or the CUDA device (`--device`), in bf16 with `--bf16`; activation checkpointing (`--checkpointing
    off | non_reentrant | reentrant`) for every method alike, GRPO included.

How it is measured:
  1. `--warmup` untimed steps per method (default 2; optimiser state, allocator and caches settle).
  2. `--rounds` rounds (default 5); in each, every method does one timed step, in an order that rotates by one
     place each round. Batches are fetched before the clock starts.
  3. Time: `time.perf_counter()` around the step (CUDA: synchronised before each reading).
  4. Memory, per step:
       CUDA (`memory_measure = "cuda_max_allocated"`): `reset_peak_memory_stats()` before the step;
         peak increase = `max_memory_allocated()` after it minus `memory_allocated()` before it.
       CPU (`memory_measure = "cpu_rss_peak_increase_sampled_1ms"`): harness.RssPeakSampler reads the process's
         resident set size about every 1 ms during the step; peak increase = highest sample minus RSS at step
         start. With glibc as a user's run has it (`--malloc default`, the default) freed pages stay resident from
         step to step, so this is not a step's own memory and the memory goals are not judged (met: null);
         `--malloc tuned`, run as a script, tunes glibc before any trainer is built (harness.tune_glibc_malloc: why,
         and what it costs the times) and judges them; `main()` called in process leaves the allocator alone.
     Reported: the median over the timed steps of the peak increase, and the highest absolute peak of the
     process (`process_peak_mem_mb_max`: RSS, or max_memory_allocated). Every method's trainer lives in this
     process, so the absolute peak is not what a user's run (one trainer) reaches. Ratios are of the per-step
     increases: medians divided by GRPO's medians.
  5. Attribution, per method: the median over steps of the sum of `weights/seconds` (the trainer's own metric, in
     all the step's passes; for the fused path the time after TRL's forward), of TRL's
     `_generate_and_score_completions` (`rollout_s`: generation, rewards, GRAIL's span finding) and of the
     optimiser's step (`optimizer_s`, AdamW only); what remains is loss and backward. For `grail`, after each
     timed step and off the clock, its floor (harness.input_only_backward) once per pass; `probe_to_floor` is the
     median probe time (`weights_seconds_median`) over the median floor.
  6. To show the weights were really computed, per method: mean completion length (completions/mean_length), the
     fraction of rows with a complete box (1 - weights/rows_without_box), of rows probed (weights/probed_rows: not a
     row with A = 0, nor, for GRAIL and the controls, one outside rollout_symmetry or without a box), of
     micro-batches on the fused path (weights/fused), the mean tokens before the first box, the mean reward, and the
     weights' effective-sample-size ratio over the rows with A != 0 (weights/ess_ratio: 1 = uniform, as GRPO's).
Output: one JSON object on stdout (config, per-method results, and harness.GOALS with whether each measured ratio
meets it; informational, the exit code is 0 either way). Everything else goes to stderr.

Departures from a training run:
  1. mask_truncated_completions = False (the preset has True): with min_new_tokens = max_completion_length
     every completion is truncated, and masking them would leave no token in the loss.
  2. `--oar-scope completion` by default (the OAR release and the config score the reasoning, before the box):
     forced completions put the box early (mean_tokens_before_box) and go on, so the reasoning would be a few
     dozen tokens where a real completion, boxed at the end, has about all N: every token is a real one's cost.
  3. No learning-rate schedule step (the preset's schedule is constant) and no logging or checkpointing.
  4. GRPO is `GRAILTrainer` with token_weighting none, which still finds the answer spans (its cost is in the
     baseline).

`--reward coin`: every completion's reward is a fair coin flip (seeded; the same sequence for every method), so a
group of G has mixed rewards with probability 1 - 2^(1-G) and every method does its full work on the rows it
reweights. A step's cost depends on which rows have A != 0, not on what the reward means; forced past their natural
end, a real model's completions are mostly wrong and few groups are mixed (SmolLM2, 256 tokens, 8 rows: no row
probed in a round). The mean reward and probed_rows_frac then describe the coin, not the model.

Run: `python perf/benchmarks/step_overhead.py` (defaults above; several minutes on 2 CPU cores). A real model:
`--model smollm2-135m --set task_style=words` (any field: --set FIELD=VALUE), with the model's own defaults.
`--smoke`: 16 tokens, 4 rows, 1 warm-up, 1 round, methods none and grail, and a warm start of
`--warmstart-steps` 2 (a barely trained model, built in seconds: its completions (almost) never close a box, so
GRAIL skips its probe; for testing the script only; tests/test_perf_scripts.py runs one whose boxes close).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time

from harness import (
    CHECKPOINTING,
    GOALS,
    MB,
    METHODS,
    RssPeakSampler,
    build_trainer,
    input_only_backward,
    log,
    prepare_for_steps,
    tune_glibc_malloc,
)

BASELINE = "none"
MIN_COMPLETION_TOKENS = 128
# harness.GOALS as (method, ratio key, largest ratio that meets it); every method's memory goal is GOALS["memory"].
TARGETS = (("grail", "time_ratio_to_grpo", GOALS["grail_time"]),
           ("grail", "probe_to_floor", GOALS["grail_probe_to_floor"]),
           ("oar_g", "time_ratio_to_grpo", GOALS["oar_g_time"]), ("oar_p", "time_ratio_to_grpo", GOALS["oar_p_time"]))
FLOOR_METHODS = ("grail",)  # fused saliency: its probe is one input-only backward (harness.input_only_backward)
DEFAULTS = {"completion_tokens": 128, "rows": 16, "generations": 8, "warmup": 2, "rounds": 5,
            "methods": ",".join(m for m in METHODS if m != "grail_rollout"), "warmstart_steps": None}
SMOKE_DEFAULTS = {"completion_tokens": 16, "rows": 4, "generations": 2, "warmup": 1, "rounds": 1,
                  "methods": "none,grail", "warmstart_steps": 2}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="step_overhead", description=__doc__.split("\n")[0],
                                     epilog="See the module docstring for what is measured and how.")
    parser.add_argument("--methods", help=f"comma-separated, from {', '.join(METHODS)} (default: all; "
                        f"{BASELINE} is always run: every ratio divides by it)")
    parser.add_argument("--completion-tokens", type=int, help="completion length N, forced (min_new_tokens = "
                        f"max_completion_length = N); at least {MIN_COMPLETION_TOKENS} unless --smoke (default 128)")
    parser.add_argument("--rows", type=int, help="completions per step, one micro-batch (default 16)")
    parser.add_argument("--generations", type=int, help="completions per prompt, G (default 8)")
    parser.add_argument("--warmup", type=int, help="untimed steps per method first (default 2)")
    parser.add_argument("--rounds", type=int, help="timed rounds, one step per method each (default 5)")
    parser.add_argument("--seed", type=int, default=42, help="seed of every trainer (default 42)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="auto: cuda if available")
    parser.add_argument("--bf16", action="store_true", help="bf16 mixed precision (for CUDA; default fp32)")
    parser.add_argument("--oar-scope", choices=("completion", "reasoning"), default="completion",
                        help="oar_scope of oar_g/oar_p (default completion; docstring, departure 2)")
    parser.add_argument("--perturbation-chunk-tokens", type=int, help="oar_p's (default: the config's)")
    parser.add_argument("--cache-dir", help="warm-start cache (default $GRAIL_CACHE or ~/.cache/grail-rl)")
    parser.add_argument("--warmstart-steps", type=int, help="warm-start steps of the tiny model (default: the "
                        "config default; --smoke: 2)")
    parser.add_argument("--num-iterations", type=int, default=1, help="TRL's num_iterations μ: one timed step is "
                        "then one rollout and its μ optimiser steps (default 1; the release's reuse: 4)")
    parser.add_argument("--checkpointing", choices=tuple(CHECKPOINTING), default="off",
                        help="activation checkpointing for every method, the baseline included (default off)")
    parser.add_argument("--smoke", action="store_true", help="tiny settings to test the script (docstring)")
    parser.add_argument("--short", action="store_true", help=f"allow --completion-tokens below "
                        f"{MIN_COMPLETION_TOKENS} (a task's own length); the goals are then listed, not judged")
    parser.add_argument("--model", default="tiny", help="model_name_or_path: `tiny` (default), a real model's name "
                        "such as smollm2-135m (`grail models fetch` it first), or a checkpoint directory")
    parser.add_argument("--reward", default="task", choices=("task", "coin"),
                        help="task: the run's reward (default); coin: each completion's reward is a fair coin flip, "
                        "seeded by --seed and the same sequence for every method (timing only; module docstring)")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="any other config field for every trainer, e.g. --set task_style=words (repeatable)")
    parser.add_argument("--malloc", choices=("default", "tuned"), default="default",
                        help="default: glibc as a user's run has it, so the times are a user's (default); tuned: glibc "
                        "returns freed memory, so a step's memory is its own and the memory goals are judged, but "
                        "every time ratio is pulled towards 1 (harness's docstring)")
    args = parser.parse_args(argv)
    try:
        args.fields = {k: v for k, _, v in (item.partition("=") for item in args.set)}
    except ValueError:
        parser.error("--set takes FIELD=VALUE")
    for key, value in (SMOKE_DEFAULTS if args.smoke else DEFAULTS).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHODS]
    if unknown or len(set(methods)) != len(methods):
        parser.error(f"--methods {args.methods!r}: give distinct names from {', '.join(METHODS)}.")
    args.methods = [BASELINE] + [m for m in methods if m != BASELINE]
    if args.completion_tokens < MIN_COMPLETION_TOKENS and not (args.smoke or args.short):
        parser.error(f"--completion-tokens {args.completion_tokens}: the benchmark needs completions of at least "
                     f"{MIN_COMPLETION_TOKENS} tokens (use --smoke to test the script with fewer).")
    for name in ("completion_tokens", "rows", "generations", "rounds", "num_iterations"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1.")
    if args.warmup < 0:
        parser.error("--warmup must be >= 0.")
    if args.rows % args.generations:
        parser.error(f"--rows {args.rows} must be a multiple of --generations {args.generations}.")
    return args


class MethodRun:
    """One method's trainer, prepared like `Trainer.train()` prepares it, and what its steps measured."""

    def __init__(self, name: str, trainer, cuda: bool):
        import torch

        self.name, self.trainer, self.cuda, self.torch = name, trainer, cuda, torch
        self.model, self.dataloader = prepare_for_steps(trainer)
        self.batches = iter(self.dataloader)
        self.rollout_seconds: list[float] = []
        inner = trainer._generate_and_score_completions

        def timed_rollout(inputs):  # instance attribute: TRL's _prepare_inputs calls this one
            start = self._clock()
            output = inner(inputs)
            self.rollout_seconds.append(self._clock() - start)
            self.last_rollout = output
            return output

        trainer._generate_and_score_completions = timed_rollout
        # per timed step (lists of floats, bytes or row counts), and TRL's metrics of the timed steps
        self.step_s, self.step_rollout_s, self.step_weights_s, self.step_optimizer_s = [], [], [], []
        self.peak_increase_bytes, self.peak_abs_bytes, self.tokens_before_box = [], [], []
        self.optimizer_seconds, self.floor_s, self.floor_rows = [], [], []
        self.metrics: dict[str, list[float]] = {}

    def _clock(self) -> float:
        if self.cuda:
            self.torch.cuda.synchronize()
        return time.perf_counter()

    def _next_batch(self):
        try:
            return next(self.batches)
        except StopIteration:
            self.batches = iter(self.dataloader)
            return next(self.batches)

    def _step(self, batches) -> None:
        """One rollout's optimiser steps: μ = num_iterations of them (TRL generates on the first)."""
        trainer, model = self.trainer, self.model
        for batch in batches:
            trainer.training_step(model, batch, None)
            if trainer.args.max_grad_norm and trainer.args.max_grad_norm > 0:
                trainer.accelerator.clip_grad_norm_(model.parameters(), trainer.args.max_grad_norm)
            start = self._clock()
            trainer.optimizer.step()
            self.optimizer_seconds.append(self._clock() - start)
            model.zero_grad()
            trainer.state.global_step += 1

    def step(self, timed: bool) -> None:
        torch, trainer = self.torch, self.trainer
        batch = [self._next_batch() for _ in range(trainer.args.num_iterations)]  # TRL's sampler repeats it μ times
        trainer._metrics["train"].clear()
        self.rollout_seconds.clear()
        self.optimizer_seconds.clear()
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            start = self._clock()
            self._step(batch)
            seconds = self._clock() - start
            peak = torch.cuda.max_memory_allocated()
            increase = peak - before
        else:
            with RssPeakSampler() as rss:
                start = time.perf_counter()
                self._step(batch)
                seconds = time.perf_counter() - start
            peak, increase = rss.peak_bytes, rss.peak_bytes - rss.start_bytes
        if len(self.rollout_seconds) != 1:
            raise RuntimeError(f"{self.name}: the step ran generation {len(self.rollout_seconds)} times, expected "
                               f"exactly once (TRL regenerates every steps_per_generation x num_iterations steps).")
        # The trainer pools its weights/* statistics when TRL logs (GRAILTrainer.log), which this loop never
        # calls: pool them here, after the clock, every step (a warm-up step's must not reach the next step).
        trainer.reduce_weight_metrics("train")
        if not timed:
            return
        self.step_s.append(seconds)
        self.peak_increase_bytes.append(increase)
        self.peak_abs_bytes.append(peak)
        self.step_rollout_s.append(self.rollout_seconds[0])
        self.step_optimizer_s.append(sum(self.optimizer_seconds))
        for key, values in trainer._metrics["train"].items():
            self.metrics.setdefault(key, []).extend(float(v) for v in values)
        self.step_weights_s.append(sum(trainer._metrics["train"].get("weights/seconds", [])))  # all μ passes
        weights = trainer.last_token_weights
        self.tokens_before_box.append(float(weights.reasoning_BT[weights.has_box_B].sum(1).float().mean())
                                      if bool(weights.has_box_B.any()) else float("nan"))
        if self.name in FLOOR_METHODS:  # after the clock: the floor on this step's rollout, once per pass
            floor = input_only_backward(trainer, self.model, self.last_rollout, self._clock)
            self.floor_s.append(float("nan") if floor is None else floor["seconds"] * len(batch))
            self.floor_rows.append(0 if floor is None else floor["rows"])

    def summary(self, baseline: MethodRun | None) -> dict:
        def mean(key: str) -> float | None:
            return statistics.fmean(self.metrics[key]) if self.metrics.get(key) else None

        def median(values) -> float | None:
            values = [v for v in values if v == v]  # drop NaN
            return statistics.median(values) if values else None

        without_box = mean("weights/rows_without_box")
        out = {
            "median_step_s": median(self.step_s),
            "step_s": self.step_s,
            "time_ratio_to_grpo": None,
            "peak_mem_increase_mb_median": median(self.peak_increase_bytes) / MB,
            "peak_mem_increase_mb": [b / MB for b in self.peak_increase_bytes],
            "process_peak_mem_mb_max": max(self.peak_abs_bytes) / MB,  # every method's trainer is in this process
            "mem_ratio_to_grpo": None,
            "weights_seconds_median": median(self.step_weights_s),  # per step: a rollout's μ passes together
            "probe_floor_s_median": median(self.floor_s),
            "probe_floor_rows_mean": statistics.fmean(self.floor_rows) if self.floor_rows else None,
            "probe_to_floor": None,
            "rollout_s_median": median(self.step_rollout_s),
            "optimizer_s_median": median(self.step_optimizer_s),  # clip excluded; AdamW's step only
            "mean_completion_tokens": mean("completions/mean_length"),
            "rows_with_box_frac": None if without_box is None else 1.0 - without_box,
            "probed_rows_frac": mean("weights/probed_rows"),
            "fused_frac": mean("weights/fused"),
            "mean_tokens_before_box": median(self.tokens_before_box),
            "reward_mean": mean("reward"),
            "ess_ratio_mean": mean("weights/ess_ratio"),
        }
        if out["probe_floor_s_median"] and out["weights_seconds_median"] is not None:
            out["probe_to_floor"] = out["weights_seconds_median"] / out["probe_floor_s_median"]
        if baseline is not None:
            base_time, base_mem = median(baseline.step_s), median(baseline.peak_increase_bytes)
            out["time_ratio_to_grpo"] = out["median_step_s"] / base_time
            out["mem_ratio_to_grpo"] = median(self.peak_increase_bytes) / base_mem if base_mem > 0 else None
        return out


def run(args: argparse.Namespace, malloc_tuning: str | None) -> dict:
    import torch
    import transformers
    import trl

    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if cuda and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is available.")
    with tempfile.TemporaryDirectory(prefix="grail-step-overhead-") as output_dir:
        runs, cfg = [], None
        for name in args.methods:
            log(f"building the {name} trainer ...")
            trainer, cfg = build_trainer(name, args, use_cpu=not cuda, output_dir=output_dir)
            runs.append(MethodRun(name, trainer, cuda))
        torch.manual_seed(args.seed)
        order = list(runs)
        total_rounds = args.warmup + args.rounds
        for r in range(total_rounds):
            timed = r >= args.warmup
            shift = r % len(order)
            for method_run in order[shift:] + order[:shift]:
                method_run.step(timed)
                if timed:
                    metrics = method_run.trainer._metrics["train"]
                    log(f"round {r - args.warmup + 1}/{args.rounds} {method_run.name}: "
                        f"{method_run.step_s[-1]:.3f} s, rollout {method_run.step_rollout_s[-1]:.3f} s, "
                        f"weights {sum(metrics.get('weights/seconds', [])):.3f} s, "
                        f"probed rows {statistics.fmean(metrics.get('weights/probed_rows', [0.0])):.2f}, "
                        f"peak +{method_run.peak_increase_bytes[-1] / MB:.1f} MB")
                else:
                    log(f"warm-up {r + 1}/{args.warmup} {method_run.name} done")
    baseline = runs[0]
    results = {run_.name: run_.summary(baseline) for run_ in runs}
    targets = []
    judged = not args.short or args.completion_tokens >= MIN_COMPLETION_TOKENS  # --short below 128: listed only
    for method, key, limit in TARGETS:
        measured = results.get(method, {}).get(key)
        targets.append({"method": method, "ratio": key, "at_most": limit, "measured": measured,
                        "met": None if measured is None or not judged else measured <= limit})
    own_memory = cuda or malloc_tuning is not None  # with glibc's default, freed pages hide a step's memory
    for method in args.methods[1:]:
        measured = results[method]["mem_ratio_to_grpo"]
        limit = GOALS["memory"]
        targets.append({"method": method, "ratio": "mem_ratio_to_grpo", "at_most": limit, "measured": measured,
                        "met": None if measured is None or not (judged and own_memory) else measured <= limit})
    device = torch.cuda.get_device_name() if cuda else f"cpu ({os.cpu_count()} cores visible)"
    return {
        "benchmark": "step_overhead",
        "config": {
            **{key: getattr(args, key) for key in ("methods", "rows", "generations", "completion_tokens", "warmup",
                                                   "rounds", "seed", "smoke", "short", "oar_scope", "checkpointing",
                                                   "model", "fields", "reward")},
            "prompts_per_step": args.rows // args.generations, "device": device,
            "dtype": "bf16 mixed precision" if args.bf16 else "fp32", "torch_threads": torch.get_num_threads(),
            "perturbation_chunk_tokens": cfg.perturbation_chunk_tokens, "warmstart_steps": cfg.warmstart_steps,
            "loss_type": cfg.loss_type, "scale_rewards": cfg.scale_rewards, "beta": cfg.beta,
            "num_iterations": cfg.num_iterations, "mask_truncated_completions": cfg.mask_truncated_completions,
            "torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__,
            "python": platform.python_version(),
        },
        "memory_measure": "cuda_max_allocated" if cuda else (
            "cpu_rss_peak_increase_sampled_1ms" if malloc_tuning else
            "cpu_rss_peak_increase_sampled_1ms, default allocator: not a step's own memory"),
        "malloc_tuning": None if cuda else malloc_tuning,
        "methods": results,
        "targets": targets,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stdout = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):  # libraries' prints must not corrupt the one JSON object
        result = run(args, _malloc_tuning)
    print(json.dumps(result, indent=2), file=stdout, flush=True)
    return 0


_malloc_tuning: str | None = None  # set only by a script run with --malloc tuned; main() leaves the allocator alone

if __name__ == "__main__":
    if parse_args(None).malloc == "tuned":
        _malloc_tuning = tune_glibc_malloc()  # before any trainer is built
    sys.exit(main())
