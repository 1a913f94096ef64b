"""The opt-in confound controls: `weight_rescale` (scale matching), `zscore_scope` (GRAIL's z-score without the
post-answer zeros) and the `weights/reasoning_std` diagnostic. Defaults stay the release's (the other weight tests
check those); here: the options' semantics against direct computations, their validation and the trainer's metric."""

import math

import pytest
import torch

from grail.methods import core
from grail.methods.diagnostics import finish, weight_diagnostics, weight_sums
from grail.methods.spans import AnswerSpans
from grail.methods.table import METHODS, checked, zscore_tokens
from grail.methods.weighting import probe_rows, weights_from_signal
from grail.options.choices import WeightingOptions
from references import random_batch, ref_log_zscore

RELEASE = {"weight_mean": 1.0, "weight_std": 0.5, "weight_min": 0.5, "weight_max": 5.0}  # METHODS.md 2.5
ZERO_SALIENCY = math.log(1e-8)  # log(0 + 1e-8): what a post-answer token contributes to the release's z-score


# ---------------------------------------------------------------------------------------------------------------
# A hand-built batch with answer spans (the layout grail.methods.spans produces)
# ---------------------------------------------------------------------------------------------------------------

def _spans_batch():
    """Four rows, T = 10. Row layout for the rows with a box (r = reasoning, m = `\\boxed{`, c = content,
    } = closing brace, x = after the box, . = padding):
        row 0: r r r r r m c } x x      A = −1 (reweighted under rollout_symmetry 'wrong')
        row 1: r r r m c c } x . .      A = +0.5 (box, not reweighted: overrides only)
        row 2: r r r r r r . . . .      A = −0.5, no box (uniform)
        row 3: r r m c } x x x x x      A = −2
    Saliency: positive up to and including `}` (the box's NLL span), exactly 0 after it, as GRAIL's probe gives."""
    layouts = ["rrrrrmc}xx", "rrrmcc}x..", "rrrrrr....", "rrmc}xxxxx"]
    T = 10
    mask = torch.tensor([[ch != "." for ch in row] for row in layouts])
    answer = torch.tensor([[ch == "c" for ch in row] for row in layouts])
    after = torch.tensor([[ch in "m}x" for ch in row] for row in layouts])
    box = torch.tensor([[ch in "mc}" for ch in row] for row in layouts])
    reasoning = mask & ~answer & ~after
    spans = AnswerSpans(answer, after, reasoning, answer.any(1), torch.ones(4, dtype=torch.bool), box)
    g = torch.Generator().manual_seed(0)
    signal = torch.exp(torch.randn(4, T, generator=g) - 3.0)  # log-normal saliency around e^-3
    tail = mask & ~reasoning & ~box  # after the closing brace
    signal = torch.where(tail, 0.0, torch.where(mask, signal, torch.nan))
    adv = torch.tensor([-1.0, 0.5, -0.5, -2.0])
    return signal, adv, spans, mask


def _weights(method, signal, adv, spans, mask, generator=None, **options):
    """The method's weights from `signal`, on the rows its probe would run on (as `token_weights` does)."""
    opts = WeightingOptions(token_weighting=method, **options)
    return weights_from_signal(signal, adv, spans, mask, probe_rows(adv, spans, mask, opts), opts, generator)


# ---------------------------------------------------------------------------------------------------------------
# Options and config fields
# ---------------------------------------------------------------------------------------------------------------

def test_defaults_are_the_release_and_the_choices_are_named():
    from grail.training.config import literal_choices

    options = WeightingOptions()
    assert (options.weight_rescale, options.zscore_scope) == ("none", "completion")
    assert literal_choices("weight_rescale") == ("none", "row_mean")
    assert literal_choices("zscore_scope") == ("completion", "to_answer")


@pytest.mark.parametrize("bad, named", [
    ({"weight_rescale": "mean"}, "weight_rescale='mean'.*'none', 'row_mean'"),
    ({"zscore_scope": "answer"}, "zscore_scope='answer'.*'completion', 'to_answer'"),
    ({"zscore_scope": "to_answer", "token_weighting": "oar_g"}, "zscore_scope='to_answer', token_weighting='oar_g'"),
    ({"zscore_scope": "to_answer", "token_weighting": "oar_p"}, "OAR has no z-score"),
])
def test_bad_values_are_refused_naming_the_field(bad, named, tmp_path):
    from grail.training.config import GRAILConfig

    with pytest.raises(ValueError, match=named):
        checked(WeightingOptions(**bad))  # the method's own check (the table) after the options' checks
    with pytest.raises(ValueError, match=next(iter(bad))):
        GRAILConfig(output_dir=str(tmp_path), **bad)


