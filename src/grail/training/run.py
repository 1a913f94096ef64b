"""One training run: resolve the model, load data, build `GRAILTrainer`, train, write the run directory.

Run directory (`output_dir`):
    config.yaml           the values set by preset, file and flags: `grail train --config` on it reruns the run
    resolved_config.json  every field after defaults, device and prompt-format resolution (for the record)
    metrics.jsonl         one JSON object per logging step ({"step": N, ...TRL and grail metrics})
    checkpoint-N/         TRL checkpoints every `save_steps`, marked complete once fully saved (grail.training.resume),
                          and one where a SIGUSR1 or SIGTERM stopped the run (grail.training.stop: no final/ then)
    resumed.jsonl         one line per resume (`--resume_from_checkpoint`): from which checkpoint, at which step
    code.jsonl            one line per start and resume: grail-rl's version and git commit, torch, transformers, TRL
                          (grail.training.provenance)
    eval/checkpoint-N/    benchmark evaluation of each checkpoint when `eval_benchmarks` is set
                          (grail.evaluation.harness)
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

from grail.evaluation.rewards import reward_named
from grail.methods.sharding import is_sharded
from grail.models.checks import check_tokenizer
from grail.models.sft_cache import find_warm_start
from grail.models.warmstart import resolve_model
from grail.options.fields import SFT_MODEL_PREFIX, SYNTHETIC_DATASET, TINY_MODEL
from grail.options.prompts import PromptFormat, empty_completions_warning, has_chat_template
from grail.training.config import GRAILConfig
from grail.training.data import format_prompts, load_prompts, prompts_are_messages
from grail.training.provenance import record_code
from grail.training.resume import CheckpointMarker, checkpoint_step, prepare_run_dir, resolve_resume
from grail.training.stop import StopOnSignal, TrainingStopped
from grail.training.trainer import GRAILTrainer

__all__ = [
    "CheckpointEval", "gradient_note", "Log", "MetricsJsonl", "Progress", "quiet_libraries",
    "resolve_model_path", "resolve_prompt_fields", "reward_function", "save_final", "train", "TrainResult",
    "write_run_config"
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
    """`grail.models.warmstart.resolve_model` for a run's model_name_or_path, warm-start settings and cache; for
    `sft:NAME`, the cached `grail sft` warm start of NAME on the run's chain task (`find_warm_start`)."""
    name = cfg.model_name_or_path
    if name.startswith(SFT_MODEL_PREFIX):
        return str(find_warm_start(name.removeprefix(SFT_MODEL_PREFIX), cfg))
    warm = cfg.warm_start_config() if name == TINY_MODEL else None  # the chain task has no tiny warm start
    return resolve_model(name, warm, cfg.cache_dir, log)


class MetricsJsonl(TrainerCallback):
    """Appends every log dict, with its step, as one JSON line."""

    def __init__(self, path: Path):
        self.path = path

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs:
            with self.path.open("a") as f:
                f.write(json.dumps({"step": state.global_step, **logs}) + "\n")


def gradient_note(logs: dict, args) -> str:
    """How many of a step's groups had a gradient (a non-zero advantage), from TRL's `frac_reward_zero_std` (the
    share of rows whose group's rewards all agree: A = 0 for every one of them), in words; "" when it is not logged.
    With scale_rewards=batch (or normalize_then_sum) TRL measures that share over the whole batch, so only "none"
    can be told."""
    frac = logs.get("frac_reward_zero_std")
    if frac is None:
        return ""
    if frac >= 1.0:
        return "no group had a gradient: every group's rewards are equal"
    if args.scale_rewards == "batch" or getattr(args, "multi_objective_aggregation", None) == "normalize_then_sum":
        return ""
    groups = args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size
    groups //= max(args.num_generations, 1)
    return f"gradient from {round((1.0 - frac) * groups)}/{groups} groups"


