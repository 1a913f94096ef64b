"""grail.analysis.saliency.token_labels and grail.analysis.saliency.quality: labels from offsets, the AUROC against a
pairwise count, the CI, and the methods' AUROC on a toy task whose answer depends on one known token."""

import itertools
import json
import math
import random

import pytest
import torch
from torch.nn.functional import cross_entropy

from grail.analysis.saliency.quality import (
    SaliencyQualityOptions,
    as_json,
    checkpoints_saliency_auroc,
    saliency_auroc,
)
from grail.analysis.saliency.token_labels import (
    CRITICAL,
    FILLER,
    UNLABELLED,
    auroc_result,
    char_labels,
    check_row,
    corrupted_solution,
    pooled_auroc,
    saliency_row,
    synthetic_rows,
    token_labels,
    trace_wins_pairs,
)
from grail.methods.table import method_names
from grail.models.tiny import build_tiny_model
from grail.tasks.arithmetic import TaskConfig, build_example

C, F, U = CRITICAL, FILLER, UNLABELLED


# ---- labels ---------------------------------------------------------------------------------------------------------
def test_token_labels_follow_the_mixed_role_rule():
    text = " 7*3=21, so ok. x"
    #       0123456789012345 6
    labels = char_labels(len(text), critical_spans=[[2, 3], [5, 7]], filler_spans=[[9, 11], [12, 14], [16, 17]])
    offsets = [(0, 2),    # " 7": space + operand → unlabelled
               (2, 4),    # "*3": the operator is critical → critical
               (4, 6),    # "=2": critical wins over format
               (6, 7),    # "1"
               (7, 11),   # ", so": the format "," is not filler → unlabelled
               (11, 14),  # " ok": space + filler → filler
               (14, 15),  # "." → unlabelled
               (15, 16),  # " ": whitespace only → unlabelled
               (16, 17),  # "x": filler
               (17, 17)]  # empty range → unlabelled
    assert token_labels(text, labels, offsets) == [U, C, C, C, U, F, U, U, F, U]


def test_tiny_tokenizer_offsets_label_a_synthetic_example(tokenizer):
    example = build_example(7, [("*", 3), ("+", 9)], fillers=[("hmm",), ()])
    row = saliency_row(example)
    assert [example.solution[s:e] for s, e in row["critical_spans"]] == ["*", "21", "+", "30"]
    assert [example.solution[s:e] for s, e in row["filler_spans"]] == ["hmm"]
    enc = tokenizer(example.solution, add_special_tokens=False, return_offsets_mapping=True)
    labels = token_labels(example.solution, char_labels(len(example.solution), row["critical_spans"],
                                                        row["filler_spans"]), enc["offset_mapping"])
    tokens = tokenizer.convert_ids_to_tokens(enc["input_ids"])
    assert [t for t, lab in zip(tokens, labels, strict=True) if lab == C] == ["*", "2", "1", "+", "3", "0"]
    assert [t for t, lab in zip(tokens, labels, strict=True) if lab == F] == ["h", "m", "m"]


def test_corrupted_solution_changes_only_the_boxed_number():
    solution = " 9+3=12. \\boxed{12} after"
    labels = char_labels(len(solution), [[5, 7]], [[20, 25]])
    text, new = corrupted_solution(solution, labels, seed="0:1")
    assert text.startswith(" 9+3=12. \\boxed{") and text.endswith("} after")
    wrong = text[len(" 9+3=12. \\boxed{"):-len("} after")]
    assert wrong.isdigit() and wrong != "12" and 13 <= int(wrong) <= 21
    assert new[:16] == labels[:16] and new[-7:] == labels[-7:] and set(new[16:-7]) == {U}
    assert corrupted_solution(solution, labels, seed="0:1") == (text, new)  # seeded


