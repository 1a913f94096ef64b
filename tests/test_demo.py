"""grail.training.demo's evaluation through the harness, without training: prompts as training renders them, greedy
decoding, the grader on the synthetic task's answers, the harness's files and figures, fresh directories.

The demo's training (and its table after real runs) is tested end to end in test_cli.py."""

import copy
import json

import pytest
import torch

from grail.evaluation.harness import read_samples
from grail.evaluation.scores import Estimate
from grail.options.presets import TINY_CPU
from grail.options.prompts import PAPER_PROMPT_SUFFIX
from grail.options.sampling import HFSampler, SamplingParams
from grail.training import demo, heldout
from grail.training.overrides import build_config, merge
from grail.training.run import TrainResult


def _config(tmp_path, **values):
    """The demo's config (tiny-cpu) on 6 held-out problems and 4 new tokens: seconds, not minutes."""
    values = {**merge(None, {}, base=TINY_CPU), "output_dir": str(tmp_path / "demo"), "task_num_heldout": 6,
              "max_completion_length": 4, **values}
    return build_config(values), values


@pytest.fixture
def untrained_demo(monkeypatch, tiny_dir):
    """run_demo with the untrained tiny model as the start and as every method's "trained" model, and every
    prompt the sampler is given recorded in `prompts`."""
    prompts, trained = [], []

    class SpySampler(HFSampler):
        def generate(self, batch, params, seed):
            prompts.extend(batch)
            return super().generate(batch, params, seed)

    def fake_train(cfg, overrides, log, model_path):
        trained.append(cfg.token_weighting)
        return TrainResult(cfg.output_dir, tiny_dir, steps=0, train_seconds=0.0, seconds_per_step=0.0)

    monkeypatch.setattr(heldout, "HFSampler", SpySampler)  # the held-out evaluations of grail.training.heldout
    monkeypatch.setattr(demo, "resolve_model_path", lambda cfg, log: str(tiny_dir))
    monkeypatch.setattr(demo, "train", fake_train)
    return prompts, trained


@pytest.mark.parametrize("conversational", [False, True])
def test_the_demo_evaluates_the_prompts_training_reads(tmp_path, untrained_demo, tokenizer, conversational):
    """prompt_suffix (and conversational) apply to the demo's evaluation as to training: the text the sampler
    gets for each held-out problem is what training makes of that problem (grail.training.data on a file of the held-out
    rows; chat prompts rendered as TRL renders them)."""
    from grail.training.data import load_train_dataset

    prompts, _ = untrained_demo
    cfg, values = _config(tmp_path, prompt_suffix="paper", conversational=conversational)
    heldout = cfg.synthetic_set().rows("heldout")
    rows_file = tmp_path / "heldout.jsonl"
    rows_file.write_text("".join(json.dumps(r) + "\n" for r in heldout))
    as_training = copy.copy(cfg)
    as_training.dataset = str(rows_file)
    training_prompts = load_train_dataset(as_training)["prompt"]
    if conversational:
        assert training_prompts[0][-1]["content"] == heldout[0]["prompt"] + PAPER_PROMPT_SUFFIX
        expected = [tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False)
                    for p in training_prompts]
    else:
        expected = [r["prompt"] + PAPER_PROMPT_SUFFIX for r in heldout]
        assert training_prompts == expected

    demo.run_demo(cfg, values, log=lambda s: None, methods=("none",))
    # before and after training, greedy then sampled: the held-out problems in order each time
    assert prompts == expected * 4


