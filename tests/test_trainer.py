"""GRAILTrainer hands TRL a (B, T) advantage: uniform weights ARE TRL's GRPO loss and gradient; the fused
saliency equals the separate pass; weights reach the loss; guards keep the loss finite."""

import pytest
import torch
from datasets import Dataset
from trl import GRPOTrainer

from batches import assert_same, loss_and_grads, make_trainer, trl_batch
from grail.evaluation.rewards import exact_int_reward
from grail.methods import probes
from grail.training import trainer as trainer_module
from grail.training.trainer import GRAILTrainer

LOSS_TYPES = ["dr_grpo", "dapo", "grpo", "bnpo"]


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_uniform_weighting_reproduces_trl_grpo_exactly(tiny_dir, tmp_path, loss_type):
    grpo = make_trainer(GRPOTrainer, tiny_dir, tmp_path, loss_type)
    grail = make_trainer(GRAILTrainer, tiny_dir, tmp_path, loss_type)
    inputs = trl_batch(grail.processing_class)
    assert_same(loss_and_grads(grail, inputs), loss_and_grads(grpo, inputs))
    assert grail._metrics["train"]["weights/mean"] == [1.0]
    assert grail._metrics["train"]["weights/adv_scale_ratio"] == [pytest.approx(1.0)]


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("path", ["fused", "separate"])
def test_grail_with_constant_weights_reproduces_trl_grpo(tiny_dir, tmp_path, loss_type, path):
    """w_mean = w_min = w_max = 1: GRAIL runs its saliency probe (fused: a gradient query on the very graph the
    loss backpropagates through) yet every weight is 1, so loss and gradients must be TRL's exactly."""
    grpo = make_trainer(GRPOTrainer, tiny_dir, tmp_path, loss_type)
    grail = make_trainer(GRAILTrainer, tiny_dir, tmp_path, loss_type, token_weighting="grail", rollout_symmetry="both",
                     weight_min=1.0, weight_max=1.0, saliency_path=path)
    inputs = trl_batch(grail.processing_class)
    assert_same(loss_and_grads(grail, inputs), loss_and_grads(grpo, inputs))
    assert grail.last_token_weights.path == path
    assert grail.last_token_weights.probed_B.tolist() == [True, False, True, False]  # rows with a box and A ≠ 0


def test_constant_saliency_gives_w_mean_and_grpo_without_a_box(tiny_dir, tmp_path, monkeypatch):
    """Constant saliency → z = 0 → w_mean on the normalised tokens; with no box anywhere GRAIL is GRPO."""
    grpo = make_trainer(GRPOTrainer, tiny_dir, tmp_path)
    grail = make_trainer(GRAILTrainer, tiny_dir, tmp_path, token_weighting="grail", saliency_path="separate",
                     rollout_symmetry="both")
    monkeypatch.setattr(probes, "answer_nll_saliency", lambda model, ids, attn, answer, **kw: torch.full(
        answer.shape, 3.0))
    inputs = trl_batch(grail.processing_class)
    loss_and_grads(grail, inputs)
    w = grail.last_token_weights
    assert torch.equal(w.weights_BT[w.normalised_BT], torch.ones(int(w.normalised_BT.sum())))
    no_box = {**inputs, "completion_ids": inputs["completion_ids"].clone()}
    boxed = grail.tokenizer.convert_tokens_to_ids("\\boxed{")
    no_box["completion_ids"][no_box["completion_ids"] == boxed] = grail.tokenizer.convert_tokens_to_ids("x")
    assert_same(loss_and_grads(grail, no_box), loss_and_grads(grpo, no_box))