@pytest.mark.parametrize("row, problem", [
    ({"prompt": "Q", "solution": "\\boxed{1}", "critical_spans": []}, "no 'filler_spans'"),
    ({"prompt": "Q", "solution": "1", "critical_spans": [], "filler_spans": []}, "no complete \\boxed"),
    ({"prompt": "Q", "solution": "\\boxed{1}", "critical_spans": [[0, 99]], "filler_spans": []}, "inside"),
    ({"prompt": "Q", "solution": "ab \\boxed{1}", "critical_spans": [[0, 2]], "filler_spans": [[1, 2]]}, "both"),
])
def test_bad_rows_are_refused_naming_the_problem(row, problem):
    with pytest.raises(ValueError, match="saliency row 3") as err:
        check_row(row, 3)
    assert problem in str(err.value)


def test_rows_without_filler_are_refused(tokenizer):
    rows = synthetic_rows(TaskConfig(filler_rate=0.0), n=2)
    with pytest.raises(ValueError, match="no filler token.*filler_rate"):
        saliency_auroc(build_tiny_model(tokenizer, hidden_size=32, num_layers=1), tokenizer, rows)


# ---- AUROC ----------------------------------------------------------------------------------------------------------
def _pairwise(scores, critical, counts):
    wins = pairs = 0.0
    for i, j in itertools.product(range(len(scores)), repeat=2):
        if critical[i] and not critical[j]:
            w = counts[i] * counts[j]
            wins += w * (1.0 if scores[i] > scores[j] else 0.5 if scores[i] == scores[j] else 0.0)
            pairs += w
    return wins / pairs if pairs else math.nan


def test_pooled_auroc_matches_a_pairwise_count_with_ties_and_multiplicities():
    g = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 5, (40,), generator=g).double()  # many ties
    critical = torch.rand(40, generator=g) < 0.3
    counts = torch.randint(0, 3, (6, 40), generator=g).double()
    got = pooled_auroc(scores, critical, counts)
    for r in range(6):
        expected = _pairwise(scores.tolist(), critical.tolist(), counts[r].tolist())
        assert math.isclose(got[r], expected, abs_tol=1e-12) or (math.isnan(expected) and math.isnan(got[r]))
    assert math.isclose(pooled_auroc(scores, critical)[0], _pairwise(scores.tolist(), critical.tolist(), [1] * 40),
                        abs_tol=1e-12)


def test_pooled_auroc_known_cases():
    critical = torch.tensor([True, True, False, False])
    assert pooled_auroc(torch.tensor([3.0, 4.0, 1.0, 2.0]), critical).item() == 1.0
    assert pooled_auroc(torch.tensor([1.0, 2.0, 3.0, 4.0]), critical).item() == 0.0
    assert pooled_auroc(torch.ones(4), critical).item() == 0.5  # all ties
    # critical {3, 1} vs filler {2, 1}: pairs (3>2) 1, (3>1) 1, (1<2) 0, (1=1) ½ → 2.5 / 4
    assert pooled_auroc(torch.tensor([3.0, 1.0, 2.0, 1.0]), critical).item() == 0.625
    assert math.isnan(pooled_auroc(torch.ones(2), torch.tensor([True, True])).item())


def test_trace_wins_pairs_match_a_pairwise_count_within_each_trace():
    g = torch.Generator().manual_seed(2)
    scores = torch.randint(0, 4, (50,), generator=g).double()
    critical = torch.rand(50, generator=g) < 0.4
    trace = torch.randint(0, 7, (50,), generator=g)
    wins, pairs = trace_wins_pairs(scores, critical, trace)
    for t in range(7):
        idx = (trace == t).nonzero().flatten().tolist()
        s, c = [scores[i].item() for i in idx], [bool(critical[i]) for i in idx]
        n_pairs = sum(c) * (len(c) - sum(c))
        assert pairs[t] == n_pairs
        if n_pairs:
            assert math.isclose(wins[t] / pairs[t], _pairwise(s, c, [1] * len(s)), abs_tol=1e-12)


