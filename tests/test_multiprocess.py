"""Training and evaluation in several processes: `accelerate launch --multi_gpu --num_processes 2` with no GPU
visible, which starts 2 CPU processes over gloo (accelerate's MULTI_CPU), each with OMP_NUM_THREADS=1, on the tiny
model. (`accelerate launch --cpu --num_processes 2` would start ONE process: with --cpu, accelerate 1.15 takes its
simple launcher, which runs several processes only through mpirun.) Every run here checks that both ranks ran.

What is checked here, and what is not: two CPU processes over gloo (DDP); FSDP2 is in tests/test_fsdp_cpu.py and
DeepSpeed ZeRO-2/3 in tests/test_deepspeed_cpu.py. NCCL is not installed here. `WEIGHTS_SCRIPT` also imitates
ZeRO-3-like sharding by a collective operation in every backbone forward and counts them (a process that runs one
forward more or less than the others hangs, as under ZeRO-3).
"""

import json
from types import SimpleNamespace

import pytest
import yaml

from launching import FAST, REPO, _launch, _records

# ---------------------------------------------------------------- training: weights/* gathered over processes

RECORD_SCRIPT = '''
"""`grail train` (grail.cli.main) with each process recording, per micro-batch, the sums its weights/* come from."""
import json, os, sys

from grail.cli import main
from grail.training.trainer import GRAILTrainer

original = GRAILTrainer._accumulate


def recording(self, adv_B, adv_BT, mask_BT, weights):
    real_B = mask_BT.any(1)
    tok_BT = mask_BT & (real_B & (adv_B != 0))[:, None]  # the tokens weights/mean and weights/max describe
    record = {"step": self.state.global_step + 1, "real_rows": int(real_B.sum()),
              "probed_rows": int(weights.probed_B.sum()), "tokens": int(tok_BT.sum()),
              "weight_sum": float(weights.weights_BT[tok_BT].double().sum()),
              "weight_max": float(weights.weights_BT[tok_BT].max()) if tok_BT.any() else 0.0}
    with open(f"{os.environ['GRAIL_RECORD']}.{self.accelerator.process_index}", "a") as f:
        f.write(json.dumps(record) + "\\n")
    return original(self, adv_B, adv_BT, mask_BT, weights)


original_reduce = GRAILTrainer.reduce_weight_metrics


def recording_reduce(self, mode):
    """This process's own sums, as they go into the trainer's one gather per logging step."""
    sums, peak = self.weight_sums.pending(mode) or (None, None)
    record = {"step": self.state.global_step, "mode": mode, "sums": None if sums is None else sums.tolist(),
              "peak": None if peak is None else float(peak)}
    with open(f"{os.environ['GRAIL_RECORD']}.sums.{self.accelerator.process_index}", "a") as f:
        f.write(json.dumps(record) + "\\n")
    return original_reduce(self, mode)


GRAILTrainer._accumulate = recording
GRAILTrainer.reduce_weight_metrics = recording_reduce
sys.exit(main(sys.argv[1:]))
'''


def _train_two_processes(tmp_path, cache, method) -> tuple[list[dict], list[list[dict]], list[list[dict]]]:
    script = tmp_path / "record_train.py"
    script.write_text(RECORD_SCRIPT)
    run = tmp_path / "run"
    _launch(tmp_path, str(script), "train", *FAST, "--token_weighting", method, "--cache_dir", str(cache),
            "--output_dir", str(run), env={"GRAIL_RECORD": str(tmp_path / "record")})
    assert (run / "final" / "config.json").is_file() and (run / "final" / "grail_prompt.json").is_file()
    rows = [_records(tmp_path / f"record.{r}") for r in (0, 1)]  # one record file per process: both ran
    sums = [[x for x in _records(tmp_path / f"record.sums.{r}") if x["mode"] == "train"] for r in (0, 1)]
    return _records(run / "metrics.jsonl"), rows, sums


def _pooled(sums_per_rank: list[dict]) -> dict[str, float]:
    """The trainer's own reduction (grail.methods.weight_metrics.pooled_metrics) of both processes' recorded sums:
    what the main process must log if its gather brought in every process's sums."""
    import torch

    from grail.methods.weight_metrics import pooled_metrics

    size = len(next(x["sums"] for x in sums_per_rank if x["sums"] is not None))
    local = torch.stack([torch.tensor([*(x["sums"] or [0.0] * size), x["peak"] or 0.0]) for x in sums_per_rank])
    return pooled_metrics(local)


