"""A swept `grail compare` (`--sweep FIELD=v1,v2`): each arm is paired with the first arm at the same swept value,
and the report adds a table and sweep.png of the headline metric against the swept value. The report is built here
from hand-written run files (no training), so every number it shows is checked against values chosen by the test."""

import json

import pytest

from grail.analysis.compare import plan as compare
from grail.analysis.compare.report import write_report
from grail.analysis.compare.summary import RESULT_FILE, run_path
from grail.analysis.compare.sweep import layout

PRIMARY = "sampled/synthetic/acc@4"
RATES = ["0", "0.5"]
# accuracy per (arm of --arms, rate, seed): grail gains 0.1 at rate 0.5 and nothing at rate 0
ACC = {("none", "0"): [0.50, 0.60, 0.55], ("none", "0.5"): [0.40, 0.30, 0.35],
       ("grail", "0"): [0.52, 0.58, 0.55], ("grail", "0.5"): [0.52, 0.38, 0.45]}


SWEEP = f"task_filler_rate={','.join(RATES)}"


def _plan(sweeps=(SWEEP,), arms="none,grail", seeds=3):
    parsed = compare.parse_arms(arms, list(sweeps))
    return {"seeds": seeds, "seed_fields": ["seed", "data_seed"], "base": {},
            "sweeps": [dict(zip(("field", "values"), compare.parse_sweep(s), strict=True)) for s in sweeps],
            "protocol": {"kind": "synthetic held-out", "primary": PRIMARY, "description": "hand-written"},
            "arms": [{"label": a.label, "slug": a.slug, "method": a.method, "fields": a.fields} for a in parsed]}


def test_each_arm_is_paired_with_the_first_arm_at_the_same_swept_value():
    lay = layout(_plan())
    assert lay.baseline == {"none@task_filler_rate=0": "none@task_filler_rate=0",
                            "none@task_filler_rate=0.5": "none@task_filler_rate=0.5",
                            "grail@task_filler_rate=0": "none@task_filler_rate=0",
                            "grail@task_filler_rate=0.5": "none@task_filler_rate=0.5"}
    assert lay.field == "task_filler_rate" and lay.values == ("0", "0.5")
    assert lay.series == {"none": {"0": "none@task_filler_rate=0", "0.5": "none@task_filler_rate=0.5"},
                          "grail": {"0": "grail@task_filler_rate=0", "0.5": "grail@task_filler_rate=0.5"}}
    assert lay.paired == ["grail@task_filler_rate=0", "grail@task_filler_rate=0.5"]


def test_a_grid_puts_the_last_sweep_on_the_x_axis_and_pairs_within_each_cell():
    lay = layout(_plan(("beta=0,0.1", "task_filler_rate=0,0.5"), arms="none,grail@saliency_leaf=middle"))
    assert lay.field == "task_filler_rate"
    assert set(lay.series) == {"none@beta=0", "none@beta=0.1", "grail@saliency_leaf=middle@beta=0",
                               "grail@saliency_leaf=middle@beta=0.1"}
    assert (lay.baseline["grail@saliency_leaf=middle@beta=0.1@task_filler_rate=0.5"]
            == "none@beta=0.1@task_filler_rate=0.5")


def test_without_a_sweep_every_arm_is_paired_with_the_first():
    plan = _plan(sweeps=(), arms="none,grail,random")
    assert layout(plan).baseline == {"none": "none", "grail": "none", "random": "none"}
    del plan["sweeps"]  # a plan written before sweeps were recorded
    assert layout(plan).paired == ["grail", "random"]


def test_arms_that_do_not_match_the_recorded_sweep_are_refused():
    plan = _plan()
    plan["sweeps"][0]["values"] = ["0", "0.9"]
    with pytest.raises(ValueError, match="compare.json's arms and sweeps disagree"):
        layout(plan)


@pytest.fixture
def swept(tmp_path):
    plan = _plan()
    for arm in plan["arms"]:
        base, rate = arm["label"].split("@task_filler_rate=")
        for seed, acc in enumerate(ACC[(base, rate)]):
            run = run_path(tmp_path, arm["slug"], seed)
            run.mkdir(parents=True)
            (run / RESULT_FILE).write_text(json.dumps({"metrics": {PRIMARY: acc}, "train_seconds": 10.0,
                                                       "seconds_per_step": 0.5, "eval_seconds": 1.0}))
            (run / "extra_metrics.json").write_text(json.dumps({"auroc/grail/weights": 0.5 + float(rate) / 2}))
            (run / "metrics.jsonl").write_text("".join(json.dumps(  # 12 steps, 2 of them clipping half
                {"step": t, "reward": acc, "completions/clipped_ratio": 0.5 if t <= 2 else 0.1}) + "\n"
                for t in range(1, 13)))
            (run / "auroc_checkpoints.json").write_text(json.dumps({"2": {"auroc/grail/signal": 0.7}}))
    warm = {a["label"]: {"auroc/grail/signal": 0.6 if a["label"].endswith("=0") else 0.8} for a in plan["arms"]}
    (tmp_path / "auroc_warmstart.json").write_text(json.dumps(warm))
    return tmp_path, plan, write_report(tmp_path, plan)


