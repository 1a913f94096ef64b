"""Where a real model's training step spends its time: seconds and FLOP/s of each phase, fp32 beside bf16, against
this machine's own matmul peak in each precision.

Precisions (`--precisions`, any of them in one run, side by side): `fp32`; `bf16`, a CPU bf16 run as it trains by
default (autocast over fp32 master weights, generation from bf16 weights: the `cpu_bf16_generation` field);
`bf16-autocast-generation`, the same with cpu_bf16_generation="autocast" (generation under autocast over the fp32
weights).

What one step is: `trainer.train()` of `GRAILTrainer` on the regime's setup (the `smollm-chains` preset: SmolLM2 after
its 30-step `grail sft` warm start, lr 5e-6, shared prompt, one prompt's 8 completions per micro-batch), `--prompts`
prompts a step (the regime: 8), with two departures that make every step the same amount of work, so that the FLOPs
counted in one step hold for the others:
  1. every completion is exactly `--completion-tokens` long (min_new_tokens = max_completion_length; the regime's
     solutions average 56 tokens), truncated completions not masked, OAR's scored tokens the whole completion;
  2. the reward is a fair coin (harness.coin_reward, seeded): nearly every group is mixed, so every method does its
     full work on every row (a real step's share of mixed groups, 62% from this start, only scales the probes).

Phases, timed by wrappers on the trainer's own methods (nothing of TRL's is re-implemented):
  generation      TRL's `_generate_single_turn` (the shared-prefill generate)
  rollout rest    the rest of `_generate_and_score_completions` (rewards, advantages, the answer spans)
  probe           the trainer's probe functions: a separate probe (`token_weights`), or on the fused path the signal
                  and weights computed after TRL's forward (`fused_signal` or `fused_probe_signal`, then
                  `weights_from_signal`: what `TokenWeights.seconds` counts), in the loss or, with weights_from
                  rollout_policy, in the rollout
  loss forward    `_compute_loss` less the probe
  backward        `accelerator.backward`
  optimizer       AdamW's step (between transformers' pre- and post-optimizer-step callbacks; gradient clipping before
                  it is in "other")
  other           the step less the phases (clipping, zeroing, callbacks, Python)

FLOPs: the first step of each trainer is a warm-up, run under a dispatch mode that adds each op's FLOPs
(torch.utils.flop_counter's formulas: matmuls and the attention kernels it knows; on CPU, PyTorch's sdpa kernel is
not among them, which leaves out attention's score FLOPs, about 1% of a step at these lengths) to the phase it runs
in; the timed steps run without it. The probe's FLOPs are scaled by the timed step's probed rows over the warm-up's.
The peak: `grail.models.precision.matmul_gflops` at SmolLM2's MLP shape, in fp32 and bf16, measured at the start.

    python perf/benchmarks/step_phases.py --methods none,grail,oar_g,oar_p --precisions fp32,bf16 --prompts 2 \
        --steps 2 --json phases.json          # --bf16-methods none: bf16 for GRPO only
    python perf/benchmarks/step_phases.py --methods none --precisions fp32,bf16,bf16-autocast-generation --prompts 2
One thread (`--threads 1`, the default), glibc as a user's run has it. Prints one JSON object on stdout: per
(method, precision) each phase's median seconds over the timed steps with every step's figure, GFLOP and GFLOP/s, the
step's total, and the ratios of each bf16 step to its fp32 one ("none bf16/fp32", "none
bf16-autocast-generation/fp32") and of each method to GRPO in the same precision.
Nothing else may run on the machine while it times. Needs `grail models fetch smollm2-135m` and
`grail sft --preset smollm-chains`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

PHASES = ("generation", "rollout rest", "probe", "loss forward", "backward", "optimizer", "other")
# precision label -> the config fields it sets (bf16 on CPU: autocast over fp32 master weights)
PRECISIONS = {"fp32": {"bf16": False},
              "bf16": {"bf16": True, "cpu_bf16_generation": "weights"},
              "bf16-autocast-generation": {"bf16": True, "cpu_bf16_generation": "autocast"}}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--methods", help="comma-separated benchmark names (default none,grail,oar_g,oar_p; --smoke: "
                   "none,grail): each method of the table and perf/benchmarks/harness.py's variants, or "
                   "METHOD@field=value@... with fields of its own (oar_p_amortized@oar_p_amortized_exact_every=8)")
    p.add_argument("--precisions", default="fp32,bf16", help="comma-separated: fp32, bf16 (CPU autocast over fp32 "
                   "master weights, generation from bf16 weights), bf16-autocast-generation (bf16 with generation "
                   "under autocast too)")
    p.add_argument("--bf16-methods", help="run bf16 for these methods only (default: every method)")
    p.add_argument("--prompts", type=int, default=8, help="prompts a step, 8 completions each (the regime: 8)")
    p.add_argument("--completion-tokens", type=int, default=64, help="every completion's exact length")
    p.add_argument("--steps", type=int, default=2, help="timed steps per trainer, after one counted warm-up")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--model", default="sft:smollm2-135m:sft_steps=30")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--smoke", action="store_true", help="the tiny model on the symbolic task, 4 tokens, 1 step: "
                   "for testing the script only")
    p.add_argument("--json", help="also write the JSON here")
    args = p.parse_args(argv)
    unknown = [name for name in args.precisions.split(",") if name not in PRECISIONS]
    if unknown:
        p.error(f"--precisions: {unknown[0]!r} is not one of {', '.join(PRECISIONS)}")
    return args


class PhaseClock:
    """Seconds (and, while `counting`, FLOPs) per phase of the current step; a phase nested in another (the probe in
    the loss) is subtracted from its parent by the caller's bookkeeping, `flops` by the counter's own stack."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)
        self.flops: dict[str, float] = defaultdict(float)
        self.counting = False
        self.stack: list[str] = []
        self.probed_rows = 0

    @contextlib.contextmanager
    def phase(self, name: str):
        self.stack.append(name)
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - start
            self.stack.pop()

    def reset(self):
        self.seconds.clear()
        self.flops.clear()
        self.probed_rows = 0


