"""perf/experiments/pilot_cost.py: a pilot's round lines to a step's cost, per probe pass (GRAIL-like) or per probed
row (OAR), absolute and scaled by how much slower the pilot ran than the run; checked on hand-written rounds."""

import pilot_cost
import pytest


def line(method, step, weights, probed):
    return f"round 1/2 {method}: {step} s, rollout 1.0 s, weights {weights} s, probed rows {probed}, peak +1.0 MB"


ROUNDS = [line("none", 20.0, 0.0, 0.0), line("none", 20.0, 0.0, 0.0),
          line("grail", 30.0, 10.0, 0.25), line("grail", 25.0, 0.0, 0.0),  # one pass, whatever the rows
          line("oar_p", 60.0, 40.0, 1.0), line("oar_p", 40.0, 20.0, 0.5)]  # 5 s a probed row of 8, both rounds


def test_each_method_costs_its_probes_at_the_runs_share_of_mixed_groups():
    out = pilot_cost.estimate(ROUNDS, run_step=80.0, mixed=0.5, micro_batches=8, rows=8)
    assert out["grpo_micro_batch_s"] == 20.0 and out["scale"] == pytest.approx(0.5)  # 80 / 8 / 20
    grail, oar_p = out["methods"]["grail"], out["methods"]["oar_p"]
    assert grail["rounds_probing"] == 1 and grail["absolute_ratio"] == pytest.approx((80 + 10 * 8 * 0.5) / 80)
    assert oar_p["absolute_ratio"] == pytest.approx((80 + 5 * 64 * 0.5) / 80)  # 5 s × 64 rows × half mixed
    assert oar_p["scaled_ratio"] == pytest.approx((80 + 5 * 64 * 0.5 * 0.5) / 80)
    assert out["methods"]["none"]["absolute_ratio"] == 1.0


def test_a_pilot_without_grpo_is_refused():
    with pytest.raises(SystemExit, match="must time GRPO"):
        pilot_cost.estimate(ROUNDS[2:], run_step=80.0, mixed=0.5, micro_batches=8, rows=8)


def test_the_probe_floor_is_not_measured_with_a_shared_prompt():
    """step_overhead.py with `--set shared_prompt=true` (the chain preset's, as the regime's runs train): the loss
    forward runs the leaf module twice, so the floor (one forward of whole rows) says it has none, before any work."""
    from types import SimpleNamespace

    import harness

    trainer = SimpleNamespace(args=SimpleNamespace(shared_prompt=True))  # nothing else is touched
    assert harness.input_only_backward(trainer, model=None, batch={}) is None