def test_the_options_reach_the_config_and_the_help(tmp_path):
    from grail.cli import _fields_help
    from grail.training.config import GRAILConfig

    cfg = GRAILConfig(output_dir=str(tmp_path), weight_rescale="row_mean", zscore_scope="to_answer",
                      token_weighting="entropy")
    options = cfg.weighting_options()
    assert (options.weight_rescale, options.zscore_scope) == ("row_mean", "to_answer")
    assert "--weight_rescale (default 'none')" in _fields_help()
    assert "--zscore_scope (default 'completion')" in _fields_help()


# ---------------------------------------------------------------------------------------------------------------
# zscore_scope="to_answer"
# ---------------------------------------------------------------------------------------------------------------

def test_tokens_through_span_match_a_loop_reference():
    signal, mask, g = random_batch(3, B=9, T=15)
    span = mask & (torch.rand(9, 15, generator=g) < 0.2)
    span[3] = False  # a row with real tokens and no span token: all its real tokens
    out = core.tokens_through_span(span, mask)
    for i in range(9):
        last = max((t for t in range(15) if span[i, t]), default=None)
        expected = [bool(mask[i, t]) and (last is None or t <= last) for t in range(15)]
        assert out[i].tolist() == expected, i


def test_to_answer_z_scores_leave_out_the_post_answer_tokens():
    """Reweighted rows' weights = clip(1 + 0.5 z) with z the z-score over the tokens up to `}` only (loop
    reference on the truncated row); the tokens after `}` get w_mean; the release's z-score differs."""
    signal, adv, spans, mask = _spans_batch()
    scope = zscore_tokens(spans, mask, WeightingOptions(zscore_scope="to_answer"))
    assert torch.equal(scope, mask & (spans.reasoning_BT | spans.box_BT))  # the tail after `}` is out
    out = core.grail_weights_from_saliency(signal, adv, mask, spans.answer_BT, spans.after_BT,
                                           rollout_symmetry="wrong", scope_BT=scope, **RELEASE)
    release = core.grail_weights_from_saliency(signal, adv, mask, spans.answer_BT, spans.after_BT,
                                               rollout_symmetry="wrong", **RELEASE)
    z_ref = ref_log_zscore(torch.where(scope, signal, torch.nan), scope)  # z over the scope only
    for i in (0, 3):  # the reweighted rows (A ≤ 0, with a box)
        reason = spans.reasoning_BT[i]
        expected = (1.0 + 0.5 * z_ref[i][reason]).clamp(0.5, 5.0).float()
        torch.testing.assert_close(out.weights_BT[i][reason], expected, atol=1e-5, rtol=0)
        assert not torch.allclose(release.weights_BT[i][reason], expected, atol=1e-3)  # the scope matters
        tail = mask[i] & ~scope[i]
        assert tail.any() and torch.all(out.weights_BT[i][tail] == 1.0)  # w_mean
        assert torch.all(out.clip_BT[i][tail] == 0)  # z = 0 there: not clipped
    # rows not reweighted (row 1: A > 0; row 2: no box) are as in the release
    torch.testing.assert_close(out.weights_BT[1:3], release.weights_BT[1:3], atol=0, rtol=0)
    # the release's own z-score is over every real token (it sees the zeros)
    z_all = ref_log_zscore(torch.where(mask, signal, torch.nan), mask)
    reason = spans.reasoning_BT[0]
    torch.testing.assert_close(release.weights_BT[0][reason], (1.0 + 0.5 * z_all[0][reason]).clamp(0.5, 5.0).float(),
                               atol=1e-5, rtol=0)


