"""`grail compare`: arms × seeds from one warm start, every run evaluated the same way, with a report over seeds whose
numbers are recomputed here from the runs' own files; a resume redoes only what is missing (kills, worker processes
and dropped checkpoints: tests/test_compare_restarts.py).

One 2-arm × 2-seed comparison (2 steps per run, 8 held-out problems) is shared by the module; tests that change a
comparison's files work on a copy. Bad arguments: tests/test_compare_arguments.py."""

import json
import math
import shutil
import statistics
from pathlib import Path

import pytest

from comparing import compare_argv as _argv
from grail.analysis.compare import plan as compare
from grail.analysis.compare import run as compare_run
from grail.analysis.compare.stats import bootstrap_interval, sign_flip_p
from grail.analysis.compare.summary import RESULT_FILE
from grail.cli import main


def _result(out, slug, seed):
    return json.loads((out / "runs" / slug / f"seed{seed}" / RESULT_FILE).read_text())


@pytest.fixture(scope="module")
def comparison(tmp_path_factory, warm_cache):
    """(output_dir, cache) of a finished 2 × 2 comparison, run in process (jobs=1)."""
    cache, _ = warm_cache
    out = tmp_path_factory.mktemp("compare") / "cmp"
    assert main(_argv(cache, out)) == 0
    return out, cache


def _t975_df1() -> float:
    return math.tan(math.pi * (0.975 - 0.5))  # Student t with 1 degree of freedom is the Cauchy distribution


def test_the_report_is_the_t_interval_of_the_runs_results(comparison):
    out, _ = comparison
    plan = json.loads((out / "compare.json").read_text())
    report = json.loads((out / "report.json").read_text())
    assert [a["label"] for a in plan["arms"]] == report["arms"] == ["none", "grail@saliency_leaf=middle"]
    widths = []
    for metric, stats in report["metrics"].items():
        per_seed = {a["label"]: [_result(out, a["slug"], s)["metrics"][metric] for s in range(2)] for a in plan["arms"]}
        for arm, (x0, x1) in per_seed.items():
            mean, sd = (x0 + x1) / 2, abs(x0 - x1) / math.sqrt(2)
            got = stats["per_arm"][arm]
            assert got["n"] == 2 and got["mean"] == pytest.approx(mean)
            assert got["half_width"] == pytest.approx(_t975_df1() * sd / math.sqrt(2), abs=1e-9)
            assert got["low"] == pytest.approx(mean - got["half_width"])
            widths.append(got["half_width"])
        base, other = per_seed["none"], per_seed["grail@saliency_leaf=middle"]
        diffs = [o - b for b, o in zip(base, other, strict=True)]
        paired = stats["paired"]["grail@saliency_leaf=middle"]
        assert paired["values"] == pytest.approx(diffs) and paired["mean"] == pytest.approx(sum(diffs) / 2)
        assert paired["half_width"] == pytest.approx(_t975_df1() * abs(diffs[0] - diffs[1]) / 2, abs=1e-9)
    assert max(widths) > 0  # the seeds differ, so the intervals are not degenerate
    # each run's figures are its harness evaluation's, with the per-problem results that pair arms by problem
    run = _result(out, "none", 1)
    harness = json.loads((out / "runs/none/seed1/eval/final/sampled/results.json").read_text())
    assert run["metrics"]["sampled/synthetic/acc@4"] == harness["benchmarks"][0]["acc_at_n"]["value"]
    (sampled,) = run["evaluations"]["sampled"]
    assert len(sampled["problem_ids"]) == len(sampled["per_problem_acc"]) == 8
    assert statistics.fmean(sampled["per_problem_acc"]) == pytest.approx(run["metrics"]["sampled/synthetic/acc@4"])
    assert report["primary_metric"] == "sampled/synthetic/acc@4"
    assert set(report["weights"]["weights/ess_ratio"]) == set(report["arms"])
    assert report["weights"]["weights/ess_ratio"]["none"]["mean"] == pytest.approx(1.0)  # GRPO: uniform weights
    for name in report["plots"]:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert set(report["plots"]) == {"accuracy.png", "differences.png", "learning_curves.png", "weights.png",
                                    "auroc_training.png"}
    assert report["sweep"] is None and set(report["reference"].values()) == {"none"}
    text = (out / "report.md").read_text()
    assert "t-interval" in text and "Seeds needed" in text and "grail@saliency_leaf=middle" in text


