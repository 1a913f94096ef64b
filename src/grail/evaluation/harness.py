"""Benchmark evaluation: sample, grade, score; resumable; results as JSON, markdown and per-sample JSONL.

Stands alone (never imports the trainer); `grail eval`, training's checkpoint evaluation and the throughput
benchmark all call `run_evaluation`. Protocol: docs/guides/evaluation.md (the prompt as in training, n samples per
problem, the last `\\boxed{}` graded against the reference with math-verify, acc@n and pass@k per benchmark, the
unweighted and the size-weighted average), plus 95% bootstrap CIs over problems (`grail.evaluation.scores`).

Scoring (`EvalSpec.scoring`, SCORINGS): "grail" grades with grail.evaluation.grader against `Problem.answer`; "release"
reproduces the release's scoring (grail.evaluation.release_scoring: its extraction, its un-normalised parse, its
reference text `Problem.release_answer`, its mean tokens over samples with a box), for comparison with the paper's
table. results.json and results.md name the scoring that produced them.

Output directory:
    run.json        the arguments (a rerun with other arguments into the same directory is refused; a field added
                    since, absent from an older run.json, reads as its default: RECORD_DEFAULTS)
    samples.jsonl   one line per sample: benchmark, problem_id, sample_index, completion, extracted, correct,
                    reason, tokens — appended batch by batch, flushed and fsync'ed. With a response prefix
                    (`EvalSpec.response_prefix`, prefilled after the generation prompt) the completion, and what
                    is graded, is prefix + generated text; tokens counts the generated tokens only
    results.json    metrics per benchmark and both averages (written atomically: temp file + rename), and
                    "timing": this call's wall seconds of sampling and grading and its new samples (a resumed
                    evaluation's covers only what this call did)
    results.md      the same as a markdown table (atomically)

Resuming. Problems are processed in a fixed order (benchmarks as given, each in file order), in batches of
`batch_size` problems; batch b is sampled with seed `seed + b`, so a batch gives the same samples whenever it
runs. A rerun with the same arguments reads samples.jsonl (dropping a torn last line), skips every batch whose
samples are all recorded, regenerates the others and records only the missing samples: the final metrics are
those of an uninterrupted run.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from grail.evaluation.benchmarks import LoadedBenchmark, Problem, load_benchmarks
from grail.evaluation.grader import GradingPool
from grail.evaluation.release_scoring import SCORINGS, release_mean_tokens, scoring_reference
from grail.evaluation.scores import BenchmarkScore, average_scores, format_markdown, score_benchmark, to_json
from grail.options.prompts import PromptFormat
from grail.options.sampling import Sampler, SamplingParams
from grail.tasks.synthetic import SyntheticSet

__all__ = ["EvalReport", "EvalSpec", "Log", "parse_size", "read_samples", "RECORD_DEFAULTS", "run_evaluation",
           "sampling_batches"]

Log = Callable[[str], None]
# run.json fields added after its first release, with the value a record written before them means, so that an older
# evaluation directory resumes with the same arguments
RECORD_DEFAULTS = {"response_prefix": ""}


@dataclass(frozen=True)
class EvalSpec:
    """What to evaluate and how; recorded in run.json."""

    benchmarks: tuple[str, ...]
    data_dir: str | None = None  # local copy laid out as <dir>/<name>/test.jsonl; None = the Hub
    # "release" (the release's subsets, grail.evaluation.benchmarks), None = all, or an int
    size: int | str | None = "release"
    subset_seed: int = 0
    sampling: SamplingParams = field(default_factory=SamplingParams)
    seed: int = 0
    batch_size: int = 16  # problems per sampling batch (each with its n samples)
    prompt: PromptFormat = field(default_factory=PromptFormat)
    release_subsets_dir: str | None = None  # folder of the release subsets' identity lists; None = data_dir
    scoring: str = "grail"  # a key of SCORINGS
    # text every response starts with, prefilled after the generation prompt (PromptFormat.render); "" = none
    response_prefix: str = ""

    def __post_init__(self):
        if self.scoring not in SCORINGS:
            raise ValueError(f"scoring={self.scoring!r}; choose from {', '.join(map(repr, SCORINGS))}.")

    def record(self) -> dict:
        record = json.loads(json.dumps(asdict(self)))  # plain JSON types (tuples → lists)
        return {**record, "sampling": self.sampling.record()}  # only the sampling settings that apply

    def load_benchmarks(self, synthetic_set: SyntheticSet | None = None) -> list[LoadedBenchmark]:
        """The problems this spec names (grail.evaluation.benchmarks.load_benchmarks with its data, size and subset
        settings); `synthetic_set`: see grail.evaluation.benchmarks.load_benchmark."""
        return load_benchmarks(self.benchmarks, data_dir=self.data_dir, size=self.size, seed=self.subset_seed,
                               release_subsets_dir=self.release_subsets_dir, synthetic_set=synthetic_set)


@dataclass
class EvalReport:
    results: dict  # the content of results.json
    markdown: str
    loaded: list[LoadedBenchmark]
    new_samples: int  # samples generated by this call (0 when everything was already recorded)
    scores: list[BenchmarkScore] = field(default_factory=list)  # per benchmark, with the per-problem arrays


def parse_size(text: str | int | None) -> int | str | None:
    """`release` → "release"; `all` or None → None (every usable problem); a positive number → that many."""
    if text is None or text == "all":
        return None
    if text == "release":
        return "release"
    try:
        value = int(text)
    except (TypeError, ValueError):
        value = 0
    if value < 1:
        raise ValueError(f"benchmark size {text!r}: give `release`, `all`, or a positive number of problems.")
    return value


def _key(benchmark: str, problem_id: str, index: int) -> tuple[str, str, int]:
    return benchmark, problem_id, index


def read_samples(path: Path) -> dict[tuple[str, str, int], dict]:
    """Recorded samples by key. A torn last line (an interrupted write) is cut off the file; a corrupt line
    elsewhere is an error naming it."""
    if not path.is_file():
        return {}
    raw = path.read_bytes()
    good_end = raw.rfind(b"\n") + 1
    if good_end < len(raw):
        with path.open("r+b") as f:  # drop the partial line so the next append starts clean
            f.truncate(good_end)
    records = {}
    for number, line in enumerate(raw[:good_end].split(b"\n")[:-1], start=1):
        try:
            r = json.loads(line.decode("utf-8"))
            records[_key(r["benchmark"], r["problem_id"], r["sample_index"])] = r
        except (ValueError, KeyError) as err:
            raise ValueError(f"{path}, line {number} is not a sample record ({err}); the file is damaged: move it "
                             f"away to start this evaluation over.") from err
    return records


def _append(path: Path, records: Sequence[dict]) -> None:
    with path.open("a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in records))
        f.flush()
        os.fsync(f.fileno())


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _check_run_record(out_dir: Path, spec: EvalSpec) -> None:
    path = out_dir / "run.json"
    record = spec.record()
    if path.is_file():
        try:
            previous = {**RECORD_DEFAULTS, **json.loads(path.read_text(encoding="utf-8"))}
        except ValueError as err:  # JSONDecodeError, UnicodeDecodeError
            raise ValueError(f"{path} is damaged ({err}), so this evaluation's arguments are unknown: move {out_dir} "
                             f"away (or delete run.json to resume with the current arguments) and rerun.") from err
        if previous != record:
            changed = sorted(k for k in record if previous.get(k) != record[k])
            raise ValueError(f"{out_dir} holds an evaluation with other arguments ({', '.join(changed)} differ); "
                             f"rerun with the same arguments to resume it, or choose another output directory.")
    else:
        _write_atomic(path, json.dumps(record, indent=2) + "\n")


def sampling_batches(spec: EvalSpec, loaded: list[LoadedBenchmark]) -> list[list[Problem]]:
    """The problems in the order they are sampled, in batches of `spec.batch_size`; batch b is sampled with seed
    `spec.seed + b` (the unit of resuming, and of sharding the evaluation over processes)."""
    items = [p for bench in loaded for p in bench.problems]
    return [items[i : i + spec.batch_size] for i in range(0, len(items), spec.batch_size)]


def run_evaluation(sampler: Sampler, tokenizer, spec: EvalSpec, out_dir: str | Path, *, workers: int | None = None,
                   log: Log = print, progress: bool = True,
                   loaded: list[LoadedBenchmark] | None = None) -> EvalReport:
    """Evaluate `sampler`'s model on `spec.benchmarks`, resuming whatever `out_dir` already holds.

    `workers`: grading processes (None: `grail.evaluation.grader.default_workers()`). `loaded`: benchmarks already
    loaded (else loaded from spec). Returns the metrics and writes the files described in the module docstring.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    _check_run_record(out_dir, spec)
    if loaded is None:
        loaded = spec.load_benchmarks()
    for bench in loaded:
        if bench.skipped:
            log(f"{bench.name}: {len(bench.skipped)} of {bench.total_rows} rows have no usable reference answer and "
                f"are not evaluated (listed in results.json)")
    samples_path = out_dir / "samples.jsonl"
    recorded = read_samples(samples_path)
    n = spec.sampling.n
    items: list[Problem] = [p for bench in loaded for p in bench.problems]
    for p in items:
        scoring_reference(p, spec.scoring)  # a problem the scoring cannot grade stops the run before any sampling
    batches = sampling_batches(spec, loaded)
    done = sum(all(_key(p.source, p.id, j) in recorded for j in range(n)) for p in items)
    bar = _progress_bar(len(items), done, progress)
    begin = time.perf_counter()
    with GradingPool(workers if done < len(items) else 1) as pool:  # one set of grading processes for the run
        new_samples = _sample_and_grade(sampler, tokenizer, spec, batches, recorded, samples_path, pool, bar)
    timing = {"seconds": time.perf_counter() - begin, "new_samples": new_samples}
    if bar is not None:
        bar.close()
    scores = [_score(bench, recorded, spec) for bench in loaded if bench.problems]
    averages = list(average_scores(scores, seed=spec.seed)) if scores else []
    results = {**to_json(scores, averages), "scoring": {"name": spec.scoring,
                                                        "description": SCORINGS[spec.scoring].description},
               "spec": spec.record(),
               "benchmarks_loaded": [{"name": b.name, "subset": b.subset, "total_rows": b.total_rows,
                                      "evaluated": len(b.problems), "skipped": [list(s) for s in b.skipped]}
                                     for b in loaded],
               "timing": timing}
    markdown = f"Scoring: {SCORINGS[spec.scoring].description}.\n\n" + format_markdown(scores, averages)
    _write_atomic(out_dir / "results.json", json.dumps(results, indent=2) + "\n")
    _write_atomic(out_dir / "results.md", markdown + "\n")
    return EvalReport(results, markdown, loaded, new_samples, scores)


