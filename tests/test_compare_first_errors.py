"""The first-error tables of `grail compare`'s report (grail.analysis.compare.errors), from hand-written samples of a
chain-task comparison: each run's share of each class is what its samples were written to have, the start's row
is over problems, the paired difference is arm − reference per seed, and a comparison on another task has none."""

import json

import pytest

from grail.analysis.compare import plan as compare
from grail.analysis.compare.errors import first_error_summary
from grail.analysis.compare.report import write_report
from grail.analysis.compare.run import arm_config
from grail.analysis.compare.summary import (
    BEFORE_RL_FILE,
    FINAL_EVAL_DIR,
    RESULT_FILE,
    load_runs,
    load_start,
    run_path,
    start_eval_dir,
)
from grail.tasks.chain_errors import chain_steps

CHAINS = {"model_name_or_path": "smollm2-135m", "dataset": "synthetic", "task_style": "chains",
          "task_num_sft": 30, "task_num_train": 30, "task_num_heldout": 20}
PRIMARY = "sampled/synthetic/acc@4"
SLIPS = {"none": [4, 6, 8], "grail": [2, 6, 4]}  # per seed: how many of the 20 problems get an arithmetic slip
SETUPS = 3  # and how many more (after those) a setup error, in every run


def write_plan(out_dir, base: dict) -> dict:
    arms = compare.parse_arms("none,grail", [])
    plan = {"seeds": 3, "seed_fields": ["seed", "data_seed"], "base": base,
            "protocol": {"kind": "synthetic held-out", "primary": PRIMARY, "description": "hand-written"},
            "arms": [{"label": a.label, "slug": a.slug, "method": a.method, "fields": a.fields} for a in arms]}
    (out_dir / compare.PLAN_FILE).write_text(json.dumps(plan))
    return plan


def slip(solution: str) -> str:
    """The reference with its first step's result off by one (an arithmetic error)."""
    s = chain_steps(solution)[0]
    return solution.replace(f"= {s.result}", f"= {s.result + 1}", 1)


def misread(solution: str) -> str:
    """The reference with its first step's right number off by one (a setup error)."""
    s = chain_steps(solution)[0]
    return solution.replace(f"{s.op} {s.right} =", f"{s.op} {s.right + 1} =", 1)


def write_samples(path, examples, slips: int, setups: int, samples: int = 1) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, e in enumerate(examples):
        text = slip(e.solution) if i < slips else misread(e.solution) if i < slips + setups else e.solution
        rows += [{"benchmark": "synthetic", "problem_id": str(i), "sample_index": j, "completion": text,
                  "correct": i >= slips + setups} for j in range(samples)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture(scope="module")
def chains(tmp_path_factory):
    out = tmp_path_factory.mktemp("errors")
    plan = write_plan(out, CHAINS)
    examples = arm_config(plan, plan["arms"][0], out).synthetic_set().examples("heldout")
    for arm, per_seed in SLIPS.items():
        for seed, slips in enumerate(per_seed):
            run = run_path(out, arm, seed)
            write_samples(run / FINAL_EVAL_DIR / "greedy" / "samples.jsonl", examples, slips, SETUPS)
            (run / "metrics.jsonl").write_text("")
            (run / RESULT_FILE).write_text(json.dumps({"metrics": {PRIMARY: 0.5}, "train_seconds": 1.0,
                                                       "seconds_per_step": 1.0, "eval_seconds": 1.0,
                                                       "evaluations": {"greedy": []}}))
    write_samples(start_eval_dir(out, "start-x") / "greedy" / "samples.jsonl", examples, 10, 0, samples=4)
    (out / BEFORE_RL_FILE).write_text(json.dumps({"version": 1, "arms": {"none": "start-x", "grail": "start-x"},
                                                  "starts": {"start-x": {"model_path": "m", "seed": 0, "metrics": {},
                                                                         "evaluations": {"greedy": []}}}}))
    return out, write_report(out, plan)


def test_each_run_shows_the_shares_its_samples_have(chains):
    _, summary = chains
    greedy = summary["first_errors"]["greedy"]["stats"]
    for arm, per_seed in SLIPS.items():
        assert greedy["arithmetic"]["per_arm"][arm]["values"] == pytest.approx([s / 20 for s in per_seed])
        assert greedy["setup"]["per_arm"][arm]["mean"] == pytest.approx(SETUPS / 20)
        assert greedy["none"]["per_arm"][arm]["values"] == pytest.approx([(17 - s) / 20 for s in per_seed])
    paired = greedy["arithmetic"]["paired"]["grail"]
    assert paired["reference"] == "none"
    differences = [(g - n) / 20 for g, n in zip(SLIPS["grail"], SLIPS["none"], strict=True)]
    assert paired["mean"] == pytest.approx(sum(differences) / 3) and paired["n"] == 3
    assert "sampled" not in summary["first_errors"]  # no sampled samples were written


def test_the_start_row_is_over_problems(chains):
    _, summary = chains
    before = summary["first_errors"]["greedy"]["before"]["starts"]["start-x"]
    assert before["arms"] == ["none", "grail"]
    assert before["over_problems"]["arithmetic"]["mean"] == pytest.approx(0.5)
    assert before["over_problems"]["arithmetic"]["n"] == 20  # problems, not samples


def test_the_report_has_the_section(chains):
    out, _ = chains
    text = (out / "report.md").read_text()
    assert "## First errors (chain task)" in text and "### First errors, greedy" in text
    assert "| before RL | – | 50.0 ± " in text


def test_another_task_has_no_first_errors(tmp_path):
    plan = write_plan(tmp_path, {"dataset": "synthetic"})
    start = load_start(tmp_path, ["none", "grail"])
    assert first_error_summary(plan, tmp_path, load_runs(tmp_path, plan, start), start) == {}


def test_each_arms_change_from_before_rl_is_paired_over_problems_and_over_seeds(chains):
    out, summary = chains
    change = summary["first_errors"]["greedy"]["change"]
    slipped = change["arithmetic"]["none"]  # the start slipped on problems 0-9, the runs on 0-3, 0-5 and 0-7
    assert slipped["before"] == pytest.approx(0.5) and slipped["seeds"] == [0, 1, 2]
    assert slipped["over_problems"]["mean"] == pytest.approx(6 / 20 - 0.5) and slipped["over_problems"]["n"] == 20
    assert slipped["over_seeds"]["values"] == pytest.approx([s / 20 - 0.5 for s in SLIPS["none"]])
    assert change["setup"]["grail"]["over_problems"]["mean"] == pytest.approx(SETUPS / 20)
    text = (out / "report.md").read_text()
    section = text.split("### First errors, greedy: change from before RL")[1].split("##")[0]
    assert "| none | arithmetic | 50.0 | 30.0 | -20.0 ± " in section
    assert "unparsed" not in section  # a class that never occurs gets no row