def test_within_trace_auroc_ignores_row_scales_that_all_pairs_mix():
    # two traces, each perfectly ranked (critical above filler), the second at 100x the scale: within-trace = 1,
    # all pairs: the second trace's filler (100) beats the first trace's critical (2) → 3/4
    scores = torch.tensor([2.0, 1.0, 200.0, 100.0])
    labels, example = torch.tensor([C, F, C, F]), torch.tensor([0, 0, 1, 1])
    assert auroc_result(scores, labels, example, num_bootstrap=0).auroc == 1.0
    assert auroc_result(scores, labels, example, pairs="all", num_bootstrap=0).auroc == 0.75


@pytest.mark.parametrize("pairs", ["within_trace", "all"])
def test_auroc_result_ci_contains_the_estimate_and_is_seeded(pairs):
    g = torch.Generator().manual_seed(1)
    labels = torch.tensor([C, F, F, U] * 30)
    example, trace = torch.arange(120) // 4, torch.arange(120) // 2  # two traces per example
    scores = torch.randn(120, generator=g) + 0.8 * (labels == C)
    result = auroc_result(scores, labels, example, trace, pairs=pairs, num_bootstrap=500, seed=3)
    assert result.ci_low < result.auroc < result.ci_high
    assert (result.n_critical, result.n_filler, result.n_examples) == (30, 60, 30)
    assert auroc_result(scores, labels, example, trace, pairs=pairs, num_bootstrap=500, seed=3) == result
    assert auroc_result(scores, labels, example, trace, pairs=pairs, num_bootstrap=500, seed=4) != result
    empty = auroc_result(scores, torch.where(labels == F, U, labels), example, pairs=pairs)
    assert math.isnan(empty.auroc) and "no filler" in empty.note


# ---- the methods on a toy whose answer depends on one known token ---------------------------------------------------
# Four digits at fixed places, one marked by "#" in place of the space before it; the box copies the marked digit, so
# the answer depends on the marked digit (and on where the marker is) and on no distractor digit. Labels: the marked
# digit critical, the distractors filler. GRAIL's score of a token is the saliency of the input that predicts it, the
# previous token's embedding (METHODS.md 2.4): here the marker for the critical digit and a space for a distractor.
# (With the marker before a space-separated digit, positions shift and some seeds stall below 80 % accuracy.)
N_DIGITS = 4


def _marked_digit_row(rng: random.Random) -> dict:
    digits, k = [str(rng.randint(0, 9)) for _ in range(N_DIGITS)], rng.randrange(N_DIGITS)
    solution = "".join(("#" if i == k else " ") + d for i, d in enumerate(digits))  # " 3 8#5 1"
    spans = [[2 * i + 1, 2 * i + 2] for i in range(N_DIGITS)]
    return {"prompt": "Q:", "solution": solution + ". \\boxed{" + digits[k] + "}", "critical_spans": [spans[k]],
            "filler_spans": spans[:k] + spans[k + 1:]}


@pytest.fixture(scope="module")
def copy_model(tokenizer):
    """A 2-layer model trained here to copy the marked digit and to write the box around it. Loss on the last five
    tokens (". \\boxed{" digit "}"), the answer digit's weighted 1 and the format tokens' 0.1 (at equal weights the
    copy is learnt much later); seeds 0-3 all reach 100 % held-out accuracy within 100 steps. The format tokens are
    trained because GRAIL explains the whole box's NLL: left untrained, their random-init NLLs dominate its saliency
    (GRAIL's AUROC was then ~0.6 while OAR-P's stayed ~1)."""
    torch.manual_seed(0)
    rng = random.Random(0)
    model = build_tiny_model(tokenizer, hidden_size=64, num_layers=2, intermediate_size=128)
    optimiser = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    token_weight = torch.tensor([0.1, 0.1, 0.1, 1.0, 0.1])  # ".", " ", "\\boxed{", the answer digit, "}"
    for step in range(120):
        ids = _ids(tokenizer, [_marked_digit_row(rng) for _ in range(32)])
        logits = model(input_ids=ids).logits[:, -6:-1]  # (B, 5, V): the positions predicting the last five tokens
        loss = (cross_entropy(logits.transpose(1, 2), ids[:, -5:], reduction="none") * token_weight).mean()
        for group in optimiser.param_groups:
            group["lr"] = 3e-3 * min(1.0, (step + 1) / 20)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    return model.eval()


