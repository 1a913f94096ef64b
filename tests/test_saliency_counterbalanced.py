"""grail.analysis.saliency.counterbalanced and grail.analysis.saliency.fixed_position: the groups' layout (one problem,
equal lengths, both classes at almost every position), the estimator against a loop over same-stratum pairs, every
signal of position alone at 0.5 exactly (and the distance-matched estimator fooled by one), a planted role signal
recovered at its analytic AUROC, the shares that enter, and the errors."""

import itertools
import math
import random
import re
from collections import Counter

import pytest
import torch

from grail.analysis.saliency.counterbalanced import (
    COUNTERBALANCED_SETS,
    OPENER,
    counterbalanced_filler_rows,
    counterbalanced_format_rows,
    entered_shares,
    reasoning_tokens,
)
from grail.analysis.saliency.fixed_position import fixed_position_auroc_result, position_only_signals
from grail.analysis.saliency.label_sets import natural_contrast_rows
from grail.analysis.saliency.position import matched_auroc_result, trace_percentile
from grail.analysis.saliency.token_labels import CRITICAL, FILLER, UNLABELLED, check_row
from grail.tasks.arithmetic import FILLER_WORDS

C, F, U = CRITICAL, FILLER, UNLABELLED
STEP = re.compile(r"(\d+) ([-+*]) (\d+) = (\d+)\.")
MAKERS = [counterbalanced_filler_rows, counterbalanced_format_rows]


def _texts(row, key):
    return [row["solution"][a:b] for a, b in row[key]]


@pytest.fixture(scope="module", params=MAKERS, ids=["filler", "format"])
def tokens(request, tokenizer):
    rows = request.param(4, seed=0, shots=0)
    x = reasoning_tokens(tokenizer, rows)
    x["length"] = torch.bincount(x["trace"])[x["trace"]]
    return x


def _fixed(x, scores, **kw):
    return fixed_position_auroc_result(scores, x["label"], x["group"], x["trace"], x["position"],
                                       num_bootstrap=kw.pop("num_bootstrap", 200), **kw)


# ---- the rows -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("make", MAKERS)
def test_a_group_is_one_problem_whose_block_moves_across_every_gap(make):
    rows = make(3, seed=0, words=5, shots=0)
    for i, row in enumerate(rows):
        check_row(row, i)
        steps = STEP.findall(row["solution"])
        assert len(steps) == row["num_steps"] and row["solution"].startswith(OPENER + " ")
        assert _texts(row, "critical_spans") == [x for _, op, _, result in steps for x in (op, result)]
        if make is counterbalanced_filler_rows:
            assert set(_texts(row, "filler_spans")) <= set(FILLER_WORDS)
            assert len(row["filler_spans"]) == 5  # the block: 5 words, every one labelled
        else:
            assert all(re.fullmatch(r"[A-Za-z]+( [a-z]+)?\.?|\.", t) for t in _texts(row, "filler_spans"))
    for group in range(3):
        members = [r for r in rows if r["group"] == group]
        k = members[0]["num_steps"]
        assert len(members) == k * 5 + 1  # k steps x 6 cuts, the k - 1 repeats dropped
        # the same pieces in another order: the same characters, a prompt, answer and arithmetic shared
        assert len({"".join(sorted(r["solution"])) for r in members}) == 1
        assert len({(str(r["prompt"]), r["answer"], r["expression"]) for r in members}) == 1
        assert len({r["solution"] for r in members}) == len(members)
        # the last step's result right before the box in some rows, a moved word right before it in others
        ends = {r["solution"].split(" \\boxed")[0].split()[-1] for r in members}
        assert f"{members[0]['answer']}." in ends and len(ends) > 1