@pytest.mark.parametrize("method", [
    "grail", *(pytest.param(m, marks=pytest.mark.slow) for m in ("oar_p", "none", "oar_g"))])  # ~20 s each
def test_two_process_training_logs_weights_pooled_over_both_processes(tmp_path, warm_cache, method):
    """Each logged weights/* value is the one computed from both processes' rows together (the trainer's one
    gather per logging step), not from the main process's rows alone."""
    cache, _ = warm_cache  # built in this process first: both ranks find the warm start cached
    lines, rows, sums = _train_two_processes(tmp_path, cache, method)
    steps = [x for x in lines if "weights/fused" in x]
    assert [x["step"] for x in steps] == [1, 2], lines
    for logged in steps:
        step = logged["step"]
        per_rank = [[r for r in records if r["step"] == step] for records in rows]
        assert all(per_rank), f"step {step}: a process computed no weights"
        both = [r for records in per_rank for r in records]
        # independent of the trainer's statistics code: weights/mean and weights/max over both processes' tokens
        tokens = sum(r["tokens"] for r in both)
        if tokens:  # a step whose groups all agree (on every process) logs no weights/mean
            assert logged["weights/mean"] == pytest.approx(sum(r["weight_sum"] for r in both) / tokens, rel=1e-5)
            assert logged["weights/max"] == pytest.approx(max(r["weight_max"] for r in both), rel=1e-6)
        else:
            assert "weights/mean" not in logged
        # every weights/* value: the trainer's reduction of BOTH processes' sums
        # each process's first reduction at this step (the end-of-training log reduces again, with nothing left)
        recorded = [next(x for x in records if x["step"] == step) for records in sums]
        expected = _pooled(recorded)
        assert expected and {k: v for k, v in logged.items() if k in expected} == pytest.approx(expected, rel=1e-6,
                                                                                                abs=1e-9)
        assert {k for k in logged if k.startswith("weights/")} - set(expected) <= {"weights/seconds",
                                                                                 "weights/fused"}
        if method == "none":
            assert logged.get("weights/probed_rows", 0) == 0 and logged.get("weights/mean", 1.0) == 1.0


# ---------------------------------------------------------------- weights: per process = one process, same rows

