"""Resuming a killed run: complete checkpoints only, the metrics file continued without duplicates, the run
directory guarded against a second run writing into it.

A checkpoint is complete when `checkpoint-N/grail_checkpoint_complete.json` exists. `CheckpointMarker` writes it
(atomically: a temporary file renamed into place) after transformers has saved everything of that step (model,
optimiser, scheduler, RNG states, trainer state) on every process; a kill during the save leaves a directory without
the marker, which resuming never picks. `resume_from_checkpoint` (TRL's field) takes a checkpoint directory or
`true` (the last complete checkpoint of output_dir).

On resume, `metrics.jsonl` is cut back to the lines of steps up to the checkpoint's (the lines written after it
belong to steps that are trained again; an attempt stopped by a signal also wrote its end-of-training line, which
goes too), and `resumed.jsonl` records each resume (from which checkpoint, at which
step, when). Starting a run into an output_dir that already holds a run refuses, naming the flag that resumes it
and the one that overwrites it.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import warnings
from pathlib import Path

from transformers import TrainerCallback

from grail.options.checkpoint_dirs import checkpoint_dirs
from grail.training.provenance import CODE_FILE

__all__ = ["MARKER", "RUN_FILES", "CheckpointMarker", "checkpoint_step", "complete_checkpoints", "load_generator",
           "prepare_run_dir", "resolve_resume", "save_generator"]

MARKER = "grail_checkpoint_complete.json"
RUN_FILES = ("metrics.jsonl", "config.yaml", "resolved_config.json", "resumed.jsonl", CODE_FILE, "final", "eval")
RESUME_LAST = ("true", "True", "last")


class CheckpointMarker(TrainerCallback):
    """Marks `checkpoint-N` complete once every process has saved its part of it."""

    def on_save(self, args, state, control, **kwargs):
        from accelerate import PartialState

        PartialState().wait_for_everyone()  # each process writes its own RNG state into the checkpoint
        if state.is_world_process_zero:
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            temporary = folder / f".{MARKER}.tmp"
            temporary.write_text(json.dumps({"step": state.global_step, "time": time.time()}) + "\n")
            os.replace(temporary, folder / MARKER)


def complete_checkpoints(run_dir: str | Path) -> list[Path]:
    """The complete checkpoints of a run directory, oldest first."""
    return [p for _, p in checkpoint_dirs(run_dir) if (p / MARKER).is_file()]


def resolve_resume(value: str | None, run_dir: str | Path) -> Path | None:
    """The checkpoint to resume from: None (a new run), the last complete one (`true`), or the given directory,
    which must be complete."""
    if value in (None, "", False, "false", "False"):
        return None
    complete = complete_checkpoints(run_dir)
    last = f"the last complete one is {complete[-1]}" if complete else f"{run_dir} holds no complete checkpoint"
    if value in RESUME_LAST or value is True:
        if not complete:
            raise ValueError(f"resume_from_checkpoint=true: {last} (a checkpoint is complete when it holds {MARKER}); "
                             f"start a new run without --resume_from_checkpoint.")
        return complete[-1]
    path = Path(value).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(f"resume_from_checkpoint={value!r}: no such directory; {last} "
                                f"(--resume_from_checkpoint true picks it).")
    if not (path / MARKER).is_file():
        raise ValueError(f"resume_from_checkpoint={value!r} is not a complete checkpoint (no {MARKER}: the run was "
                         f"killed while saving it, or it was not written by grail); {last}.")
    return path


def checkpoint_step(checkpoint: Path) -> int:
    """The step a complete checkpoint was saved at (its marker's)."""
    return json.loads((checkpoint / MARKER).read_text())["step"]


def _previous_run(run_dir: Path) -> list[Path]:
    if not run_dir.is_dir():
        return []
    previous = [run_dir / name for name in RUN_FILES if (run_dir / name).exists()]
    return previous + [p for _, p in checkpoint_dirs(run_dir)]


def prepare_run_dir(run_dir: str | Path, resume_from: Path | None, overwrite: bool, main_process: bool) -> None:
    """Before training: refuse to mix two runs in one directory; on resume, cut metrics.jsonl back to the
    checkpoint's step and record the resume; with `overwrite`, remove the previous run's files (only those).
    Every process decides on what the directory held before any of them wrote to it."""
    from accelerate import PartialState

    run_dir = Path(run_dir)
    previous = _previous_run(run_dir)
    PartialState().wait_for_everyone()  # every process looks before the main process writes anything
    if resume_from is None:
        if previous and not overwrite:
            names = ", ".join(p.name for p in previous[:4]) + (", ..." if len(previous) > 4 else "")
            raise ValueError(f"output_dir {str(run_dir)!r} already holds a run ({names}); continue it with "
                             f"--resume_from_checkpoint true, "
                             f"replace it with --overwrite_output_dir true, or choose another output_dir.")
        if previous and overwrite and main_process:
            for path in previous:
                shutil.rmtree(path) if path.is_dir() else path.unlink()
        return
    if not main_process:
        return
    step = checkpoint_step(resume_from)
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file():
        kept = [line for line in metrics.read_text().splitlines()
                if (line_step := _line_step(line)) is not None and line_step <= step and not _summary(line)]
        temporary = metrics.with_suffix(".jsonl.tmp")
        temporary.write_text("".join(line + "\n" for line in kept))
        os.replace(temporary, metrics)
    with (run_dir / "resumed.jsonl").open("a") as f:
        f.write(json.dumps({"from": str(resume_from), "step": step, "time": time.time()}) + "\n")


def _summary(line: str) -> bool:
    """The end-of-training line transformers logs (`train_runtime`, `train_loss`): an attempt that a stop signal
    ended early wrote one at its checkpoint's step (grail.training.stop); the resumed run writes its own at the end."""
    return '"train_runtime"' in line


def _line_step(line: str) -> int | None:
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None  # a torn last line from the kill: dropped


# ---- the trainer's token-weighting generator (GRAILTrainer's S6) ----------------------------------------------------
def _generator_file(checkpoint: str | Path, rank: int) -> Path:
    return Path(checkpoint) / f"grail_generator_state_{rank}.pth"


def save_generator(generator, checkpoint: str | Path, rank: int) -> None:
    """Save process `rank`'s token-weighting generator (the random control's permutations, OAR-G's noise) into a
    checkpoint beside transformers' RNG states: without it a resumed run would draw again from the seed."""
    import torch

    torch.save(generator.get_state(), _generator_file(checkpoint, rank))


def load_generator(generator, checkpoint: str | Path, rank: int, method: str) -> None:
    """Restore what `save_generator` saved; a checkpoint without it (saved before grail-rl kept it) warns unless the
    method is `none`, whose weights draw nothing."""
    import torch

    path = _generator_file(checkpoint, rank)
    if path.is_file():
        generator.set_state(torch.load(path, weights_only=True))
    elif method != "none":
        warnings.warn(f"grail: {checkpoint} holds no token-weighting generator state (saved before grail-rl kept "
                      f"it): if {method} draws from it (the random control and OAR-G do), its draws after this step "
                      f"differ from an uninterrupted run's.", stacklevel=3)


# ---- a learning method's state (MethodSpec.state; GRAILTrainer's S6) ----------------------------------------------
def _method_state_file(checkpoint: str | Path, rank: int) -> Path:
    return Path(checkpoint) / f"method_state_{rank}.pt"


def save_method_state(state, checkpoint: str | Path, rank: int) -> None:
    """Save process `rank`'s method state (`MethodSpec.state`: what a learning method has learned so far) into a
    checkpoint, beside the token-weighting generator."""
    import torch

    torch.save(state.state_dict(), _method_state_file(checkpoint, rank))


def load_method_state(state, checkpoint: str | Path, rank: int, method: str) -> None:
    """Restore what `save_method_state` saved. A checkpoint without it cannot resume the method exactly (it was
    saved by a run of another method): ValueError naming the file and the fix."""
    import torch

    path = _method_state_file(checkpoint, rank)
    if not path.is_file():
        raise ValueError(f"{checkpoint} holds no state of token_weighting={method!r} ({path.name}): it was saved by a "
                         f"run of another method, or before the method kept state, and {method} would start learning "
                         f"again from nothing. Resume it with the method it was trained with, or start a new run "
                         f"(a new output_dir).")
    state.load_state_dict(torch.load(path, weights_only=True))