def test_to_answer_spreads_the_reasoning_weights_more_than_the_release():
    """Direction, from the maths. Per row, x_t = log(s_t + 1e-8); the z-score's scope holds n tokens (mean μ, std σ)
    and the release adds k post-answer tokens at x₀ = log 1e-8 ≈ −18.4. Its variance over n + k tokens is
        σ_all² = (n σ² + n k (μ − x₀)² / (n + k)) / (n + k),
    larger than σ² iff (μ − x₀)² > σ² (n + k) / n: true here, where μ ≈ −3 and σ ≈ 1. A reasoning token's weight is
    1 + 0.5 (x − μ') / σ' before clipping, so its spread over the row is 0.5 σ_r / σ' (σ_r: the std of the reasoning
    x's): larger for σ' = σ (to_answer) than for σ' = σ_all (release), and clipping only shrinks a spread (it is
    monotone and 1-Lipschitz), so if to_answer clips nothing its pooled std must be the larger one."""
    signal, adv, spans, mask = _spans_batch()
    adv = torch.full((4,), -1.0)  # every row with a box reweighted, every row described

    def reasoning_std(scope):
        w = _weights("grail", signal, adv, spans, mask, zscore_scope=scope)
        d = weight_diagnostics(w.weights_BT, adv, mask, spans.reasoning_BT, w.normalised_BT, weight_min=0.5,
                               weight_max=5.0)
        return d["reasoning_std"].item(), w

    narrow, _ = reasoning_std("completion")
    wide, w = reasoning_std("to_answer")
    boxed = w.has_box_B[:, None] & spans.reasoning_BT
    assert torch.all((w.weights_BT[boxed] > 0.5) & (w.weights_BT[boxed] < 5.0))  # the premise: nothing clipped
    assert wide > narrow > 0
    # the same statistic without the no-box row (its reasoning weights are all 1 under both scopes) keeps the order
    w_rel = _weights("grail", signal, adv, spans, mask).weights_BT
    assert w.weights_BT[boxed].std(unbiased=False) > w_rel[boxed].std(unbiased=False)


@pytest.mark.parametrize("method", ["random", "entropy"])
def test_to_answer_applies_to_the_controls(method):
    signal, adv, spans, mask = _spans_batch()
    default = _weights(method, signal, adv, spans, mask, torch.Generator().manual_seed(1)).weights_BT
    scoped = _weights(method, signal, adv, spans, mask, torch.Generator().manual_seed(1),
                      zscore_scope="to_answer").weights_BT
    grail = _weights("grail", signal, adv, spans, mask, zscore_scope="to_answer").weights_BT
    reason = spans.reasoning_BT
    assert not torch.allclose(default[reason], scoped[reason])
    for i in range(4):  # random: GRAIL's to_answer weights of the row, permuted; entropy: the same pipeline
        torch.testing.assert_close(scoped[i][reason[i]].sort().values, grail[i][reason[i]].sort().values)


# ---------------------------------------------------------------------------------------------------------------
# weight_rescale="row_mean"
# ---------------------------------------------------------------------------------------------------------------

def test_row_mean_rescaled_invariants():
    signal, mask, g = random_batch(4, B=8, T=12)
    w = torch.where(mask, 0.5 + 4.5 * torch.rand(8, 12, generator=g), 0.0)
    w[2] = mask[2].float()  # a uniform row
    w[3] = 0.0  # an all-zero row (w_min = 0 settings)
    out = core.row_mean_rescaled(w, mask)
    real = mask.any(1)
    means = (out * mask).sum(1) / mask.sum(1).clamp(min=1)
    for i in range(8):
        if real[i] and i != 3:
            assert means[i].item() == pytest.approx(1.0, abs=1e-6), i
            ratio = out[i][mask[i]] / w[i][mask[i]]
            torch.testing.assert_close(ratio, ratio[0].expand_as(ratio))  # one factor per row: shape kept
    assert torch.equal(out[2], w[2])  # uniform: unchanged, exactly
    assert torch.equal(out[3], w[3]) and torch.all(out[~mask] == 0)
    perm = torch.randperm(12, generator=g)
    full = torch.ones(8, 12, dtype=torch.bool)
    torch.testing.assert_close(core.row_mean_rescaled(w[:, perm], full), core.row_mean_rescaled(w, full)[:, perm])


@pytest.mark.parametrize("method", sorted(METHODS))
def test_row_mean_gives_every_row_mean_weight_one_and_grpos_mean_advantage(method):
    signal, adv, spans, mask = _spans_batch()
    base = _weights(method, signal, adv, spans, mask, torch.Generator().manual_seed(2))
    out = _weights(method, signal, adv, spans, mask, torch.Generator().manual_seed(2), weight_rescale="row_mean")
    w = out.weights_BT
    n = mask.sum(1).float()
    torch.testing.assert_close((w * mask).sum(1) / n, torch.ones(4))
    adv_BT = core.token_advantages(adv, w)
    torch.testing.assert_close((adv_BT.abs() * mask).sum(1) / n, adv.abs())  # mean |Â| = |A| per row
    d = weight_diagnostics(w, adv, mask, spans.reasoning_BT, out.normalised_BT, weight_min=0.5, weight_max=5.0)
    assert d["adv_scale_ratio"].item() == pytest.approx(1.0, abs=1e-6)
    # it is a rescale of the method's own weights (same draws for the random control): one factor per row
    torch.testing.assert_close(w, core.row_mean_rescaled(base.weights_BT, mask), atol=0, rtol=0)
    assert torch.all(w[~mask] == 0)
    base_means = (base.weights_BT * mask).sum(1) / n
    spec = METHODS[method]
    if spec.rows == "saliency":  # GRAIL's pipeline (the release's weights): mean > 1 on every row with a box
        assert torch.all(base_means[spans.has_box_B] > 1.05)
    elif spec.preserves_mass:  # GRPO is uniform; OAR's, EAPO's, span masking's rows keep their mass
        torch.testing.assert_close(w, base.weights_BT)
    if spec.rows != "advantaged":  # methods that read the box leave the row without one uniform, exactly
        assert torch.equal(w[2], mask[2].float())