def test_each_run_reports_the_saliency_auroc_of_its_final_model_and_of_the_warm_start(comparison, warm_cache):
    """extra_metrics.json holds grail.analysis.compare.auroc's figures, which recomputing on the final model reproduces;
    the warm start's are in auroc_warmstart.json and in report.md."""
    from grail.analysis.compare.auroc import AurocPlan, run_auroc
    from grail.methods.table import method_names
    from grail.training.overrides import build_config

    out, _ = comparison
    _, warm_start_dir = warm_cache
    plan = json.loads((out / "compare.json").read_text())
    assert plan["auroc_rows"] == 8
    for arm in plan["arms"]:
        for seed in range(2):
            extra = json.loads((out / "runs" / arm["slug"] / f"seed{seed}" / "extra_metrics.json").read_text())
            assert {f"auroc/{m}/signal" for m in method_names(auroc=True)} <= set(extra)
            assert all(0.0 <= v <= 1.0 for k, v in extra.items() if k.startswith("auroc/"))
            assert extra["logp/critical"] < 0 and extra["logp/contrast"] < 0  # mean log-probabilities
    run_dir = out / "runs" / "grail_saliency_leaf_middle" / "seed0"
    if not run_dir.is_dir():
        run_dir = next(p / "seed0" for p in (out / "runs").iterdir() if p.name != "none")
    cfg = build_config(compare.run_values(plan, plan["arms"][1], 0, out))
    assert run_auroc(run_dir / "final", cfg, AurocPlan(8)) == json.loads((run_dir / "extra_metrics.json").read_text())
    warm = json.loads((out / "auroc_warmstart.json").read_text())
    assert set(warm) == {a["label"] for a in plan["arms"]}  # one entry per arm, with that arm's weighting options
    assert warm["grail@saliency_leaf=middle"] == run_auroc(warm_start_dir, cfg, AurocPlan(8))
    assert warm["none"]["auroc/entropy/signal"] == warm["grail@saliency_leaf=middle"]["auroc/entropy/signal"]
    assert set(warm["none"]) >= {f"auroc/{m}/weights" for m in method_names(auroc=True)}
    text = (out / "report.md").read_text()
    assert "At the start (step 0, before RL), under each arm's own task and weighting settings: none: " in text
    first = sorted(method_names(auroc=True))[0]  # the AUROCs are listed by name
    assert f"; grail@saliency_leaf=middle: {first}/signal" in text
    assert "`logp/<critical|contrast>`" in text and "`signal_fixed`" not in text  # the task's rows: no fixed AUROC


def test_each_checkpoint_gets_the_saliency_auroc_and_the_report_follows_it_over_training(comparison, tmp_path):
    """auroc_checkpoints.json holds run_auroc of every checkpoint (recomputed here); report.json's AUROC-over-training
    curve is step 0 = the warm start, then the checkpoints' mean over seeds. A run finished without the file (an
    earlier grail-rl) gets it on the next rerun, and nothing else is redone."""
    from grail.analysis.compare.auroc import AurocPlan, run_auroc
    from grail.training.overrides import build_config

    source, cache = comparison
    plan = json.loads((source / "compare.json").read_text())
    arm = plan["arms"][1]
    run_dir = source / "runs" / arm["slug"] / "seed1"
    steps = json.loads((run_dir / "auroc_checkpoints.json").read_text())
    assert list(steps) == ["1", "2"]  # --save_steps 1, --max_steps 2
    cfg = build_config(compare.run_values(plan, arm, 1, source))
    assert steps["1"] == run_auroc(run_dir / "checkpoint-1", cfg, AurocPlan(8))
    report = json.loads((source / "report.json").read_text())
    warm = json.loads((source / "auroc_warmstart.json").read_text())
    curve = report["auroc_training"]["auroc/grail/signal"][arm["label"]]
    assert list(curve) == ["0", "1", "2"]
    assert curve["0"]["mean"] == pytest.approx(warm[arm["label"]]["auroc/grail/signal"])
    per_seed = [json.loads((source / "runs" / arm["slug"] / f"seed{s}" / "auroc_checkpoints.json").read_text())
                ["2"]["auroc/grail/signal"] for s in range(2)]
    assert curve["2"]["mean"] == pytest.approx(sum(per_seed) / 2) and curve["2"]["n"] == 2
    assert "Saliency AUROC over training" in (source / "report.md").read_text()

    out = tmp_path / "cmp"
    shutil.copytree(source, out)
    copied = out / "runs" / arm["slug"] / "seed1"
    (copied / "auroc_checkpoints.json").unlink()
    marker = (copied / RESULT_FILE).stat().st_mtime_ns
    assert main(_argv(cache, out)) == 0
    assert json.loads((copied / "auroc_checkpoints.json").read_text()) == steps
    assert (copied / RESULT_FILE).stat().st_mtime_ns == marker  # the run itself is not redone