def _ids(tokenizer, rows) -> torch.Tensor:
    """(B, L) prompt ⊕ solution ids, tokenized apart as saliency_auroc does ("Q: " would merge into one token)."""
    return torch.tensor([tokenizer(r["prompt"], add_special_tokens=False)["input_ids"]
                         + tokenizer(r["solution"], add_special_tokens=False)["input_ids"] for r in rows])


def test_copy_model_learned_the_task(copy_model, tokenizer):
    ids = _ids(tokenizer, [_marked_digit_row(random.Random(1000 + i)) for i in range(64)])
    with torch.no_grad():
        predicted = copy_model(input_ids=ids).logits[:, -6:-1].argmax(-1)  # (B, 5)
    assert (predicted[:, 3] == ids[:, -2]).float().mean() > 0.95  # the answer digit
    assert (predicted == ids[:, -5:]).all(1).float().mean() > 0.95  # and the box around it


def test_gradient_and_perturbation_methods_find_the_marked_digit_and_random_does_not(copy_model, tokenizer):
    # The answer depends on the marked digit and on no distractor, so a method that explains the answer must rank the
    # marked digit first in (nearly) every trace: AUROC > 0.9. OAR-P measures that dependence directly (the answer
    # distribution with the token replaced by pad); GRAIL and OAR-G estimate it from gradients. The random control's
    # expected AUROC is 0.5; 0.35-0.65 is about 3 standard errors at 64 examples.
    rows = [_marked_digit_row(random.Random(1000 + i)) for i in range(64)]
    results = saliency_auroc(copy_model, tokenizer, rows, options=SaliencyQualityOptions(num_bootstrap=100))
    assert set(results) == set(method_names(probed=True))
    for method in ("grail", "oar_g", "oar_p"):
        for part in ("signal", "weights"):
            assert results[method][part].auroc > 0.9, (method, part, results[method][part])
    for part in ("signal", "weights"):
        assert 0.35 < results["random"][part].auroc < 0.65, results["random"][part]
    grail = results["grail"]
    assert (grail["signal"].n_critical, grail["signal"].n_filler, grail["signal"].n_examples) == (128, 384, 64)
    # rollout_symmetry="wrong": GRAIL reweights only the corrupted (A = −1) traces; OAR reweights both
    assert (grail["weights"].n_critical, results["oar_g"]["weights"].n_critical) == (64, 128)


# ---- the synthetic task with the warm-started model -----------------------------------------------------------------
def test_every_method_runs_on_the_synthetic_task_with_the_warm_model(warm_cache, tmp_path):
    _, checkpoint = warm_cache
    rows = synthetic_rows(TaskConfig(filler_rate=0.6), n=6)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "checkpoint-2").symlink_to(checkpoint)
    run_dir.joinpath("checkpoint-10").symlink_to(checkpoint)
    per_step = checkpoints_saliency_auroc(run_dir, rows, options=SaliencyQualityOptions(num_bootstrap=50),
                                          device="cpu")
    assert list(per_step) == [2, 10]
    # same weights, same seed → same figures (compared as JSON: a profile bin with no token is NaN, and NaN != NaN)
    assert json.dumps(as_json(per_step[2])) == json.dumps(as_json(per_step[10]))
    for method in method_names(probed=True):
        for part in ("signal", "weights"):
            result = per_step[2][method][part]
            assert all(0 <= x <= 1 for x in (result.auroc, result.ci_low, result.ci_high)), (method, part, result)
            assert result.n_critical > 0 and result.n_filler > 0
