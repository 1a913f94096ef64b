"""FSDP2 on 2 gloo CPU processes (examples/accelerate_fsdp2_cpu.yaml): accelerate 1.15 drops an FSDP config on CPU
processes (it runs DDP), grail says so, and with accelerate's gate opened in the launched script torch's own
fully_shard trains `none` and `grail`. Launched as in tests/test_multiprocess.py (tests/launching.py)."""

import json

import pytest

from launching import FAST, REPO, _launch, _records

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
# in DDP. This opener takes that branch for MULTI_CPU too, exactly as accelerate would (the plugin accelerate built
# from the launcher's FSDP_* variables, PartialState's distributed_type updated as state.py does); the sharding and
# its collectives are torch's own fully_shard over gloo.
FSDP2_SCRIPT = '''
"""`grail train` under FSDP2 on CPU processes, accelerate's MULTI_CPU gate opened; each process records its model."""
import json, os, sys, time

import accelerate.state as st
import torch
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

from grail.cli import main
from grail.training.trainer import GRAILTrainer, sharded_by

original_step = GRAILTrainer.training_step


def training_step(self, model, inputs, *args, **kwargs):
    start = time.perf_counter()
    loss = original_step(self, model, inputs, *args, **kwargs)
    params = list(self.model.parameters())
    record = {"step": self.state.global_step + 1, "seconds": time.perf_counter() - start,
              "fsdp2": self.accelerator.is_fsdp2, "model": type(self.model).__name__,
              "dtensor": all(type(p).__name__ == "DTensor" for p in params),
              "local": sum(getattr(p, "to_local", lambda: p)().numel() for p in params),
              "full": sum(p.numel() for p in params), "sharded_by": sharded_by(self),
              "fused_unavailable": self.fused_unavailable}
    with open(f"{os.environ['GRAIL_RECORD']}.{self.accelerator.process_index}", "a") as f:
        f.write(json.dumps(record) + "\\n")
    return loss


GRAILTrainer.training_step = training_step
sys.exit(main(sys.argv[1:]))
'''


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
@pytest.mark.parametrize("method", ["none", "grail"])
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
    for rank in (0, 1):
        steps = _records(tmp_path / f"record.{rank}")
        assert steps, f"process {rank} ran no training step"
        for step in steps:
            assert step["fsdp2"] and step["dtensor"] and step["model"].startswith("FSDP"), step
            assert step["local"] * 2 == step["full"] and step["sharded_by"] == "FSDP", step
        if method == "grail":
            assert steps[0]["fused_unavailable"].startswith("FSDP"), steps[0]


@pytest.mark.parametrize("env, distributed_type, warned", [
    ({"ACCELERATE_USE_FSDP": "true"}, "MULTI_CPU", True),  # what the launch above gives: an FSDP config run as DDP
    ({"ACCELERATE_USE_FSDP": "true"}, "FSDP", False),
    ({}, "MULTI_CPU", False),
    ({"ACCELERATE_USE_FSDP": "false"}, "MULTI_CPU", False),
])
def test_a_dropped_fsdp_config_is_named_not_silent(env, distributed_type, warned):
    from grail.training.trainer import dropped_engine

    reason = dropped_engine(env, distributed_type)
    assert (reason is not None) == warned
    if warned:
        assert "runs FSDP configs on CPU processes as DDP" in reason