def test_each_run_says_where_its_evaluation_time_went_and_the_report_sums_it_up(comparison):
    """eval_phase_seconds: each accuracy evaluation's sampling and grading as its harness timed it, the rest of the
    accuracy part, then the AUROC; the parts add up to eval_seconds, and the report's table is their mean over runs."""
    out, _ = comparison
    report = json.loads((out / "report.json").read_text())
    phases = report["timing"]["eval_phase_seconds"]
    assert list(phases) == ["greedy", "sampled", "loading and writing", "auroc and extra evaluations"]
    for arm in json.loads((out / "compare.json").read_text())["arms"]:
        runs = [_result(out, arm["slug"], s) for s in range(2)]
        for seed, run in enumerate(runs):
            parts = run["eval_phase_seconds"]
            assert all(v >= 0 for v in parts.values()) and parts["auroc and extra evaluations"] > 0
            assert sum(parts.values()) == pytest.approx(run["eval_seconds"], rel=1e-6)
            for name in ("greedy", "sampled"):
                harness = out / "runs" / arm["slug"] / f"seed{seed}" / "eval" / "final" / name / "results.json"
                assert parts[name] == json.loads(harness.read_text())["timing"]["seconds"]
        assert phases["sampled"][arm["label"]]["mean"] == pytest.approx(statistics.fmean(
            r["eval_phase_seconds"]["sampled"] for r in runs))
    assert "Where the evaluation's time went" in (out / "report.md").read_text()


def test_arms_of_one_seed_differ_only_in_the_arms_fields(comparison):
    out, _ = comparison

    def resolved(slug, seed):
        return json.loads((out / "runs" / slug / f"seed{seed}" / "resolved_config.json").read_text())

    def differing(a, b):
        return {k for k in a.keys() | b.keys() if a.get(k) != b.get(k)}

    for seed in range(2):
        none, grail = resolved("none", seed), resolved("grail@saliency_leaf=middle", seed)
        assert differing(none, grail) == {"token_weighting", "saliency_leaf", "output_dir"}
        assert none["seed"] == grail["seed"] == none["data_seed"] == seed
    assert differing(resolved("none", 0), resolved("none", 1)) == {"seed", "data_seed", "output_dir"}


