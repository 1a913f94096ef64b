"""grail.analysis.saliency.rollout_labels and the script that samples chain rollouts for it
(perf/experiments/saliency_auroc.py): each token labelled by its role in the model's own arithmetic, skips counted,
group advantages, and a base model sampled after training's plain prompt."""

import pytest

from grail.analysis.saliency.rollout_labels import rollout_row, rollout_rows
from grail.analysis.saliency.token_labels import check_row


def _texts(row, key):
    return [row["solution"][a:b] for a, b in row[key]]


def _spans(row):
    return _texts(row, "critical_spans"), _texts(row, "filler_spans")


def test_a_correct_rollout_is_labelled_by_its_own_arithmetic():
    completion = ("Lily has 16 + 26 = 42 toy cars. Max has 42 + 49 = 91 toy cars. Tom has 91 - 14 = 77 toy cars. "
                  "\\boxed{77}")
    row = rollout_row("prompt", completion, group=3, answer="77")
    check_row(row, 0)
    critical, contrast = _spans(row)
    assert critical == ["+", "42", "+", "91", "-", "77"]  # operators and results, not operands or the box
    assert contrast == ["Lily", "has", "toy", "cars.", "Max", "has", "toy", "cars.", "Tom", "has", "toy", "cars."]
    assert row["arithmetic_ok"] and row["correct"] and row["group"] == 3


def test_wrong_arithmetic_is_labelled_as_written_and_flagged():
    # 91 - 14 is 77: the model wrote 87, and the role of "87" in ITS arithmetic is still the result
    row = rollout_row("p", "Lily has 16 + 26 = 42 toy cars. Tom has 42 * 2 + 3 = 87 toy cars. Let me check.\n"
                           "\\boxed{87} or \\boxed{88}", answer="87")
    critical, contrast = _spans(row)
    assert critical == ["+", "42", "*", "+", "87"]
    assert "Let" not in contrast and "check." not in contrast  # a sentence without an equation: unlabelled
    assert row["arithmetic_ok"] and not row["correct"]  # 42 * 2 + 3 = 87 holds; the LAST box (88) is graded
    wrong = rollout_row("p", "Tom has 91 - 14 = 87 toy cars. \\boxed{87}", answer="77")
    assert _spans(wrong)[0] == ["-", "87"] and not wrong["arithmetic_ok"] and not wrong["correct"]


def test_malformed_rollouts_are_skipped_and_counted():
    samples = [("p", "Lily has 16 + 26 = 42 toy cars. Max has", 0),          # truncated: no box
               ("p", "Lily has 16 + 26 = 42 toy cars. \\boxed{42", 0),       # an unclosed box
               ("p", "I think the answer is 42. \\boxed{42}", 0),            # no equation
               ("p", "16 + 26 = 42 \\boxed{42}", 1),                         # an equation, no format word
               ("p", "", 1),
               ("p", "Max has 5 + 3 = 8 cars. \\boxed{8}", 1)]
    rows, skipped = rollout_rows(samples)
    assert [r["group"] for r in rows] == [1] and _spans(rows[0])[0] == ["+", "8"]
    assert skipped == {"no box": 3, "no equation": 1, "no format word": 1}
    assert "group" not in rollout_row("p", "Max has 5 + 3 = 8 cars. \\boxed{8}")  # no group given, none kept


def test_the_script_labels_sampled_chain_rollouts_with_their_group_advantage(tokenizer, monkeypatch):
    import saliency_auroc  # perf/experiments

    import grail.analysis.explain.compute as compute
    from grail.tasks.chains import ChainSet

    problems = ChainSet(num_train=2, seed=0).rows("train")[:2]
    answers = [p["answer"] for p in problems]

    def fake_samples(model, tok, prompt, params, seed):  # per prompt: right, wrong, truncated
        answer = answers[seed]
        texts = [f"Mia has 1 + 2 = 3 cars. \\boxed{{{answer}}}", "Mia has 1 + 2 = 4 cars. \\boxed{0}", "Mia has 1"]
        return [tok(t, add_special_tokens=False)["input_ids"] for t in texts][:params.n]

    monkeypatch.setattr(compute, "sample_completions", fake_samples)
    rows, skipped = saliency_auroc.chain_rollout_rows(None, tokenizer, prompts=2, samples=3, seed=0, max_new_tokens=8)
    assert skipped == {"no box": 2} and [r["group"] for r in rows] == [0, 0, 1, 1]
    assert [r["correct"] for r in rows] == [True, False] * 2 and [r["arithmetic_ok"] for r in rows] == [True, False] * 2
    assert [r["advantage"] for r in rows] == pytest.approx([2 / 3, -1 / 3] * 2)  # reward minus the prompt's mean
    assert rows[0]["prompt"] == problems[0]["prompt"]


def test_a_base_model_samples_after_trainings_plain_prompt_and_its_rows_drop_the_leading_space(tokenizer,
                                                                                                monkeypatch):
    """Without a chat template the sampler gets training's prompt ("... Answer:", no trailing space) and the rows'
    solutions lose the completion's leading space, which the scored prompt (`render_messages`) holds."""
    import copy

    import saliency_auroc  # perf/experiments

    import grail.analysis.explain.compute as compute
    from grail.analysis.saliency.quality import render_messages
    from grail.tasks.chains import ChainSet

    base = copy.deepcopy(tokenizer)
    base.chat_template = None
    answer = ChainSet(num_train=1, seed=0).rows("train")[0]["answer"]
    seen = []

    def fake_samples(model, tok, prompt, params, seed):
        seen.append(prompt)
        return [tok(f" Mia has 1 + 2 = 3 cars. \\boxed{{{answer}}}", add_special_tokens=False)["input_ids"]]

    monkeypatch.setattr(compute, "sample_completions", fake_samples)
    rows, _ = saliency_auroc.chain_rollout_rows(None, base, prompts=1, samples=1, seed=0, max_new_tokens=8)
    assert seen[0].endswith("Answer:") and render_messages(base, rows[0]["prompt"]) == seen[0] + " "
    assert rows[0]["solution"].startswith("Mia has") and rows[0]["correct"]
