"""DeepSpeed ZeRO-2 and ZeRO-3 for real on 2 gloo CPU processes (examples/accelerate_zero3_cpu.yaml; deepspeed is in
the `dev` extra): DeepSpeed's CPU accelerator, accelerate's DeepSpeed plugin and engine, parameters partitioned by
ZeRO-3. Per-process weights equal an unsharded copy's (the script of tests/test_fsdp_cpu.py), and `grail train` trains
GRAIL, OAR-G and OAR-P under ZeRO-3 and saves a model that loads in one process. Launched as in
tests/test_multiprocess.py."""

import json

import pytest
import torch
import yaml

from grail.methods.table import method_names
from launching import FAST, RECORD_STEPS, REPO, _launch, _records
from test_fsdp_cpu import check_paths, check_sharded_weights, sharded_weights_reports

pytest.importorskip("deepspeed", reason="deepspeed is not installed: pip install -c constraints.txt -e '.[deepspeed]'")

ZERO3_CONFIG = REPO / "examples" / "accelerate_zero3_cpu.yaml"
# ZeRO-3 wraps every linear layer's forward in its own autograd function (deepspeed.runtime.zero.linear, installed as
# torch.nn.functional.linear process-wide) over parameters gathered into its own buffers: forward hidden states are
# bit-identical to the unsharded copy's (measured 0), gradients to the leaf differ by rounding, which OAR-G's KL under
# σ = 1e-3 noise amplifies: measured ≤ 6.4e-6 on weights of order 1 on one CPU, 2.2e-5 on a CI runner's (GRAIL ≤ 3e-7).
# A sharding defect (a missing gather, another process's rows) moves weights by 0.1 or more.
ZERO3_TOLERANCE = {"oar_g": 1e-4}


def zero_config(tmp_path, stage: int):
    config = yaml.safe_load(ZERO3_CONFIG.read_text())
    config["deepspeed_config"]["zero_stage"] = stage
    path = tmp_path / f"zero{stage}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_per_process_weights_on_zero3_equal_one_process_on_the_same_rows(tmp_path):
    """Each process holds half of every parameter (ZeRO-3 partitions); every method that trains sharded gives each
    process the weights of an unsharded copy on its rows, including a process with nothing to probe."""
    reports = sharded_weights_reports(tmp_path, ZERO3_CONFIG)
    worst = check_sharded_weights(reports, "DEEPSPEED", ZERO3_TOLERANCE)
    assert worst["entropy"] == 0.0, worst  # no gradient: the forward is bit-identical


@pytest.mark.slow  # ~22 s; ZeRO-3 (above) is the sharded case
def test_per_process_weights_on_zero2_equal_one_process_on_the_same_rows(tmp_path):
    """ZeRO-2 shards optimizer states and gradients only: whole parameters, the same weights exactly."""
    reports = sharded_weights_reports(tmp_path, zero_config(tmp_path, 2), methods=["grail", "oar_g"])
    worst = check_sharded_weights(reports, "DEEPSPEED", {}, sharded=False, methods=["grail", "oar_g"])
    assert max(worst.values()) == 0.0, worst


@pytest.mark.slow
@pytest.mark.parametrize("stage, method", [*((3, m) for m in method_names()), (2, "grail")])  # every method
def test_grail_train_under_deepspeed_on_two_cpu_processes(tmp_path, warm_cache, stage, method):
    """2 steps of `grail train` under DeepSpeed on 2 CPU processes: accelerate counts 2 processes (GRAILConfig names
    the gloo backend), ZeRO-3 holds half of the model per process, the probe runs, and final/ loads in one process."""
    from transformers import AutoModelForCausalLM

    cache, _ = warm_cache
    script = tmp_path / "record_train.py"
    script.write_text(RECORD_STEPS)
    run = tmp_path / "run"
    _launch(tmp_path, str(script), "train", *FAST, "--token_weighting", method, "--cache_dir", str(cache),
            "--output_dir", str(run), config=zero_config(tmp_path, stage),
            env={"GRAIL_RECORD": str(tmp_path / "record")})
    assert [x["step"] for x in _records(run / "metrics.jsonl") if "loss" in x] == [1, 2]
    by_rank = [_records(tmp_path / f"record.{rank}") for rank in (0, 1)]
    if method != "none":
        check_paths(method, by_rank)
    for steps in by_rank:
        assert [s["step"] for s in steps] == [1, 2], steps
        for step in steps:
            assert step["engine"] == "DEEPSPEED" and step["processes"] == 2, step
            assert step["sharded_by"] == ("DeepSpeed ZeRO-3" if stage == 3 else None), step
            assert (step["local"] * 2 == step["full"]) if stage == 3 else (step["local"] == step["full"]), step
        if method == "grail":  # no fused saliency under DeepSpeed: its engine takes the gradient query for a backward
            assert steps[0]["fused_unavailable"].startswith("DeepSpeed"), steps[0]
    model = AutoModelForCausalLM.from_pretrained(run / "final")  # whole weights (zero3_save_16bit_model)
    assert sum(p.numel() for p in model.parameters()) == steps[0]["full"]
    resolved = json.loads((run / "resolved_config.json").read_text())
    assert resolved["use_cpu"] is False and resolved["ddp_backend"] == "gloo", resolved