def test_a_resumed_comparison_redoes_only_what_is_missing(comparison, tmp_path, monkeypatch):
    """A copy with four states: finished (kept), trained but not evaluated (evaluated only), half trained with a
    complete checkpoint (resumed from it), half trained without one (started over). An extra evaluation hook runs
    on the runs it evaluates; a hand-written extra_metrics.json is read as well."""
    source, cache = comparison
    out = tmp_path / "cmp"
    shutil.copytree(source, out)
    runs = out / "runs"
    kept, evaluate_only = runs / "none/seed0", runs / "grail@saliency_leaf=middle/seed0"
    resumed, restarted = runs / "none/seed1", runs / "grail@saliency_leaf=middle/seed1"
    (evaluate_only / RESULT_FILE).unlink()
    for run in (resumed, restarted):
        for name in (RESULT_FILE, "compare_trained.json"):
            (run / name).unlink()
        shutil.rmtree(run / "final")
    shutil.rmtree(resumed / "checkpoint-2")
    for checkpoint in restarted.glob("checkpoint-*"):
        (checkpoint / "grail_checkpoint_complete.json").unlink()  # as if the kill came during each save
    (kept / "extra_metrics.json").write_text(json.dumps({"probe/seed": 0.0}))
    untouched = [kept / RESULT_FILE, kept / "final/model.safetensors", evaluate_only / "final/model.safetensors",
                 evaluate_only / "checkpoint-2/model.safetensors"]
    before = {p: p.stat().st_mtime_ns for p in untouched}
    samples = (evaluate_only / "eval/final/sampled/samples.jsonl").read_text()
    monkeypatch.setattr(compare_run, "EXTRA_EVALUATIONS", [lambda final_dir, cfg, log: {"probe/seed": float(cfg.seed)}])

    assert main(_argv(cache, out)) == 0
    assert {p: p.stat().st_mtime_ns for p in untouched} == before
    assert (evaluate_only / "eval/final/sampled/samples.jsonl").read_text() == samples  # nothing sampled again
    assert all((run / RESULT_FILE).is_file() for run in (kept, evaluate_only, resumed, restarted))
    (resume,) = [json.loads(line) for line in (resumed / "resumed.jsonl").read_text().splitlines()]
    assert resume["step"] == 1 and _result(out, "none", 1)["resumed"] is True
    assert not (restarted / "resumed.jsonl").exists()
    assert _result(out, "grail@saliency_leaf=middle", 1)["resumed"] is False
    for run in (resumed, restarted):
        steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()
                 if "reward" in json.loads(line)]
        assert steps == [1, 2]  # no step twice, none missing
    report = json.loads((out / "report.json").read_text())
    probe = report["extra_metrics"]["probe/seed"]
    assert probe["per_arm"]["none"]["values"] == [0.0, 1.0]  # the file of the kept run and the hook's value
    assert probe["per_arm"]["grail@saliency_leaf=middle"]["mean"] == pytest.approx(0.5)
    assert probe["paired"]["grail@saliency_leaf=middle"]["values"] == [0.0, 0.0]
    assert report["timing"]["train_seconds"]["none"]["n"] == 1  # the resumed run's clock is left out
    assert _result(out, "grail@saliency_leaf=middle", 0)["trained_earlier"] is True  # only evaluated here: left out
    assert _result(out, "grail@saliency_leaf=middle", 1)["trained_earlier"] is False
    assert report["timing"]["eval_seconds"]["grail@saliency_leaf=middle"]["n"] == 1
    # ... but its steps are counted: each step's time once, from metrics.jsonl as cut back on resume
    step_times = [json.loads(line)["step_time"] for line in (resumed / "metrics.jsonl").read_text().splitlines()
                  if "step_time" in json.loads(line)]
    assert len(step_times) == 2
    assert report["timing"]["step_seconds"]["none"]["n"] == 2
    assert sum(step_times) in report["timing"]["step_seconds"]["none"]["values"]
    total = report["timing"]["total"]
    assert total["runs"] == 4 and total["resumed"] == 2  # none/seed1 in training, grail's seed 0 in evaluation
    assert total["step_seconds"] == pytest.approx(sum(v for arm in report["timing"]["step_seconds"].values()
                                                      for v in arm["values"]))
    md = (out / "report.md").read_text()
    assert "2 of them resumed (in training or evaluation)" in md and "weights' share of step time (%)" in md
    shares = {arm: s["mean"] for arm, s in report["timing"]["weights_share"].items() if s["n"] == 2}  # every run
    assert 0 <= shares["none"] < shares["grail@saliency_leaf=middle"] < 1  # the weights' own timer ÷ step time


@pytest.mark.parametrize("change, named", [
    (["--seeds", "3"], "seeds"),
    (["--learning_rate", "2e-3"], "learning_rate"),
    (["--arms", "none,grail"], "arms"),
])
def test_a_rerun_with_other_arguments_is_refused(comparison, capsys, change, named):
    out, cache = comparison
    argv = _argv(cache, out)
    for flag, value in zip(change[::2], change[1::2], strict=True):
        argv[argv.index(flag) + 1] = value
    plan = (out / "compare.json").read_text()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert named in err and "--output_dir" in err and "same arguments" in err
    assert (out / "compare.json").read_text() == plan


def test_first_seed_moves_every_run_s_seed_and_a_rerun_or_resume_must_keep_it(comparison, capsys, tmp_path):
    from grail.analysis.compare.summary import plan_seeds
    from grail.options.presets import TINY_CPU

    plan = compare.make_plan(compare.parse_arms("none,grail", []), 2, dict(TINY_CPU), tmp_path / "pilot",
                             first_seed=100)
    assert list(plan_seeds(plan)) == [100, 101] and plan["first_seed"] == 100
    grail = plan["arms"][1]
    runs = [compare_run.run_values(plan, grail, seed, tmp_path / "pilot") for seed in plan_seeds(plan)]
    assert [(r["seed"], r["data_seed"]) for r in runs] == [(100, 100), (101, 101)]
    assert runs[0]["output_dir"].endswith("seed100")
    out, cache = comparison
    assert main(_argv(cache, out) + ["--first-seed", "7"]) == 2  # the stored comparison's seeds start at 0
    assert "first_seed" in capsys.readouterr().err
    assert main(["compare", "--resume", str(out), "--first-seed", "7"]) == 2
    assert "drop --first-seed" in capsys.readouterr().err


