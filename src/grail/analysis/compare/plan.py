"""`grail compare`: arms × training seeds, each an ordinary grail training run from one warm start, every run
evaluated by the same protocol, resumable after a kill, then a report over seeds (grail.analysis.compare.report).

An arm is a `token_weighting` method, optionally with config fields: `grail@saliency_leaf=middle@weight_std=1.0`
(fields after `@`, each `field=value`; arms are comma-separated on the command line). A sweep `field=v1,v2` crosses
every arm with every value (`grail@learning_rate=5e-05`). Every arm's config is built (validated) before any
training. Seed s (0..S−1) sets `seed` (TRL: model init, sampling, the prompt sampler, the random control's
permutation) and `data_seed` for every arm, and `dataset_shuffle_seed` too when the base config sets one, so arms
are paired by seed. Everything else is the base config: evaluation settings come from it, not from an arm's fields,
so every arm is measured the same way.

Comparison directory (`--output_dir`):
    compare.json                the plan (arms, seeds, base config, seed fields, sweeps, evaluation); a rerun with
                                other arguments is refused
    auroc_warmstart.json        with auroc_rows: the saliency AUROC of each arm's warm start, {arm label: {...}}
    runs/<arm-slug>/seed<s>/    one `grail train` run directory (grail.training.run), plus compare.log (its training and
                                evaluation log) and the files of grail.analysis.compare.run (compare_trained.json,
                                eval/, extra_metrics.json, auroc_checkpoints.json, compare_result.json: the finished
                                marker)
    report.md, report.json, *.png   grail.analysis.compare.report

A sweep `--sweep FIELD=v1,v2` pairs each arm with the first arm at the same value (grail.analysis.compare.sweep), not
across values; the report adds a table and a plot of the headline metric against the swept value.

Resuming: a finished run (compare_result.json) is skipped; a trained one is only evaluated (the harness resumes its
samples); a half-trained one resumes from its last complete checkpoint (`resume_from_checkpoint=true`), or starts
over (`overwrite_output_dir`) when it has none.

Running: with jobs=1 the runs train one after another in this process; with jobs=N, N worker processes
(`python -m grail.analysis.compare.cli OUT SLUG SEED THREADS PARENT_PID`), each with cpu_count // N threads
(OMP_NUM_THREADS and torch.set_num_threads) and, with several visible GPUs, one GPU each (CUDA_VISIBLE_DEVICES, round
robin over the N slots). A worker exits when its parent dies, so a killed comparison leaves no orphan training.

Per-run evaluations beyond the protocol: grail.analysis.compare.run.EXTRA_EVALUATIONS (re-exported here).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import typing
from dataclasses import dataclass
from pathlib import Path

from grail.analysis.compare.auroc import auroc_methods, run_auroc
from grail.analysis.compare.report import RESULT_FILE, WARMSTART_AUROC_FILE, run_path, write_report
from grail.analysis.compare.run import (
    EXTRA_EVALUATIONS,
    LOG_FILE,
    Log,
    checkpoint_auroc,
    lock,
    run_one,
    run_values,
    write_json,
)
from grail.options.choices import Method
from grail.options.fields import SYNTHETIC_DATASET, TINY_MODEL
from grail.training.config import GRAILConfig
from grail.training.overrides import build_config, coerce

__all__ = ["Arm", "check_plan", "EXTRA_EVALUATIONS", "make_plan", "parse_arms", "parse_sweep", "PLAN_FILE",
           "run_comparison", "run_one", "run_values", "run_worker"]

PLAN_FILE = "compare.json"
SEED_FIELDS = ("seed", "data_seed")  # plus dataset_shuffle_seed when the base config sets it
RESERVED = ("token_weighting", "output_dir", "resume_from_checkpoint", "overwrite_output_dir", *SEED_FIELDS,
            "dataset_shuffle_seed")
STATUS_EVERY_S = 30.0
_FIELD_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# ---- arms and the plan -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Arm:
    label: str  # as written: method@field=value@...
    method: str
    fields: dict  # typed values

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9._@=+-]", "_", self.label)


def _arm(text: str) -> Arm:
    method, *parts = text.split("@")
    methods = typing.get_args(Method)
    if method not in methods:
        raise ValueError(f"--arms: arm {text!r} starts with {method!r}, not a method; an arm is METHOD or "
                         f"METHOD@field=value@... with METHOD one of {', '.join(methods)}.")
    fields, labels = {}, [method]
    for part in parts:
        key, eq, value = part.partition("=")
        if not eq or not _FIELD_RE.match(key) or value == "":
            raise ValueError(f"--arms: {part!r} in arm {text!r} is not field=value (e.g. grail@saliency_leaf=middle"
                             f"@weight_std=1.0).")
        if key in RESERVED:
            raise ValueError(f"--arms: arm {text!r} sets {key}, which grail compare sets itself (the method comes "
                             f"first; seeds are --seeds; directories follow --output_dir).")
        if key in fields:
            raise ValueError(f"--arms: arm {text!r} sets {key} twice.")
        fields[key] = coerce(key, value, f"arm {text}")
        labels.append(f"{key}={value}")
    return Arm("@".join(labels), method, fields)


def parse_sweep(text: str) -> tuple[str, list[str]]:
    """`learning_rate=2.5e-5,5e-5` → ("learning_rate", ["2.5e-5", "5e-5"])."""
    key, eq, values = text.partition("=")
    raw = [v.strip() for v in values.split(",") if v.strip()]
    if not eq or not _FIELD_RE.match(key.strip()) or not raw:
        raise ValueError(f"--sweep {text!r}: give FIELD=v1,v2,... (e.g. --sweep learning_rate=2.5e-5,5e-5,1e-4).")
    if key.strip() in RESERVED:
        raise ValueError(f"--sweep {text!r}: grail compare sets {key.strip()} itself; sweep another field.")
    return key.strip(), raw


def parse_arms(text: str, sweeps: list[str] | tuple[str, ...] = ()) -> list[Arm]:
    """The arms of `--arms A,B,...`, crossed with every `--sweep FIELD=v1,v2` (labels show the values)."""
    parts = [part.strip() for part in text.split(",")]
    if not all(parts):
        raise ValueError(f"--arms {text!r}: give one or more arms, comma-separated, none empty (e.g. --arms "
                         f"none,grail).")
    arms = [_arm(part) for part in parts]
    for sweep in sweeps:
        key, values = parse_sweep(sweep)
        clash = [a.label for a in arms if key in a.fields]
        if clash:
            raise ValueError(f"--sweep {sweep!r}: arm {clash[0]!r} already sets {key}; sweep it or set it, not both.")
        arms = [Arm(f"{a.label}@{key}={v}", a.method, {**a.fields, key: coerce(key, v, f"--sweep {sweep}")})
                for a in arms for v in values]
    for attr in ("label", "slug"):
        names = [getattr(a, attr) for a in arms]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"--arms: two arms have the {attr} {repeated[0]!r}; every arm must differ.")
    return arms


def _protocol(cfg: GRAILConfig) -> dict:
    from grail.training.heldout import SAMPLES_PER_PROBLEM

    if cfg.eval_benchmarks:
        from grail.evaluation.benchmarks import parse_benchmark_list

        names = parse_benchmark_list(cfg.eval_benchmarks)
        primary = "benchmarks/unweighted/acc@n" if len(names) > 1 else f"benchmarks/{names[0]}/acc@{cfg.eval_samples}"
        return {"kind": "benchmarks", "primary": primary,
                "description": f"{', '.join(names)} as training's checkpoint evaluation (eval_size={cfg.eval_size}, "
                               f"eval_samples={cfg.eval_samples}, eval_data_dir={cfg.eval_data_dir})"}
    if cfg.dataset != SYNTHETIC_DATASET:
        raise ValueError(f"grail compare evaluates on the synthetic task's held-out split by default, which needs "
                         f"dataset=synthetic (not {cfg.dataset!r}); for another dataset set --eval_benchmarks (and "
                         f"--eval_data_dir for local files).")
    return {"kind": "synthetic held-out", "primary": f"sampled/synthetic/acc@{SAMPLES_PER_PROBLEM}",
            "description": f"the {cfg.task_num_heldout} held-out synthetic problems, greedy acc@1 and sampled "
                           f"acc@{SAMPLES_PER_PROBLEM} at temperature {cfg.temperature:g} (as `grail demo`)"}


def _jsonable(values: dict) -> dict:
    return json.loads(json.dumps(values))


def make_plan(arms: list[Arm], seeds: int, base: dict, out_dir: str | Path, auroc_rows: int = 0,
              sweeps: list[str] | tuple[str, ...] = ()) -> dict:
    """The plan (compare.json), after building every arm's config: a bad field stops here, before any training.
    `sweeps`: the `--sweep FIELD=v1,v2` texts the arms were crossed with (parse_arms), recorded as
    [{"field": F, "values": [text, ...]}] for the report's sweep table and plot (grail.analysis.compare.sweep)."""
    if seeds < 1:
        raise ValueError(f"--seeds {seeds}: give 1 or more (seeds 0..S-1; 3 or more for an interval worth having).")
    base = _jsonable({k: v for k, v in base.items() if k != "output_dir"})
    seed_fields = [*SEED_FIELDS, *(["dataset_shuffle_seed"] if base.get("dataset_shuffle_seed") is not None else [])]
    if auroc_rows < 0:
        raise ValueError(f"--auroc-rows {auroc_rows}: give 0 (off) or a number of held-out problems.")
    plan = {"version": 1, "seeds": seeds, "seed_fields": seed_fields, "base": base, "auroc_rows": auroc_rows,
            "sweeps": [dict(zip(("field", "values"), parse_sweep(text), strict=True)) for text in sweeps],
            "arms": [{"label": a.label, "slug": a.slug, "method": a.method, "fields": _jsonable(a.fields)}
                     for a in arms]}
    for arm in plan["arms"]:
        try:
            build_config(run_values(plan, arm, 0, out_dir))
        except ValueError as err:
            raise ValueError(f"arm {arm['label']!r}: {err}") from err
    plan["protocol"] = _protocol(build_config(run_values(plan, None, 0, out_dir)))
    return plan


