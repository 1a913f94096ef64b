"""Where a benchmark's raw rows come from: a local copy (``<data_dir>/<name>/test.jsonl``), the Hugging Face Hub
(HUB_IDS), or the embedded task's held-out split. Each source returns ((row index, row) pairs, a description of
the origin); `grail.evaluation.benchmarks` normalises the rows to Problems.
"""

from __future__ import annotations

import json
from pathlib import Path

from grail.tasks.chains import ChainSet
from grail.tasks.synthetic import SyntheticSet

__all__ = ["HUB_IDS", "LOCAL_FILE", "chain_solutions", "hub_id", "hub_rows", "local_rows", "synthetic_rows"]

HUB_IDS: dict[str, str | None] = {
    "math500": "HuggingFaceH4/MATH-500",
    "aime24": "math-ai/aime24",
    "amc23": "math-ai/amc23",
    "minerva_math": "math-ai/minervamath",
    "college_math": None,  # not given by the data README: local copies only
    "olympiadbench": "math-ai/olympiadbench",
}
LOCAL_FILE = "test.jsonl"


def local_rows(name: str, data_dir: str | Path) -> tuple[list[tuple[int, dict]], str]:
    """(0-based line index, row) of every non-blank line of ``<data_dir>/<name>/test.jsonl``."""
    path = Path(data_dir).expanduser() / name / LOCAL_FILE
    if not path.is_file():
        raise FileNotFoundError(f"benchmark {name!r}: no file {str(path)!r}. data_dir must hold one folder per "
                                f"benchmark, <data_dir>/<name>/{LOCAL_FILE}; see docs/guides/evaluation.md).")
    rows = []
    with path.open(encoding="utf-8") as lines:
        for index, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}: line {index + 1} is not valid JSON ({err.msg} at column {err.colno}); "
                                 f"each line must be one JSON object.") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}: line {index + 1} is a JSON {type(row).__name__}, not an object; each "
                                 f"line must be one JSON object.")
            rows.append((index, row))
    return rows, str(path)


def _hub_hint(name: str) -> str:
    return f"pass --data-dir pointing at a local copy laid out as <dir>/{name}/{LOCAL_FILE}"


def hub_id(name: str) -> str:
    hub_id = HUB_IDS[name]
    if hub_id is None:
        raise ValueError(f"benchmark {name!r} has no known Hub id and cannot be loaded from the Hub: use a local "
                         f"directory instead; {_hub_hint(name)}.")
    return hub_id


def hub_rows(name: str) -> tuple[list[tuple[int, dict]], str]:
    """(row index, row) of the Hub copy's "test" split (or its only split)."""
    hint, dataset_id = _hub_hint(name), hub_id(name)
    from datasets import load_dataset  # local loading does not need `datasets`

    try:
        splits = load_dataset(dataset_id)
    except Exception as err:  # offline, unknown id, gated, ...: several exception types
        raise OSError(f"could not load benchmark {name!r} from the Hub id {dataset_id!r} ({type(err).__name__}: "
                      f"{err}). Offline or no Hub access? {hint[0].upper()}{hint[1:]}.") from err
    if "test" in splits:
        split = "test"
    elif len(splits) == 1:
        split = next(iter(splits))
    else:
        raise ValueError(f"Hub dataset {dataset_id!r} has no 'test' split but several others ({list(splits)}); "
                         f"{hint}.")
    return list(enumerate(splits[split])), f"hub:{dataset_id} (split {split})"


def synthetic_rows(synthetic_set: SyntheticSet | ChainSet | None = None) -> tuple[list[tuple[int, dict]], str]:
    """The held-out rows of `synthetic_set` (a training run's `GRAILConfig.synthetic_set()`: a `ChainSet` for the
    chain task), or of the default `SyntheticSet` when it is None."""
    which = "the run's task settings" if synthetic_set is not None else "default task settings"
    synthetic_set = synthetic_set or SyntheticSet()
    return list(enumerate(synthetic_set.rows("heldout"))), (
        f"grail.tasks held-out split ({synthetic_set.num_heldout} problems, task_seed {synthetic_set.seed}, {which})")


def chain_solutions(chain_set: ChainSet) -> dict[str, tuple[str, str]]:
    """The held-out reference solutions of `chain_set` with their answers, by the problem id its benchmark gives each
    row (the row's index in `synthetic_rows`): what `grail.tasks.chain_errors` reads completions against."""
    return {str(i): (e.solution, e.answer) for i, e in enumerate(chain_set.examples("heldout"))}
