"""grail.analysis.saliency.position: distances and positions, the stratified Mann–Whitney kernel against a pairwise
count, the position-matched AUROC against a loop reference and on synthetic signals over the label sets (a signal
that is only distance to the box lands at 0.5 matched, one that is only the label at 1.0), bins without a class,
and the position profile."""

import itertools
import math
import random
from dataclasses import replace

import pytest
import torch

from grail.analysis.saliency.label_sets import multi_step_filler_rows, natural_contrast_rows
from grail.analysis.saliency.position import (
    box_distance_BT,
    matched_auroc_result,
    position_profile,
    relative_position_BT,
    trace_percentile,
    window_standing,
)
from grail.analysis.saliency.token_labels import (
    CRITICAL,
    FILLER,
    UNLABELLED,
    auroc_result,
    char_labels,
    stratified_wins_pairs,
    synthetic_rows,
    token_labels,
)
from grail.tasks.word_problems import WORDS_TASK

C, F, U = CRITICAL, FILLER, UNLABELLED


def _tokens(tokenizer, rows) -> dict[str, torch.Tensor]:
    """Every reasoning token of each row's solution (one trace per row): label, distance to the box (first token
    whose range reaches past the box's start), relative position, trace id."""
    out = {k: [] for k in ("label", "distance", "position", "trace")}
    for i, row in enumerate(rows):
        text = row["solution"]
        offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        labels = token_labels(text, char_labels(len(text), row["critical_spans"], row["filler_spans"]), offsets)
        k0 = next(t for t, (_, end) in enumerate(offsets) if end > text.index("\\boxed{"))
        for t in range(k0):
            out["label"].append(labels[t])
            out["distance"].append(k0 - t)
            out["position"].append(t / k0)
            out["trace"].append(i)
    return {k: torch.tensor(v) for k, v in out.items()}


@pytest.fixture(scope="module")
def multi_step(tokenizer):
    return _tokens(tokenizer, multi_step_filler_rows(48, seed=0))


@pytest.fixture(scope="module")
def natural(tokenizer):
    return _tokens(tokenizer, natural_contrast_rows(48, seed=0))


def _pooled(x, scores, **kw):
    return auroc_result(scores, x["label"], x["trace"], num_bootstrap=200, **kw)


def _matched(x, scores, **kw):
    return matched_auroc_result(scores, x["label"], x["trace"], x["distance"], num_bootstrap=200, **kw)


# ---- positions ----------------------------------------------------------------------------------------------------
def test_box_distance_and_relative_position_count_from_the_box():
    box_BT = torch.tensor([[0, 0, 0, 1, 1, 0], [0, 1, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0]], dtype=torch.bool)
    assert box_distance_BT(box_BT).tolist() == [[3, 2, 1, 0, -1, -2], [1, 0, -1, -2, -3, -4], [6, 5, 4, 3, 2, 1]]
    reasoning_BT = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 0, 0, 0, 0, 0]], dtype=torch.bool)
    assert relative_position_BT(reasoning_BT).tolist() == [[0, 0.25, 0.5, 0.75, 0, 0], [0, 0, 0, 0, 0, 0]]


def test_window_standing_reads_each_score_against_its_traces_last_tokens():
    # trace 0: scores at distances 4,3,2,1 = 9,1,5,5; trace 1: distances 3,2,1 = 0,2,2. D = 3 (the shorter trace).
    scores = torch.tensor([9.0, 1.0, 5.0, 5.0, 0.0, 2.0, 2.0])
    trace = torch.tensor([0, 0, 0, 0, 1, 1, 1])
    distance = torch.tensor([4, 3, 2, 1, 3, 2, 1])
    u, D = window_standing(scores, trace, distance)
    assert D == 3
    # trace 0's window {1, 5, 5}: 9 is above all (3/3); 1: ½·1/3; 5: (1 + ½·2)/3. trace 1's {0, 2, 2}: 0 → ½·1/3,
    # 2 → (1 + ½·2)/3.
    assert u.tolist() == pytest.approx([1, 1 / 6, 2 / 3, 2 / 3, 1 / 6, 2 / 3, 2 / 3])
    assert window_standing(scores, trace, distance, window=1)[0].tolist() == pytest.approx([1, 0, .5, .5, 0, .5, .5])
    assert trace_percentile(torch.tensor([3.0, 3.0, 1.0]), torch.tensor([0, 0, 0])).tolist() == pytest.approx(
        [4 / 6, 4 / 6, 1 / 6])  # 3: (1 + ½·2)/3; 1: ½/3