def test_rows_are_seeded_deterministic_and_prefixes_of_longer_sets():
    for make in MAKERS:
        assert make(2, seed=3) == make(2, seed=3) == make(3, seed=3)[:len(make(2, seed=3))]
        assert make(2, seed=3) != make(2, seed=4)
        assert {r["num_steps"] for r in make(4, 0, steps=(3, 3), words=2)} == {3}
    assert set(COUNTERBALANCED_SETS) == {"counterbalanced_filler", "counterbalanced_format"}
    with pytest.raises(ValueError, match="1 <= min <= max"):
        counterbalanced_filler_rows(2, steps=(3, 2))
    with pytest.raises(ValueError, match="words=0"):
        counterbalanced_format_rows(2, words=0)


def test_each_group_tokenizes_to_one_length_and_most_tokens_enter(tokens, tokenizer):
    lengths = {(g, int(n)) for g, n in zip(tokens["group"].tolist(), tokens["length"].tolist(), strict=True)}
    assert len(lengths) == len(set(tokens["group"].tolist()))  # one reasoning length per group
    result = _fixed(tokens, tokens["position"].double(), num_bootstrap=0)
    # the tiny tokenizer cuts every character: a moved word shifts a sentence by 3-6 tokens, which leaves holes
    # (the guide's table gives the real tokenizers' shares, 0.82-1.00)
    assert result.n_critical / result.labelled_critical > 0.85, result.note
    assert result.n_filler / result.labelled_filler > 0.5, result.note
    assert "entered:" in result.note and "strata (group, length, position)" in result.note
    assert "more than one reasoning length" not in result.note


def test_a_row_that_tokenizes_to_another_length_falls_out_and_is_counted(tokenizer):
    rows = counterbalanced_filler_rows(1, seed=0, words=4, shots=0)
    changed = dict(rows[0], solution=rows[0]["solution"].replace(OPENER, OPENER + "!", 1))
    changed["critical_spans"] = [[a + 1, b + 1] for a, b in rows[0]["critical_spans"]]
    changed["filler_spans"] = [[a + 1, b + 1] for a, b in rows[0]["filler_spans"]]
    full, lost = entered_shares(tokenizer, rows), entered_shares(tokenizer, [changed, *rows[1:]])
    assert lost[0] < full[0] and lost[1] < full[1]  # its tokens sit in strata of their own: no pair
    x = reasoning_tokens(tokenizer, [changed, *rows[1:]])
    note = fixed_position_auroc_result(x["position"].double(), x["label"], x["group"], x["trace"], x["position"],
                                       num_bootstrap=0).note
    assert "1 of 1 groups hold traces of more than one reasoning length" in note, note


# ---- the estimator ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("scale", ["trace", "raw"])
def test_fixed_position_auroc_matches_a_loop_over_same_stratum_pairs(scale):
    rng = random.Random(0)
    rows = []  # (group, trace, position, label, score): 3 groups, traces of length 5 or 6
    for trace in range(12):
        group, length = trace % 3, 5 + trace % 2
        rows += [(group, trace, t, rng.choice([C, F, U]), float(rng.randint(0, 4))) for t in range(length)]
    group, trace, position, labels, scores = (torch.tensor(c) for c in zip(*rows, strict=True))
    result = fixed_position_auroc_result(scores, labels, group, trace, position, scale=scale, num_bootstrap=0)
    u = trace_percentile(scores, trace) if scale == "trace" else scores.double()
    length = Counter(trace.tolist())
    w = p = 0.0
    entered = set()
    for i, j in itertools.product(range(len(rows)), range(len(rows))):
        (gi, ti, pi, li, _), (gj, tj, pj, lj, _) = rows[i], rows[j]
        if li == C and lj == F and (gi, length[ti], pi) == (gj, length[tj], pj):
            w += 1.0 if u[i] > u[j] else 0.5 if u[i] == u[j] else 0.0
            p += 1
            entered |= {i, j}
    assert result.auroc == pytest.approx(w / p)
    assert result.n_critical + result.n_filler == len(entered)
    assert result.labelled_critical == int((labels == C).sum()) and result.labelled_filler == int((labels == F).sum())