WEIGHTS_SCRIPT = '''
"""Each process computes `grail.methods.weighting.token_weights` on its shard of one batch, reducing with the trainer's
own `GRAILTrainer._any_process`; the main process compares every shard's weights with a one-process computation on the
same rows (and, for the methods without randomness, with the whole batch at once)."""
import json, sys
from types import SimpleNamespace

import torch
import torch.distributed as dist
from accelerate import Accelerator

from grail.methods import probes
from grail.options.choices import WeightingOptions
from grail.tasks.arithmetic import TaskConfig
from grail.tasks.synthetic import generate
from grail.models.tiny import build_tiny_model, build_tokenizer
from grail.training.trainer import GRAILTrainer
from grail.methods.weighting import token_weights

accelerator = Accelerator(cpu=True)
rank, world = accelerator.process_index, accelerator.num_processes
assert world == 2
any_process = lambda local: GRAILTrainer._any_process(SimpleNamespace(accelerator=accelerator), local)

tokenizer = build_tokenizer()
model = build_tiny_model(tokenizer, seed=0)
with torch.no_grad():  # sharper distributions than a fresh init
    model.get_input_embeddings().weight.mul_(3.0)
model.eval()

examples = generate(TaskConfig(), 8, "train", seed=3)
completions = [e.solution if i % 3 else e.solution.replace("\\\\boxed{", "\\\\boxed{1") for i, e in enumerate(examples)]
completions[5] = completions[5].split("\\\\boxed")[0]  # a row without a box
p = tokenizer([e.prompt for e in examples], return_tensors="pt", padding=True, padding_side="left",
              add_special_tokens=False)
c = tokenizer(completions, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False)
ids_BL = torch.cat([p["input_ids"], c["input_ids"]], 1)
attn_BL = torch.cat([p["attention_mask"], c["attention_mask"]], 1)
mask_BT = c["attention_mask"].bool()
B = ids_BL.shape[0]
shards = [slice(0, B // 2), slice(B // 2, B)]
CASES = {  # advantages of the whole batch; shard 0 = rows 0-3 (process 0), shard 1 = rows 4-7 (process 1)
    "both": torch.tensor([1.0, -1.0, 0.5, -0.5, 0.75, -0.25, -1.0, 1.0]),
    "only_rank0": torch.tensor([1.0, -1.0, 0.5, -0.5, 0.0, 0.0, 0.0, 0.0]),  # process 1: nothing to probe
    "only_rank1": torch.tensor([0.0, 0.0, 0.0, 0.0, 0.75, -0.25, -1.0, 1.0]),
    "neither": torch.zeros(8),
}
# ZeRO-3 imitated: every backbone forward runs a collective, so processes running different numbers of forwards
# hang (the launching test's timeout ends them). Not for OAR-P, which GRAILTrainer refuses on sharded
# models.
collective = {"on": False, "forwards": 0}


def gather_like_zero3(module, args, kwargs):
    if collective["on"]:
        collective["forwards"] += 1
        dist.all_reduce(torch.ones(1))


probes.backbone(model).register_forward_pre_hook(gather_like_zero3, with_kwargs=True)
RANDOM = {"oar_g", "random"}  # draw from the generator: the whole batch draws other numbers than a shard
report = {}
for method in sys.argv[1].split(","):
    options = WeightingOptions(token_weighting=method, rollout_symmetry="both")
    for case, adv_B in CASES.items():
        rows = shards[rank]
        collective.update(on=method != "oar_p", forwards=0)
        mine = token_weights(model, tokenizer, ids_BL[rows], attn_BL[rows], mask_BT[rows], adv_B[rows], options,
                             generator=torch.Generator().manual_seed(100 + rank), any_process=any_process)
        collective["on"] = False
        gathered = accelerator.gather(mine.weights_BT)  # (B, T): shard 0's rows, then shard 1's
        forwards = accelerator.gather(torch.tensor([collective["forwards"]]))
        paths = [None] * world
        dist.all_gather_object(paths, mine.path)
        if rank == 0:
            alone = [token_weights(model, tokenizer, ids_BL[s], attn_BL[s], mask_BT[s], adv_B[s], options,
                                   generator=torch.Generator().manual_seed(100 + r)) for r, s in enumerate(shards)]
            expected = torch.cat([a.weights_BT for a in alone])
            entry = {"same_rows_max_diff": float((gathered - expected).abs().max()),
                     "paths": paths, "alone_paths": [a.path for a in alone],
                     "forwards": forwards.tolist(), "probed": [int(a.probed_B.sum()) for a in alone],
                     "reweighted_rows": int(((expected != 1) & mask_BT).any(1).sum())}
            if method not in RANDOM:
                whole = token_weights(model, tokenizer, ids_BL, attn_BL, mask_BT, adv_B, options).weights_BT
                entry["whole_batch_max_diff"] = float((gathered - whole).abs().max())
            report[f"{method}/{case}"] = entry
if rank == 0:
    with open(sys.argv[2], "w") as f:
        json.dump(report, f, indent=1)
accelerator.wait_for_everyone()
# end the process group before exit, as grail's command line does (grail.cli._close_process_group): left to
# exit-time teardown, gloo's threads can abort a finished process ("terminate called without an active exception")
torch.distributed.destroy_process_group()
'''


def _weights_report(tmp_path, methods: list[str]) -> dict:
    script = tmp_path / "shard_weights.py"
    script.write_text(WEIGHTS_SCRIPT)
    out = tmp_path / "report.json"
    _launch(tmp_path, str(script), ",".join(methods), str(out))
    return json.loads(out.read_text())


def _check_weights_report(report: dict, methods: list[str]) -> None:
    for method in methods:
        for case in ("both", "only_rank0", "only_rank1", "neither"):
            entry = report[f"{method}/{case}"]
            assert entry["same_rows_max_diff"] <= 1e-6, (method, case, entry)
            if "whole_batch_max_diff" in entry:
                assert entry["whole_batch_max_diff"] <= 1e-5, (method, case, entry)
            if method == "none":
                continue
            probed = entry["probed"]
            # the skip logic: a process with nothing to probe runs the probe anyway while the other has rows
            # (same collectives), and everyone skips when nobody has rows
            expected = ["separate" if n or any(probed) else "skipped" for n in probed]
            assert entry["paths"] == expected, (method, case, entry)
            assert entry["alone_paths"] == ["separate" if n else "skipped" for n in probed], (method, case, entry)
            if method != "oar_p":  # the imitated ZeRO-3 collective ran the same number of times
                assert entry["forwards"][0] == entry["forwards"][1], (method, case, entry)
        both, forced = report[f"{method}/both"], report[f"{method}/only_rank0"]
        if method != "none":  # the cases mean something: rows were probed and reweighted
            assert all(both["probed"]) and forced["probed"][0] > 0 == forced["probed"][1], (method, forced)
            assert both["reweighted_rows"] > 0, (method, both)
        if method == "grail":
            assert forced["forwards"][1] > 0  # process 1 really ran forwards it did not need


