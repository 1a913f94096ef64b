r"""Evaluation benchmarks as (id, problem, reference answer) triples: six math sets and the synthetic task.

The six sets of the evaluation protocol (docs/guides/evaluation.md) are read from a local copy laid out as
``<data_dir>/<name>/test.jsonl`` or, with no ``data_dir``, from the Hugging Face Hub
(grail.evaluation.benchmark_sources.HUB_IDS). How each set's rows become problems (its schema, ids, skipped rows,
answer normalisation): grail.evaluation.benchmark_rows, whose names this module exports too. Which problems are
taken:

1. ``size="release"`` takes the release's fixed 200-problem files for CollegeMath and OlympiadBench, in the
   release's order, and every usable row elsewhere. Their identities are read from the lists in
   RELEASE_SUBSET_FILES, ``<lists_dir>/<name>/<file>`` (a local copy keeps them next to test.jsonl): one
   OlympiadBench ``id`` per line; one JSON object per line with CollegeMath's ``data_source`` and
   ``question_number`` (the pair that makes its id) and ``row``, the 0-based line in the local test.jsonl,
   checked against a local copy. Problems are matched by id, so a Hub copy works too, given the lists'
   folder. A listed problem missing from the data is an error, never a smaller subset.
2. ``size=N`` is a seeded subset: the usable problems sorted on sha256(f"{seed}:{id}"), the first N kept, in
   file order: the same on every machine, and nested (a smaller size is a subset of a larger one for the same
   seed). It is not the release's subset.
3. Hub copies are assumed to carry the local copies' fields; the split is "test", or the only split when
   there is no "test" split. A Hub copy with other field names shows up as every row skipped: ValueError.
4. "synthetic" is the embedded task's held-out split (grail.tasks.synthetic.SyntheticSet), with the default task
   settings or a training run's own (``synthetic_set``). Its problem is the task's prompt ("Q: 7+5*3\nA:"),
   which already carries the task's format; ``data_dir`` and the Hub play no part. "synthetic_words" is its word
   style's held-out split (grail.tasks.word_problems: the run's when the run uses that style, else WORDS_SET), whose
   problems are chat messages (worked examples as earlier turns), rendered with the model's chat template.
   "synthetic_chains" is the chain task's held-out split (grail.tasks.chains: the run's when the run uses that
   style, else the default `ChainSet`), one user turn each. A run with task_style chains gets the same problems
   under "synthetic" (its `synthetic_set` is a `ChainSet`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from grail.evaluation.benchmark_rows import (
    BENCHMARK_NAMES,
    LOADABLE_NAMES,
    RELEASE_ANSWER_FIELDS,
    SYNTHETIC,
    SYNTHETIC_CHAINS,
    SYNTHETIC_NAMES,
    SYNTHETIC_WORDS,
    Problem,
    normalise,
    release_reference,
    row_id,
    strip_math_delimiters,
)
from grail.evaluation.benchmark_sources import hub_id, hub_rows, local_rows, synthetic_rows
from grail.tasks.chains import ChainSet
from grail.tasks.synthetic import SyntheticSet

__all__ = [
    "BENCHMARK_NAMES", "load_benchmark", "load_benchmarks", "LOADABLE_NAMES", "LoadedBenchmark",
    "parse_benchmark_list", "Problem", "RELEASE_ANSWER_FIELDS", "release_reference", "RELEASE_SUBSET_FILES",
    "release_subset_ids", "seeded_subset", "strip_math_delimiters", "SYNTHETIC", "SYNTHETIC_CHAINS", "SYNTHETIC_NAMES",
    "SYNTHETIC_WORDS", "synthetic_problems"
]

# the identity lists of the release's fixed subsets, <lists_dir>/<name>/<file>; the other benchmarks: every row
RELEASE_SUBSET_FILES = {"college_math": "release_subset.jsonl", "olympiadbench": "release_subset_ids.txt"}


@dataclass(frozen=True)
class LoadedBenchmark:
    """The selected problems of one benchmark, in file order (the release's subsets: in the release's order).

    total_rows: rows read (usable or not); skipped: (id, reason) of every row with no usable problem or answer;
    subset: how ``problems`` was chosen among the usable rows ("all", "seeded 200 of 2818 (seed 0)" or
    "release 200 of 675 (<path of the identity list>)");
    origin: where the rows came from (a file path, "hub:<id> (split test)", or the synthetic task).
    """

    name: str
    problems: tuple[Problem, ...]
    total_rows: int
    skipped: tuple[tuple[str, str], ...]
    subset: str
    origin: str = ""


# ---- selection and the public loaders ------------------------------------------------------------------------
def seeded_subset(problems: Sequence[Problem], size: int, seed: int) -> tuple[Problem, ...]:
    """The ``size`` problems with the smallest sha256(f"{seed}:{id}"), in their original order.

    Deterministic on every machine; for one seed, the subset of size k is contained in that of size k + 1.
    """
    ranked = sorted(range(len(problems)), key=lambda i: hashlib.sha256(f"{seed}:{problems[i].id}".encode()).digest())
    return tuple(problems[i] for i in sorted(ranked[:size]))


def _check_name(name: str) -> None:
    if name not in LOADABLE_NAMES:
        raise ValueError(f"unknown benchmark {name!r}; choose from {', '.join(LOADABLE_NAMES)}.")


def _release_list_path(name: str, lists_dir: str | Path | None) -> Path:
    file = f"{name}/{RELEASE_SUBSET_FILES[name]}"
    fix = (f"pass a local copy holding it as data_dir (grail eval --data-dir, training's eval_data_dir; "
           f"a local copy keeps the lists next to test.jsonl), or its folder as release_subsets_dir (grail eval "
           f"--release-subsets-dir DIR, DIR/{file}); or choose another size: `all` or a number (a seeded subset, "
           f"not the release's)")
    if lists_dir is None:
        raise ValueError(f"size='release' for {name!r} needs the release's identity list {file}, which neither "
                         f"grail-rl nor the Hub copy holds: {fix}.")
    path = Path(lists_dir).expanduser() / file
    if not path.is_file():
        raise FileNotFoundError(f"size='release' for {name!r}: no identity list {str(path)!r}; {fix}.")
    return path


def release_subset_ids(name: str, path: str | Path) -> list[tuple[str, int | None]]:
    """(problem id, 0-based line in the local test.jsonl or None) of each listed problem, in the list's order.

    OlympiadBench: one id per line. CollegeMath: one JSON object per line; the id is made from its
    ``data_source`` and ``question_number`` exactly as for a data row, and ``row`` is the line. ValueError on a
    malformed line or a repeated problem.
    """
    entries, seen = [], set()
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        if name == "olympiadbench":
            entry = (line.strip(), None)
        else:
            try:
                record = json.loads(line)
                entry = (f"{record['data_source']}/{record['question_number']}", record.get("row"))
            except (ValueError, KeyError, TypeError) as err:
                raise ValueError(f"{path}: line {number} is not a JSON object with data_source and "
                                 f"question_number ({type(err).__name__}: {err}).") from None
        if entry[0] in seen:
            raise ValueError(f"{path}: line {number} lists {entry[0]!r} a second time; each problem once.")
        seen.add(entry[0])
        entries.append(entry)
    return entries


def _release_subset(name: str, problems: list[Problem], rows: list[tuple[int, dict]], origin: str, path: Path,
                    local: bool) -> tuple[tuple[Problem, ...], str]:
    """The problems listed in `path`, in its order, and the subset's description; ValueError if any is missing
    (or, in a local copy, sits on another line than the list says)."""
    entries = release_subset_ids(name, path)
    by_id = {p.id: p for p in problems}
    missing = [problem_id for problem_id, _ in entries if problem_id not in by_id]
    if missing:
        raise ValueError(f"{name}: {len(missing)} of the {len(entries)} problems listed in {path} are not among the "
                         f"usable rows of {origin} (first: {missing[:3]}); this is not the copy the list was made "
                         f"for. Use the matching copy, or size `all` or a number.")
    if local:
        line_of = {row_id(name, row, index): index for index, row in rows}
        moved = [(i, line, line_of[i]) for i, line in entries if line is not None and line != line_of[i]]
        if moved:
            raise ValueError(f"{name}: {len(moved)} problems of {path} are not on the line it gives in {origin} "
                             f"(first: id, listed line, actual line = {moved[0]}); the list was made for another "
                             f"copy. Use the matching copy, or size `all` or a number.")
    return tuple(by_id[i] for i, _ in entries), f"release {len(entries)} of {len(problems)} ({path})"


def synthetic_problems(name: str, synthetic_set: SyntheticSet | ChainSet | None = None
                       ) -> SyntheticSet | ChainSet | None:
    """The problem set behind the synthetic benchmark `name`, given a run's `synthetic_set` (`load_benchmark`'s
    argument: which one each name takes, and its defaults); None for "synthetic" without one (`synthetic_rows`'
    default)."""
    if name == SYNTHETIC_WORDS:
        from grail.tasks.synthetic import WORDS_SET

        words = synthetic_set is not None and synthetic_set.task.style == "words"
        return synthetic_set if words else WORDS_SET
    if name == SYNTHETIC_CHAINS:
        return synthetic_set if isinstance(synthetic_set, ChainSet) else ChainSet()
    return synthetic_set


def load_benchmark(
    name: str,
    *,
    data_dir: str | Path | None = None,
    size: int | None | Literal["release"] = "release",
    seed: int = 0,
    release_subsets_dir: str | Path | None = None,
    synthetic_set: SyntheticSet | ChainSet | None = None,
) -> LoadedBenchmark:
    """Load one benchmark (the per-benchmark normalisation: grail.evaluation.benchmark_rows).

    data_dir: folder holding ``<name>/test.jsonl``; None loads its Hub copy
    (grail.evaluation.benchmark_sources.HUB_IDS).
    size: "release" = the release's subset where RELEASE_SUBSET_FILES lists one, else every usable row; None =
        every usable row; an int = a seeded subset of that many usable rows (1 <= size <= usable rows).
    seed: chooses a seeded subset (ignored otherwise).
    release_subsets_dir: folder holding the identity lists as ``<name>/<file>``; None = data_dir. Needed only for
        size="release" on CollegeMath or OlympiadBench.
    synthetic_set: for "synthetic", the problems a training run uses (`GRAILConfig.synthetic_set()`), so that
        checkpoint evaluation uses the run's own task; None = the default `SyntheticSet`. For "synthetic_words",
        the same when its style is "words", else the word style's defaults (grail.tasks.synthetic.WORDS_SET); for
        "synthetic_chains", the same when it is a `ChainSet`, else the default `ChainSet`.
    """
    _check_name(name)
    if data_dir is None and name not in SYNTHETIC_NAMES:
        hub_id(name)  # a benchmark with no Hub copy: that error first
    release_list = None  # found before the rows are read: a missing list stops before a Hub download
    if size == "release" and name in RELEASE_SUBSET_FILES:
        release_list = _release_list_path(name, release_subsets_dir or data_dir)
    if name in SYNTHETIC_NAMES:
        rows, origin = synthetic_rows(synthetic_problems(name, synthetic_set))
    elif data_dir is None:
        rows, origin = hub_rows(name)
    else:
        rows, origin = local_rows(name, data_dir)
    problems, skipped = normalise(name, rows)
    if not problems:
        raise ValueError(f"benchmark {name!r} ({origin}): none of its {len(rows)} rows has a usable problem and "
                         f"answer (first reasons: {skipped[:3]}); the file does not have the expected schema.")
    if release_list is not None:
        selected, subset = _release_subset(name, problems, rows, origin, release_list, local=data_dir is not None)
        return LoadedBenchmark(name=name, problems=selected, total_rows=len(rows), skipped=tuple(skipped),
                               subset=subset, origin=origin)
    if size == "release":
        size = None
    if size is not None and (isinstance(size, bool) or not isinstance(size, int)):
        raise ValueError(f"size={size!r} for {name!r} must be an int, None (all rows) or 'release'.")
    if size is not None and not 1 <= size <= len(problems):
        raise ValueError(f"size={size} for {name!r} must be between 1 and {len(problems)} (its usable rows; "
                         f"{len(skipped)} skipped), or None for all rows.")
    if size is None or size == len(problems):
        selected, subset = tuple(problems), "all"
    else:
        selected, subset = seeded_subset(problems, size, seed), f"seeded {size} of {len(problems)} (seed {seed})"
    return LoadedBenchmark(name=name, problems=selected, total_rows=len(rows), skipped=tuple(skipped),
                           subset=subset, origin=origin)


def parse_benchmark_list(text: str) -> list[str]:
    """ "math500, aime24" → ["math500", "aime24"]; "all" stands for the six BENCHMARK_NAMES. ValueError on an
    unknown or repeated name, or on an empty list."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    names = [expanded for n in names for expanded in (BENCHMARK_NAMES if n == "all" else (n,))]
    allowed = f"choose from {', '.join(LOADABLE_NAMES)} (comma-separated), or 'all' for the six math sets"
    if not names:
        raise ValueError(f"empty benchmark list {text!r}; {allowed}.")
    unknown = [n for n in names if n not in LOADABLE_NAMES]
    if unknown:
        raise ValueError(f"unknown benchmark(s) {', '.join(map(repr, unknown))}; {allowed}.")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"benchmark(s) listed twice in {text!r}: {', '.join(repeated)}; list each once.")
    return names


def load_benchmarks(names: Sequence[str] | str, **kwargs) -> list[LoadedBenchmark]:
    """``load_benchmark(name, **kwargs)`` for each name (a string is parsed with parse_benchmark_list)."""
    if isinstance(names, str):
        names = parse_benchmark_list(names)
    return [load_benchmark(name, **kwargs) for name in names]
