"""FSDP2 on 2 gloo CPU processes (examples/accelerate_fsdp2_cpu.yaml): accelerate 1.15 drops an FSDP config on CPU
processes (it runs DDP), grail says so; with accelerate's gate opened in the launched script, torch's own fully_shard
gives each process exactly the weights of an unsharded copy for every method (OAR-P and span masking in lockstep:
the same number of forwards on every process), and trains `none`, `grail`, `oar_g`, `oar_p` and `entropy`. Launched
as in tests/test_multiprocess.py (tests/launching.py)."""

import json

import pytest

from grail.methods.table import METHODS, method_names
from launching import FAST, RECORD_STEPS, REPO, _launch, _records

# ------------------------------------------- FSDP2 on 2 gloo CPU processes (examples/accelerate_fsdp2_cpu.yaml)

FSDP2_CONFIG = REPO / "examples" / "accelerate_fsdp2_cpu.yaml"

STATE_SCRIPT = '''
"""What accelerate makes of the launch: one JSON line per process."""
import json, os
from accelerate import Accelerator

state = Accelerator(cpu=True).state  # as `grail train` without CUDA: GRAILConfig sets use_cpu=True

with open(f"{os.environ['GRAIL_RECORD']}.{state.process_index}", "w") as f:
    json.dump({"distributed_type": state.distributed_type.name,
               "fsdp_plugin": getattr(state, "fsdp_plugin", None) is not None,
               "env": os.environ.get("ACCELERATE_USE_FSDP")}, f)
import torch.distributed
if torch.distributed.is_initialized():  # before exit (see WEIGHTS_SCRIPT)
    torch.distributed.destroy_process_group()
'''

# accelerate 1.15 takes its FSDP branch only for accelerator devices: AcceleratorState.__init__ (accelerate/state.py,
# `elif self.distributed_type in [DistributedType.MULTI_GPU, ..., MULTI_NEURON]:` then `self.distributed_type =
# DistributedType.FSDP`) leaves MULTI_CPU out, so on CPU the FSDP config is silently dropped and the model is wrapped
# in DDP. OPEN_GATE takes that branch for MULTI_CPU too, exactly as accelerate would (the plugin accelerate built
# from the launcher's FSDP_* variables, PartialState's distributed_type updated as state.py does); the sharding and
# its collectives are torch's own fully_shard over gloo.
OPEN_GATE = """
import accelerate.state as st
from accelerate.utils import DistributedType

original_state_init = st.AcceleratorState.__init__


def state_init(self, *args, fsdp_plugin=None, **kwargs):
    original_state_init(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
    if self.distributed_type == DistributedType.MULTI_CPU and fsdp_plugin is not None \\
            and getattr(self, "fsdp_plugin", None) is None:
        self.distributed_type = DistributedType.FSDP
        self.fsdp_plugin = fsdp_plugin
        st.PartialState._shared_state["distributed_type"] = self.distributed_type


st.AcceleratorState.__init__ = state_init
"""

# `grail train` under FSDP2 on CPU processes, accelerate's MULTI_CPU gate opened; each process records its model
FSDP2_SCRIPT = OPEN_GATE + RECORD_STEPS


def _expected_path(method: str) -> str | None:
    """How a step's weights are made on a sharded model: entropy reads TRL's own entropies (fused), a method that
    reads whole groups weights them at rollout time, a method without a signal has none, the others probe."""
    spec = METHODS[method]
    if spec.probe is None:
        return "none"
    return "fused" if spec.fuse == "entropy" else "rollout" if spec.groups else "separate"


def check_paths(method: str, steps_by_rank: list[list[dict]]) -> None:
    """Each process made its weights the way `_expected_path` says. A probe that calls no model (the position
    null) keeps no collective in step, so a process whose own rows had no mixed group skips it: there, one process
    doing it suffices."""
    expected, spec = _expected_path(method), METHODS[method]
    if spec.probe is not None and not spec.calls_model:
        paths = [s["path"] for steps in steps_by_rank for s in steps]
        assert expected in paths and set(paths) <= {expected, "skipped"}, paths
        return
    for steps in steps_by_rank:
        assert any(step["path"] == expected for step in steps), steps