def check_plan(plan: dict, out_dir: str | Path) -> None:
    """Check that the compare.json in out_dir, if any, is this plan (naming the first difference)."""
    path = Path(out_dir) / PLAN_FILE
    if not path.is_file():
        return
    stored = json.loads(path.read_text())
    for key in ("seeds", "arms", "seed_fields", "protocol", "base", "auroc_rows"):
        old, new = stored.get(key), plan.get(key)
        if old == new:
            continue
        if key == "base":
            name = sorted(k for k in set(old) | set(new) if old.get(k, "<unset>") != new.get(k, "<unset>"))[0]
            key, old, new = f"config field {name}", old.get(name, "<unset>"), new.get(name, "<unset>")
        elif key == "arms":
            old, new = [a["label"] for a in old], [a["label"] for a in new]
            if old == new:
                key, old, new = "arm fields", stored["arms"], plan["arms"]
        raise ValueError(f"{path} holds a comparison with other arguments: {key} is {old!r} there and {new!r} now. "
                         f"Rerun with the same arguments to resume it, or give a new --output_dir.")


# ---- the comparison ------------------------------------------------------------------------------------------------

def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def _latest_step(run_dir: Path) -> int | None:
    """The step of the last complete line of metrics.jsonl (reads its last 4 KB)."""
    path = run_dir / "metrics.jsonl"
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            lines = f.read().split(b"\n")[:-1]
        return int(json.loads(lines[-1])["step"]) if lines else None
    except (OSError, ValueError, KeyError, IndexError):
        return None


