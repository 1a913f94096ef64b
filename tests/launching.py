"""Launching 2 gloo CPU processes for the multi-process tests (tests/test_multiprocess.py, tests/test_fsdp_cpu.py):
`accelerate launch` with no GPU visible, each process single-threaded, with a hang bound."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import WARM_STEPS

REPO = Path(__file__).resolve().parents[1]
LAUNCH_TIMEOUT_S = 420  # a hang (processes out of step) ends the test here instead of never
FAST = ["--preset", "tiny-cpu", "--max_steps", "2", "--per_device_train_batch_size", "8", "--num_generations", "4",
        "--task_num_train", "64", "--learning_rate", "1e-3", "--logging_steps", "1", "--save_steps", "100",
        "--warmstart_steps", str(WARM_STEPS)]


def _free_port() -> int:
    """A free TCP port for the processes' rendezvous (two engineers' runs must not meet on accelerate's 29500)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(tmp_path: Path, *args: str, env: dict | None = None, config: Path | None = None,
            check: bool = True) -> subprocess.CompletedProcess:
    """`accelerate launch --multi_gpu --num_processes 2 ARGS` (or `--config_file CONFIG --num_processes 2 ARGS`)
    without a visible GPU (2 gloo CPU processes), each single-threaded; fails the test on a non-zero exit (unless not
    `check`), and on a hang after LAUNCH_TIMEOUT_S."""
    mode = (["--config_file", str(config)] if config is not None else
            ["--multi_gpu", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"])
    command = [sys.executable, "-m", "accelerate.commands.launch", *mode, "--num_processes", "2",
               "--main_process_port", str(_free_port()), *args]
    environment = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
                   "TOKENIZERS_PARALLELISM": "false", **(env or {})}
    try:
        done = subprocess.run(command, cwd=tmp_path, env=environment, capture_output=True, text=True,
                              timeout=LAUNCH_TIMEOUT_S)
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"2-process run did not finish within {LAUNCH_TIMEOUT_S} s (processes out of step?):\n"
                    f"{(err.stdout or b'')[-3000:]!r}\n{(err.stderr or b'')[-3000:]!r}")
    assert done.returncode == 0 or not check, f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return done


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# `grail train` with each process recording, per training step, its engine and how much of the model it holds (one
# JSON line per step in $GRAIL_RECORD.RANK). `local`: this process's part of the parameters (an FSDP2 DTensor's
# shard, a ZeRO-3 partition, else the whole); `full`: the whole. The main call is guarded: the grading workers of
# checkpoint evaluation start by importing this file again (spawn).
RECORD_STEPS = """
import json, os, sys, time

from grail.cli import main
from grail.training.engines import sharded_by
from grail.training.trainer import GRAILTrainer

original_step = GRAILTrainer.training_step


def _local(p):
    return p.to_local() if hasattr(p, "to_local") else getattr(p, "ds_tensor", p)


def training_step(self, model, inputs, *args, **kwargs):
    start = time.perf_counter()
    loss = original_step(self, model, inputs, *args, **kwargs)
    unwrapped = self.accelerator.unwrap_model(self.model)
    params = list(unwrapped.parameters())
    record = {"step": self.state.global_step + 1, "seconds": time.perf_counter() - start,
              "engine": self.accelerator.distributed_type.name, "processes": self.accelerator.num_processes,
              "fsdp2": self.accelerator.is_fsdp2, "model": type(unwrapped).__name__,
              "dtensor": all(type(p).__name__ == "DTensor" for p in params),
              "local": sum(_local(p).numel() for p in params),
              "full": sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in params),
              "sharded_by": sharded_by(self), "fused_unavailable": self.fused_unavailable,
              "path": getattr(self.last_token_weights, "path", None)}
    with open(f"{os.environ['GRAIL_RECORD']}.{self.accelerator.process_index}", "a") as f:
        f.write(json.dumps(record) + "\\n")
    return loss


GRAILTrainer.training_step = training_step
if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
"""