def test_the_demo_scores_are_the_harness_results(tmp_path, untrained_demo):
    """Every evaluation writes the harness's directory; the scores the demo compares are results.json's; the
    same model evaluated twice with the same seeds differs by exactly 0."""
    _, trained = untrained_demo
    cfg, values = _config(tmp_path)
    lines = []
    summary = demo.run_demo(cfg, values, log=lines.append, methods=("none", "grail"))
    assert trained == ["none", "grail"]
    out = tmp_path / "demo"
    dirs = {"before": out / "eval" / "before", "none": out / "none" / "eval", "grail": out / "grail" / "eval"}
    for who, directory in dirs.items():
        scores = summary["before"] if who == "before" else summary["runs"][who]["after"]
        for name, n, temperature in (("greedy", 1, 0.0), ("sampled", 4, cfg.temperature)):
            results = json.loads((directory / name / "results.json").read_text())
            (bench,) = results["benchmarks"]
            assert (bench["name"], bench["num_problems"], bench["n"]) == ("synthetic", 6, n)
            assert results["spec"]["sampling"]["temperature"] == temperature
            assert results["spec"]["sampling"]["max_new_tokens"] == 4 and results["spec"]["seed"] == cfg.seed
            assert results["scoring"]["name"] == "grail"  # the grader, not the training reward
            score = scores[name]
            assert score.acc_at_n == Estimate(**bench["acc_at_n"])
            records = read_samples(directory / name / "samples.jsonl")
            correct_P = [sum(records["synthetic", str(p), j]["correct"] for j in range(n)) for p in range(6)]
            assert score.per_problem_acc == tuple(c / n for c in correct_P)
    assert summary["problems"] == 6
    assert summary["runs"]["grail"]["after"]["sampled"] == summary["runs"]["none"]["after"]["sampled"]
    assert summary["differences"] == {"grail": Estimate(0.0, 0.0, 0.0)}
    table = lines[-1]
    assert "GRAIL − GRPO, sampled acc: +0.0 points (95% CI +0.0 to +0.0" in table
    assert "held-out problems" in table and "sampled acc@4 (T=1)" in table


def test_the_demo_refuses_a_directory_with_an_earlier_evaluation(tmp_path, untrained_demo):
    """The harness resumes what a directory holds: a second demo into it would score the first one's samples."""
    _, trained = untrained_demo
    cfg, values = _config(tmp_path)
    (tmp_path / "demo" / "grail" / "eval" / "sampled").mkdir(parents=True)
    with pytest.raises(ValueError, match="grail/eval/sampled holds an earlier demo's evaluation; choose a new"):
        demo.run_demo(cfg, values, log=lambda s: None, methods=("none", "grail"))
    assert trained == []  # refused before any training


def test_greedy_sampling_is_argmax_decoding(tokenizer):
    """SamplingParams accepts temperature 0 (with n=1) and HFSampler then decodes greedily: the argmax token at
    every step (a loop reference here), whatever the seed."""
    from grail.models.tiny import build_tiny_model

    model = build_tiny_model(tokenizer, seed=3)
    model.generation_config.min_new_tokens = 8  # no early end token: all 8 steps are compared
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=8)
    sampler = HFSampler(model, tokenizer, batch_size=1)
    for prompt in ("Q: 7+5*3\nA:", "Q: 12-4\nA:"):
        ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            for _ in range(8):
                logits_V = model(ids).logits[0, -1]
                ids = torch.cat([ids, logits_V.argmax().reshape(1, 1)], dim=1)
        reference = tokenizer.decode(ids[0, -8:], skip_special_tokens=True)
        (first,), (second,) = (sampler.generate([prompt], params, seed=s)[0] for s in (0, 1))
        assert first.text == second.text == reference
    with pytest.raises(ValueError, match="greedy decoding"):
        SamplingParams(n=4, temperature=0.0)


def test_the_grader_grades_the_synthetic_answers_like_the_training_reward():
    """The demo's accuracy comes from grail.evaluation.grader (math-verify), training's reward from exact_int_reward: on
    the task's own solutions both say correct, with the answer off by one both say wrong."""
    from grail.evaluation.grader import grade_many
    from grail.evaluation.rewards import exact_int_reward
    from grail.tasks.arithmetic import TaskConfig
    from grail.tasks.synthetic import SyntheticSet, generate

    examples = generate(SyntheticSet().task, 100, "heldout", seed=0)
    examples += generate(TaskConfig(num_steps=3, filler_rate=0.5), 50, "heldout", seed=1)
    right = [e.solution for e in examples]
    wrong = [e.solution.replace(f"\\boxed{{{e.answer}}}", f"\\boxed{{{int(e.answer) + 1}}}") for e in examples]
    answers = [e.answer for e in examples]
    for completions, verdict in ((right, True), (wrong, False)):
        graded = grade_many(completions, answers, workers=1)
        assert [g.correct for g in graded] == [verdict] * len(examples)
        assert exact_int_reward(completions, answer=answers) == [float(verdict)] * len(examples)