# ---- the Mann–Whitney kernel and the estimator against loops ------------------------------------------------------
def test_stratified_wins_pairs_match_a_pairwise_count_with_ties_and_multiplicities():
    rng = random.Random(0)
    N = 40
    scores = torch.tensor([float(rng.randint(0, 5)) for _ in range(N)])  # many ties
    critical = torch.tensor([rng.random() < 0.4 for _ in range(N)])
    stratum = torch.tensor([rng.randint(0, 3) for _ in range(N)])
    counts = torch.tensor([[float(rng.randint(0, 2)) for _ in range(N)] for _ in range(3)])
    wins, pairs = stratified_wins_pairs(scores, critical, stratum, counts)
    for r, s in itertools.product(range(3), range(4)):
        w = p = 0.0
        for i, j in itertools.product(range(N), range(N)):
            if critical[i] and not critical[j] and stratum[i] == s and stratum[j] == s:
                m = float(counts[r, i] * counts[r, j])  # a number: pytest 9.2 approx refuses tensors in a tuple
                w += m * (1.0 if scores[i] > scores[j] else 0.5 if scores[i] == scores[j] else 0.0)
                p += m
        assert (float(wins[r, s]), float(pairs[r, s])) == pytest.approx((w, p))


@pytest.mark.parametrize("bin_width", [1, 2])
def test_matched_auroc_matches_a_loop_over_same_bin_pairs(bin_width):
    rng = random.Random(1)
    rows = []  # (trace, distance, label, score): 6 traces of 8 reasoning tokens
    for g in range(6):
        for d in range(8, 0, -1):
            rows.append((g, d, rng.choice([C, F, U]), float(rng.randint(0, 4))))
    trace, distance, labels, scores = (torch.tensor(c) for c in zip(*rows, strict=True))
    result = matched_auroc_result(scores, labels, trace, distance, bin_width=bin_width, num_bootstrap=0)
    u = {}  # the window is the last 8 tokens = the whole trace here
    for g in range(6):
        mine = [s for t, _, _, s in rows if t == g]
        for i, (t, _, _, s) in enumerate(rows):
            if t == g:
                u[i] = (sum(x < s for x in mine) + 0.5 * sum(x == s for x in mine)) / len(mine)
    w = p = 0.0
    for i, j in itertools.product(range(len(rows)), range(len(rows))):
        same_bin = (rows[i][1] - 1) // bin_width == (rows[j][1] - 1) // bin_width
        if rows[i][2] == C and rows[j][2] == F and same_bin:
            w += 1.0 if u[i] > u[j] else 0.5 if u[i] == u[j] else 0.0
            p += 1
    assert result.auroc == pytest.approx(w / p)


# ---- synthetic signals on the label sets ----------------------------------------------------------------------------
def test_a_signal_that_is_only_distance_lands_at_one_half_matched(multi_step, natural, tokenizer):
    # On the multi-step set a strictly monotone distance signal is balanced by design (filler at every gap), so the
    # distance-only signal here is a recency window, 1 on the last 12 tokens before the box: it prefers the last
    # gap's filler words, and the pooled AUROC sees that.
    recency = (multi_step["distance"] <= 12).double()
    pooled, matched = _pooled(multi_step, recency), _matched(multi_step, recency)
    assert pooled.ci_high < 0.47, pooled
    assert (matched.auroc, matched.ci_low, matched.ci_high) == (0.5, 0.5, 0.5), matched
    for x in (multi_step, natural):
        for signal in (-x["distance"].double(), (x["distance"] - 6.0).abs(), (x["distance"] <= 12).double()):
            assert _matched(x, signal).auroc == 0.5
            assert _matched(x, signal, scale="raw").auroc == 0.5
    # the one-step words set, filler only right before the box: pure recency ranks every filler token first
    one_step = _tokens(tokenizer, synthetic_rows(replace(WORDS_TASK, filler_rate=0.6), 48, "heldout", 0))
    pooled = _pooled(one_step, -one_step["distance"].double())
    matched = _matched(one_step, -one_step["distance"].double())
    assert pooled.auroc < 0.05 and matched.auroc == 0.5, (pooled, matched)


def test_a_signal_that_is_only_the_label_scores_one_in_both(multi_step, natural):
    for x in (multi_step, natural):
        label = (x["label"] == C).double()
        for result in (_pooled(x, label), _matched(x, label), _matched(x, label, scale="raw")):
            assert (result.auroc, result.ci_low, result.ci_high) == (1.0, 1.0, 1.0), result


