"""One training run: resolve the model, load data, build `GRAILTrainer`, train, write the run directory.

Run directory (`output_dir`):
    config.yaml           the values set by preset, file and flags: `grail train --config` on it reruns the run
    resolved_config.json  every field after defaults and device resolution (for the record)
    metrics.jsonl         one JSON object per logging step ({"step": N, ...TRL and grail metrics})
    checkpoint-N/         TRL checkpoints every `save_steps`, marked complete once fully saved (grail.resume)
    resumed.jsonl         one line per resume (`--resume_from_checkpoint`): from which checkpoint, at which step
    eval/checkpoint-N/    benchmark evaluation of each checkpoint when `eval_benchmarks` is set (grail.eval_harness)
    final/                the trained model and tokenizer, loadable with `from_pretrained(path)`, and
                          grail_prompt.json, the prompt format it was trained with (read by `grail eval`)
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml
from transformers import TrainerCallback
from transformers.trainer_callback import PrinterCallback, ProgressCallback

from grail.config import GRAILConfig
from grail.config_fields import SYNTHETIC_DATASET
from grail.data import load_train_dataset
from grail.model_checks import check_tokenizer
from grail.prompts import PromptFormat
from grail.resume import CheckpointMarker, prepare_run_dir, resolve_resume
from grail.rewards import reward_named
from grail.trainer import GRAILTrainer, sharded_by
from grail.warmstart import resolve_model

__all__ = [
    "check_sharding", "CheckpointEval", "Log", "MetricsJsonl", "Progress", "quiet_libraries", "resolve_model_path",
    "reward_function", "train", "TrainResult", "write_run_config"
]

Log = Callable[[str], None]


@dataclass(frozen=True)
class TrainResult:
    run_dir: Path
    final_dir: Path
    steps: int
    train_seconds: float  # wall time of trainer.train()
    seconds_per_step: float  # median over steps after the first (first steps pay cold caches)


def reward_function(cfg: GRAILConfig):
    """The run's reward (`reward`; `auto` = exact_int on the synthetic task, else math_verify)."""
    return reward_named(cfg.reward, synthetic=cfg.dataset == SYNTHETIC_DATASET)


def resolve_model_path(cfg: GRAILConfig, log: Log = print) -> str:
    """`grail.warmstart.resolve_model` for a run's model_name_or_path, warm-start settings and cache."""
    return resolve_model(cfg.model_name_or_path, cfg.warm_start_config(), cfg.cache_dir, log)


class MetricsJsonl(TrainerCallback):
    """Appends every log dict, with its step, as one JSON line."""

    def __init__(self, path: Path):
        self.path = path

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs:
            with self.path.open("a") as f:
                f.write(json.dumps({"step": state.global_step, **logs}) + "\n")


class Progress(TrainerCallback):
    """One compact line per logging step, and per-step wall times for the run summary."""

    def __init__(self, log: Log):
        self.log, self.step_seconds, self._last = log, [], None

    def on_step_begin(self, args, state, control, **kwargs):
        self._last = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.step_seconds.append(time.perf_counter() - self._last)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs or "reward" not in logs:
            return
        recent = self.step_seconds[-1] if self.step_seconds else float("nan")
        eta = recent * (state.max_steps - state.global_step)
        loss = logs.get("loss", logs.get("train_loss", float("nan")))  # the end-of-training log says train_loss
        self.log(f"step {state.global_step}/{state.max_steps} | reward {logs['reward']:.3f} | "
                 f"loss {loss:.4f} | {recent:.2f} s/step | eta {eta:.0f} s")


class _Replay:
    """A sampler that hands `run_evaluation` the samples already generated for each batch (keyed by seed)."""

    name = "replay"

    def __init__(self, samples: dict[int, tuple[list[str], list]]):
        self.samples = samples

    def generate(self, prompts, params, seed: int):
        recorded_prompts, samples = self.samples[seed]
        if list(prompts) != recorded_prompts:  # both sides batch with grail.eval_harness.sampling_batches
            raise RuntimeError(f"checkpoint evaluation: the prompts of the batch with seed {seed} differ from those "
                               f"sampled for it (a bug: report it).")
        return samples