def test_accelerate_drops_the_fsdp2_config_on_cpu_processes(tmp_path):
    """Without the opener, accelerate 1.15 runs the FSDP config as DDP on CPU (MULTI_CPU, no FSDP plugin): the
    reason the FSDP2 run below opens accelerate's gate. When accelerate honours FSDP on CPU, this fails: drop the
    opener then."""
    script = tmp_path / "state.py"
    script.write_text(STATE_SCRIPT)
    _launch(tmp_path, str(script), config=FSDP2_CONFIG, env={"GRAIL_RECORD": str(tmp_path / "state")})
    for rank in (0, 1):
        state = json.loads((tmp_path / f"state.{rank}").read_text())
        assert state == {"distributed_type": "MULTI_CPU", "fsdp_plugin": False, "env": "true"}, state


@pytest.mark.slow
@pytest.mark.parametrize("method", method_names())  # every method of the table
def test_fsdp2_trains_on_two_cpu_processes(tmp_path, warm_cache, method):
    """2 steps under FSDP2 (torch's fully_shard over gloo) on 2 CPU processes: each process holds half of every
    parameter (DTensor shards), grail takes its separate path (the fused one is refused under sharding), the run
    finishes and saves its final model."""
    cache, _ = warm_cache
    script = tmp_path / "fsdp2_train.py"
    script.write_text(FSDP2_SCRIPT)
    run = tmp_path / "run"
    _launch(tmp_path, str(script), "train", *FAST, "--token_weighting", method, "--cache_dir", str(cache),
            "--output_dir", str(run), config=FSDP2_CONFIG, env={"GRAIL_RECORD": str(tmp_path / "record")})
    assert (run / "final" / "config.json").is_file()
    assert [x["step"] for x in _records(run / "metrics.jsonl") if "loss" in x] == [1, 2]
    by_rank = [_records(tmp_path / f"record.{rank}") for rank in (0, 1)]
    for rank, steps in enumerate(by_rank):
        assert steps, f"process {rank} ran no training step"
        for step in steps:
            assert step["fsdp2"] and step["dtensor"] and step["model"].startswith("FSDP"), step
            assert step["local"] * 2 == step["full"] and step["sharded_by"] == "FSDP", step
        if method == "grail":
            assert steps[0]["fused_unavailable"].startswith("FSDP"), steps[0]
    if method != "none":  # the probe ran on the sharded model (on this process's rows, or in step with the other)
        check_paths(method, by_rank)