def _pooled_rollouts(seed: int, role_shift: float):
    """Tokens of 6 prompts × 4 sampled traces in ONE group (lengths 5 or 6), labels at random, scores random plus
    `role_shift` on the critical ones: (group, trace, position, labels, scores, unit = the trace's prompt)."""
    rng = random.Random(seed)
    rows = []
    for trace in range(24):
        unit, length = trace // 4, 5 + trace % 2
        for t in range(length):
            label = rng.choice([C, F, U])
            rows.append((0, trace, t, label, rng.random() + (role_shift if label == C else 0.0), unit))
    group, trace, position, labels, scores, unit = (torch.tensor(c) for c in zip(*rows, strict=True))
    return group, trace, position, labels, scores, unit


def test_one_pooled_group_gets_an_interval_by_resampling_its_units_as_duplicated_data_would():
    """fixed_group="all" (one group, pairs across prompts): the bootstrap's unit is the prompt. Each draw equals the
    point AUROC of the data with every drawn prompt's traces copied as often as it was drawn (copies of one prompt
    pair with each other and with every other prompt's tokens at the same length and position)."""
    from grail.analysis.saliency.token_labels import percentile_interval, resample_counts

    group, trace, position, labels, scores, unit = _pooled_rollouts(0, 0.3)
    without = fixed_position_auroc_result(scores, labels, group, trace, position, scale="raw", num_bootstrap=0)
    got = fixed_position_auroc_result(scores, labels, group, trace, position, unit_N=unit, scale="raw",
                                      num_bootstrap=200, seed=5)
    assert got.auroc == without.auroc and got.n_examples == 6  # the point is unchanged; 6 units
    assert got.ci_low < got.auroc < got.ci_high
    keep = labels != U
    draws = []
    for counts_RE in resample_counts(6, 200, int(keep.sum()), 5):
        for counts_E in counts_RE:
            copies, copy_traces = [], {}  # each copy of a trace is a trace of its own
            for i in range(len(trace)):
                for c in range(int(counts_E[int(unit[i])])):
                    copies.append((i, copy_traces.setdefault((int(trace[i]), c), len(copy_traces))))
            idx, new_trace = (torch.tensor(x) for x in zip(*copies, strict=True))
            one = fixed_position_auroc_result(scores[idx], labels[idx], group[idx], new_trace, position[idx],
                                              scale="raw", num_bootstrap=0)
            draws.append(one.auroc)
    low, high, _ = percentile_interval(torch.tensor(draws, dtype=torch.float64), 0.95)
    assert (got.ci_low, got.ci_high) == pytest.approx((low, high), abs=1e-12)


def test_the_pooled_interval_finds_a_planted_role_signal_and_covers_chance_without_one():
    for shift, inside in ((0.0, True), (1.0, False)):
        group, trace, position, labels, scores, unit = _pooled_rollouts(1, shift)
        got = fixed_position_auroc_result(scores, labels, group, trace, position, unit_N=unit, num_bootstrap=500)
        assert (got.ci_low <= 0.5 <= got.ci_high) is inside
        assert got.ci_high > got.ci_low  # one group, but six units: the interval has width
    one_unit = torch.zeros_like(unit)
    got = fixed_position_auroc_result(scores, labels, group, trace, position, unit_N=one_unit, num_bootstrap=50)
    assert got.ci_low == got.ci_high and "only 1 unit" in got.note
    split = unit.clone()
    split[0] = 5  # trace 0 now spans two units
    with pytest.raises(ValueError, match="more than one unit id"):
        fixed_position_auroc_result(scores, labels, group, trace, position, unit_N=split)

def _position_signals(x) -> dict[str, torch.Tensor]:
    return position_only_signals(x["position"], x["length"], x["label"])


def test_every_signal_of_position_alone_scores_one_half_exactly(tokens):
    for name, signal in _position_signals(tokens).items():
        for scale in ("trace", "raw"):
            result = _fixed(tokens, signal, scale=scale)
            assert (result.auroc, result.ci_low, result.ci_high) == (0.5, 0.5, 0.5), (name, scale, result)