class _Progress:
    """One line per start and finish, and a status line every STATUS_EVERY_S: done / running / left, elapsed, ETA
    from the finished runs' durations, and each running run's latest step."""

    def __init__(self, plan: dict, out_dir: Path, total: int, done: dict[str, float], jobs: int, log: Log):
        self.plan, self.out_dir, self.total, self.jobs, self.log = plan, out_dir, total, jobs, log
        self.durations = dict(done)  # run name → seconds
        self.running: dict[str, float] = {}  # run name → start time
        self.failed = 0
        self.start = self.last = time.perf_counter()

    def _line(self) -> str:
        now = time.perf_counter()
        left = self.total - len(self.durations) - len(self.running)
        failed = f" ({self.failed} failed)" if self.failed else ""
        text = (f"{len(self.durations)}/{self.total} done, {len(self.running)} running, {left} left{failed} | "
                f"elapsed {_duration(now - self.start)}")
        if self.durations:
            mean = sum(self.durations.values()) / len(self.durations)
            remaining = left * mean + sum(max(0.0, mean - (now - t)) for t in self.running.values())
            text += f" | eta {_duration(remaining / self.jobs)}"
        steps = []
        for name in self.running:
            slug, seed = name.rsplit("/seed", 1)
            arm = next(a for a in self.plan["arms"] if a["slug"] == slug)
            step = _latest_step(run_path(self.out_dir, slug, int(seed)))
            if step is not None:
                steps.append(f"{arm['label']}/seed{seed} step {step}/"
                             f"{run_values(self.plan, arm, int(seed), self.out_dir).get('max_steps', '?')}")
        return text + (f" | {', '.join(steps)}" if steps else "")

    def started(self, name: str) -> None:
        self.running[name] = time.perf_counter()
        self.log(f"compare: started {name} | {self._line()}")

    def finished(self, name: str, ok: bool = True) -> None:
        seconds = time.perf_counter() - self.running.pop(name)
        if ok:
            self.durations[name] = seconds
        else:
            self.failed += 1
        self.log(f"compare: {'finished' if ok else 'FAILED'} {name} in {_duration(seconds)} | {self._line()}")
        self.last = time.perf_counter()

    def tick(self) -> None:
        if time.perf_counter() - self.last >= STATUS_EVERY_S:
            self.last = time.perf_counter()
            self.log(f"compare: {self._line()}")


