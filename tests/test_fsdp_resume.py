"""Checkpoint save and resume under FSDP2 on 2 gloo CPU processes (accelerate's gate opened, as in
tests/test_fsdp_cpu.py): a run killed after its checkpoint resumes with `--resume_from_checkpoint true` from the
saved step to the result of a run that was never interrupted, as a single process does (tests/test_resume.py)."""

import json
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from grail.training.resume import MARKER
from launching import FAST, _launch, _records
from test_fsdp_cpu import FSDP2_CONFIG, FSDP2_SCRIPT

STEPS, SAVE_EVERY, KILL_AT = 4, 2, 3  # killed after step 3: checkpoint-2 is the last one, step 3 is trained again

# The kill: right after step KILL_AT's metrics line is written, every process leaves at once (os._exit: no final
# model, no further checkpoint, nothing flushed or torn down), after the step's last collective. Deterministic, unlike
# a SIGKILL from outside at a polled step (tests/test_resume.py), which under the launcher may land on a process in
# the middle of a collective or after the run ended. Exit status 0, so that the launcher waits for the other process
# instead of terminating it on the first one's failure.
KILL = '''
from transformers import TrainerCallback


class Kill(TrainerCallback):
    def on_log(self, args, state, control, logs=None, **kwargs):  # after grail's MetricsJsonl (added before)
        if state.global_step == int(os.environ["GRAIL_KILL_AT"]):
            os._exit(0)


original_init = GRAILTrainer.__init__


def init(self, *args, **kwargs):
    original_init(self, *args, **kwargs)
    if os.environ.get("GRAIL_KILL_AT"):
        self.add_callback(Kill())


GRAILTrainer.__init__ = init
'''
assert FSDP2_SCRIPT.count('if __name__ == "__main__":') == 1, "FSDP2_SCRIPT changed: put KILL before grail's main"
RESUME_SCRIPT = FSDP2_SCRIPT.replace('if __name__ == "__main__":', KILL + 'if __name__ == "__main__":')

# Every per-step figure is compared; these differ between any two runs (wall clock) or are the end-of-run summary
# that transformers averages over the steps this process trained (as in tests/test_resume.py).
VOLATILE = {"step_time", "weights/seconds", "train_runtime", "train_samples_per_second", "train_steps_per_second",
            "epoch", "total_flos", "train_loss"}


def _train(tmp_path, cache, run, record, config, *extra, kill_at=None):
    args = [*FAST, "--max_steps", str(STEPS), "--save_steps", str(SAVE_EVERY), "--seed", "7"]
    env = {"GRAIL_RECORD": str(tmp_path / record), **({"GRAIL_KILL_AT": str(kill_at)} if kill_at else {})}
    return _launch(tmp_path, str(tmp_path / "resume.py"), "train", *args, "--token_weighting", "grail",
                   "--cache_dir", str(cache), "--output_dir", str(run), *extra, config=config, env=env)


def _metrics(run):
    return [{k: v for k, v in line.items() if k not in VOLATILE} for line in _records(run / "metrics.jsonl")]


def _config(tmp_path, state_dict_type):
    """examples/accelerate_fsdp2_cpu.yaml (FULL_STATE_DICT), or a copy with another fsdp_state_dict_type."""
    if state_dict_type == "FULL_STATE_DICT":
        return FSDP2_CONFIG
    config = tmp_path / "fsdp2.yaml"
    config.write_text(FSDP2_CONFIG.read_text().replace("fsdp_state_dict_type: FULL_STATE_DICT",
                                                       f"fsdp_state_dict_type: {state_dict_type}"))
    return config