class CheckpointEval(TrainerCallback):
    """`eval_benchmarks` at every checkpoint, with the model being trained: the same `run_evaluation` as
    `grail eval`, into <output_dir>/eval/checkpoint-N/, and one metrics.jsonl line of eval/* figures.

    With several processes the sampling is sharded: process r samples batches b ≡ r (mod processes) of
    `grail.eval_harness.sampling_batches`, each with seed `seed + b` as a single process would; the samples are
    gathered to the main process, which grades them and writes the files; then every process goes on together.
    (Sampling on the main process only left the others waiting at their next collective operation.) Sharded
    models (ZeRO-3, FSDP) are refused before training (`check_sharding`): their `generate` would need every
    process to run the same number of forwards."""

    def __init__(self, cfg: GRAILConfig, run_dir: Path, log: Log):
        from grail.benchmarks import parse_benchmark_list
        from grail.eval_harness import EvalSpec, parse_size
        from grail.sampling import SamplingParams

        self.run_dir, self.log = run_dir, log
        benchmarks = tuple(parse_benchmark_list(cfg.eval_benchmarks))
        self.spec = EvalSpec(benchmarks=benchmarks, data_dir=cfg.eval_data_dir, size=parse_size(cfg.eval_size),
                             sampling=SamplingParams(n=cfg.eval_samples,
                                                     max_new_tokens=cfg.eval_max_new_tokens
                                                     or cfg.max_completion_length),
                             seed=cfg.seed, batch_size=cfg.per_device_train_batch_size,
                             prompt=PromptFormat.from_config(cfg), release_subsets_dir=cfg.eval_release_subsets_dir,
                             scoring=cfg.eval_scoring)
        # load (and check) the benchmarks now: a missing directory should stop the run before training
        self.loaded = self.spec.load_benchmarks(synthetic_set=cfg.synthetic_set())

    def on_save(self, args, state, control, model=None, processing_class=None, **kwargs):
        from accelerate import PartialState

        from grail.sampling import HFSampler

        tokenizer = getattr(processing_class, "tokenizer", processing_class)
        sampler = HFSampler(model, tokenizer, batch_size=self.spec.batch_size)
        processes = PartialState()
        if processes.num_processes > 1:
            sampler = self._sharded_samples(sampler, tokenizer, processes, state.global_step)
        if state.is_world_process_zero:
            self._evaluate(sampler, tokenizer, state.global_step)
        processes.wait_for_everyone()  # the others wait here for the grading, not inside a training collective

    def _sharded_samples(self, sampler, tokenizer, processes, step: int) -> _Replay:
        """This process's share of the batches, sampled here; everyone's samples, gathered on every process."""
        from accelerate.utils import gather_object

        from grail.eval_harness import sampling_batches

        rank, world = processes.process_index, processes.num_processes
        mine = []
        for b, batch in enumerate(sampling_batches(self.spec, self.loaded)):
            if b % world == rank:
                prompts = [self.spec.prompt.render(tokenizer, p.problem) for p in batch]
                mine.append((self.spec.seed + b, prompts, sampler.generate(prompts, self.spec.sampling,
                                                                          seed=self.spec.seed + b)))
        self.log(f"checkpoint {step}: process {rank} of {world} sampled evaluation batches "
                 f"{[seed - self.spec.seed for seed, _, _ in mine]}")
        return _Replay({seed: (prompts, samples) for seed, prompts, samples in gather_object(mine)})

    def _evaluate(self, sampler, tokenizer, step: int) -> None:
        from grail.eval_harness import run_evaluation

        out = self.run_dir / "eval" / f"checkpoint-{step}"
        report = run_evaluation(sampler, tokenizer, self.spec, out, log=self.log, progress=False, loaded=self.loaded)
        figures = {f"eval/{b['name']}/acc@{b['n']}": b["acc_at_n"]["value"] for b in report.results["benchmarks"]}
        figures.update({f"eval/{a['kind']}/acc@n": a["acc_at_n"]["value"] for a in report.results["averages"]})
        with (self.run_dir / "metrics.jsonl").open("a") as f:
            f.write(json.dumps({"step": step, **figures}) + "\n")
        self.log(f"checkpoint {step}: " + ", ".join(f"{k} {v:.3f}" for k, v in figures.items()))


