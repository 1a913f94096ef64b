"""The supervised warm start of a real model on the chain task (`grail sft`): TRL's `SFTTrainer` fits the model to
the worked solutions of the task's `sft` split, loss on the solution tokens only, and the result is cached as a
save_pretrained directory that `grail train --model_name_or_path DIR` and `grail eval --model DIR` take.

The pipeline is two stages: `grail sft` (this module), then `grail train --task_style chains` from its directory
(docs/getting-started/warm-start.md). What this module relies on in TRL 1.16's SFTTrainer:
  1. prompt-completion rows: conversational ones (chat messages) are rendered with the tokenizer's chat template,
     the prompt with the generation prompt; a row's `chat_template_kwargs` column goes to the template; plain-text
     rows are tokenised with the special tokens (as GRPOTrainer tokenises plain prompts) and get the EOS token
     appended to the completion (conversational rows end where the template ends the assistant turn);
  2. `completion_only_loss=True` (set, not left to TRL's None = "prompt-completion data"): the collator's labels are
     -100 outside the completion (tests/test_sft.py reads them);
  3. `trainer.train(resume_from_checkpoint=...)` resumes the optimizer, scheduler, RNG states and data order from a
     checkpoint written every `sft_save_steps`.
The prompts are rendered as `grail train` renders the same task (`resolve_prompt_format` with the task's messages:
the chat template iff the tokenizer has one, else `render_plain`; no suffix), and the format is saved with the model
(grail_prompt.json), so the policy is fine-tuned on exactly what RL and evaluation give it.

Cache (`sft_warm_start`): the entry `grail.models.sft_cache.entry_dir` names, complete once its `MARKER` is in it
(written last, then the folder is renamed into place). Work in progress lives in
<cache>/sft/.<model>-<key>.work/ (TRL's checkpoints): an interrupted run, run again with the same settings, resumes
from its last checkpoint; the work folder is removed once the entry is in place.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from transformers.trainer_utils import get_last_checkpoint
from trl import SFTConfig, SFTTrainer

from grail.models.sft_cache import MARKER, entry_dir, resolve_base
from grail.options.fields import GRAILFields
from grail.options.prompts import PromptFormat, resolve_prompt_format
from grail.options.sft import SFT_RECIPE_VERSION, SFTFields, preset_values, sft_cache_key, sft_settings_record
from grail.tasks.chains import ChainSet, check_heldout_disjoint

__all__ = ["chain_set_of", "make_trainer", "run_command", "sft_dataset", "sft_warm_start"]

Log = Callable[[str], None]


def chain_set_of(values: dict) -> ChainSet:
    """The chain task's problem set from `task_*` values (GRAILFields' names; the others at their defaults)."""
    return GRAILFields(**{**values, "task_style": "chains"}).synthetic_set()


def sft_dataset(chain_set: ChainSet, tokenizer) -> tuple[Dataset, PromptFormat]:
    """The sft split as SFTTrainer's prompt-completion rows, in the format `grail train` resolves for this task and
    tokenizer (returned too): chat messages (with the format's chat_template_kwargs) for a tokenizer with a chat
    template; else `render_plain` text, "Question: ...\\n\\nAnswer:", and " " + the solution as the completion."""
    fmt = resolve_prompt_format(tokenizer, synthetic=True, messages=True)
    rows = []
    for pair in chain_set.sft_pairs():
        prompt = fmt.training_prompt(pair["prompt"])
        if fmt.chat:
            extra = {"chat_template_kwargs": dict(fmt.chat_template_kwargs)} if fmt.chat_template_kwargs else {}
            rows.append({"prompt": prompt, "completion": pair["completion"], **extra})
        else:
            rows.append({"prompt": prompt, "completion": " " + pair["completion"][0]["content"]})
    return Dataset.from_list(rows), fmt


class _Progress(TrainerCallback):
    """One line per logging step and after a new run's first step (a real model's first ten can take minutes): the
    step, the loss, the time spent and left (from this run's pace)."""

    def __init__(self, log: Log):
        self.log, self.start, self.first = log, 0.0, 0

    def on_train_begin(self, args, state, control, **kwargs):
        self.start, self.first = time.monotonic(), state.global_step

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "loss" not in logs or not state.is_world_process_zero:
            return
        spent, done = time.monotonic() - self.start, state.global_step - self.first
        left = spent / done * (state.max_steps - state.global_step) if done else math.nan
        self.log(f"sft: step {state.global_step}/{state.max_steps}  loss {logs['loss']:.4f}  "
                 f"{spent:.0f} s spent, about {left:.0f} s left")


# Why `grail sft` does not follow grail.models.precision's per-machine choice on CPU.
SFT_CPU_PRECISION = ("a warm start is trained once and cached under its settings, and its precision is part of which "
                     "model it is: the regime's figures were measured from fp32 starts, so a bf16 start on one machine "
                     "and an fp32 one on another would be two different models under one name")


def make_trainer(settings: SFTFields, chain_set: ChainSet, base_path: Path, output_dir: Path, log: Log = print,
                 callbacks: Sequence[TrainerCallback] = ()) -> tuple[SFTTrainer, PromptFormat]:
    """TRL's SFTTrainer for `settings` on `chain_set`'s sft split, checkpoints in `output_dir`, and the prompt format.
    The model is loaded in float32 (bf16 autocast on a GPU that has it)."""
    tokenizer = AutoTokenizer.from_pretrained(base_path)
    model = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    dataset, fmt = sft_dataset(chain_set, tokenizer)
    on_gpu = torch.cuda.is_available()
    args = SFTConfig(
        output_dir=str(output_dir), max_steps=settings.sft_steps, learning_rate=settings.sft_learning_rate,
        per_device_train_batch_size=settings.sft_batch_size,
        gradient_accumulation_steps=settings.sft_gradient_accumulation_steps, warmup_steps=settings.sft_warmup_steps,
        lr_scheduler_type="linear", max_length=settings.sft_max_length, seed=settings.sft_seed,
        data_seed=settings.sft_seed, save_strategy="steps", save_steps=settings.sft_save_steps, save_total_limit=1,
        logging_steps=settings.sft_logging_steps, logging_first_step=True, report_to="none",
        completion_only_loss=True, packing=False,
        use_cpu=not on_gpu, bf16=on_gpu and torch.cuda.is_bf16_supported(), disable_tqdm=True,
        activation_checkpointing=False)  # TRL's default is on: recomputation that models this small do not need
    trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer,
                         callbacks=[_Progress(log), *callbacks])
    return trainer, fmt