def test_random_control_under_row_mean_permutes_the_rescaled_grail_weights():
    """The row mean does not depend on the order of a row's values, so rescaling after the permutation (what the
    code does) is the permutation of GRAIL's rescaled weights."""
    signal, adv, spans, mask = _spans_batch()
    grail = _weights("grail", signal, adv, spans, mask, weight_rescale="row_mean").weights_BT
    random = _weights("random", signal, adv, spans, mask, torch.Generator().manual_seed(3),
                      weight_rescale="row_mean").weights_BT
    reason = spans.reasoning_BT
    for i in range(4):
        torch.testing.assert_close(random[i][reason[i]].sort().values, grail[i][reason[i]].sort().values)
        torch.testing.assert_close(random[i][~reason[i]], grail[i][~reason[i]])
    assert not torch.equal(random[reason], grail[reason])  # it did permute


def test_clip_counts_under_row_mean_count_the_clipping_itself():
    """Rescaled weights leave the bounds, so the clip fractions read clip_BT; on GRAIL's own weights (no rescale)
    that gives the value-based count."""
    signal, adv, spans, mask = _spans_batch()
    signal = torch.where(spans.reasoning_BT & (torch.arange(10) < 2), 0.0, signal)  # a few low clips
    for method in ("grail", "random"):
        plain = _weights(method, signal, adv, spans, mask, torch.Generator().manual_seed(0))
        scaled = _weights(method, signal, adv, spans, mask, torch.Generator().manual_seed(0),
                          weight_rescale="row_mean")
        args = (adv, core.token_advantages(adv, plain.weights_BT), mask, spans.reasoning_BT, plain.normalised_BT)
        by_value = weight_sums(plain.weights_BT, *args, weight_min=0.5, weight_max=5.0)
        by_clip = weight_sums(scaled.weights_BT, *args, weight_min=0.5, weight_max=5.0, clip_BT=scaled.clip_BT)
        assert by_value["clip_low"].item() > 0
        assert (by_clip["clip_low"].item(), by_clip["clip_high"].item()) == (by_value["clip_low"].item(),
                                                                             by_value["clip_high"].item())


# ---------------------------------------------------------------------------------------------------------------
# weights/reasoning_std
# ---------------------------------------------------------------------------------------------------------------

def test_reasoning_std_pools_unequal_batches_like_the_concatenated_batch():
    signal, mask, g = random_batch(6, B=11, T=19)
    w = core.saliency_weights(signal, mask, **{**RELEASE, "weight_std": 1.5})
    adv = torch.randint(-2, 3, (11,), generator=g).float()
    reasoning = mask & (torch.arange(19)[None, :] < torch.randint(0, 20, (11, 1), generator=g))

    def sums(rows):
        return weight_sums(w[rows], adv[rows], core.token_advantages(adv[rows], w[rows]), mask[rows], reasoning[rows],
                           mask[rows], weight_min=0.5, weight_max=5.0)

    first, second = sums(slice(0, 2)), sums(slice(2, 11))  # 2 rows and 9 rows
    pooled = finish({k: torch.maximum(first[k], second[k]) if k == "max" else first[k] + second[k] for k in first})
    described = reasoning & ((adv != 0) & mask.any(1))[:, None]
    direct = w[described].double().std(unbiased=False).item()  # the concatenated batch's tokens
    assert pooled["reasoning_std"].item() == pytest.approx(direct, abs=1e-6)
    halves = [finish(first)["reasoning_std"].item(), finish(second)["reasoning_std"].item()]
    assert direct != pytest.approx(sum(halves) / 2, abs=1e-4)  # the test can tell pooling from averaging


