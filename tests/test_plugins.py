"""The open method table: a method registered from outside the package (the example plug-in installed as a package,
or `register_method` from a script) is accepted everywhere a method is; registration refuses what would collide."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grail import MethodOption, MethodSpec, register_method, unregister_method, weights_for
from grail.methods import builtin
from grail.methods.table import METHODS, method_names, method_spec
from grail.models.tiny import build_tiny_model
from grail.training.overrides import ConfigError, build_config, merge, parse_flags

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "position_decay"


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The example plug-in installed by pip into a folder of its own (not the package, not this process)."""
    import importlib.util

    target = tmp_path_factory.mktemp("site")
    # build with this environment's setuptools when it has one (no download); else pip fetches it from the registry
    isolation = ["--no-build-isolation"] if importlib.util.find_spec("setuptools") else []
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", *isolation, "--target",
                           str(target), str(EXAMPLE)], capture_output=True, text=True)
    assert done.returncode == 0, f"pip could not install the example plug-in:\n{done.stderr[-2000:]}"
    return target


def _grail(target: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(target), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", "from grail.cli import run; run()", *argv], env=env,
                          capture_output=True, text=True, timeout=600)


def test_the_example_plugin_is_one_short_file():
    assert len((EXAMPLE / "grail_position_decay.py").read_text().splitlines()) <= 50


def test_the_installed_example_plugin_trains_two_steps_and_is_listed(installed, tmp_path, warm_cache):
    from conftest import WARM_STEPS

    cache, _ = warm_cache
    listed = _grail(installed, "methods", "position_decay")
    assert listed.returncode == 0 and "--position_decay_rate (default 0.9)" in listed.stdout, listed.stderr
    checked = _grail(installed, "methods", "check", "position_decay")  # the public checker, as its author runs it
    assert checked.returncode == 0 and "position_decay: passed" in checked.stdout, checked.stdout + checked.stderr
    assert "ok   model_free" in checked.stdout and "ok   mass" in checked.stdout
    out = tmp_path / "run"
    run = _grail(installed, "train", "--preset", "tiny-cpu", "--token_weighting", "position_decay",
                 "--position_decay_rate", "0.8", "--max_steps", "2", "--warmstart_steps", str(WARM_STEPS),
                 "--cache_dir", str(cache), "--output_dir", str(out), "--report_to", "none")
    assert run.returncode == 0, run.stderr[-2000:]
    resolved = json.loads((out / "resolved_config.json").read_text())
    assert resolved["token_weighting"] == "position_decay"
    assert resolved["method_options"] == {"position_decay_rate": 0.8}
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert any("weights/ess_ratio" in s and s["weights/ess_ratio"] < 1 for s in steps)  # it did reweight
    bad = _grail(installed, "train", "--preset", "tiny-cpu", "--token_weighting", "position_decay",
                 "--position_decay_rate", "2", "--output_dir", str(tmp_path / "bad"))
    assert bad.returncode == 2 and "position_decay_rate=2.0: must be <= 1.0" in bad.stderr


def _toy_spec(name="toy", options=None) -> MethodSpec:
    return MethodSpec(name, "toy", lambda model, rows, options, generator: rows.reasoning_BT.float() + 1,
                      builtin.uniform_pipeline, rows="advantaged",
                      options=options or (MethodOption(f"{name}_scale", 2.0, "a scale", minimum=0.0),))


def test_a_method_registered_from_a_script_is_accepted_everywhere(tokenizer, tmp_path):
    spec = register_method(_toy_spec())
    try:
        assert "toy" in method_names(probed=True) and method_spec("toy") is spec
        values = merge(None, parse_flags(["--token_weighting", "toy", "--toy_scale", "3", "--output_dir",
                                          str(tmp_path)]))
        cfg = build_config(values)
        assert cfg.weighting_options().method_options == {"toy_scale": 3.0}  # parsed once, into the options
        model = build_tiny_model(tokenizer, seed=0)
        p = tokenizer(["Q: 1+2\nA:"] * 2, return_tensors="pt", add_special_tokens=False)
        c = tokenizer([" 1+2=3 \\boxed{3}", " 1+2=5 \\boxed{5}"], return_tensors="pt", add_special_tokens=False)
        w = weights_for("toy", model, tokenizer, p["input_ids"], p["attention_mask"], c["input_ids"],
                        c["attention_mask"], torch.tensor([0.5, -0.5]), toy_scale=1.0)
        assert torch.all(w == 1)
        with pytest.raises(ValueError, match="toy_scale=-1.0: must be >= 0.0"):
            weights_for("toy", model, tokenizer, p["input_ids"], p["attention_mask"], c["input_ids"],
                        c["attention_mask"], torch.tensor([0.5, -0.5]), toy_scale=-1.0)
    finally:
        unregister_method("toy")
    assert "toy" not in METHODS


@pytest.mark.parametrize("spec, named", [
    (lambda: _toy_spec("grail"), "already registered"),
    (lambda: _toy_spec("toy2", options=(MethodOption("eapo_alpha", 1.0, "x"),)), "must start with 'toy2_'"),
    (lambda: _toy_spec("BadName"), "lower-case Python identifier"),
    (lambda: MethodSpec("toy3", "t", None, builtin.uniform_pipeline, rows="advantaged"), "without a probe"),
])
def test_registration_refuses_collisions_and_malformed_specs(spec, named):
    with pytest.raises(ValueError, match=named):
        register_method(spec())


def test_options_of_another_method_and_unknown_names_are_refused_with_the_fix(tmp_path):
    with pytest.raises(ConfigError, match="ktae_top is an option of token_weighting='ktae'; token_weighting='grail' "
                                          "does not read it.*set token_weighting=ktae"):
        build_config(merge(None, parse_flags(["--token_weighting", "grail", "--ktae_top", "0.5",
                                              "--output_dir", str(tmp_path)])))
    with pytest.raises(ConfigError, match="method_options nope: not an option of token_weighting='grail'"):
        build_config({"token_weighting": "grail", "method_options": {"nope": 1}, "output_dir": str(tmp_path)})
    with pytest.raises(ConfigError, match="'nope' is not a method; choose one of none, grail"):
        build_config({"token_weighting": "nope", "output_dir": str(tmp_path)})
    # a method that reads whole groups gets rollout-time weights; TRL's arm gets its quantile; both recorded
    assert build_config({"token_weighting": "ktae", "output_dir": str(tmp_path)}).weights_from == "rollout_policy"
    assert build_config({"token_weighting": "top_entropy", "output_dir": str(tmp_path)}).top_entropy_quantile == 0.2
    with pytest.raises(ConfigError, match="top_entropy_quantile=1.5.*set it in \\[0, 1\\)"):
        build_config({"token_weighting": "top_entropy", "top_entropy_quantile": 1.5, "output_dir": str(tmp_path)})


def test_a_broken_entry_point_is_reported_not_fatal(monkeypatch):
    from importlib.metadata import EntryPoint

    from grail.methods import table

    fresh = table._Table()
    broken = EntryPoint("broken", "no_such_module_xyz:SPEC", table.ENTRY_POINT_GROUP)
    monkeypatch.setattr("importlib.metadata.entry_points", lambda group: [broken])
    with pytest.warns(UserWarning, match="did not load"):
        names = list(fresh)
    assert "broken" not in names and "broken" in fresh.failed and "grail" in names