def test_per_process_weights_equal_one_process_on_the_same_rows(tmp_path):
    """none, grail, oar_g, oar_p; including a process with no row to probe while the other has some (it runs the
    probe anyway, under an imitated ZeRO-3 collective per forward for GRAIL, and completes)."""
    methods = ["none", "grail", "oar_g", "oar_p"]
    _check_weights_report(_weights_report(tmp_path, methods), methods)


@pytest.mark.slow
def test_per_process_weights_of_the_controls(tmp_path):
    methods = ["entropy", "random"]
    _check_weights_report(_weights_report(tmp_path, methods), methods)


# ---------------------------------------------------------------- checkpoint evaluation, sharded

def check_checkpoint_evaluation(tmp_path, cache, *, script: str = "-m", launched: str = "grail", config=None,
                                method: str = "none", size: int = 16) -> None:
    """`grail train` with eval_benchmarks on 2 processes: each samples its share of the batches of 8 problems (the
    log says which), rank 0 grades and writes; the samples are those a one-process evaluation of the saved checkpoint
    draws. `size` 24: 3 batches, so process 1 has one fewer (on a sharded model it generates once more, unused)."""
    flags = [*FAST, "--max_steps", "1", "--save_steps", "1", "--eval_benchmarks", "synthetic", "--eval_size",
             str(size), "--eval_samples", "2", "--eval_max_new_tokens", "24"]
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grail.evaluation.harness import run_evaluation
    from grail.options.sampling import HFSampler
    from grail.training.config import GRAILConfig
    from grail.training.overrides import build_config, merge, parse_flags
    from grail.training.run import CheckpointEval

    run = tmp_path / "run"
    args = [script, launched] if script == "-m" else [script]
    done = _launch(tmp_path, *args, "train", *flags, "--token_weighting", method, "--cache_dir", str(cache),
                   "--output_dir", str(run), config=config, env={"GRAIL_RECORD": str(tmp_path / "record")})
    batches = -(-size // 8)
    for rank in (0, 1):
        mine = [b for b in range(batches) if b % 2 == rank]
        assert f"process {rank} of 2 sampled evaluation batches {mine}" in done.stdout, done.stdout
    evaluated = run / "eval" / "checkpoint-1"
    results = json.loads((evaluated / "results.json").read_text())
    assert results["benchmarks"][0]["num_problems"] == size
    assert [x["step"] for x in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
            if "eval/synthetic/acc@2" in x] == [1]

    # the same evaluation in this one process, on the checkpoint the training saved at that step
    cfg = build_config(merge(None, parse_flags([*flags, "--output_dir", str(tmp_path / "unused")])))
    assert isinstance(cfg, GRAILConfig)
    callback = CheckpointEval(cfg, tmp_path / "unused", log=lambda s: None)
    model = AutoModelForCausalLM.from_pretrained(run / "checkpoint-1")
    tokenizer = AutoTokenizer.from_pretrained(run / "checkpoint-1")
    run_evaluation(HFSampler(model, tokenizer, batch_size=callback.spec.batch_size), tokenizer, callback.spec,
                   tmp_path / "alone", workers=1, log=lambda s: None, progress=False, loaded=callback.loaded)

    def samples(path):
        rows = [json.loads(line) for line in (path / "samples.jsonl").read_text().splitlines()]
        return sorted((r["problem_id"], r["sample_index"], r["completion"], r["correct"]) for r in rows)

    assert samples(evaluated) == samples(tmp_path / "alone")


def test_checkpoint_evaluation_is_sharded_over_processes_and_matches_one_process(tmp_path, warm_cache):
    check_checkpoint_evaluation(tmp_path, warm_cache[0])


# ---------------------------------------------------------------- sharded models: a method may refuse them

def _fake_trainer(zero_stage=None, fsdp=False):
    plugin = SimpleNamespace(zero_stage=zero_stage) if zero_stage is not None else None
    return SimpleNamespace(accelerator=SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=plugin)),
                           is_fsdp_enabled=fsdp)


def _unshardable(name="oar_p"):
    """A method like a built-in, but whose spec says its probe cannot run sharded (a plug-in may say so). Its own
    options go: they are named after the built-in, and a spec's options must start with its own name."""
    from dataclasses import replace

    from grail.methods.table import method_spec

    return replace(method_spec(name), name=f"{name}_unshardable", options=(),
                   unshardable="its probe reads every shard itself")