class Progress(TrainerCallback):
    """One compact line per logging step (with how many groups had a gradient), per-step wall times for the run
    summary, and one warning the first time most completions are empty."""

    # TRL's completion lengths count the end-of-sequence token: an empty completion is 1 token, any other is >= 2,
    # so a mean length <= 1.5 means at least half of the completions are empty.
    EMPTY_MEAN_LENGTH = 1.5

    def __init__(self, log: Log):
        self.log, self.step_seconds, self._last = log, [], None
        self.warned_empty = False

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
        note = gradient_note(logs, args)
        self.log(f"step {state.global_step}/{state.max_steps} | reward {logs['reward']:.3f} | "
                 f"loss {loss:.4f} | " + (f"{note} | " if note else "") + f"{recent:.2f} s/step | eta {eta:.0f} s")
        self._warn_if_empty(logs, args)

    def _warn_if_empty(self, logs: dict, args) -> None:
        mean_length = logs.get("completions/mean_length")
        if self.warned_empty or mean_length is None or mean_length > self.EMPTY_MEAN_LENGTH:
            return
        self.warned_empty = True
        fmt = PromptFormat(args.prompt_suffix, args.conversational is True) if hasattr(args, "prompt_suffix") else None
        self.log(empty_completions_warning(f"most completions are empty (mean length {mean_length:.2f} tokens, the "
                                           f"end-of-sequence token included)", fmt))


class _Replay:
    """A sampler that hands `run_evaluation` the samples already generated for each batch (keyed by seed)."""

    name = "replay"

    def __init__(self, samples: dict[int, tuple[list[str], list]]):
        self.samples = samples

    def generate(self, prompts, params, seed: int):
        recorded_prompts, samples = self.samples[seed]
        if list(prompts) != recorded_prompts:  # both sides batch with grail.evaluation.harness.sampling_batches
            raise RuntimeError(f"checkpoint evaluation: the prompts of the batch with seed {seed} differ from those "
                               f"sampled for it (a bug: report it).")
        return samples