WEIGHTS_SCRIPT = '''
"""Each process shards the tiny model with accelerate's engine of the launch config (`Accelerator.prepare`: FSDP2
with the gate opened, or DeepSpeed) and computes `token_weights` on its own rows of one batch; it compares them with
the same rows on an unsharded copy made before sharding. argv: methods (name or name@leaf), out.json (one file per
process: out.json.RANK)."""
import copy, json, os, sys
from types import SimpleNamespace

import torch
import torch.distributed as dist
''' + OPEN_GATE + '''
from accelerate import Accelerator

from grail.methods import probes
from grail.methods.weighting import token_weights
from grail.models.tiny import build_tiny_model, build_tokenizer
from grail.options.choices import WeightingOptions
from grail.tasks.arithmetic import TaskConfig
from grail.tasks.synthetic import generate
from grail.training.trainer import GRAILTrainer

probes.token_entropies.__wrapped__.__kwdefaults__["chunk_positions"] = 8  # output-layer calls: as many as rows need
if os.environ.get("ACCELERATE_USE_DEEPSPEED") == "true":  # as GRAILConfig under a DeepSpeed launch on CPU
    from accelerate.utils import InitProcessGroupKwargs
    accelerator = Accelerator(kwargs_handlers=[InitProcessGroupKwargs(backend="gloo")])
    accelerator.state.deepspeed_plugin.deepspeed_config.update(train_micro_batch_size_per_gpu=1)
else:
    accelerator = Accelerator(cpu=True)
rank = accelerator.process_index
assert accelerator.num_processes == 2, accelerator.num_processes
any_process = lambda local: GRAILTrainer._any_process(SimpleNamespace(accelerator=accelerator), local)
tokenizer = build_tokenizer()
model = build_tiny_model(tokenizer, seed=0)
with torch.no_grad():  # sharper distributions than a fresh init
    model.get_input_embeddings().weight.mul_(3.0)
model.eval()
alone = copy.deepcopy(model)
model, _ = accelerator.prepare(model, torch.optim.AdamW(model.parameters()))  # FSDP2 takes both
model = accelerator.unwrap_model(model)  # DeepSpeed's engine → its module; FSDP2 shards in place
params = list(model.parameters())
local = lambda p: p.to_local() if hasattr(p, "to_local") else getattr(p, "ds_tensor", p)  # this process's part
shards = {"engine": accelerator.distributed_type.name, "local": sum(local(p).numel() for p in params),
          "full": sum(int(torch.Size(p.ds_shape).numel()) if hasattr(p, "ds_shape") else p.numel() for p in params)}

examples = generate(TaskConfig(), 8, "train", seed=3)
completions = [e.solution if i % 3 else e.solution.replace("\\\\boxed{", "\\\\boxed{1") for i, e in enumerate(examples)]
completions[5] = completions[5].split("\\\\boxed")[0]  # a row without a box
completions[6] = completions[6] + " and some more words" * 3  # rows of unequal length: processes differ in work
p = tokenizer([e.prompt for e in examples], return_tensors="pt", padding=True, padding_side="left",
              add_special_tokens=False)
c = tokenizer(completions, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False)
ids_BL = torch.cat([p["input_ids"], c["input_ids"]], 1)
attn_BL = torch.cat([p["attention_mask"], c["attention_mask"]], 1)
mask_BT = c["attention_mask"].bool()
rows = slice(0, 4) if rank == 0 else slice(4, 8)
CASES = {  # advantages of the whole batch; process 0 takes rows 0-3, process 1 rows 4-7
    "both": torch.tensor([1.0, -1.0, 0.5, -0.5, 0.75, -0.25, -1.0, 1.0]),
    "only_rank0": torch.tensor([1.0, -1.0, 0.5, -0.5, 0.0, 0.0, 0.0, 0.0]),  # process 1: nothing to probe
    "only_rank1": torch.tensor([0.0, 0.0, 0.0, 0.0, 0.75, -0.25, -1.0, 1.0]),
}
forwards = {"sharded": 0, "alone": 0}  # backbone forwards of each model (the lockstep's rounds)
probes.backbone(model).register_forward_pre_hook(lambda *_: forwards.__setitem__("sharded", forwards["sharded"] + 1))
probes.backbone(alone).register_forward_pre_hook(lambda *_: forwards.__setitem__("alone", forwards["alone"] + 1))
report = {"shards": shards}
for name in sys.argv[1].split(","):
    method, _, leaf = name.partition("@")
    options = WeightingOptions(token_weighting=method, rollout_symmetry="both", saliency_leaf=leaf or "embeddings",
                               perturbation_chunk_tokens=64)  # OAR-P: many chunks, as many as each row needs
    for case, adv_B in CASES.items():
        forwards.update(sharded=0, alone=0)
        mine = token_weights(model, tokenizer, ids_BL[rows], attn_BL[rows], mask_BT[rows], adv_B[rows], options,
                             generator=torch.Generator().manual_seed(100 + rank), any_process=any_process)
        ref = token_weights(alone, tokenizer, ids_BL[rows], attn_BL[rows], mask_BT[rows], adv_B[rows], options,
                            generator=torch.Generator().manual_seed(100 + rank))
        report[f"{name}/{case}"] = {
            "max_diff": float((mine.weights_BT - ref.weights_BT).abs().max()), "path": mine.path,
            "alone_path": ref.path, "probed": int(ref.probed_B.sum()),
            "reweighted": int(((ref.weights_BT != 1) & mask_BT[rows]).sum()), **forwards}
with open(f"{sys.argv[2]}.{rank}", "w") as f:
    json.dump(report, f, indent=1)
accelerator.wait_for_everyone()
dist.destroy_process_group()
'''

# every method with a signal (GRAIL at a layer leaf too), except those that read whole groups of rollouts (KTAE: token
# statistics of a group, no model call; this batch has no groups)
# the methods whose probe calls the (sharded) model; a model-free one (KTAE, the position null) has nothing to shard
SHARDABLE = [*(m for m in method_names(probed=True) if METHODS[m].calls_model), "grail@middle"]


def sharded_weights_reports(tmp_path, config, methods=SHARDABLE) -> list[dict]:
    """WEIGHTS_SCRIPT launched on 2 processes with an accelerate config; each process's report."""
    script = tmp_path / "sharded_weights.py"
    script.write_text(WEIGHTS_SCRIPT)
    _launch(tmp_path, str(script), ",".join(methods), str(tmp_path / "weights.json"), config=config)
    return [json.loads((tmp_path / f"weights.json.{rank}").read_text()) for rank in (0, 1)]