def _gpu_ids() -> list[str]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [g.strip() for g in visible.split(",") if g.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def _prepare(plan: dict, out_dir: Path, log: Log) -> None:
    """Before the runs: read each distinct training set once (a bad path stops everything now, not in every run)
    and warm-start (or find in the cache) the tiny model each distinct warm-start setting needs, so that every run
    starts from the same cached checkpoint and none trains it concurrently. With auroc_rows: the saliency AUROC of
    each arm's warm start (arms that share a warm start, task and weighting options share the computation), as
    {arm label: {name: value}} in auroc_warmstart.json; arms already there are kept."""
    from grail.training.data import load_prompts
    from grail.training.run import resolve_model_path

    auroc_path = out_dir / WARMSTART_AUROC_FILE
    warm_auroc = json.loads(auroc_path.read_text()) if auroc_path.is_file() else {}
    if not all(isinstance(v, dict) for v in warm_auroc.values()):
        warm_auroc = {}  # the one-warm-start format of earlier versions: recompute, per arm
    seen, computed, starts = set(), {}, {}
    for arm in plan["arms"]:
        cfg = build_config(run_values(plan, arm, 0, out_dir))
        data = ("data", cfg.dataset, cfg.dataset_config, cfg.dataset_split, cfg.prompt_column, cfg.answer_column,
                repr(cfg.synthetic_set()) if cfg.dataset == SYNTHETIC_DATASET else None)
        if data not in seen:
            seen.add(data)
            load_prompts(cfg)  # the rows, checked (the prompt format needs the model's tokenizer: each run's own)
        if cfg.model_name_or_path != TINY_MODEL:
            continue
        warm = (cfg.model_name_or_path, cfg.cache_dir, repr(cfg.warm_start_config()))
        if warm not in starts:
            starts[warm] = resolve_model_path(cfg, log)
        if plan.get("auroc_rows") and arm["label"] not in warm_auroc:  # the start each arm's AUROC moves from
            key = (warm, repr(cfg.synthetic_set()), repr(cfg.weighting_options()), tuple(auroc_methods(cfg)))
            if key not in computed:
                computed[key] = run_auroc(starts[warm], cfg, plan["auroc_rows"])
            warm_auroc[arm["label"]] = computed[key]
    if computed:
        write_json(auroc_path, warm_auroc)


def run_comparison(plan: dict, out_dir: str | Path, jobs: int = 1, log: Log = print) -> dict:
    """Every run of the plan (finished ones skipped), then the report; returns report.json's content. The plan is
    written to out_dir/compare.json once the data and the warm start are found, or must equal the one there."""
    from grail.training.run import quiet_libraries

    if jobs < 1:
        raise ValueError(f"--jobs {jobs}: give 1 or more runs at a time.")
    out_dir = Path(out_dir)
    check_plan(plan, out_dir)
    quiet_libraries()  # no loading bars in the comparison's log (warm starts, AUROC, in-process runs)
    with lock(out_dir / ".compare.lock", wait=False):
        check_plan(plan, out_dir)  # again: another comparison may have written it before this one took the lock
        _prepare(plan, out_dir, log)
        stored = out_dir / PLAN_FILE
        if not stored.is_file() or json.loads(stored.read_text()).get("sweeps") != plan.get("sweeps"):
            write_json(stored, plan)  # new, or written before sweeps were recorded (check_plan: the rest is equal)
        keys = [(arm["slug"], seed) for seed in range(plan["seeds"]) for arm in plan["arms"]]  # seed-major: pairs early
        done = {}
        for slug, seed in keys:
            marker = run_path(out_dir, slug, seed) / RESULT_FILE
            if marker.is_file():
                done[f"{slug}/seed{seed}"] = json.loads(marker.read_text()).get("wall_seconds", 0.0)
        pending = [(slug, seed) for slug, seed in keys if f"{slug}/seed{seed}" not in done]
        log(f"compare: {len(keys)} runs ({len(plan['arms'])} arms × {plan['seeds']} seeds), {len(done)} finished "
            f"earlier; {jobs} at a time; directory {out_dir}")
        progress = _Progress(plan, out_dir, len(keys), done, min(jobs, max(1, len(pending))), log)
        failed = (_in_process if jobs == 1 else _in_workers)(plan, out_dir, pending, jobs, progress)
        if failed:
            raise RuntimeError(f"{len(failed)} run(s) failed: " + "; ".join(failed) + ". Fix the cause and rerun the "
                               "same command: finished runs are kept, the others resume.")
        if plan.get("auroc_rows"):  # runs finished by a grail-rl without auroc_checkpoints.json get it now
            for slug, seed in keys:
                if f"{slug}/seed{seed}" in done:
                    checkpoint_auroc(plan, out_dir, slug, seed, log)
        summary = write_report(out_dir, plan, jobs)
    log(f"compare: report in {out_dir / 'report.md'} (and report.json, {', '.join(summary['plots']) or 'no plots'})")
    return summary


def _in_process(plan: dict, out_dir: Path, pending: list, jobs: int, progress: _Progress) -> list[str]:
    for slug, seed in pending:
        name = f"{slug}/seed{seed}"
        run_dir = run_path(out_dir, slug, seed)
        run_dir.mkdir(parents=True, exist_ok=True)
        progress.started(name)
        with (run_dir / LOG_FILE).open("a") as handle:
            def log(line: str, handle=handle) -> None:
                handle.write(line + "\n")
                handle.flush()
                progress.tick()

            run_one(plan, out_dir, slug, seed, log, grading_workers=None)
        progress.finished(name)
    return []


def _in_workers(plan: dict, out_dir: Path, pending: list, jobs: int, progress: _Progress) -> list[str]:
    threads = max(1, (os.cpu_count() or 1) // jobs)
    if os.environ.get("OMP_NUM_THREADS", "").isdigit():
        threads = max(1, min(threads, int(os.environ["OMP_NUM_THREADS"])))
    gpus = _gpu_ids()
    slots: dict[int, tuple[str, subprocess.Popen]] = {}
    failed: list[str] = []
    pending = list(pending)
    try:
        while pending or slots:
            while pending and len(slots) < jobs and not failed:
                slug, seed = pending.pop(0)
                slot = min(set(range(jobs)) - set(slots))
                env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
                if len(gpus) > 1:
                    env["CUDA_VISIBLE_DEVICES"] = gpus[slot % len(gpus)]
                run_dir = run_path(out_dir, slug, seed)
                run_dir.mkdir(parents=True, exist_ok=True)
                with (run_dir / LOG_FILE).open("a") as handle:
                    process = subprocess.Popen(
                        [sys.executable, "-m", "grail.analysis.compare.cli", str(out_dir), slug, str(seed),
                         str(threads), str(os.getpid())], stdout=handle, stderr=subprocess.STDOUT, env=env)
                slots[slot] = (f"{slug}/seed{seed}", process)
                progress.started(f"{slug}/seed{seed}")
            time.sleep(0.2)
            for slot, (name, process) in list(slots.items()):
                if process.poll() is None:
                    continue
                del slots[slot]
                ok = process.returncode == 0
                progress.finished(name, ok)
                if not ok:
                    slug, seed = name.rsplit("/seed", 1)
                    log_path = run_path(out_dir, slug, int(seed)) / LOG_FILE
                    tail = log_path.read_text().strip().splitlines()[-1:] if log_path.is_file() else []
                    failed.append(f"{name} (exit {process.returncode}: {' '.join(tail)}; log {log_path})")
            progress.tick()
    finally:
        for _, process in slots.values():  # interrupted: stop the workers (they resume on the next run)
            process.terminate()
        for _, process in slots.values():
            process.wait()
    return failed


# ---- worker process (started by grail.analysis.compare.cli's worker entry)
# ------------------------------------------------

def run_worker(out_dir: Path, slug: str, seed: int, threads: int) -> int:
    """One run of the plan in out_dir/compare.json, in a worker process with `threads` CPU threads."""
    import torch

    from grail.training.run import quiet_libraries

    torch.set_num_threads(threads)
    quiet_libraries()
    try:
        plan = json.loads((out_dir / PLAN_FILE).read_text())
        run_one(plan, out_dir, slug, seed, lambda line: print(line, flush=True), grading_workers=1)
    except (ValueError, OSError) as err:
        if os.environ.get("GRAIL_DEBUG"):
            raise
        print(f"grail compare: error: {err}", file=sys.stderr, flush=True)
        return 2
    return 0