def test_auroc_set_is_recorded_checked_and_refused_where_it_would_compute_nothing(comparison, capsys, tmp_path):
    from grail.options.presets import TINY_CPU

    arms = compare.parse_arms("none,grail", [])
    plan = compare.make_plan(arms, 2, dict(TINY_CPU), tmp_path / "c", auroc_rows=8, auroc_set="natural_contrast")
    assert plan["auroc_set"] == "natural_contrast"
    assert "auroc_set" not in compare.make_plan(arms, 2, dict(TINY_CPU), tmp_path / "c", auroc_rows=8)  # the default
    with pytest.raises(ValueError, match="multi_step_filler, natural_contrast"):
        compare.make_plan(arms, 2, dict(TINY_CPU), tmp_path / "c", auroc_rows=8, auroc_set="filler")
    with pytest.raises(ValueError, match="--auroc-rows N"):
        compare.make_plan(arms, 2, dict(TINY_CPU), tmp_path / "c", auroc_rows=0, auroc_set="multi_step_filler")
    with pytest.raises(ValueError, match="oar_q"):  # not a method with a per-token signal
        compare.make_plan(arms, 2, dict(TINY_CPU), tmp_path / "c", auroc_rows=8, auroc_methods=["grail", "oar_q"])
    plan = compare.make_plan(arms, 2, dict(TINY_CPU), tmp_path / "c", auroc_rows=8, auroc_methods=["grail"])
    assert plan["auroc_methods"] == ["grail"]
    out, cache = comparison
    assert main(_argv(cache, out) + ["--auroc-set", "multi_step_filler"]) == 2  # the stored one used the task's rows
    assert "auroc_set" in capsys.readouterr().err
    assert main(["compare", "--resume", str(out), "--auroc-set", "multi_step_filler"]) == 2
    assert "drop --auroc-set" in capsys.readouterr().err
    assert main(_argv(cache, out) + ["--auroc-methods", "grail"]) == 2  # the stored one measured the default set
    assert "auroc_methods" in capsys.readouterr().err


def test_run_auroc_on_a_label_set_is_the_saliency_auroc_of_its_rows_pooled_and_position_matched(warm_cache):
    """A label set works for any run (here a non-synthetic dataset's config): its rows' AUROCs, the matched one
    included, exactly as grail.analysis.saliency.quality computes them, for the methods asked for and the run's own."""
    from grail.analysis.compare.auroc import AurocPlan, run_auroc
    from grail.analysis.saliency.label_sets import label_set_rows
    from grail.analysis.saliency.quality import SaliencyQualityOptions, model_dir_saliency_auroc
    from grail.training.overrides import build_config

    _, warm_dir = warm_cache
    cfg = build_config({"token_weighting": "random", "dataset": "openai/gsm8k", "output_dir": "unused"})
    assert run_auroc(warm_dir, cfg, AurocPlan(4)) == {}  # the task's rows need the synthetic task
    auroc = AurocPlan(4, "multi_step_filler", ("grail", "position"))
    got = run_auroc(warm_dir, cfg, auroc)
    assert set(got) == {f"auroc/{m}/{k}" for m in ("grail", "position", "random")
                        for k in ("signal", "weights", "signal_matched")} | {"logp/critical", "logp/contrast"}
    assert set(got) < auroc.names(cfg)  # the position-fixed kind needs a counterbalanced set
    expected = model_dir_saliency_auroc(warm_dir, label_set_rows("multi_step_filler", 4, 0), ["grail", "position"],
                                        SaliencyQualityOptions(weighting=cfg.weighting_options()))
    for method in ("grail", "position"):
        assert got[f"auroc/{method}/signal"] == expected[method]["signal"].auroc
        assert got[f"auroc/{method}/weights"] == expected[method]["weights"].auroc
        assert got[f"auroc/{method}/signal_matched"] == expected[method]["signal"].matched.auroc
    assert got["auroc/position/signal_matched"] == 0.5  # position alone separates nothing at a fixed distance
    for bad, named in ((AurocPlan(4, "bogus"), "natural_contrast"), (AurocPlan(4, methods=("none",)), "grail"),
                       (AurocPlan(0, "multi_step_filler"), "--auroc-rows N")):
        with pytest.raises(ValueError, match=named):
            run_auroc(warm_dir, cfg, bad)