def check_sharded_weights(reports: list[dict], engine: str, tolerance: dict[str, float], sharded: bool = True,
                          methods=SHARDABLE) -> dict[str, float]:
    """Every process's weights equal the unsharded copy's on its rows, to `tolerance[method]` (default 1e-6); a
    process with nothing to probe runs the probe while the other has rows. Returns the largest difference per method."""
    worst = {}
    for rank, report in enumerate(reports):
        shards = report["shards"]
        assert shards["engine"] == engine, shards
        assert shards["local"] * 2 == shards["full"] if sharded else shards["local"] == shards["full"], shards
        for name in methods:
            for case in ("both", "only_rank0", "only_rank1"):
                entry = report[f"{name}/{case}"]
                worst[name] = max(worst.get(name, 0.0), entry["max_diff"])
                assert entry["max_diff"] <= tolerance.get(name.split("@")[0], 1e-6), (rank, name, case, entry)
                busy = (case == "both") or (case == f"only_rank{rank}")
                assert entry["alone_path"] == ("separate" if busy else "skipped"), (rank, name, case, entry)
                assert entry["path"] == "separate", (rank, name, case, entry)  # runs when the other process does
                assert (entry["probed"] > 0) == busy, (rank, name, case, entry)
            assert report[f"{name}/both"]["reweighted"] > 0, (rank, name)
    for name in methods:  # every process ran the same number of forwards, whatever its own rows needed
        counts = [[report[f"{name}/{case}"]["sharded"] for report in reports] for case in ("both", "only_rank0")]
        assert all(a == b for a, b in counts), (name, counts)
    if "oar_p" in methods:  # ... which differ for OAR-P: the lockstep (probes.in_lockstep) padded them
        needs = [[report[f"oar_p/{case}"]["alone"] for report in reports] for case in ("both", "only_rank0")]
        assert any(a != b for a, b in needs), needs
    return worst


@pytest.mark.slow
def test_checkpoint_evaluation_under_fsdp2_matches_one_process(tmp_path, warm_cache):
    """eval_benchmarks at a checkpoint of an FSDP2 model: generation runs synced over processes, each sampling its
    share, and the samples equal a one-process evaluation of the saved checkpoint (tests/test_multiprocess.py)."""
    from test_multiprocess import check_checkpoint_evaluation

    script = tmp_path / "fsdp2_train.py"
    script.write_text(FSDP2_SCRIPT)
    check_checkpoint_evaluation(tmp_path, warm_cache[0], script=str(script), config=FSDP2_CONFIG, method="grail",
                                size=24)


def test_per_process_weights_on_fsdp2_equal_one_process_on_the_same_rows(tmp_path):
    """Under torch's FSDP2 (accelerate's prepare, 2 gloo processes, every parameter a DTensor half), each method
    that trains on a sharded model gives each process exactly the weights of an unsharded copy on the same rows:
    the probes run the model's own forward (FSDP gathers its units in the root's hooks) and gather the output layer
    once (`sharding.unsharded`); fp32 all-gathers are exact, and the measured difference is 0. Includes a process with
    nothing to probe while the other has rows (it runs the probe anyway: same collectives) and rows of unequal
    length; entropy in chunks of 8 positions (a data-dependent number of output-layer calls)."""
    worst = check_sharded_weights(sharded_weights_reports(tmp_path, FSDP2_CONFIG), "FSDP", tolerance={})
    assert max(worst.values()) == 0.0, worst


@pytest.mark.parametrize("env, distributed_type, warned", [
    ({"ACCELERATE_USE_FSDP": "true"}, "MULTI_CPU", True),  # what the launch above gives: an FSDP config run as DDP
    ({"ACCELERATE_USE_FSDP": "true"}, "FSDP", False),
    ({}, "MULTI_CPU", False),
    ({"ACCELERATE_USE_FSDP": "false"}, "MULTI_CPU", False),
])
def test_a_dropped_fsdp_config_is_named_not_silent(env, distributed_type, warned):
    from grail.training.engines import dropped_engine

    reason = dropped_engine(env, distributed_type)
    assert (reason is not None) == warned
    if warned:
        assert "runs FSDP configs on CPU processes as DDP" in reason