def check_sharding(cfg: GRAILConfig, trainer) -> None:
    """Refuse, before training, checkpoint evaluation on a sharded model (ZeRO-3, FSDP); ZeRO-1/2 and DDP are fine.
    (A method whose probe cannot run sharded is refused by GRAILTrainer itself, when it is built.)"""
    sharded = sharded_by(trainer)
    if sharded is not None and cfg.eval_benchmarks:
        raise ValueError(f"eval_benchmarks={cfg.eval_benchmarks!r} cannot run at checkpoints of a model sharded by "
                         f"{sharded} (each process's generate would run its own number of forwards and hang): leave "
                         f"eval_benchmarks empty and evaluate the saved checkpoints with `grail eval --model "
                         f"RUN/checkpoint-N`, or use DeepSpeed ZeRO-2 or DDP.")


def write_run_config(cfg: GRAILConfig, overrides: dict, run_dir: Path) -> None:
    """config.yaml: the values the user set, without `output_dir`, so that `grail train --config run/config.yaml`
    starts a new run directory instead of appending to this one (and evaluating against its samples);
    resolved_config.json: every field, the run directory included."""
    run_dir.mkdir(parents=True, exist_ok=True)
    values = {k: v for k, v in overrides.items() if k != "output_dir"}
    header = f"# grail train values of the run in {run_dir}; rerunning with --config starts a new run directory\n"
    (run_dir / "config.yaml").write_text(header + yaml.safe_dump(values, sort_keys=True))
    (run_dir / "resolved_config.json").write_text(json.dumps(cfg.to_dict(), indent=2, default=str,
                                                             sort_keys=True))


def quiet_libraries() -> None:
    """No progress bars or info chatter from transformers and datasets: they would bury grail's own progress lines
    (`grail train`, `demo`, `compare` and its runs' logs)."""
    import warnings

    import datasets
    from transformers.utils import logging as hf_logging

    # TRL 1.16 still calls transformers 5's deprecated `is_gradient_checkpointing`; nothing for a user to do.
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()


def train(cfg: GRAILConfig, overrides: dict | None = None, log: Log = print,
          model_path: str | None = None) -> TrainResult:
    """Train with GRPO (+ token weighting) as configured; see the module docstring for what is written.

    `model_path`: an already resolved `resolve_model_path(cfg)`, to skip resolving it again.
    """
    run_dir = Path(cfg.output_dir)
    # Cheap checks first: a bad dataset or benchmark list must stop the run before a warm start or a download.
    dataset = load_train_dataset(cfg)
    if cfg.dataset_shuffle_seed is not None:  # the release's one-off shuffle before TRL's sampler
        dataset = dataset.shuffle(seed=cfg.dataset_shuffle_seed)
    progress = Progress(log)
    callbacks = [MetricsJsonl(run_dir / "metrics.jsonl"), progress]
    if cfg.eval_benchmarks:
        callbacks.append(CheckpointEval(cfg, run_dir, log))
    main_process = cfg.process_index == 0  # with several processes, one writes the run directory's own files
    resume_from = resolve_resume(cfg.resume_from_checkpoint, run_dir)
    prepare_run_dir(run_dir, resume_from, cfg.overwrite_output_dir, main_process)
    callbacks.append(CheckpointMarker())
    model_path = model_path or resolve_model_path(cfg, log)
    check_tokenizer(cfg.model_name_or_path, model_path, bool(cfg.conversational))
    trainer = GRAILTrainer(model=model_path, reward_funcs=[reward_function(cfg)], args=cfg,
                           train_dataset=dataset, callbacks=callbacks)
    check_sharding(cfg, trainer)
    if main_process and resume_from is None:  # the run's first file, once every check has passed (a resumed run
        write_run_config(cfg, overrides or {}, run_dir)  # keeps its config files; resumed.jsonl records the resume)
    for noisy in (PrinterCallback, ProgressCallback):  # our Progress line replaces both
        trainer.remove_callback(noisy)
    log(f"training {cfg.model_name_or_path} on {cfg.dataset} for {cfg.max_steps} steps "
        f"(token_weighting={cfg.token_weighting}); run directory {run_dir}")
    start = time.perf_counter()
    trainer.train(resume_from_checkpoint=str(resume_from) if resume_from is not None else None)
    train_seconds = time.perf_counter() - start
    final_dir = run_dir / "final"
    trainer.save_model(str(final_dir))  # writes on the main process only
    if main_process:
        PromptFormat.from_config(cfg).save(final_dir)  # `grail eval` reads problems the way the model was trained
    later = sorted(progress.step_seconds[1:]) or progress.step_seconds or [float("nan")]
    return TrainResult(run_dir, final_dir, trainer.state.global_step, train_seconds, later[len(later) // 2])