def test_the_window_ignores_each_traces_scale_and_raw_scores_do_not(natural):
    generator = torch.Generator().manual_seed(0)
    noisy = (natural["label"] == C).double() + 0.5 * torch.randn(len(natural["label"]), generator=generator)
    scale_G = torch.exp(3 * torch.randn(int(natural["trace"].max()) + 1, generator=generator))
    scaled = noisy * scale_G[natural["trace"]]
    assert _matched(natural, scaled).auroc == _matched(natural, noisy).auroc
    assert _pooled(natural, scaled).auroc == _pooled(natural, noisy).auroc  # within-trace pairs: scale-free too
    # raw cross-trace pairs mostly compare the traces' scales: pulled towards 0.5
    assert _matched(natural, scaled, scale="raw").auroc < _matched(natural, noisy, scale="raw").auroc - 0.05


def test_wider_bins_or_a_whole_trace_percentile_would_leave_position_in(natural):
    # why exact distances and a window (position.py's docstring): both alternatives score a distance-only signal
    # away from 0.5 on the natural-contrast set
    recency = -natural["distance"].double()
    assert abs(_matched(natural, recency, bin_width=4).auroc - 0.5) > 0.05
    whole_trace = trace_percentile(recency, natural["trace"])
    assert abs(_matched(natural, whole_trace, scale="raw").auroc - 0.5) > 0.05


# ---- bins without a class -----------------------------------------------------------------------------------------
def test_a_bin_without_both_classes_is_reported_not_an_error():
    # distance:     3  2  1 | 3  2  1   (two traces, window D = 3 = the whole trace)
    labels = torch.tensor([C, F, F, F, C, F])
    scores = torch.tensor([2.0, 1.0, 0.0, 5.0, 9.0, 7.0])
    trace = torch.tensor([0, 0, 0, 1, 1, 1])
    distance = torch.tensor([3, 2, 1, 3, 2, 1])
    result = matched_auroc_result(scores, labels, trace, distance, num_bootstrap=0)
    # standing: trace 0 (2, 1, 0) → (5/6, 3/6, 1/6); trace 1 (5, 9, 7) → (1/6, 5/6, 3/6).
    # distance 3: critical 5/6 vs filler 1/6 → win; distance 2: critical 5/6 vs filler 3/6 → win; distance 1: no
    # critical token, no pair. AUROC = 2/2.
    assert result.auroc == 1.0 and (result.n_critical, result.n_filler) == (2, 2)
    assert "1 of 3 bins lack a class" in result.note and "distance 1;" in result.note, result.note
    assert "0 critical and 2 filler tokens" in result.note


def test_no_bin_with_both_classes_gives_nan_and_says_why():
    labels = torch.tensor([C, F, C, F])
    distance = torch.tensor([2, 1, 2, 1])  # critical always at 2, filler always at 1
    result = matched_auroc_result(torch.arange(4.0), labels, torch.tensor([0, 0, 1, 1]), distance)
    assert math.isnan(result.auroc) and "no distance bin holds both" in result.note, result
    assert "distance 1-2" in result.note
    with pytest.raises(ValueError, match="distance 0 < 1"):
        matched_auroc_result(torch.arange(2.0), torch.tensor([C, F]), torch.tensor([0, 0]), torch.tensor([1, 0]))


def test_the_matched_ci_is_seeded_and_brackets_the_estimate(multi_step):
    generator = torch.Generator().manual_seed(1)
    noisy = (multi_step["label"] == C).double() + 2 * torch.randn(len(multi_step["label"]), generator=generator)
    a, b = _matched(multi_step, noisy, seed=3), _matched(multi_step, noisy, seed=3)
    assert a == b and a.ci_low < a.auroc < a.ci_high


# ---- the profile --------------------------------------------------------------------------------------------------
def test_position_profile_averages_by_class_and_relative_position():
    scores = torch.tensor([1.0, 3.0, 2.0, 4.0, 8.0])
    labels = torch.tensor([C, F, U, C, F])
    position = torch.tensor([0.0, 0.1, 0.5, 0.6, 0.95])
    profile = position_profile(scores, labels, position, torch.zeros(5, dtype=torch.long), bins=2)
    # bin 0: critical 1.0, filler 3.0; bin 1: critical 4.0, filler 8.0. Percentiles in the one trace of 5 tokens:
    # 1 → 0.1, 3 → 0.5, 4 → 0.7, 8 → 0.9 (the unlabelled 2 counts in them).
    assert profile.critical_mean == (1.0, 4.0) and profile.filler_mean == (3.0, 8.0)
    assert profile.critical_rank == pytest.approx((0.1, 0.7)) and profile.filler_rank == pytest.approx((0.5, 0.9))
    assert profile.critical_count == (1, 1) and profile.filler_count == (1, 1)
    empty = position_profile(scores, labels, position, torch.zeros(5, dtype=torch.long), bins=4)
    assert empty.critical_count == (1, 0, 1, 0) and math.isnan(empty.critical_mean[1])
