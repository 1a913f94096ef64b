"""The checkpoints of a run directory: TRL saves each checkpoint as a `checkpoint-N` folder, N the optimiser step.
Pure pathlib, so that the training layer (grail.training.resume: which are complete, resuming) and the analysis layer
(the saliency AUROC of each checkpoint) read them the same way."""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["checkpoint_dirs"]

_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")


def checkpoint_dirs(run_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, folder) of every `checkpoint-N` folder in run_dir, by increasing step; [] when run_dir is not a
    directory. Complete or not: grail.training.resume.complete_checkpoints keeps the completely saved ones."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    return sorted((int(m.group(1)), p) for p in run_dir.iterdir() if p.is_dir() and (m := _CHECKPOINT_RE.match(p.name)))