@pytest.mark.parametrize("method, leaf, span", [
    ("grail", "embeddings", "box"), ("grail", "middle", "box"), ("grail", "embeddings", "content"),
    ("entropy", "embeddings", "box"), ("entropy", "middle", "box"),
    ("grail_over_surprise", "embeddings", "box"), ("grail_over_surprise", "middle", "content"),
])
def test_fused_equals_separate(tiny_dir, tmp_path, method, leaf, span):
    """The fused path (signal from TRL's forward) gives the separate pass's weights to 1e-5 (fp32, no dropout),
    with the release's answer NLL over the whole box (`box`) and over the content only."""
    results = {}
    for path in ("fused", "separate"):
        trainer = make_trainer(GRAILTrainer, tiny_dir, tmp_path, token_weighting=method, saliency_leaf=leaf,
                           rollout_symmetry="both", saliency_path=path, answer_nll_span=span)
        # A freshly initialised model's next-token entropies are all ≈ log V (spread ~1e-3), and the per-row
        # z-score would amplify 1e-6 rounding differences to 1e-4; larger embeddings make the signal vary.
        # (Not much larger: entropies below ~1e-6 are rounding-dominated in float32, TRL's kernel more so.)
        with torch.no_grad():
            trainer.model.get_input_embeddings().weight.mul_(3.0)
        results[path] = (loss_and_grads(trainer, trl_batch(trainer.processing_class)), trainer.last_token_weights)
    (fused, w_fused), (separate, w_separate) = results["fused"], results["separate"]
    assert w_fused.path == "fused" and w_separate.path == "separate"
    normalised = w_separate.normalised_BT
    assert normalised.sum() >= 10  # the comparison covers real saliency-weighted tokens
    assert w_separate.weights_BT[normalised].std() > 0.02  # ... whose weights vary (≫ the 1e-5 tolerance)
    torch.testing.assert_close(w_fused.weights_BT, w_separate.weights_BT, rtol=0, atol=1e-5)
    assert_same(fused, separate, atol=1e-5)


@pytest.mark.parametrize("path", ["fused", "separate"])
def test_grail_with_permuted_weights_trains_as_the_random_control(tiny_dir, tmp_path, path):
    """permute_weights reaches the trainer's weights on both paths: GRAIL's weights shuffled with the run's own
    generator are the random control's, token for token, and so is the loss."""
    results = {}
    for name, fields in (("random", {}), ("grail", {"permute_weights": True})):
        trainer = make_trainer(GRAILTrainer, tiny_dir, tmp_path / name, token_weighting=name, saliency_path=path,
                               rollout_symmetry="both", **fields)
        results[name] = (loss_and_grads(trainer, trl_batch(trainer.processing_class)), trainer.last_token_weights)
    (random_out, w_random), (grail_out, w_grail) = results["random"], results["grail"]
    assert w_grail.path == path and w_random.path == path
    assert torch.equal(w_grail.weights_BT, w_random.weights_BT)
    assert_same(grail_out, random_out, atol=0)


def test_fused_probe_writes_no_parameter_grad(tiny_dir, tmp_path):
    trainer = make_trainer(GRAILTrainer, tiny_dir, tmp_path, token_weighting="grail", saliency_path="fused")
    trainer.current_gradient_accumulation_steps = 1
    trainer.model.train()
    trainer.model.zero_grad(set_to_none=True)
    loss = trainer._compute_loss(trainer.model, trl_batch(trainer.processing_class))
    assert trainer.last_token_weights.path == "fused" and loss.requires_grad
    assert all(p.grad is None for p in trainer.model.parameters())


def test_the_weights_reach_trls_loss(tiny_dir, tmp_path, monkeypatch):
    """Doubling every weight doubles the dr_grpo loss at ratio 1 (the loss is linear in Â there)."""
    grail = make_trainer(GRAILTrainer, tiny_dir, tmp_path)
    inputs = trl_batch(grail.processing_class)
    loss_uniform, _ = loss_and_grads(grail, inputs)
    real = trainer_module.token_weights

    def doubled(*args, **kwargs):
        weights = real(*args, **kwargs)
        weights.weights_BT = 2.0 * weights.weights_BT
        return weights

    monkeypatch.setattr(trainer_module, "token_weights", doubled)
    loss_doubled, _ = loss_and_grads(grail, inputs)
    torch.testing.assert_close(loss_doubled, 2 * loss_uniform)
    assert grail._metrics["train"]["weights/mean"][-1] == 2.0


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 0.0])
def test_bad_saliency_falls_back_to_uniform_and_is_counted(tiny_dir, tmp_path, monkeypatch, bad):
    grail = make_trainer(GRAILTrainer, tiny_dir, tmp_path, token_weighting="grail", saliency_path="separate",
                     rollout_symmetry="both")
    monkeypatch.setattr(probes, "answer_nll_saliency", lambda model, ids, attn, answer, **kw: torch.full(
        answer.shape, bad))
    loss, grads = loss_and_grads(grail, trl_batch(grail.processing_class))
    assert torch.isfinite(loss) and all(torch.isfinite(g).all() for g in grads)
    w = grail.last_token_weights
    assert w.fallback_B.tolist() == [True, False, True, False]
    mask = trl_batch(grail.processing_class)["completion_mask"].bool()
    assert torch.equal(w.weights_BT[w.fallback_B], mask[w.fallback_B].float())
    assert grail._metrics["train"]["weights/fallback_rows"] == [2.0]


