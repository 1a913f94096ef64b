"""The method contract: `check_method` passes for every method of the table and fails, naming the check, for a spec
that breaks each rule; registration refuses a spec that could never reweight or would shadow a config field; option
fields are scoped to the methods that read them; a config resolves its method once; the fused `weights/seconds`
counts the weight computation once."""

import json
import re
import time
from pathlib import Path

import pytest
import torch

from batches import loss_and_grads, make_trainer, trl_batch
from grail import MethodOption, MethodSpec, register_method, unregister_method
from grail.analysis.checks import MethodCheckError, check_method
from grail.cli import main
from grail.methods import builtin, table
from grail.methods.spec import MethodSpec as Spec
from grail.methods.spec import TokenWeights
from grail.methods.table import method_names
from grail.training.overrides import build_config, merge, parse_flags
from grail.training.trainer import GRAILTrainer


@pytest.mark.parametrize("name", method_names())
def test_every_method_of_the_table_passes_the_public_checker(name):
    report = check_method(name)
    assert report.ok and {r.name for r in report.results} >= {"shape", "padding", "detached", "reweights", "seeded"}


# ---- specs that break one rule each ------------------------------------------------------------------------------

def _position_signal(model, rows, options, generator):
    """(rows, T) a position rule: later reasoning tokens score higher (no model call)."""
    return rows.reasoning_BT.float().cumsum(1) * rows.reasoning_BT


def _scaled(pipeline_weights):
    def pipeline(spec, signal_BT, adv_B, spans, mask_BT, rows_B, options, generator, min_importance):
        out = builtin.saliency_pipeline(spec, signal_BT, adv_B, spans, mask_BT, rows_B, options, generator,
                                        min_importance)
        out.weights_BT = pipeline_weights(out.weights_BT, mask_BT, options)
        return out
    return pipeline


def _spec(name="broken", **fields):
    values = dict(probe=_position_signal, pipeline=builtin.saliency_pipeline, rows="saliency", calls_model=False,
                  reads=builtin.SALIENCY_READS, preserves_mass=False)
    return Spec(name, name, **{**values, **fields})


def _noisy_probe(model, rows, options, generator):
    return torch.rand(rows.answer_BT.shape)  # the global RNG, not `generator`


def _grad_writing_probe(model, rows, options, generator):
    model(input_ids=rows.input_ids_BL, attention_mask=rows.attention_mask_BL).logits.sum().backward()
    return _position_signal(model, rows, options, generator)


def _entropy_at_temperature_one(model, rows, options, generator):
    return builtin.entropy_probe(model, rows, options.__class__(**{**options.__dict__, "temperature": 1.0}), None)


BROKEN = {
    "padding": lambda: _spec(pipeline=_scaled(lambda w, mask, o: w + 0.5 * ~mask)),
    "sign": lambda: _spec(pipeline=_scaled(lambda w, mask, o: (w - 1.0) * mask)),
    "mass": lambda: _spec(preserves_mass=True),
    "detached": lambda: _spec(probe=_grad_writing_probe, calls_model=True),
    "reweights": lambda: _spec(pipeline=builtin.uniform_pipeline),
    "seeded": lambda: _spec(probe=_noisy_probe),
    "options": lambda: _spec(reads=()),
    "model_free": lambda: _spec(probe=_grad_writing_probe),
    "fused": lambda: _spec(probe=_entropy_at_temperature_one, calls_model=True, fuse="entropy",
                           reads=builtin.SALIENCY_READS + ("saliency_path",)),
}


@pytest.mark.parametrize("rule", sorted(BROKEN))
def test_the_checker_fails_a_spec_that_breaks_one_rule_naming_it(rule):
    from grail.options.choices import WeightingOptions

    options = WeightingOptions(temperature=0.7) if rule == "fused" else None
    report = check_method(BROKEN[rule](), raise_on_failure=False, options=options)
    failed = {r.name for r in report.results if r.passed is False}
    assert failed == {rule}, report.text()
    with pytest.raises(MethodCheckError, match=rule):
        check_method(BROKEN[rule](), options=options)


def test_the_position_rule_itself_passes():
    assert check_method(_spec()).ok


def test_grail_methods_check_exits_1_for_a_failing_plugin(capsys):
    register_method(BROKEN["reweights"]())
    try:
        assert main(["methods", "check", "broken"]) == 1
        out = capsys.readouterr().out
        assert "FAIL reweights" in out and "trains as GRPO" in out
    finally:
        unregister_method("broken")


# ---- registration and option scope ---------------------------------------------------------------------------------

@pytest.mark.parametrize("spec, named", [
    (lambda: Spec("silent", "silent", None, builtin.saliency_pipeline, rows="none"), "would train as GRPO"),
    (lambda: Spec("max", "max", _position_signal, builtin.saliency_pipeline, calls_model=False,
                  options=(MethodOption("max_steps", 1, "a TRL field's name"),)), "name of a config field"),
    (lambda: Spec("task", "task", _position_signal, builtin.saliency_pipeline, calls_model=False,
                  options=(MethodOption("task_seed", 1, "a grail field's name"),)), "name of a config field"),
])
def test_registration_refuses_a_spec_that_cannot_reweight_or_shadows_a_field(spec, named):
    with pytest.raises(ValueError, match=named):
        register_method(spec())