def flop_mode(clock: PhaseClock):
    """A dispatch mode adding each op's FLOPs (torch.utils.flop_counter's registry) to the innermost open phase."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import flop_registry

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            packet = func._overloadpacket
            if packet in flop_registry and clock.stack:
                flops = flop_registry[packet](*args, **kwargs, out_val=out)  # the registry takes the tensors
                clock.flops[clock.stack[-1]] += flops
            return out

    return Count()


def instrument(trainer, clock: PhaseClock) -> None:
    """Wrap the trainer's phase methods (instance attributes: this trainer only)."""
    from transformers import TrainerCallback

    def wrap(name: str, phase: str):
        original = getattr(trainer, name)

        def call(*args, **kwargs):
            with clock.phase(phase):
                return original(*args, **kwargs)
        setattr(trainer, name, call)

    wrap("_generate_single_turn", "generation")
    wrap("_generate_and_score_completions", "rollout")
    wrap("_compute_loss", "loss")
    original_advantages = trainer._token_advantages

    def token_advantages(adv_B, mask_BT, weights):
        clock.probed_rows += int(weights.probed_B.sum())
        return original_advantages(adv_B, mask_BT, weights)
    trainer._token_advantages = token_advantages
    backward = trainer.accelerator.backward

    def timed_backward(loss, **kwargs):
        with clock.phase("backward"):
            return backward(loss, **kwargs)
    trainer.accelerator.backward = timed_backward

    class Optimizer(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            clock.stack.append("optimizer")
            self.start = time.perf_counter()

        def on_optimizer_step(self, args, state, control, **kwargs):
            clock.seconds["optimizer"] += time.perf_counter() - self.start
            clock.stack.pop()

    trainer.add_callback(Optimizer())


@contextlib.contextmanager
def probe_phase(clock: PhaseClock):
    """For the trainer module's probe functions (`token_weights` on the separate and rollout paths; `fused_signal` or
    `fused_probe_signal`, and `weights_from_signal`, on the fused one: the time `TokenWeights.seconds` counts there):
    each call timed, and its FLOPs counted, as the phase "probe"; a call nested in another probe call counts once.
    Restored on exit."""
    import grail.training.trainer as module

    names = ("token_weights", "fused_signal", "fused_probe_signal", "weights_from_signal")
    originals = {name: getattr(module, name) for name in names}

    def timed(original):
        def call(*args, **kwargs):
            if "probe" in clock.stack:
                return original(*args, **kwargs)
            inside_rollout = "loss" not in clock.stack
            start = time.perf_counter()
            with clock.phase("probe"):
                result = original(*args, **kwargs)
            if inside_rollout:  # weights_from rollout_policy: computed inside the rollout phase
                clock.seconds["probe in rollout"] += time.perf_counter() - start
            return result
        return call

    for name, original in originals.items():
        setattr(module, name, timed(original))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(module, name, original)


class Steps:
    """A TrainerCallback recording each step's phases: the first counted (FLOPs), the rest timed."""

    def __init__(self, clock: PhaseClock, mode):
        from transformers import TrainerCallback

        self.clock, self.mode, self.records = clock, mode, []
        outer = self

        class Callback(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                outer.clock.reset()
                outer.clock.counting = state.global_step == 0
                if outer.clock.counting:
                    outer.mode.__enter__()
                outer.start = time.perf_counter()

            def on_step_end(self, args, state, control, **kwargs):
                total = time.perf_counter() - outer.start
                if outer.clock.counting:
                    outer.mode.__exit__(None, None, None)
                outer.records.append(phase_record(outer.clock, total, counted=outer.clock.counting))

        self.callback = Callback()


def phase_record(clock: PhaseClock, total: float, counted: bool) -> dict:
    """One step's seconds per PHASES entry (and FLOPs if counted), nested phases subtracted from their parents."""
    s, f = clock.seconds, clock.flops
    in_rollout = s["probe in rollout"]
    seconds = {"generation": s["generation"], "rollout rest": s["rollout"] - s["generation"] - in_rollout,
               "probe": s["probe"], "loss forward": s["loss"] - (s["probe"] - in_rollout), "backward": s["backward"],
               "optimizer": s["optimizer"]}
    seconds["other"] = total - sum(seconds.values())
    record = {"total_s": total, "seconds": seconds, "probed_rows": clock.probed_rows}
    if counted:  # the counter adds to the innermost open phase: the probe's FLOPs are its own, not the loss's
        record["gflop"] = {"generation": f["generation"] / 1e9, "rollout rest": f["rollout"] / 1e9,
                           "probe": f["probe"] / 1e9, "loss forward": f["loss"] / 1e9,
                           "backward": f["backward"] / 1e9, "optimizer": f["optimizer"] / 1e9}
    return record


def run_one(method: str, precision: str, args, out_dir: str) -> dict:
    """One trainer's steps; `method` is a benchmark name or METHOD@field=value@... (`grail compare`'s arm syntax,
    e.g. oar_p_amortized@oar_p_amortized_exact_every=2), the fields over the run's own."""
    import torch
    from harness import coin_reward, log, make_trainer

    from grail.analysis.compare.plan import parse_arms
    from grail.options.presets import SMOLLM_CHAINS, TINY_CPU
    from grail.training.overrides import fold_method_options

    arm = parse_arms(method)[0] if "@" in method else None

    base = TINY_CPU if args.smoke else SMOLLM_CHAINS
    values = {**base, "model_name_or_path": "tiny" if args.smoke else args.model,
              "per_device_train_batch_size": 8, "num_generations": 8, "gradient_accumulation_steps": args.prompts,
              "max_completion_length": args.completion_tokens,
              "generation_kwargs": {"min_new_tokens": args.completion_tokens}, "mask_truncated_completions": False,
              "oar_scope": "completion", "max_steps": 1 + args.steps, "save_steps": 10_000, "logging_steps": 1,
              "seed": args.seed, "use_cpu": True, **PRECISIONS[precision], "report_to": "none",
              "output_dir": os.path.join(out_dir, f"{method}-{precision}")}
    if args.smoke:
        values.pop("warmstart_steps", None)
        values.update({"warmstart_steps": 2, "per_device_train_batch_size": 4, "num_generations": 4})
    if not args.smoke:
        values["shared_prompt"] = True
    if method == "grail":
        values["saliency_path"] = "fused"
    if arm is not None:
        values = fold_method_options({**values, **arm.fields,
                                      "output_dir": os.path.join(out_dir, f"{arm.slug}-{precision}")})
    trainer, _ = make_trainer(arm.method if arm else method, values, reward=coin_reward(args.seed))
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    for noisy in (PrinterCallback, ProgressCallback):  # stdout carries the JSON only
        trainer.remove_callback(noisy)
    clock = PhaseClock()
    instrument(trainer, clock)
    steps = Steps(clock, flop_mode(clock))
    trainer.add_callback(steps.callback)
    log(f"{method} {precision}: training {1 + args.steps} steps ({args.prompts} prompts x 8, "
        f"{args.completion_tokens} tokens)")
    with probe_phase(clock):
        trainer.train()
    params = sum(p.numel() for p in trainer.model.parameters())
    dtypes = sorted({str(p.dtype) for p in trainer.model.parameters()})
    from_bf16 = trainer.generate_from_bf16
    del trainer
    counted, timed = steps.records[0], steps.records[1:]
    return summarize(counted, timed) | {"parameters": params, "parameter_dtypes": dtypes,
                                        "generation_from_bf16_weights": from_bf16,
                                        "torch_threads": torch.get_num_threads()}


def summarize(counted: dict, timed: list[dict]) -> dict:
    phases = {}
    for name in PHASES:
        per_step = [r["seconds"][name] for r in timed]
        median = statistics.median(per_step)
        gflop = counted.get("gflop", {}).get(name)
        if name == "probe" and gflop and counted["probed_rows"]:
            gflop *= statistics.median(r["probed_rows"] for r in timed) / counted["probed_rows"]
        phases[name] = {"seconds_median": median, "seconds_per_step": per_step, "gflop": gflop,
                        "gflops": (gflop / median if gflop is not None and median > 0 else None)}
    totals = [r["total_s"] for r in timed]
    gflop = sum(p["gflop"] or 0.0 for p in phases.values())
    return {"phases": phases, "step_s_median": statistics.median(totals), "step_s_per_step": totals,
            "step_gflop": gflop, "step_gflops": gflop / statistics.median(totals),
            "probed_rows_per_step": [r["probed_rows"] for r in timed], "counted_step_s": counted["total_s"]}


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.smoke:
        args.methods, args.completion_tokens, args.steps, args.prompts = args.methods or "none,grail", 4, 1, 1
    import torch
    from harness import log

    from grail.models.precision import cpu_bf16_flags, cpu_model_name, matmul_gflops

    torch.set_num_threads(args.threads)
    methods = (args.methods or "none,grail,oar_g,oar_p").split(",")
    precisions = args.precisions.split(",")
    peak = {"fp32": matmul_gflops(torch.float32), "bf16": matmul_gflops(torch.bfloat16)}
    log(f"matmul peak at {args.threads} thread(s): fp32 {peak['fp32']:.1f}, bf16 {peak['bf16']:.1f} GFLOP/s")
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as out_dir:
        for method in methods:
            for precision in precisions:
                bf16 = PRECISIONS[precision]["bf16"]
                if bf16 and args.bf16_methods and method not in args.bf16_methods.split(","):
                    continue
                result = run_one(method, precision, args, out_dir)
                top = peak["bf16" if bf16 else "fp32"]
                for phase in result["phases"].values():
                    phase["share_of_peak"] = (phase["gflops"] / top if phase["gflops"] else None)
                result["step_share_of_peak"] = result["step_gflops"] / top
                result["floor_s"] = result["step_gflop"] / top
                result["step_to_floor"] = result["step_s_median"] / result["floor_s"] if result["floor_s"] else None
                results[f"{method}/{precision}"] = result
                if args.json:  # kept as it goes: a stopped run keeps what it measured
                    with open(args.json + ".partial", "w") as f:
                        json.dump({"matmul_peak_gflops": peak, "results": results}, f, indent=2)
                log(f"{method} {precision}: step {result['step_s_median']:.1f} s "
                    f"({', '.join(f'{s:.1f}' for s in result['step_s_per_step'])}), "
                    + ", ".join(f"{k} {v['seconds_median']:.1f}" for k, v in result["phases"].items()))
    ratios = {}
    for method in methods:
        for precision in precisions:
            if precision != "fp32" and f"{method}/fp32" in results and f"{method}/{precision}" in results:
                ratios[f"{method} {precision}/fp32"] = (results[f"{method}/{precision}"]["step_s_median"]
                                                       / results[f"{method}/fp32"]["step_s_median"])
        for precision in precisions:
            if method != "none" and f"none/{precision}" in results and f"{method}/{precision}" in results:
                ratios[f"{method}/none {precision}"] = (results[f"{method}/{precision}"]["step_s_median"]
                                                       / results[f"none/{precision}"]["step_s_median"])
    out = {"config": {**{k: v for k, v in vars(args).items() if k != "json"}, "cpu": cpu_model_name(),
                      "bf16_flags": list(cpu_bf16_flags()), "torch": torch.__version__,
                      "malloc": "glibc default"},
           "matmul_peak_gflops": peak, "results": results, "ratios": ratios}
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
        Path(args.json + ".partial").unlink(missing_ok=True)  # the whole run is in the JSON now
    return out


if __name__ == "__main__":
    main()