def test_rollout_policy_weights_are_stored_with_the_batch(tiny_dir, tmp_path):
    """weights_from=rollout_policy: weights computed once after generation travel in the batch dict."""
    trainer = make_trainer(GRAILTrainer, tiny_dir, tmp_path, token_weighting="grail", weights_from="rollout_policy",
                       rollout_symmetry="both")
    assert trainer.fused_unavailable is not None
    inputs = trl_batch(trainer.processing_class)
    mask_BT = trainer.real_token_mask(inputs)
    stored = trainer._rollout_weights(inputs, mask_BT, trainer._spans(inputs, mask_BT))
    batch = {**inputs, **stored.as_batch_entries()}
    loss, _ = loss_and_grads(trainer, batch)
    assert trainer.last_token_weights.path == "rollout"
    torch.testing.assert_close(trainer.last_token_weights.weights_BT, stored.weights_BT)
    assert torch.isfinite(loss)


def test_fused_is_refused_where_it_cannot_work(tiny_dir, tmp_path):
    with pytest.raises(ValueError, match="saliency_path='fused' cannot work here: .*rollout"):
        make_trainer(GRAILTrainer, tiny_dir, tmp_path, token_weighting="grail", saliency_path="fused",
                 weights_from="rollout_policy")
    trainer = make_trainer(GRAILTrainer, tiny_dir, tmp_path, token_weighting="grail")
    trainer.model.get_input_embeddings().weight.requires_grad_(False)
    assert "frozen embeddings" in trainer._fused_unavailable_reason()


def test_loss_under_no_grad_uses_the_separate_pass(tiny_dir, tmp_path):
    """TRL evaluates the loss under no_grad (prediction_step): there is no graph to fuse with."""
    trainer = make_trainer(GRAILTrainer, tiny_dir, tmp_path, token_weighting="grail", rollout_symmetry="both")
    trainer.current_gradient_accumulation_steps = 1
    trainer.model.eval()
    with torch.no_grad():
        loss = trainer._compute_loss(trainer.model, trl_batch(trainer.processing_class))
    assert torch.isfinite(loss) and trainer.last_token_weights.path == "separate"
    assert trainer.last_token_weights.probed_B.any()


def test_grail_trainer_needs_a_grail_config(tiny_dir, tmp_path):
    from trl import GRPOConfig

    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=2, use_cpu=True,
                      report_to="none")
    with pytest.raises(TypeError, match="GRAILConfig"):
        GRAILTrainer(model=str(tiny_dir), reward_funcs=[exact_int_reward], args=args,
                     train_dataset=Dataset.from_list([{"prompt": "Q: 1+1\nA:", "answer": "2"}] * 4))


def test_release_diagnostics_are_logged_with_the_release_definitions(tiny_dir, tmp_path):
    trainer = make_trainer(GRAILTrainer, tiny_dir, tmp_path, token_weighting="grail", rollout_symmetry="both",
                       saliency_path="separate")
    inputs = trl_batch(trainer.processing_class)
    loss_and_grads(trainer, inputs)
    w, metrics = trainer.last_token_weights, trainer._metrics["train"]
    mask, adv = inputs["completion_mask"].bool(), inputs["advantages"]
    # Σ|Â| over real tokens / their count, over the mean |A| of all rows (the release's advantage scale ratio)
    expected = (w.weights_BT * adv[:, None]).abs()[mask].sum() / mask.sum() / (adv.abs().mean() + 1e-8)
    assert metrics["weights/release/adv_scale_ratio"][-1] == pytest.approx(expected.item(), rel=1e-6)
    # clip fractions over every real token of the reweighted rows (rows 0 and 2: the rows with a box), box included
    assert w.reweighted_BT.any(1).tolist() == [True, False, True, False]
    assert torch.equal(w.reweighted_BT, w.reweighted_BT.any(1, keepdim=True) & mask)
    n = w.reweighted_BT.sum()
    assert metrics["weights/release/clip_high_frac"][-1] == pytest.approx((((w.clip_BT > 0) & w.reweighted_BT).sum()
                                                                            / n).item())
    assert metrics["weights/release/clip_low_frac"][-1] == pytest.approx((((w.clip_BT < 0) & w.reweighted_BT).sum()
                                                                           / n).item())
    assert n > w.normalised_BT.sum()  # the release's denominator counts the box and post-box tokens too