def test_trainer_logs_reasoning_std_and_honours_both_options(tiny_dir, tmp_path):
    from batches import loss_and_grads, make_trainer, trl_batch
    from grail.training.trainer import GRAILTrainer

    for options in ({}, {"weight_rescale": "row_mean", "zscore_scope": "to_answer"}):
        trainer = make_trainer(GRAILTrainer, tiny_dir, tmp_path / str(len(options)), token_weighting="grail",
                               rollout_symmetry="both", saliency_path="separate", **options)
        inputs = trl_batch(trainer.processing_class)
        loss_and_grads(trainer, inputs)
        w, metrics = trainer.last_token_weights, trainer._metrics["train"]
        mask, adv = inputs["completion_mask"].bool(), inputs["advantages"]
        reasoning = w.reasoning_BT & mask & (adv != 0)[:, None]
        direct = w.weights_BT[reasoning].double().std(unbiased=False).item()
        assert metrics["weights/reasoning_std"][-1] == pytest.approx(direct, abs=1e-6)
        row_means = (w.weights_BT * mask).sum(1) / mask.sum(1)
        if options:
            torch.testing.assert_close(row_means, torch.ones(4))
            assert metrics["weights/adv_scale_ratio"][-1] == pytest.approx(1.0, abs=1e-6)
            assert metrics["weights/mean"][-1] == pytest.approx(1.0, abs=1e-6)
        else:
            assert metrics["weights/adv_scale_ratio"][-1] > 1.0  # the release's scale: answer tokens at w_max


def test_the_functional_api_honours_both_options(tokenizer):
    from grail.methods.weighting import grail_weights, oar_g_weights
    from grail.models.tiny import build_tiny_model

    model = build_tiny_model(tokenizer, seed=0).eval()
    p = tokenizer(["Q: 1+2\nA:", "Q: 5-1\nA:"], return_tensors="pt", padding=True, padding_side="left",
                  add_special_tokens=False)
    c = tokenizer([" 1+2=3. \\boxed{3} ok", " 5-1=4. 4-1=3. \\boxed{3}"], return_tensors="pt", padding=True,
                  padding_side="right", add_special_tokens=False)
    args = (model, tokenizer, p["input_ids"], p["attention_mask"], c["input_ids"], c["attention_mask"],
            torch.tensor([-1.0, -0.5]))
    mask = c["attention_mask"].bool()
    release = grail_weights(*args)
    w = grail_weights(*args, weight_rescale="row_mean", zscore_scope="to_answer")
    torch.testing.assert_close((w * mask).sum(1) / mask.sum(1), torch.ones(2))
    assert torch.all((release * mask).sum(1) / mask.sum(1) > 1.05)  # the release's scale, for contrast
    with pytest.raises(ValueError, match="zscore_scope"):
        oar_g_weights(*args, zscore_scope="to_answer")


# ---------------------------------------------------------------------------------------------------------------
# permute_weights: any method's own permutation null
# ---------------------------------------------------------------------------------------------------------------

def test_grail_with_permuted_weights_is_the_random_control_exactly():
    signal, adv, spans, mask = _spans_batch()
    for rescale in ("none", "row_mean"):
        random = _weights("random", signal, adv, spans, mask, torch.Generator().manual_seed(5), rollout_symmetry="both",
                          weight_rescale=rescale).weights_BT
        grail = _weights("grail", signal, adv, spans, mask, torch.Generator().manual_seed(5), rollout_symmetry="both",
                         weight_rescale=rescale, permute_weights=True).weights_BT
        assert torch.equal(grail, random)


@pytest.mark.parametrize("method", sorted(m for m, s in METHODS.items() if s.probe is not None and not s.permutes))
def test_permuted_weights_keep_each_rows_reasoning_multiset_and_everything_else(method):
    signal, adv, spans, mask = _spans_batch()
    base = _weights(method, signal.abs().nan_to_num(0.0), adv, spans, mask, torch.Generator().manual_seed(1),
                    rollout_symmetry="both").weights_BT
    out = _weights(method, signal.abs().nan_to_num(0.0), adv, spans, mask, torch.Generator().manual_seed(1),
                   rollout_symmetry="both", permute_weights=True).weights_BT
    reason = spans.reasoning_BT & mask
    for i in range(4):
        torch.testing.assert_close(out[i][reason[i]].sort().values, base[i][reason[i]].sort().values)
        assert torch.equal(out[i][~reason[i]], base[i][~reason[i]])
    varied = [i for i in range(4) if base[i][reason[i]].unique().numel() > 1]
    assert varied and any(not torch.equal(out[i], base[i]) for i in varied)  # it did permute


@pytest.mark.parametrize("method, why", [("random", "already permuted"), ("none", "does nothing"),
                                         ("top_entropy", "does nothing")])
def test_permute_weights_is_refused_where_it_means_nothing(method, why):
    with pytest.raises(ValueError, match=why):
        checked(WeightingOptions(token_weighting=method, permute_weights=True))