class CheckpointEval(TrainerCallback):
    """`eval_benchmarks` at every checkpoint, with the model being trained: the same `run_evaluation` as
    `grail eval`, into <output_dir>/eval/checkpoint-N/, and one metrics.jsonl line of eval/* figures.

    With several processes the sampling is sharded: process r samples batches b ≡ r (mod processes) of
    `grail.evaluation.harness.sampling_batches`, each with seed `seed + b` as a single process would; the samples are
    gathered to the main process, which grades them and writes the files; then every process goes on together.
    (Sampling on the main process only left the others waiting at their next collective operation.) On a model
    sharded over processes (ZeRO-3, FSDP2), where every forward gathers parameters from all processes, each
    process makes the same number of `generate` calls (a process with fewer batches samples its first one again,
    unused) and generation runs synced (`HFSampler(synced=True)`: transformers' `synced_gpus`). With
    `shared_prompt` (one process only) each prompt's prefill is computed once for its samples
    (grail.training.shared_prompt.shared_prefill), as in `grail compare`'s evaluation."""

    def __init__(self, cfg: GRAILConfig, run_dir: Path, log: Log, prompt: PromptFormat | None = None,
                 loaded=None):
        """`prompt`: the format the model was trained with (default: the config's, `PromptFormat.from_config`, which
        needs `auto` resolved unless the task is synthetic); `loaded`: the benchmarks, already loaded by
        `load_checkpoint_benchmarks` (default: loaded now)."""
        self.run_dir, self.log, self.shared_prompt = run_dir, log, cfg.shared_prompt
        self.spec = _checkpoint_spec(cfg, prompt if prompt is not None else PromptFormat.from_config(cfg))
        self.loaded = loaded if loaded is not None else load_checkpoint_benchmarks(cfg)

    def on_save(self, args, state, control, model=None, processing_class=None, **kwargs):
        from accelerate import PartialState

        from grail.options.sampling import HFSampler
        from grail.training.shared_prompt import shared_prefill

        tokenizer = getattr(processing_class, "tokenizer", processing_class)
        processes = PartialState()
        synced = processes.num_processes > 1 and is_sharded(model)
        share = self.shared_prompt and processes.num_processes == 1  # refused before training with more
        sampler = HFSampler(model, tokenizer, batch_size=self.spec.batch_size, synced=synced,
                            generate=shared_prefill(model, model.generate) if share else None)
        if processes.num_processes > 1:
            sampler = self._sharded_samples(sampler, tokenizer, processes, state.global_step)
        if state.is_world_process_zero:
            self._evaluate(sampler, tokenizer, state.global_step)
        processes.wait_for_everyone()  # the others wait here for the grading, not inside a training collective

    def _sharded_samples(self, sampler, tokenizer, processes, step: int) -> _Replay:
        """This process's share of the batches, sampled here; everyone's samples, gathered on every process."""
        from accelerate.utils import gather_object

        from grail.evaluation.harness import sampling_batches

        rank, world = processes.process_index, processes.num_processes
        batches = list(sampling_batches(self.spec, self.loaded))
        mine = []
        for b, batch in enumerate(batches):
            if b % world == rank:
                prompts = [self.spec.prompt.render(tokenizer, p.problem) for p in batch]
                mine.append((self.spec.seed + b, prompts, sampler.generate(prompts, self.spec.sampling,
                                                                          seed=self.spec.seed + b)))
        if sampler.synced and len(mine) < -(-len(batches) // world):  # as many generate calls as the busiest
            prompts = [self.spec.prompt.render(tokenizer, p.problem) for p in batches[0]]
            sampler.generate(prompts, self.spec.sampling, seed=self.spec.seed)  # in step with it, unused
        self.log(f"checkpoint {step}: process {rank} of {world} sampled evaluation batches "
                 f"{[seed - self.spec.seed for seed, _, _ in mine]}")
        return _Replay({seed: (prompts, samples) for seed, prompts, samples in gather_object(mine)})

    def _evaluate(self, sampler, tokenizer, step: int) -> None:
        from grail.evaluation.harness import run_evaluation

        out = self.run_dir / "eval" / f"checkpoint-{step}"
        report = run_evaluation(sampler, tokenizer, self.spec, out, log=self.log, progress=False, loaded=self.loaded)
        figures = {f"eval/{b['name']}/acc@{b['n']}": b["acc_at_n"]["value"] for b in report.results["benchmarks"]}
        figures.update({f"eval/{a['kind']}/acc@n": a["acc_at_n"]["value"] for a in report.results["averages"]})
        with (self.run_dir / "metrics.jsonl").open("a") as f:
            f.write(json.dumps({"step": step, **figures}) + "\n")
        self.log(f"checkpoint {step}: " + ", ".join(f"{k} {v:.3f}" for k, v in figures.items()))


def _checkpoint_spec(cfg: GRAILConfig, prompt: PromptFormat):
    from grail.evaluation.benchmarks import parse_benchmark_list
    from grail.evaluation.harness import EvalSpec, parse_size
    from grail.options.sampling import SamplingParams

    return EvalSpec(benchmarks=tuple(parse_benchmark_list(cfg.eval_benchmarks)), data_dir=cfg.eval_data_dir,
                    size=parse_size(cfg.eval_size),
                    sampling=SamplingParams(n=cfg.eval_samples,
                                            max_new_tokens=cfg.eval_max_new_tokens or cfg.max_completion_length),
                    seed=cfg.seed, batch_size=cfg.per_device_train_batch_size, prompt=prompt,
                    release_subsets_dir=cfg.eval_release_subsets_dir, scoring=cfg.eval_scoring)


def load_checkpoint_benchmarks(cfg: GRAILConfig):
    """The problems of `eval_benchmarks` (checked: a missing file or directory stops here, before any work)."""
    return _checkpoint_spec(cfg, PromptFormat()).load_benchmarks(synthetic_set=cfg.synthetic_set())


def resolve_prompt_fields(cfg: GRAILConfig, tokenizer, rows) -> PromptFormat:
    """The run's prompt format for this model's tokenizer and these `load_prompts` rows (`auto` resolved by
    grail.options.prompts.resolve_prompt_format; chat when the prompts are chat messages), written back into `cfg`: TRL
    renders with the resolved chat_template_kwargs, and resolved_config.json records what the run used."""
    fmt = PromptFormat.from_config(cfg, tokenizer, messages=prompts_are_messages(rows))
    if fmt.chat and not has_chat_template(tokenizer):  # only chat-message prompts get here (check_tokenizer)
        raise ValueError(f"dataset {cfg.dataset!r} holds chat messages, which TRL renders with the tokenizer's chat "
                         f"template, but the tokenizer of {cfg.model_name_or_path!r} has none: point prompt_column at "
                         f"a text column, or use a model whose tokenizer has a chat_template.")
    cfg.conversational, cfg.prompt_suffix = fmt.chat, fmt.suffix
    cfg.chat_template_kwargs = dict(fmt.chat_template_kwargs)
    return fmt


def save_final(trainer, final_dir: Path) -> None:
    """`trainer.save_model(final_dir)`: the whole model, loadable by `from_pretrained` in one plain process. Under FSDP
    with SHARDED_STATE_DICT, transformers' `Trainer.save_model` writes nothing at all (transformers 5.23, trainer.py,
    its `elif self.is_fsdp_enabled:` branch saves only when the type is FULL_STATE_DICT), which left no final/: here
    the full model is gathered (every process takes part) and saved exactly as that branch does for FULL_STATE_DICT.
    The checkpoints keep FSDP's sharded files, which resuming reads."""
    plugin = getattr(trainer.accelerator.state, "fsdp_plugin", None)
    if not getattr(trainer, "is_fsdp_enabled", False) or plugin is None \
            or "FULL_STATE_DICT" in str(plugin.state_dict_type):
        trainer.save_model(str(final_dir))  # writes on the main process only
        return
    state_dict = trainer.accelerator.get_state_dict(trainer.model)  # the whole model on the main process
    trainer._save(str(final_dir), state_dict=state_dict)


# TrainingArguments types these as floats (a value below 1 is a fraction of the run), so `--logging_steps 1` arrives
# as 1.0; config.yaml writes a whole number of steps as the integer the user gave.
_STEP_FIELDS = ("logging_steps", "save_steps", "eval_steps")


def _as_written(key: str, value):
    if key in _STEP_FIELDS and isinstance(value, float) and value.is_integer() and value >= 1:
        return int(value)
    return value


def write_run_config(cfg: GRAILConfig, overrides: dict, run_dir: Path) -> None:
    """config.yaml: the values the user set, without `output_dir`, so that `grail train --config run/config.yaml`
    starts a new run directory instead of appending to this one (and evaluating against its samples);
    resolved_config.json: every field, the run directory included."""
    run_dir.mkdir(parents=True, exist_ok=True)
    values = {k: _as_written(k, v) for k, v in overrides.items() if k != "output_dir"}
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
    rows = load_prompts(cfg)
    if cfg.dataset_shuffle_seed is not None:  # the release's one-off shuffle before TRL's sampler
        rows = rows.shuffle(seed=cfg.dataset_shuffle_seed)
    benchmarks = load_checkpoint_benchmarks(cfg) if cfg.eval_benchmarks else None
    main_process = cfg.process_index == 0  # with several processes, one writes the run directory's own files
    resume_from = resolve_resume(cfg.resume_from_checkpoint, run_dir)
    prepare_run_dir(run_dir, resume_from, cfg.overwrite_output_dir, main_process)
    model_path = model_path or resolve_model_path(cfg, log)
    tokenizer = check_tokenizer(cfg.model_name_or_path, model_path, cfg.conversational is True)
    fmt = resolve_prompt_fields(cfg, tokenizer, rows)  # before anything reads the format: data, TRL, checkpoints
    dataset = format_prompts(rows, fmt)
    progress = Progress(log)
    callbacks = [MetricsJsonl(run_dir / "metrics.jsonl"), progress]
    if benchmarks is not None:
        callbacks.append(CheckpointEval(cfg, run_dir, log, prompt=fmt, loaded=benchmarks))
    stop = StopOnSignal()  # SIGUSR1 / SIGTERM: a checkpoint at the end of the step, then TrainingStopped
    callbacks += [CheckpointMarker(), stop]
    trainer = GRAILTrainer(model=model_path, reward_funcs=[reward_function(cfg)], args=cfg,
                           train_dataset=dataset, callbacks=callbacks)
    stop.any_process = trainer._any_process  # every process stops at the step any one of them was signalled in
    if main_process and resume_from is None:  # the run's first file, once every check has passed (a resumed run
        write_run_config(cfg, overrides or {}, run_dir)  # keeps its config files; resumed.jsonl records the resume)
    if main_process:
        record_code(run_dir, 0 if resume_from is None else checkpoint_step(resume_from))
    for noisy in (PrinterCallback, ProgressCallback):  # our Progress line replaces both
        trainer.remove_callback(noisy)
    log(f"training {cfg.model_name_or_path} on {cfg.dataset} for {cfg.max_steps} steps "
        f"(token_weighting={cfg.token_weighting}; prompts: {fmt.describe()}); run directory {run_dir}")
    if "precision_reason" in cfg.__dict__:  # CPU runs: which precision, and why (grail.models.precision)
        log(f"precision: {cfg.precision_reason}")
    start = time.perf_counter()
    trainer.train(resume_from_checkpoint=str(resume_from) if resume_from is not None else None)
    train_seconds = time.perf_counter() - start
    if stop.signal_name is not None and trainer.state.global_step < trainer.state.max_steps:
        raise TrainingStopped(trainer.state.global_step, str(run_dir / f"checkpoint-{trainer.state.global_step}"),
                              stop.signal_name)
    final_dir = run_dir / "final"
    save_final(trainer, final_dir)
    if main_process:
        fmt.save(final_dir)  # `grail eval` reads problems the way the model was trained
    later = sorted(progress.step_seconds[1:]) or progress.step_seconds or [float("nan")]
    return TrainResult(run_dir, final_dir, trainer.state.global_step, train_seconds, later[len(later) // 2])