def test_the_distance_matched_estimator_is_fooled_by_a_signal_of_position_alone(tokenizer, tokens):
    # the correction on the results page: matching distance to the box does not fix the position from the start,
    # across traces of different lengths; a prior over positions ranks critical tokens first at the same distance
    natural = reasoning_tokens(tokenizer, natural_contrast_rows(48, seed=0))
    natural["length"] = torch.bincount(natural["trace"])[natural["trace"]]
    for x, above in ((natural, 0.9), (tokens, 0.55)):  # on the counterbalanced sets too, groups differ in length
        prior = _position_signals(x)["P(critical | position)"]
        old = matched_auroc_result(prior, x["label"], x["trace"], x["length"] - x["position"], num_bootstrap=200)
        assert old.ci_low > above, old
    new = _fixed(tokens, _position_signals(tokens)["P(critical | position)"])
    assert new.auroc == 0.5


def test_a_label_alone_scores_one(tokens):
    label = (tokens["label"] == C).double()
    result = _fixed(tokens, label + 0.01 * tokens["position"].double())
    assert (result.auroc, result.ci_low, result.ci_high) == (1.0, 1.0, 1.0), result
    assert "zero width is not a measure of uncertainty" in result.note  # the width is said, not implied
    below = _fixed(tokens, -label)
    assert below.auroc == 0.0 and "AUROC 0" in below.note
    noisy = label + torch.rand(len(label), dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 2
    assert "zero width" not in _fixed(tokens, noisy).note


@pytest.mark.parametrize("delta", [0.5, 1.0])
def test_a_planted_role_signal_is_recovered_at_its_analytic_auroc(tokens, delta):
    # score = f(position) + delta * critical + N(0, 1): at one position, critical minus contrast ~ N(delta, 2), so
    # P(critical above) = Phi(delta / sqrt(2)) on raw scores; the standing within the trace keeps it nearly so
    generator = torch.Generator().manual_seed(1)
    critical = (tokens["label"] == C).double()
    noise = torch.randn(len(critical), generator=generator, dtype=torch.float64)
    signal = 3 * torch.sin(tokens["position"].double() / 4) + delta * critical + noise
    expected = 0.5 * (1 + math.erf(delta / 2))  # Phi(delta / (sigma * sqrt(2))), sigma = 1
    for scale in ("raw", "trace"):
        result = _fixed(tokens, signal, scale=scale, num_bootstrap=400)
        assert result.ci_low <= expected <= result.ci_high, (scale, expected, result)
        assert abs(result.auroc - expected) < 0.03, (scale, expected, result)
    # and the estimator can tell it from nothing
    assert _fixed(tokens, signal).ci_low > 0.55


def test_the_trace_standing_ignores_each_traces_scale(tokens):
    generator = torch.Generator().manual_seed(2)
    noisy = (tokens["label"] == C).double() + torch.randn(len(tokens["label"]), generator=generator,
                                                          dtype=torch.float64)
    scale_G = torch.exp(3 * torch.randn(int(tokens["trace"].max()) + 1, generator=generator, dtype=torch.float64))
    scaled = noisy * scale_G[tokens["trace"]]
    assert _fixed(tokens, scaled).auroc == _fixed(tokens, noisy).auroc
    assert _fixed(tokens, scaled, scale="raw").auroc < _fixed(tokens, noisy, scale="raw").auroc - 0.05


def test_bad_inputs_are_refused_or_reported():
    one = torch.zeros(3, dtype=torch.long)
    with pytest.raises(ValueError, match="positions 0..R-1"):  # a trace that does not start at 0
        fixed_position_auroc_result(torch.arange(3.0), torch.tensor([C, F, U]), one, one, torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="one group"):
        fixed_position_auroc_result(torch.arange(3.0), torch.tensor([C, F, U]), torch.tensor([0, 0, 1]), one,
                                    torch.arange(3))
    with pytest.raises(ValueError, match="scale='window'"):
        fixed_position_auroc_result(torch.arange(3.0), torch.tensor([C, F, U]), one, one, torch.arange(3),
                                    scale="window")
    # two traces of one group whose classes never share a position: no pair, NaN with the reason and the shares
    result = fixed_position_auroc_result(torch.arange(4.0), torch.tensor([C, F, C, F]), torch.zeros(4).long(),
                                         torch.tensor([0, 0, 1, 1]), torch.tensor([0, 1, 0, 1]))
    assert math.isnan(result.auroc) and "no stratum" in result.note and "0 of 2 critical" in result.note, result


# ---- through saliency quality, with the tiny model ----------------------------------------------------------------
def test_saliency_auroc_reports_the_fixed_auroc_and_the_position_null_sits_at_one_half(tokenizer):
    from grail.analysis.saliency.quality import SaliencyQualityOptions, as_json, saliency_auroc
    from grail.models.tiny import build_tiny_model

    model = build_tiny_model(tokenizer, seed=0)
    rows = counterbalanced_filler_rows(2, seed=0, words=4, shots=0)
    results = saliency_auroc(model, tokenizer, rows, ["grail", "position"], SaliencyQualityOptions(num_bootstrap=50))
    for part, result in results["position"].items():  # the null's signal AND its weights (z-scored, clipped)
        assert (result.fixed.auroc, result.fixed.ci_low, result.fixed.ci_high) == (0.5, 0.5, 0.5), (part, result)
    fixed = results["grail"]["signal"].fixed
    assert 0 <= fixed.auroc <= 1 and 0 < fixed.n_critical <= fixed.labelled_critical, fixed
    assert fixed.labelled_critical == results["grail"]["signal"].n_critical  # every labelled token, entered or not
    assert "entered:" in as_json(results)["grail"]["signal"]["fixed"]["note"]
    # rows without a group: each row is its own group, whose two traces share one layout: no pair, said so
    plain = [{k: v for k, v in r.items() if k != "group"} for r in rows]
    alone = saliency_auroc(model, tokenizer, plain, ["position"], SaliencyQualityOptions(num_bootstrap=0))
    fixed = alone["position"]["signal"].fixed
    assert math.isnan(fixed.auroc) and "no stratum" in fixed.note, fixed
    pooled = saliency_auroc(model, tokenizer, plain, ["position"],
                            SaliencyQualityOptions(num_bootstrap=0, fixed_group="all"))
    assert pooled["position"]["signal"].fixed.auroc == 0.5  # one group: the rows of equal length pair again
    units = saliency_auroc(model, tokenizer, rows, ["grail"], SaliencyQualityOptions(num_bootstrap=50,
                                                                                      fixed_group="all"))
    assert units["grail"]["signal"].fixed.n_examples == 2  # one group of strata, bootstrapped over the 2 group keys
    with pytest.raises(ValueError, match="fixed_group='some'"):
        SaliencyQualityOptions(fixed_group="some")


# ---- GRAIL's saliency read at the token's own position ------------------------------------------------------------
def test_grail_is_also_reported_at_the_tokens_own_position_on_the_tiny_model(tokenizer):
    from grail.analysis.saliency.quality import SaliencyQualityOptions, saliency_auroc
    from grail.models.tiny import build_tiny_model

    model = build_tiny_model(tokenizer, seed=0)
    rows = counterbalanced_format_rows(1, seed=0, words=3, shots=0)
    options = SaliencyQualityOptions(num_bootstrap=0, read_at_token=("grail",))
    results = saliency_auroc(model, tokenizer, rows, ["grail", "oar_g"], options)
    own, predicting = results["grail@token"]["signal"], results["grail"]["signal"]
    assert set(results["grail@token"]) == {"signal"}  # the weights are GRAIL's, wherever its signal is read
    assert (own.n_critical, own.n_filler) == (predicting.n_critical, predicting.n_filler)
    assert own.auroc != predicting.auroc and own.fixed.labelled_critical == predicting.fixed.labelled_critical
    with pytest.raises(ValueError, match=r"read_at_token=\['oar_g'\]"):  # OAR reads the token's own position already
        saliency_auroc(model, tokenizer, rows, ["grail", "oar_g"], SaliencyQualityOptions(read_at_token=("oar_g",)))