def _score(bench: LoadedBenchmark, recorded: dict, spec: EvalSpec) -> BenchmarkScore:
    """One benchmark's metrics from its recorded samples; release scoring takes the release's mean tokens."""
    records_PN = [[recorded[_key(bench.name, p.id, j)] for j in range(spec.sampling.n)] for p in bench.problems]
    tokens_PN = [[r["tokens"] for r in records_N] for records_N in records_PN]
    score = score_benchmark(bench.name, [[r["correct"] for r in records_N] for records_N in records_PN], tokens_PN,
                            seed=spec.seed)
    if spec.scoring == "release":
        extracted_PN = [[r["extracted"] for r in records_N] for records_N in records_PN]
        score = replace(score, mean_completion_tokens=release_mean_tokens(tokens_PN, extracted_PN))
    return score


def _sample_and_grade(sampler: Sampler, tokenizer, spec: EvalSpec, batches: list[list[Problem]],
                      recorded: dict, samples_path: Path, pool: GradingPool, bar) -> int:
    """Sample and grade every batch with an unrecorded sample; append the new records batch by batch."""
    n, new_samples = spec.sampling.n, 0
    for b, batch in enumerate(batches):
        missing = [(p, j) for p in batch for j in range(n) if _key(p.source, p.id, j) not in recorded]
        if not missing:
            continue
        prompts = [spec.prompt.render(tokenizer, p.problem, spec.response_prefix) for p in batch]
        samples = sampler.generate(prompts, spec.sampling, seed=spec.seed + b)  # the whole batch: same samples
        row = {(p.source, p.id): i for i, p in enumerate(batch)}
        chosen = [(p, j, samples[row[p.source, p.id]][j]) for p, j in missing]
        references = [scoring_reference(p, spec.scoring) for p, _, _ in chosen]
        texts = [spec.response_prefix + s.text for _, _, s in chosen]  # the response as the model wrote it
        grades = pool.grade_many(texts, references, scoring=SCORINGS[spec.scoring])
        records = [{"benchmark": p.source, "problem_id": p.id, "sample_index": j, "completion": text,
                    "extracted": g.extracted, "correct": bool(g.correct), "reason": g.reason, "tokens": s.num_tokens}
                   for (p, j, s), text, g in zip(chosen, texts, grades, strict=True)]
        _append(samples_path, records)
        recorded.update({_key(r["benchmark"], r["problem_id"], r["sample_index"]): r for r in records})
        new_samples += len(records)
        if bar is not None:
            bar.update(len({(p.source, p.id) for p, _ in missing}))
    return new_samples


def _progress_bar(total: int, done: int, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=done, desc="problems", unit="problem")
