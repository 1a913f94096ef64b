"""`grail compare`'s plan records each arm's configuration as its runs resolve it
(grail.analysis.compare.run.ArmConfig), and the comparison reads an arm there; a plan written before plans held the
record reads the same values, resolved when asked."""

import json

import pytest

from grail.analysis.compare.plan import PLAN_FILE, check_plan, make_plan, parse_arms
from grail.analysis.compare.run import arm_config, run_values
from grail.analysis.compare.start import describe_setting, start_groups
from grail.options.presets import TINY_CPU
from grail.training.overrides import build_config


@pytest.fixture
def plan(tmp_path):
    arms = parse_arms("none,oar_g@oar_variant=grail_release,ktae@ktae_top=0.5")
    return make_plan(arms, 2, {**TINY_CPU, "max_steps": 3}, tmp_path)


def _without_records(plan: dict) -> dict:
    """The plan as an earlier grail-rl wrote it."""
    return {**plan, "arms": [{k: v for k, v in arm.items() if k != "resolved"} for arm in plan["arms"]]}


def test_each_arm_records_what_its_runs_resolve_to(plan, tmp_path):
    none, oar_g, ktae = plan["arms"]
    assert oar_g["resolved"]["oar_quantile"] == 0.4 and oar_g["resolved"]["oar_scope"] == "completion"  # the variant
    assert ktae["resolved"]["method_options"] == {"ktae_alpha": 1.0, "ktae_beta_ig": 1.0, "ktae_tf": True,
                                                  "ktae_top": 0.5}  # parsed, with the defaults of the rest
    assert ktae["resolved"]["weights_from"] == "rollout_policy"  # the config value the method comes with
    assert none["resolved"]["max_steps"] == 3
    assert not {"seed", "data_seed", "output_dir"} & set(none["resolved"])  # what differs between an arm's runs
    json.dumps(plan)  # compare.json holds it as it is


def test_an_arm_read_from_the_plan_is_its_runs_config(plan, tmp_path):
    for arm in plan["arms"]:
        run = build_config(run_values(plan, arm, 1, tmp_path))
        cfg = arm_config(plan, arm, tmp_path)
        assert cfg.weighting_options() == run.weighting_options()
        assert (cfg.synthetic_set(), cfg.warm_start_config(), cfg.max_steps) == (
            run.synthetic_set(), run.warm_start_config(), run.max_steps)


def test_the_comparison_reads_the_record_without_building_a_config(plan, tmp_path, monkeypatch):
    monkeypatch.setattr("grail.analysis.compare.run.build_config", lambda values: pytest.fail("a config was built"))
    assert [labels for _, labels in start_groups(plan, tmp_path).values()] == [[a["label"] for a in plan["arms"]]]
    assert describe_setting(plan, tmp_path)["max_steps"] == 3


def test_a_plan_without_records_reads_the_same_values(plan, tmp_path):
    old = _without_records(plan)
    for arm, earlier in zip(plan["arms"], old["arms"], strict=True):
        assert arm_config(old, earlier, tmp_path) == arm_config(plan, arm, tmp_path)
    assert describe_setting(old, tmp_path) == describe_setting(plan, tmp_path)


def test_rerunning_the_arguments_of_an_earlier_plan_resumes_it(plan, tmp_path):
    (tmp_path / PLAN_FILE).write_text(json.dumps(_without_records(plan)))
    check_plan(plan, tmp_path)  # the same arguments: no record to compare, the same plan
    other = make_plan(parse_arms("none,grail"), 2, {**TINY_CPU, "max_steps": 3}, tmp_path)
    with pytest.raises(ValueError, match="holds a comparison with other arguments"):
        check_plan(other, tmp_path)