def test_a_probe_less_spec_with_rows_is_refused_when_built_naming_calls_model():
    with pytest.raises(ValueError, match="calls_model=False"):
        MethodSpec("free", "free", None, builtin.saliency_pipeline, rows="advantaged")


def test_an_option_of_another_method_exits_2_naming_the_fix(tmp_path, capsys):
    assert main(["train", "--token_weighting", "grail", "--oar_quantile", "0.3", "--output_dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "oar_quantile=0.3 is an option of oar_g, oar_p" in err and "set token_weighting to oar_g or oar_p" in err
    assert not any(tmp_path.iterdir())  # nothing written


def test_an_option_of_the_chosen_method_is_accepted_and_recorded(tmp_path):
    cfg = build_config({"token_weighting": "oar_p", "oar_quantile": 0.3, "output_dir": str(tmp_path)})
    assert cfg.weighting_options().oar_quantile == 0.3 and cfg.weighting_options().oar_scope == "reasoning"
    grail = build_config({"token_weighting": "grail", "output_dir": str(tmp_path)})
    assert grail.to_dict()["oar_scope"] is None  # a field GRAIL does not read is not recorded with OAR's value


def test_a_config_resolves_its_method_once(tmp_path, monkeypatch):
    """CLI flags → config: the table is looked up once, the method's own options parsed once, the WeightingOptions
    built once (before: 1 lookup + 1 in the trainer, 2 parses, 3 builds); the trainer takes them from the config.
    Nothing is written back onto the config's fields, and they cannot change afterwards: no staleness check."""
    from grail.options.choices import WeightingOptions

    calls = {"lookup": 0, "resolve": 0, "parse": 0, "built": 0}
    real_lookup, real_resolve, real_parse = table.method_spec, Spec.resolve_options, MethodOption.parse
    real_built = WeightingOptions.__post_init__
    monkeypatch.setattr(WeightingOptions, "__post_init__",
                        lambda self: calls.__setitem__("built", calls["built"] + 1) or real_built(self))
    monkeypatch.setattr("grail.training.config.method_spec",
                        lambda name: calls.__setitem__("lookup", calls["lookup"] + 1) or real_lookup(name))
    monkeypatch.setattr(Spec, "resolve_options", lambda self, given: calls.__setitem__(
        "resolve", calls["resolve"] + 1) or real_resolve(self, given))
    monkeypatch.setattr(MethodOption, "parse",
                        lambda self, value: calls.__setitem__("parse", calls["parse"] + 1) or real_parse(self, value))
    cfg = build_config(merge(None, parse_flags(["--token_weighting", "ktae", "--ktae_top", "0.5",
                                                "--output_dir", str(tmp_path)])))
    assert calls == {"lookup": 1, "resolve": 1, "parse": 1, "built": 1}
    assert cfg.method is cfg.method and cfg.method.name == "ktae"
    assert cfg.weighting_options() is cfg.weighting_options()
    assert cfg.weighting_options().method_options["ktae_top"] == 0.5 == cfg.to_dict()["method_options"]["ktae_top"]
    assert cfg.resolved == (cfg.method, cfg.weighting_options())
    with pytest.raises(AttributeError, match="weight_std=2.0: the token-weighting options were resolved"):
        cfg.weight_std = 2.0


def test_the_trainer_takes_the_method_from_the_config(tiny_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(table, "method_spec", lambda name: pytest.fail("the trainer looked the method up again"))
    trainer = make_trainer(GRAILTrainer, tiny_dir, tmp_path, token_weighting="grail")
    assert trainer.method is trainer.args.method and trainer.method.name == "grail"
    assert trainer.weighting is trainer.args.weighting_options()


# ---- weights/seconds on the fused path -------------------------------------------------------------------------------

PIPELINE_SECONDS = 0.3


def _slow_pipeline(spec, signal_BT, adv_B, spans, mask_BT, rows_B, options, generator, min_importance):
    time.sleep(PIPELINE_SECONDS)
    return builtin.saliency_pipeline(spec, signal_BT, adv_B, spans, mask_BT, rows_B, options, generator,
                                     min_importance)


def test_fused_weights_seconds_count_the_pipeline_once(tiny_dir, tmp_path):
    """The pipeline sleeps 0.3 s: the fused path's `weights/seconds` must be about that, not twice it (before the fix,
    the trainer added the whole span, which already held `token_weights`' own timing)."""
    spec = MethodSpec("slow_entropy", "slow", builtin.entropy_probe, _slow_pipeline, rows="saliency",
                      fuse="entropy", reads=builtin.SALIENCY_READS + ("saliency_path",), preserves_mass=False)
    register_method(spec)
    try:
        trainer = make_trainer(GRAILTrainer, tiny_dir, tmp_path, token_weighting="slow_entropy",
                               rollout_symmetry="both")
        loss_and_grads(trainer, trl_batch(trainer.processing_class))
    finally:
        unregister_method("slow_entropy")
    weights: TokenWeights = trainer.last_token_weights
    assert weights.path == "fused"
    assert PIPELINE_SECONDS <= weights.seconds < 1.8 * PIPELINE_SECONDS
    assert trainer._metrics["train"]["weights/seconds"] == [weights.seconds]


# ---- the position-only null (a model-free plug-in of grail-rl's own) ------------------------------------------------

def test_the_position_null_rises_towards_the_box_and_ignores_the_model():
    from grail.methods.controls.position import position_signal

    reasoning_BT = torch.tensor([[True, True, True, True, False, False], [True, True, False, False, False, False]])
    mask_BT = torch.tensor([[True] * 6, [True, True, True, False, False, False]])
    # row 0: R = 4 reasoning tokens → 1/4, 2/4, 3/4, 4/4, then the box's tokens 1; row 1: 1/2, 2/2, box 1, padding 0
    expected = torch.tensor([[0.25, 0.5, 0.75, 1.0, 1.0, 1.0], [0.5, 1.0, 1.0, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(position_signal(reasoning_BT, mask_BT), expected)
    # from the start: 4/4, 3/4, 2/4, 1/4, and the box takes the value next to it (1/4); squared with power 2
    start = position_signal(reasoning_BT, mask_BT, direction="from_start", power=2.0)
    torch.testing.assert_close(start[0], torch.tensor([1.0, 0.5625, 0.25, 0.0625, 0.0625, 0.0625]))
    assert table.METHODS["position"].calls_model is False and table.METHODS.source["position"] == "grail-rl"


# ---- a method written from docs/guides/plugins.md alone ------------------------------------------------------------

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guides" / "plugins.md"


def _guide_specs() -> dict[str, MethodSpec]:
    """Each complete `# grail_<name>.py` code block of the guide, run as a module of its own: its SPEC."""
    blocks = re.findall(r"```python\n(# grail_\w+\.py\n.*?)```", GUIDE.read_text(), flags=re.DOTALL)
    specs = {}
    for code in blocks:
        namespace: dict = {"__name__": code.split("\n", 1)[0][2:-3]}
        exec(compile(code, str(GUIDE), "exec"), namespace)
        specs[namespace["SPEC"].name] = namespace["SPEC"]
    return specs


def test_the_guide_shows_a_probed_and_a_model_free_method():
    specs = _guide_specs()
    assert sorted(spec.calls_model for spec in specs.values()) == [False, True], specs


@pytest.mark.parametrize("name", ["surprisal", "position_decay"])
def test_a_method_written_from_the_guide_passes_the_checker_and_trains(name, tmp_path, warm_cache):
    from conftest import WARM_STEPS

    spec = _guide_specs()[name]
    assert check_method(spec).ok
    cache, _ = warm_cache
    register_method(spec, replace=True)
    try:
        out = tmp_path / "run"
        assert main(["train", "--preset", "tiny-cpu", "--token_weighting", name, "--max_steps", "2",
                     "--warmstart_steps", str(WARM_STEPS), "--cache_dir", str(cache), "--output_dir", str(out),
                     "--report_to", "none"]) == 0
    finally:
        unregister_method(name)
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert any("weights/mean" in line for line in lines) and (out / "final" / "config.json").is_file()


def test_a_shared_option_goes_to_the_arms_that_read_it_and_one_no_arm_reads_is_refused(tmp_path, capsys):
    from grail.analysis.compare.plan import make_plan, parse_arms
    from grail.analysis.compare.run import run_values

    plan = make_plan(parse_arms("none,grail"), 1, {"weight_std": 1.0}, tmp_path)
    none, grail = (run_values(plan, arm, 0, tmp_path) for arm in plan["arms"])
    assert "weight_std" not in none and grail["weight_std"] == 1.0
    with pytest.raises(ValueError, match="--oar_beta is read by none of the arms' methods"):
        make_plan(parse_arms("none,grail"), 1, {"oar_beta": 1.5}, tmp_path)
    assert main(["demo", "--method", "none,grail", "--oar_quantile", "0.3", "--output_dir", str(tmp_path / "d")]) == 2
    assert "--oar_quantile is read by none of the demo's methods" in capsys.readouterr().err


def test_a_specs_rounding_floor_is_its_min_importance_or_zero():
    """`MethodSpec.rounding_floor`, the one place the pipelines' `min_importance` comes from: OAR-P's by the model's
    dtype or its option, 0.0 for a method without one."""
    from grail.options.choices import WeightingOptions

    bf16 = torch.nn.Linear(2, 2).to(torch.bfloat16)
    oar_p, grail_spec = table.METHODS["oar_p"], table.METHODS["grail"]
    assert oar_p.rounding_floor(bf16, WeightingOptions(token_weighting="oar_p")) == builtin.OAR_P_FLOOR[16]
    assert oar_p.rounding_floor(None, WeightingOptions(token_weighting="oar_p", oar_min_importance=0.25)) == 0.25
    assert grail_spec.rounding_floor(bf16, WeightingOptions(token_weighting="grail")) == 0.0