@pytest.mark.parametrize("sharding", [{"zero_stage": 3}, {"fsdp": True}])
def test_a_method_that_says_it_cannot_run_sharded_is_refused_before_training(sharding):
    """Every built-in method trains sharded (tests/test_fsdp_cpu.py, tests/test_deepspeed_cpu.py); a method whose
    spec names why it cannot (`MethodSpec.unshardable`) is refused on ZeRO-3/FSDP with that reason."""
    from grail.methods.table import METHODS
    from grail.training.trainer import refuse_if_unshardable, sharded_by

    trainer = _fake_trainer(**sharding)
    with pytest.raises(ValueError, match=f"token_weighting='oar_p_unshardable' cannot train a model sharded by "
                                         f"{sharded_by(trainer)}: its probe reads every shard itself.*ZeRO-2 or DDP"):
        refuse_if_unshardable(_unshardable(), sharded_by(trainer))
    refuse_if_unshardable(_unshardable(), sharded_by(_fake_trainer(zero_stage=2)))  # whole parameters: fine
    refuse_if_unshardable(_unshardable(), sharded_by(_fake_trainer()))
    assert not [name for name, spec in METHODS.items() if spec.unshardable]  # none of grail's own


# ------------------------------------------------ the DeepSpeed ZeRO-2 config of docs/getting-started/clusters.md

ZERO2_CONFIG = REPO / "examples" / "accelerate_zero2.yaml"


def test_the_zero2_accelerate_config_is_valid_and_shown_in_the_docs():
    """The file is read by accelerate's own code as `accelerate launch --config_file` reads it (without deepspeed
    installed: only the launcher's validation runs, not DeepSpeed), asks for ZeRO-2 on 4 processes in bf16, and is
    the file the README shows."""
    from accelerate.commands.config.config_args import ClusterConfig
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils import DistributedType

    readme = (REPO / "docs" / "getting-started" / "clusters.md").read_text()
    shown = readme.split(f"--config_file {ZERO2_CONFIG.relative_to(REPO)}", 1)[1].split("```yaml\n", 1)[1]
    assert yaml.safe_load(shown.split("```", 1)[0]) == yaml.safe_load(ZERO2_CONFIG.read_text())  # one config
    config = ClusterConfig.from_yaml_file(str(ZERO2_CONFIG))  # an unknown top-level key is a ValueError naming it
    assert config.distributed_type == DistributedType.DEEPSPEED
    parser = launch_command_parser()
    # accelerate copies each deepspeed_config key onto the launch arguments of that name: a typo would be ignored
    unknown = set(yaml.safe_load(ZERO2_CONFIG.read_text())["deepspeed_config"]) - {a.dest for a in parser._actions}
    assert not unknown, f"deepspeed_config keys accelerate launch does not know: {unknown}"
    args, _, _ = _validate_launch_command(parser.parse_args(["--config_file", str(ZERO2_CONFIG), "-m", "grail",
                                                             "train"]))
    assert args.use_deepspeed and int(args.zero_stage) == 2 and args.num_processes == 4
    assert args.mixed_precision == "bf16" and args.offload_optimizer_device == "none"  # the paper preset: bf16
    assert args.gradient_accumulation_steps is None  # left to grail's config (the paper preset's 8)


def test_grail_train_refuses_an_unshardable_method_on_a_sharded_model_before_the_first_step(tmp_path, warm_cache,
                                                                                          monkeypatch, capsys):
    """Through the CLI: the refusal comes after the trainer is built (it knows the sharding) and before training."""
    import grail.training.trainer
    from grail import register_method, unregister_method
    from grail.cli import main
    from grail.training.trainer import GRAILTrainer

    cache, _ = warm_cache
    # GRAILTrainer refuses it when built
    monkeypatch.setattr(grail.training.trainer, "sharded_by", lambda trainer: "FSDP")
    monkeypatch.setattr(GRAILTrainer, "train", lambda self, *a, **k: pytest.fail("training started"))
    register_method(_unshardable("grail"))
    try:
        assert main(["train", *FAST, "--token_weighting", "grail_unshardable", "--cache_dir", str(cache),
                     "--output_dir", str(tmp_path / "run")]) == 2
    finally:
        unregister_method("grail_unshardable")
    assert "token_weighting='grail_unshardable' cannot train a model sharded by FSDP" in capsys.readouterr().err