def sft_warm_start(settings: SFTFields, chain_set: ChainSet, log: Log = print,
                   callbacks: Sequence[TrainerCallback] = ()) -> Path:
    """The cached warm start of `settings.base_model` on `chain_set`'s sft split: the entry's directory, trained (or
    resumed from its last checkpoint) on a miss. ValueError when `chain_set` splits problems otherwise than the
    held-out set `grail train` evaluates on (its sft split could hold held-out problems)."""
    try:
        check_heldout_disjoint(ChainSet(task=chain_set.task), chain_set)
    except ValueError as err:
        raise ValueError(f"sft: {err}") from err
    base_path, identity = resolve_base(settings.base_model, settings.cache_dir)
    entry = entry_dir(settings, identity, chain_set)
    key = sft_cache_key(settings, identity, chain_set)
    if (entry / MARKER).is_file():
        log(f"sft: reusing the cached warm start {entry}")
        return entry
    work = entry.parent / f".{entry.name}.work"
    checkpoints = work / "checkpoints"
    last = get_last_checkpoint(str(checkpoints)) if checkpoints.is_dir() else None
    log(f"sft: {'resuming from ' + last if last else 'fine-tuning ' + str(base_path)} ({settings.sft_steps} steps on "
        f"{chain_set.num_sft} solutions); cached at {entry}")
    if not torch.cuda.is_available():
        log(f"sft: precision fp32 on CPU, on every machine: {SFT_CPU_PRECISION}")
    trainer, fmt = make_trainer(settings, chain_set, base_path, checkpoints, log, callbacks)
    trainer.train(resume_from_checkpoint=last)
    staging = work / "model"
    if trainer.accelerator.is_main_process:  # what a run killed while saving left
        shutil.rmtree(staging, ignore_errors=True)
    trainer.save_model(str(staging))  # model and tokenizer (written by the main process)
    if not trainer.accelerator.is_main_process:  # under `accelerate launch`: the main process publishes the entry
        trainer.accelerator.wait_for_everyone()
        return entry
    fmt.save(staging)  # `grail eval` and `grail explain` read the problems as they were trained
    losses = [row["loss"] for row in trainer.state.log_history if "loss" in row]
    record = {"key": key, "recipe": SFT_RECIPE_VERSION, "base": identity, "base_path": str(base_path),
              "task": asdict(chain_set.task), "num_sft": chain_set.num_sft, "seed": chain_set.seed,
              "splits": asdict(chain_set.splits), "settings": sft_settings_record(settings),
              "steps": trainer.state.global_step, "last_loss": losses[-1] if losses else None,
              "prompt_format": fmt.describe()}
    (staging / MARKER).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    if entry.exists():  # an unmarked entry (an interrupted rename): replace it
        shutil.rmtree(entry)
    staging.rename(entry)
    shutil.rmtree(work, ignore_errors=True)
    log(f"sft: done; warm start in {entry}")
    trainer.accelerator.wait_for_everyone()
    return entry


def run_command(values: dict, log: Log = print) -> int:
    """`grail sft`: `values` holds the given SFTFields and task_* fields (grail.options.sft.add_parser), and maybe a
    preset, whose task_* values and `sft:NAME` model are the defaults of the others (`preset_values`)."""
    values = {**preset_values(values.pop("preset", None)), **values}
    settings = SFTFields(**{k: v for k, v in values.items() if not k.startswith("task_")})
    chain_set = chain_set_of({k: v for k, v in values.items() if k.startswith("task_")})
    entry = sft_warm_start(settings, chain_set, log)
    task = " ".join(f"--{k} {v}" for k, v in values.items() if k.startswith("task_"))
    print(entry)
    log(f"next: grail train --model_name_or_path {entry} --task_style chains {task}".rstrip())
    log(f"      grail eval --model {entry} --benchmarks synthetic_chains (the default task's held-out problems)")
    return 0