def _check_full_checkpoint(checkpoint, names):
    """FULL_STATE_DICT (accelerate's save_fsdp_model / save_fsdp_optimizer, written by process 0 only): the whole
    model in pytorch_model_fsdp.bin, equal to the model.safetensors that transformers' save_model writes beside it;
    the whole optimiser state in optimizer.bin, keyed by parameter name, every moment at the full parameter's shape."""
    assert {"pytorch_model_fsdp.bin", "optimizer.bin", "model.safetensors", "config.json"} <= names, names
    assert not any((checkpoint / name).is_dir() for name in names), names  # no per-process shards
    model = torch.load(checkpoint / "pytorch_model_fsdp.bin", weights_only=True)
    saved = load_file(str(checkpoint / "model.safetensors"))
    assert all(type(t) is torch.Tensor for t in model.values())  # plain tensors, not DTensor shards
    assert saved.keys() <= model.keys() and all(torch.equal(saved[k], model[k]) for k in saved)
    optimizer = torch.load(checkpoint / "optimizer.bin", weights_only=True)
    moments = optimizer["state"]  # every parameter's, once: the tiny model's output layer is its input embeddings
    assert moments.keys() <= model.keys() and model.keys() - moments.keys() == {"lm_head.weight"}
    assert sorted(n for group in optimizer["param_groups"] for n in group["params"]) == sorted(moments)
    for name, state in moments.items():
        assert float(state["step"]) == SAVE_EVERY, (name, state["step"])
        assert state["exp_avg"].shape == state["exp_avg_sq"].shape == model[name].shape, name


def _check_sharded_checkpoint(checkpoint, names):
    """SHARDED_STATE_DICT (torch.distributed.checkpoint): model and optimiser each a folder holding one file of
    shards per process and the metadata; no whole model (transformers' save_model writes none for this type)."""
    assert {"pytorch_model_fsdp_0", "optimizer_0"} <= names, names
    assert not names & {"pytorch_model_fsdp.bin", "optimizer.bin", "model.safetensors"}, names
    for folder in ("pytorch_model_fsdp_0", "optimizer_0"):
        assert sorted(p.name for p in (checkpoint / folder).iterdir()) == [".metadata", "__0_0.distcp",
                                                                            "__1_0.distcp"], folder


@pytest.mark.slow
@pytest.mark.parametrize("state_dict_type", ["FULL_STATE_DICT", "SHARDED_STATE_DICT"])
def test_a_killed_fsdp2_run_resumes_from_its_checkpoint_to_the_uninterrupted_result(tmp_path, warm_cache,
                                                                                    state_dict_type):
    """FSDP2 (torch's fully_shard over gloo, accelerate's gate opened), grail's separate probe on the sharded model.
    A run killed after step 3 resumes from checkpoint-2 (`--resume_from_checkpoint true`): each process's first
    trained step is 3, metrics.jsonl holds steps 1-4 once each and every per-step figure equals an uninterrupted
    4-step run's, and so does every final parameter, exactly (restored model, optimiser moments, scheduler, each
    process's RNG state and data position; the collectives are the same, so the arithmetic is too). The checkpoint
    holds what FSDP2 saves for the state dict type; the final model loads in one plain process."""
    from transformers import AutoModelForCausalLM

    cache, _ = warm_cache
    config = _config(tmp_path, state_dict_type)
    (tmp_path / "resume.py").write_text(RESUME_SCRIPT)
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    _train(tmp_path, cache, whole, "whole", config)
    _train(tmp_path, cache, killed, "killed", config, kill_at=KILL_AT)
    assert not (killed / "final").exists() and [m["step"] for m in _metrics(killed)] == [1, 2, 3]
    assert [p.name for p in killed.glob("checkpoint-*")] == ["checkpoint-2"]
    checkpoint = killed / "checkpoint-2"
    names = {p.name for p in checkpoint.iterdir()}
    assert {MARKER, "scheduler.pt", "rng_state_0.pth", "rng_state_1.pth", "trainer_state.json"} <= names, names
    assert json.loads((checkpoint / "trainer_state.json").read_text())["global_step"] == SAVE_EVERY
    check = _check_full_checkpoint if state_dict_type == "FULL_STATE_DICT" else _check_sharded_checkpoint
    check(checkpoint, names)

    _train(tmp_path, cache, killed, "resumed", config, "--resume_from_checkpoint", "true")
    for rank in (0, 1):  # sharded throughout, and the resumed processes trained steps 3 and 4 only
        resumed = _records(tmp_path / f"resumed.{rank}")
        assert [s["step"] for s in resumed] == [3, 4], resumed
        assert all(s["fsdp2"] and s["dtensor"] and s["local"] * 2 == s["full"] for s in resumed), resumed
        assert all(s["path"] == "separate" for s in resumed), resumed
    (resume,) = _records(killed / "resumed.jsonl")
    assert resume["step"] == SAVE_EVERY and resume["from"] == str(checkpoint)

    got, expected = _metrics(killed), _metrics(whole)
    assert [m["step"] for m in got] == [m["step"] for m in expected] == [1, 2, 3, 4, 4]  # 4 twice: the run's summary
    for a, b in zip(got, expected, strict=True):
        assert a.keys() == b.keys(), a["step"]
        for key in b:
            assert a[key] == b[key], (a["step"], key, a[key], b[key])
    final, reference = load_file(str(killed / "final" / "model.safetensors")), load_file(
        str(whole / "final" / "model.safetensors"))
    assert final.keys() == reference.keys()
    for name, tensor in reference.items():
        assert torch.equal(final[name], tensor), (name, float((final[name] - tensor).abs().max()))

    model = AutoModelForCausalLM.from_pretrained(killed / "final")  # one plain process: no FSDP, no DTensor
    assert all(type(p) is torch.nn.Parameter for p in model.parameters())
    assert all(torch.equal(t, final[k]) for k, t in model.state_dict().items() if k in final)
    assert (killed / "final" / "grail_prompt.json").is_file()