def test_a_deepspeed_launch_on_cpu_keeps_accelerate_off_cpu_mode(monkeypatch):
    """accelerate takes DeepSpeed only without cpu=True and counts one process without a backend
    (GRAILConfig._cpu_engine; the launched test above checks resolved_config.json); outside a DeepSpeed launch, CPU
    training keeps use_cpu=True; an explicit use_cpu=True under a DeepSpeed launch is kept, and named by the
    trainer's dropped-engine warning."""
    from types import SimpleNamespace

    from grail.training.config import GRAILConfig
    from grail.training.engines import dropped_engine

    def resolved(**fields):
        cfg = SimpleNamespace(use_cpu=False, ddp_backend=None, **fields)
        GRAILConfig._cpu_engine(cfg)
        return cfg.use_cpu, cfg.ddp_backend

    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    assert resolved() == (False, "gloo")
    cfg = SimpleNamespace(use_cpu=True, ddp_backend=None)
    GRAILConfig._cpu_engine(cfg)
    assert (cfg.use_cpu, cfg.ddp_backend) == (True, None)
    assert "use_cpu=True was given" in dropped_engine({"ACCELERATE_USE_DEEPSPEED": "true"}, "MULTI_CPU")
    assert dropped_engine({"ACCELERATE_USE_DEEPSPEED": "true"}, "DEEPSPEED") is None
    monkeypatch.delenv("ACCELERATE_USE_DEEPSPEED")
    assert resolved() == (True, None)


@pytest.mark.slow
def test_a_killed_zero3_run_resumes_from_its_checkpoint_to_the_uninterrupted_result(tmp_path, warm_cache):
    """As tests/test_fsdp_resume.py under ZeRO-3: a 4-step `grail` run killed after step 3 resumes from checkpoint-2
    (DeepSpeed's partitioned model and optimizer states, one file per process, plus the whole model that
    zero3_save_16bit_model gathers) to the uninterrupted run's per-step metrics and final weights, exactly."""
    from safetensors.torch import load_file

    from test_fsdp_resume import KILL, KILL_AT, SAVE_EVERY, _metrics, _train

    assert RECORD_STEPS.count('if __name__ == "__main__":') == 1
    (tmp_path / "resume.py").write_text(RECORD_STEPS.replace('if __name__ == "__main__":',
                                                              KILL + 'if __name__ == "__main__":'))
    cache, _ = warm_cache
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    _train(tmp_path, cache, whole, "whole", ZERO3_CONFIG)
    _train(tmp_path, cache, killed, "killed", ZERO3_CONFIG, kill_at=KILL_AT)
    assert [p.name for p in killed.glob("checkpoint-*")] == ["checkpoint-2"]
    checkpoint = killed / "checkpoint-2"
    partitions = sorted(p.name for p in (checkpoint / f"global_step{SAVE_EVERY}").iterdir())
    assert len([name for name in partitions if "optim_states" in name]) == 2, partitions  # one per process
    assert (checkpoint / "model.safetensors").is_file()
    _train(tmp_path, cache, killed, "resumed", ZERO3_CONFIG, "--resume_from_checkpoint", "true")
    for rank in (0, 1):
        resumed = _records(tmp_path / f"resumed.{rank}")
        assert [s["step"] for s in resumed] == [3, 4], resumed
        assert all(s["sharded_by"] == "DeepSpeed ZeRO-3" and s["local"] * 2 == s["full"] for s in resumed), resumed
    got, expected = _metrics(killed), _metrics(whole)
    assert [m["step"] for m in got] == [m["step"] for m in expected] == [1, 2, 3, 4, 4]
    for a, b in zip(got, expected, strict=True):
        assert a == b, (a["step"], {k: (a.get(k), b.get(k)) for k in b if a.get(k) != b.get(k)})
    final, reference = (load_file(str(run / "final" / "model.safetensors")) for run in (killed, whole))
    assert final.keys() == reference.keys()
    assert all(torch.equal(final[name], tensor) for name, tensor in reference.items())


@pytest.mark.slow
def test_checkpoint_evaluation_under_zero3_matches_one_process(tmp_path, warm_cache):
    """eval_benchmarks at a checkpoint of a ZeRO-3 model: generation runs synced over processes, each sampling its
    share, and the samples equal a one-process evaluation of the saved checkpoint (tests/test_multiprocess.py)."""
    from test_multiprocess import check_checkpoint_evaluation

    check_checkpoint_evaluation(tmp_path, warm_cache[0], config=ZERO3_CONFIG, method="grail", size=24)
