"""Where `grail compare` and `grail demo` evaluate: on the GPU when the run trains there, on the CPU when it trains
there (seen on a GPU machine: every held-out evaluation ran on its CPU, four minutes for 256 problems)."""

import dataclasses

from grail.training import heldout
from grail.training.overrides import build_config, merge


def test_a_cpu_run_evaluates_on_the_cpu(tmp_path):
    cfg = build_config(merge(None, {"preset": "tiny-cpu", "output_dir": str(tmp_path)}))
    assert cfg.use_cpu and heldout.eval_device(cfg) == "cpu"
    cfg.use_cpu = False  # as a run on a GPU machine resolves it
    assert heldout.eval_device(cfg) is None  # load_inference_model's default: cuda when visible


def test_the_held_out_model_is_loaded_where_the_run_says(tmp_path, tiny_dir, monkeypatch):
    cfg = build_config(merge(None, {"preset": "tiny-cpu", "output_dir": str(tmp_path)}))
    specs = heldout.eval_specs(cfg)
    (loaded,) = specs["greedy"].load_benchmarks(synthetic_set=cfg.synthetic_set())
    few = dataclasses.replace(loaded, problems=loaded.problems[:2])
    devices = []
    plain = heldout.load_inference_model
    monkeypatch.setattr(heldout, "load_inference_model", lambda path, device: devices.append(device) or plain(path,
                                                                                                            device))
    scores = heldout.heldout_accuracy(str(tiny_dir), specs, few, tmp_path / "eval", log=lambda s: None,
                                      device=heldout.eval_device(cfg))
    assert devices == ["cpu"] and set(scores) == {"greedy", "sampled"}