def _trainer(state_dict_type, calls):
    """What `Trainer.save_model` and `save_final` read of a trainer, recording what they save."""
    from torch.distributed.fsdp import StateDictType

    plugin = None if state_dict_type is None else SimpleNamespace(state_dict_type=StateDictType[state_dict_type])
    accelerator = SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin),
                                  get_state_dict=lambda model: calls.append(("gather", model)) or {"w": "full"})
    return SimpleNamespace(is_fsdp_enabled=plugin is not None, accelerator=accelerator, model="sharded model",
                           args=SimpleNamespace(push_to_hub=False, output_dir="unused"),
                           save_model=lambda path: calls.append(("save_model", path)),
                           _save=lambda path, state_dict=None: calls.append(("_save", path, state_dict)))


@pytest.mark.parametrize("state_dict_type, saves", [("FULL_STATE_DICT", True), ("SHARDED_STATE_DICT", False)])
def test_transformers_save_model_saves_nothing_under_fsdp_sharded_state_dict(state_dict_type, saves):
    """The reason for `save_final`: transformers' Trainer.save_model under FSDP gathers and saves the model for
    FULL_STATE_DICT only (trainer.py, `elif self.is_fsdp_enabled:` in save_model) and writes nothing for
    SHARDED_STATE_DICT. When transformers saves there too, this fails: `save_final` can then call save_model alone."""
    from transformers import Trainer

    calls = []
    Trainer.save_model(_trainer(state_dict_type, calls), "final")
    assert calls == ([("gather", "sharded model"), ("_save", "final", {"w": "full"})] if saves else [])


@pytest.mark.parametrize("state_dict_type", [None, "FULL_STATE_DICT", "SHARDED_STATE_DICT"])
def test_save_final_saves_the_whole_model_for_every_state_dict_type(tmp_path, state_dict_type):
    """`grail.training.run.save_final`: save_model where it saves the whole model (no FSDP, FULL_STATE_DICT), else
    the full state dict gathered (by every process) and saved as save_model does for FULL_STATE_DICT."""
    from grail.training.run import save_final

    calls = []
    save_final(_trainer(state_dict_type, calls), tmp_path / "final")
    if state_dict_type == "SHARDED_STATE_DICT":
        assert calls == [("gather", "sharded model"), ("_save", str(tmp_path / "final"), {"w": "full"})]
    else:
        assert calls == [("save_model", str(tmp_path / "final"))]
