"""grail.analysis.saliency.label_sets, and saliency quality on them: what the rows hold (filler at every gap;
format interleaved with the critical tokens), determinism, spans that map to tokens (a clear error naming the row
when they do not), prompts for a tokenizer without a chat template, the matched AUROC and profile in the output, the
plot, and the random control at 0.5."""

import json
import math
import re

import pytest
import torch

from grail.analysis.saliency.label_sets import (
    LABEL_SETS,
    label_set_rows,
    multi_step_filler_rows,
    natural_contrast_rows,
)
from grail.analysis.saliency.quality import SaliencyQualityOptions, as_json, render_messages, saliency_auroc
from grail.analysis.saliency.token_labels import check_row
from grail.models.tiny import build_tiny_model, build_tokenizer
from grail.options.prompts import plain_prefix
from grail.tasks.arithmetic import FILLER_WORDS
from grail.tasks.word_problems import NAMES, OBJECTS

STEP = re.compile(r"(\d+) ([-+*]) (\d+) = (\d+)")


def _texts(row, key):
    return [row["solution"][a:b] for a, b in row[key]]


def _reasoning(row):
    return row["solution"][:row["solution"].index("\\boxed{")]


# ---- the rows -----------------------------------------------------------------------------------------------------
def test_multi_step_rows_have_filler_at_every_gap_and_the_arithmetic_as_critical():
    rows = multi_step_filler_rows(40, seed=0)
    assert {r["num_steps"] for r in rows} == {2, 3, 4}
    for i, row in enumerate(rows):
        check_row(row, i)
        steps = STEP.findall(row["solution"])
        assert len(steps) == row["num_steps"]
        # critical: each step's operator and result, in order; the results chain and the last is the answer
        assert _texts(row, "critical_spans") == [x for _, op, _, result in steps for x in (op, result)]
        assert all(steps[k][3] == steps[k + 1][0] for k in range(len(steps) - 1))
        assert steps[-1][3] == row["answer"] and row["solution"].endswith(f"\\boxed{{{row['answer']}}}")
        assert set(_texts(row, "filler_spans")) <= set(FILLER_WORDS)
        # every gap holds filler: before the first step, between steps, and right before the box
        reasoning = _reasoning(row)
        gaps = re.split(r"(?:[A-Z]\w* has|Then \w+ has) \d+ [-+*] \d+ = \d+ [a-z ]+?\.", reasoning)
        assert len(gaps) == row["num_steps"] + 1
        assert all(gap.split() and set(gap.split()) <= set(FILLER_WORDS) for gap in gaps), gaps
        assert row["filler_spans"][0][0] == 0  # the solution opens with filler


def test_natural_contrast_rows_have_no_inserted_words_and_format_between_critical_tokens():
    names = {n for n, _ in NAMES} | {p for _, p in NAMES} | {"has", "Then", "."}
    words = {w for pair in OBJECTS for form in pair for w in form.split()}
    for i, row in enumerate(natural_contrast_rows(40, seed=0)):
        check_row(row, i)
        assert not set(_reasoning(row).split()) & set(FILLER_WORDS)
        contrast = _texts(row, "filler_spans")
        assert all(t.rstrip(".") in names | words or t == "." for t in contrast), contrast
        box = row["solution"].index("\\boxed{")
        assert all(end <= box for _, end in row["filler_spans"])
        # interleaved: format words, then a step's operator and result, then format again, step after step
        spans = sorted([(s, "c") for s, _ in row["critical_spans"]] + [(s, "f") for s, _ in row["filler_spans"]])
        kinds = "".join(k for _, k in spans)
        assert re.fullmatch(f"(f+cc){{{row['num_steps']}}}f+", kinds), kinds


def test_rows_are_seeded_deterministic_and_prefixes_of_longer_sets():
    for make in (multi_step_filler_rows, natural_contrast_rows):
        assert make(5, seed=3) == make(5, seed=3) == make(9, seed=3)[:5]
        assert make(5, seed=3) != make(5, seed=4)
        assert make(3, seed=0, shots=0)[0]["prompt"][0]["role"] == "user"
        assert len(make(3, seed=0, shots=3)[0]["prompt"]) == 7  # 3 worked examples (user, assistant) + the question
        assert {r["num_steps"] for r in make(6, 0, steps=(3, 3))} == {3}
    assert label_set_rows("natural_contrast", 4, 2) == natural_contrast_rows(4, 2)
    assert set(LABEL_SETS) == {"multi_step_filler", "natural_contrast"}
    with pytest.raises(ValueError, match="multi_step_filler, natural_contrast"):
        label_set_rows("one_step", 4)
    with pytest.raises(ValueError, match="1 <= min <= max"):
        multi_step_filler_rows(4, steps=(3, 2))