def test_run_auroc_on_a_counterbalanced_set_adds_the_position_fixed_auroc_and_the_label_logprobs(warm_cache):
    """On a counterbalanced set (rows = groups) run_auroc adds `signal_fixed`, quality's position-fixed AUROC (0.5
    exactly for the position null), and the model's `logp/critical|contrast` as label_logprobs computes them."""
    from grail.analysis.compare.auroc import AurocPlan, default_rows, run_auroc
    from grail.analysis.saliency.counterbalanced import counterbalanced_filler_rows
    from grail.analysis.saliency.label_logprobs import label_logprobs
    from grail.analysis.saliency.quality import SaliencyQualityOptions, load_model_dir, saliency_auroc
    from grail.training.overrides import build_config

    _, warm_dir = warm_cache
    cfg = build_config({"token_weighting": "grail", "dataset": "openai/gsm8k", "output_dir": "unused"})
    auroc = AurocPlan(1, "counterbalanced_filler", ("grail", "position"))
    assert "1 group of the counterbalanced label set" in auroc.describe()
    assert "2 groups of" in AurocPlan(2, "counterbalanced_format").describe()
    assert [default_rows(name) for name in ("counterbalanced_filler", None, "multi_step_filler")] == [2, 64, 64]
    got = run_auroc(warm_dir, cfg, auroc)
    assert set(got) == auroc.names(cfg)
    rows = counterbalanced_filler_rows(1, 0)
    options = SaliencyQualityOptions(weighting=cfg.weighting_options())
    model, tokenizer = load_model_dir(warm_dir)
    expected = saliency_auroc(model, tokenizer, rows, ["grail", "position"], options)
    for method in ("grail", "position"):
        assert got[f"auroc/{method}/signal_fixed"] == expected[method]["signal"].fixed.auroc
        assert got[f"auroc/{method}/signal"] == expected[method]["signal"].auroc
    assert got["auroc/position/signal_fixed"] == 0.5
    assert got["auroc/grail/signal_fixed"] != 0.5
    logp = label_logprobs(model, tokenizer, rows, options)
    assert (got["logp/critical"], got["logp/contrast"]) == (logp.critical, logp.contrast)


def test_the_report_gives_the_paired_checks_without_normality(comparison):
    out, _ = comparison
    report = json.loads((out / "report.json").read_text())
    for stats in report["metrics"].values():
        paired = stats["paired"]["grail@saliency_leaf=middle"]
        assert paired["sign_flip_p"] == pytest.approx(sign_flip_p(paired["values"]))
        assert paired["bootstrap"] == pytest.approx(list(bootstrap_interval(paired["values"])))
        assert paired["holm_p"] == paired["sign_flip_p"]  # one arm compared: nothing to adjust
    text = (out / "report.md").read_text()
    assert "sign-flip permutation test" in text and "Holm" not in text  # the report shows it for several arms only


def test_the_report_names_the_code_that_trained_the_runs(comparison, tmp_path):
    """Each run's code.jsonl (one start each here) summed in report.json's `code` and report.md's Code section; a run
    without one (trained before grail-rl wrote it) is counted as such."""
    from grail.analysis.compare.report import write_report
    from grail.training.provenance import CODE_FILE, code_versions

    out, _ = comparison
    report = json.loads((out / "report.json").read_text())
    lines = [json.loads(x) for r in report["runs"] for x in (Path(r["run_dir"]) / CODE_FILE).read_text().splitlines()]
    code, now = report["code"], code_versions()
    assert code["runs"] == len(report["runs"]) == len(lines) == code["attempts"] == 4
    assert code["runs_without_record"] == 0 and [x["from_step"] for x in lines] == [0] * 4
    assert sum(code["commits"].values()) == 4
    assert all(key.startswith(now["commit"][:12]) for key in code["commits"]) if now["commit"] else code["commits"]
    assert code["versions"]["torch"] == [now["torch"]] and code["versions"]["trl"] == [now["trl"]]
    assert "## Code" in (out / "report.md").read_text()
    older = tmp_path / "cmp"
    shutil.copytree(out, older)
    (older / Path(report["runs"][0]["run_dir"]).relative_to(out) / CODE_FILE).unlink()
    again = write_report(older, json.loads((older / "compare.json").read_text()))
    assert again["code"]["runs_without_record"] == 1 and again["code"]["attempts"] == 3
    assert "1 finished run(s) trained before grail-rl wrote it" in (older / "report.md").read_text()