def test_the_sweep_report_pairs_within_each_value_and_tabulates_against_it(swept):
    out, plan, report = swept
    paired = report["metrics"][PRIMARY]["paired"]
    assert set(paired) == {"grail@task_filler_rate=0", "grail@task_filler_rate=0.5"}
    high = paired["grail@task_filler_rate=0.5"]
    expected = [g - n for g, n in zip(ACC[("grail", "0.5")], ACC[("none", "0.5")], strict=True)]
    assert high["reference"] == "none@task_filler_rate=0.5" and high["values"] == pytest.approx(expected)
    assert high["mean"] == pytest.approx(0.10)
    assert paired["grail@task_filler_rate=0"]["mean"] == pytest.approx(0.0)
    assert report["sweep"] == {"field": "task_filler_rate", "values": RATES, "series": layout(plan).series}
    text = (out / "report.md").read_text()
    assert "## Sweep over task_filler_rate" in text
    row = next(line for line in text.splitlines() if line.startswith("| grail | +"))  # the paired table's row
    assert row.split(" | ")[1:] == ["+0.0 ± 5.0", "+10.0 ± 5.0 |"]  # t_{0.975,2} · 0.02 / √3 = 0.0497 at both
    assert "| none | 55.0 ± " in text  # the mean of 0.50, 0.60, 0.55 at rate 0
    assert "auroc/grail/weights of the final model" in text
    assert ("At the start (step 0, before RL), under each arm's own task and weighting settings: "
            "none@task_filler_rate=0, grail@task_filler_rate=0: grail/signal 0.600; ") in text
    # the tiny model is warm-started on each swept task: two starts, each named with its arms
    assert "the arms start from 2 different models" in text
    assert "**Model (arms none@task_filler_rate=0.5, grail@task_filler_rate=0.5)**: `tiny`" in text
    assert "filler rate 0.5)" in text
    curve = report["auroc_training"]["auroc/grail/signal"]["grail@task_filler_rate=0.5"]
    assert curve["0"]["mean"] == pytest.approx(0.8) and curve["2"]["mean"] == pytest.approx(0.7)
    for name in ("sweep.png", "auroc_training.png", "differences.png"):
        assert name in report["plots"] and (out / name).read_bytes()[:4] == b"\x89PNG"


def test_the_report_shows_how_many_completions_training_cut_off(swept):
    out, plan, report = swept
    clipped = report["completions"]
    arm = "grail@task_filler_rate=0.5"
    assert clipped["completions/clipped_ratio"][arm]["mean"] == pytest.approx((2 * 0.5 + 10 * 0.1) / 12)
    assert clipped["completions/clipped_ratio (last 10 steps)"][arm]["mean"] == pytest.approx(0.1)
    assert clipped["completions/mean_length"][arm]["mean"] is None  # not logged: left out, not zero
    assert "## Completions during training" in (out / "report.md").read_text()


def test_the_report_adjusts_the_sign_flip_p_over_the_arms_compared(swept):
    """Two arms paired with their references: rate 0.5's differences (+0.12, +0.08, +0.10) are all positive, p = 2/8;
    rate 0's (+0.02, −0.02, 0) sum to 0, p = 1. Holm: 0.25 · 2 = 0.5, then max(0.5, 1 · 1) = 1."""
    out, _, report = swept
    paired = report["metrics"][PRIMARY]["paired"]
    assert paired["grail@task_filler_rate=0.5"]["sign_flip_p"] == pytest.approx(0.25)
    assert paired["grail@task_filler_rate=0"]["sign_flip_p"] == pytest.approx(1.0)
    assert paired["grail@task_filler_rate=0.5"]["holm_p"] == pytest.approx(0.5)
    assert paired["grail@task_filler_rate=0"]["holm_p"] == pytest.approx(1.0)
    text = (out / "report.md").read_text()
    assert "p = 0.25 (Holm 0.5)" in text and "Holm's adjustment of each p over the 2 arms compared" in text


def test_the_report_gives_the_smallest_difference_its_seeds_detect_with_80_percent_power(swept):
    """Rate 0.5's differences (+0.12, +0.08, +0.10) have sd 2 points over 3 seeds: (t_{0.975,2} + t_{0.80,2}) · 2 / √3
    with the tabled t_{0.975,2} = 4.302653 and t_{0.80,2} = 1.060660."""
    out, _, report = swept
    expected = (4.302653 + 1.060660) * 2.0 / 3 ** 0.5
    got = report["resolution"]["grail@task_filler_rate=0.5"]["detectable_80pct_power_points"]
    assert got == pytest.approx(expected, rel=1e-5)
    assert f"| {expected:.2f} (S=3) |" in (out / "report.md").read_text()