# ---- through saliency quality -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def plain_tokenizer():
    """The tiny tokenizer without its chat template: a base model's situation."""
    tokenizer = build_tokenizer()
    tokenizer.chat_template = None
    return tokenizer


def test_messages_render_as_plain_text_without_a_chat_template(plain_tokenizer, tokenizer):
    messages = natural_contrast_rows(1, seed=0, shots=1)[0]["prompt"]
    text = render_messages(plain_tokenizer, messages)  # training's plain rendering, then the answer's space
    assert text == (plain_prefix(plain_tokenizer) + f"Question: {messages[0]['content']}\n\nAnswer: "
                    f"{messages[1]['content']}\n\nQuestion: {messages[2]['content']}\n\nAnswer: ")
    assert render_messages(tokenizer, messages).startswith("<|im_start|>user\n")  # with a template: the template


def test_a_span_that_maps_to_no_token_is_refused_naming_the_row(tokenizer):
    model = build_tiny_model(tokenizer, seed=0)
    row = natural_contrast_rows(2, seed=0)[1]
    space = row["solution"].index(" ")
    bad = {**row, "filler_spans": [*row["filler_spans"], [space, space + 1]]}  # whitespace only: never filler
    with pytest.raises(ValueError, match=r"saliency row 1: filler span \[\d+, \d+\) ' ' maps to no filler token"):
        saliency_auroc(model, tokenizer, [row, bad], ["entropy"], SaliencyQualityOptions(num_bootstrap=0))
    marker = row["solution"].index("\\boxed{")  # "box" inside the tiny tokenizer's one-token marker
    bad = {**row, "filler_spans": [[marker + 1, marker + 4]]}
    with pytest.raises(ValueError, match=r"saliency row 0: filler span .* 'box' maps to no filler token: its tokens "
                                         r"also cover"):
        saliency_auroc(model, tokenizer, [bad], ["entropy"], SaliencyQualityOptions(num_bootstrap=0))


@pytest.mark.parametrize("make", [multi_step_filler_rows, natural_contrast_rows])
def test_saliency_auroc_on_a_label_set_reports_matched_and_profile(make, plain_tokenizer, tmp_path):
    pytest.importorskip("matplotlib")
    from grail.analysis.saliency.plots import plot_position_profiles

    model = build_tiny_model(plain_tokenizer, seed=0)
    rows = make(4, seed=0, shots=0)  # no worked examples: short prompts for the character-level tokenizer
    options = SaliencyQualityOptions(num_bootstrap=50)
    results = saliency_auroc(model, plain_tokenizer, rows, ["grail", "random", "entropy"], options)
    for method, parts in results.items():
        for part, result in parts.items():
            assert result.n_critical > 0 and result.n_filler > 0, (method, part, result)
            assert result.matched is not None and 0 <= result.matched.auroc <= 1, (method, part, result.matched)
            assert "last" in result.matched.note  # the window it read scores against
            profile = result.profile
            assert sum(profile.critical_count) == result.n_critical and sum(profile.filler_count) == result.n_filler
    dumped = json.loads(json.dumps(as_json(results)))
    assert set(dumped["grail"]["signal"]["matched"]) >= {"auroc", "ci_low", "ci_high", "note"}
    assert len(dumped["grail"]["weights"]["profile"]["critical_rank"]) == options.profile_bins
    path = plot_position_profiles(results, "tiny (random init)", tmp_path / "profile.png")
    assert path.stat().st_size > 1000


@pytest.mark.slow
def test_the_random_control_sits_at_one_half_on_every_label_set(tokenizer):
    """Its weights are GRAIL's permuted over the reasoning tokens, which hold every scored token: over draws the
    AUROC averages 0.5 (pooled and matched), and each draw's CI holds 0.5 about 95% of the time."""
    model = build_tiny_model(tokenizer, seed=0)
    for make in (multi_step_filler_rows, natural_contrast_rows):
        rows = make(12, seed=0, shots=0)
        draws = {"pooled": [], "matched": []}
        covered = 0
        for seed in range(20):
            options = SaliencyQualityOptions(num_bootstrap=200, seed=seed, traces="corrupted")
            weights = saliency_auroc(model, tokenizer, rows, ["random"], options)["random"]["weights"]
            draws["pooled"].append(weights.auroc)
            draws["matched"].append(weights.matched.auroc)
            covered += weights.ci_low <= 0.5 <= weights.ci_high
        for kind, values in draws.items():
            values = torch.tensor(values, dtype=torch.float64)
            se = values.std() / math.sqrt(len(values))
            assert abs(values.mean() - 0.5) < 3 * se + 0.01, (make.__name__, kind, values)
        assert covered >= 15, (make.__name__, covered)  # 20 draws at 95%: P(< 15) ≈ 0.3%
