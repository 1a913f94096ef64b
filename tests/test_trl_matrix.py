"""Every row of the TRL option matrix (grail.options.trl_matrix), on the tiny model: with the row's option set,
uniform weights reproduce TRL's own GRPOTrainer (loss and gradients), a non-uniform w gives the loss and gradients of
the reference written from the option's formula (tests/trl_reference.py), and a refused row stops the config, and
`grail train` with exit 2, before any model is loaded."""

import math

import pytest
import torch
from datasets import Dataset
from trl import GRPOTrainer

from batches import assert_same, loss_and_grads, trl_batch
from grail.cli import main
from grail.evaluation.rewards import exact_int_reward
from grail.options.trl_matrix import LOSS_TYPES, RATIO_GRADIENT_LOSSES, TRL_OPTIONS, refusal
from grail.training import trainer as trainer_module
from grail.training.config import GRAILConfig
from grail.training.trainer import GRAILTrainer
from trl_reference import reference_loss

LOSS_ROWS = [row for row in TRL_OPTIONS if row.tested == "loss" and row.support == "supported"]
REFUSED = [row for row in TRL_OPTIONS if row.support == "refused"]
ROLLOUT_ROWS = [row for row in TRL_OPTIONS if row.tested == "rollout"]


def _trainer(cls, tiny_dir, tmp_path, setting, reward=exact_int_reward, **fields):
    args = GRAILConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=2,
                       max_completion_length=fields.pop("max_completion_length", 24), report_to="none",
                       **{"loss_type": "dr_grpo", "beta": 0.0, **setting, **fields})
    dataset = Dataset.from_list([{"prompt": "Q: 1+1\nA:", "answer": "2"}] * 4)
    return cls(model=str(tiny_dir), reward_funcs=[reward], args=args, train_dataset=dataset)


def _forward(trainer, batch, grad):
    """TRL's own per-token log-probs and entropies of the batch's completions (its model call, not its loss)."""
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    with torch.set_grad_enabled(grad):
        logps, entropies, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, attention, batch["completion_ids"].shape[1], compute_entropy=True)
    return logps, entropies


def _batch(trainer):
    """TRL's layout with every entry an option reads: old log-probs a reuse pass away from the policy (ratios
    e^(±0.15), so clipping, δ and the soft gates act), reference log-probs, and a sampler ratio."""
    batch = trl_batch(trainer.processing_class)
    g = torch.Generator().manual_seed(7)
    logps, _ = _forward(trainer, batch, grad=False)
    noise = lambda: 0.15 * torch.randn(logps.shape, generator=g)  # noqa: E731
    sampler_ratio = torch.where(batch["completion_mask"].bool(), torch.exp(noise()).clamp(max=1.2), 1.0)
    batch.update(old_per_token_logps=logps + noise(), ref_per_token_logps=logps + noise(),
                 importance_sampling_ratio=sampler_ratio)  # 1 on padding, where no token was sampled
    return batch


def _weights(mask_BT):
    g = torch.Generator().manual_seed(11)
    return (0.2 + 2.8 * torch.rand(mask_BT.shape, generator=g)) * mask_BT


def test_the_matrix_covers_every_loss_type_and_each_row_once():
    names = [row.name for row in TRL_OPTIONS]
    assert len(names) == len(set(names))
    assert {row.setting["loss_type"] for row in TRL_OPTIONS if row.name.startswith("loss_type=")} == set(LOSS_TYPES)
    assert all(row.support in ("supported", "refused") and row.tested in ("loss", "rollout", "seam") and row.source
               for row in TRL_OPTIONS)
    for row in TRL_OPTIONS:  # the table and the config's refusal are one fact
        assert (refusal(row.setting, "grail") is not None) == (row.support == "refused"), row.name


@pytest.mark.parametrize("row", LOSS_ROWS, ids=[row.name for row in LOSS_ROWS])
def test_a_supported_option_is_trls_loss_at_w_1_and_its_formula_at_any_w(tiny_dir, tmp_path, monkeypatch, row):
    grpo = _trainer(GRPOTrainer, tiny_dir, tmp_path, row.setting)
    grail = _trainer(GRAILTrainer, tiny_dir, tmp_path, row.setting)
    for trainer in (grpo, grail):
        for name, value in {**row.extra, "_last_world_entropy": 0.0}.items():
            setattr(trainer, name, value)
    batch = _batch(grail)
    uniform = loss_and_grads(grail, batch)
    assert_same(uniform, loss_and_grads(grpo, batch))

    weights_BT = _weights(batch["completion_mask"])
    real = trainer_module.token_weights

    def fixed(*args, **kwargs):
        weights = real(*args, **kwargs)
        weights.weights_BT = weights_BT.clone()
        return weights

    monkeypatch.setattr(trainer_module, "token_weights", fixed)
    coef, grail._last_world_entropy = grail.entropy_coef, 0.0  # the adaptive schedule's state now (it moved)
    loss, grads = loss_and_grads(grail, batch)
    grail.model.zero_grad(set_to_none=True)
    logps, entropies = _forward(grail, batch, grad=True)
    want = reference_loss(grail.args, logps, entropies, batch, weights_BT * batch["advantages"][:, None],
                          use_vllm=bool(row.extra.get("use_vllm")), entropy_coef=coef, last_world_entropy=0.0)
    want.backward()
    want_grads = [p.grad for p in grail.model.parameters() if p.grad is not None]
    assert_same((loss, grads), (want.detach(), want_grads), atol=1e-6)
    assert not torch.allclose(loss, uniform[0]), "the weights did not change the loss: the check is vacuous"


@pytest.mark.parametrize("row", REFUSED, ids=[row.name for row in REFUSED])
@pytest.mark.parametrize("loss_type", RATIO_GRADIENT_LOSSES)
def test_a_refused_option_stops_the_config_naming_both_options_and_the_fix(row, loss_type):
    setting = {**row.setting, "loss_type": loss_type}
    with pytest.raises(ValueError) as err:
        GRAILConfig(output_dir="unused", token_weighting="grail", **setting)
    assert all(f"{name}={value!r}" in str(err.value) for name, value in setting.items())
    assert "importance_sampling_level='token'" in str(err.value)  # the fix
    GRAILConfig(output_dir="unused", token_weighting="none", **setting)  # GSPO itself stays available


def test_grail_train_exits_2_on_a_refused_option_before_loading_a_model(tmp_path, capsys, monkeypatch):
    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded before the refusal")

    monkeypatch.setattr(GRAILTrainer, "__init__", no_model)
    run = tmp_path / "run"
    argv = ["train", "--max_steps", "1", "--output_dir", str(run), "--token_weighting", "grail",
            "--importance_sampling_level", "sequence", "--loss_type", "dapo"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert last.startswith("grail: error:") and "importance_sampling_level='sequence'" in last
    assert not run.exists() or not any(run.iterdir())


def test_why_sequence_level_ratios_are_refused_token_weights_reach_only_each_rows_mean(tiny_dir, tmp_path):
    """TRL's own loss at the sequence level: two token advantages with the same row means give the same gradient,
    at the token level they do not."""
    for level, same in (("sequence", True), ("token", False)):
        grpo = _trainer(GRPOTrainer, tiny_dir, tmp_path, {"importance_sampling_level": level})
        batch = _batch(grpo)
        weights_BT = _weights(batch["completion_mask"])
        shuffled_BT = weights_BT.clone()  # each row's weights reversed over its own tokens: same row means
        for i, row in enumerate(batch["completion_mask"].bool()):
            shuffled_BT[i, row] = weights_BT[i, row].flip(0)
        results = [loss_and_grads(grpo, {**batch, "advantages": w * batch["advantages"][:, None]})
                   for w in (weights_BT, shuffled_BT)]
        close = all(torch.allclose(a, b, atol=1e-6) for a, b in zip(results[0][1], results[1][1], strict=True))
        assert close == same, level


def _varied_reward(completions, **kwargs):
    return [float(sum(map(ord, str(c))) % 3) for c in completions]


@pytest.mark.parametrize("row", ROLLOUT_ROWS, ids=[row.name for row in ROLLOUT_ROWS])
def test_an_option_that_acts_on_the_rollout_leaves_grails_rollout_trls(tiny_dir, tmp_path, row):
    outputs = {}
    for cls in (GRPOTrainer, GRAILTrainer):
        trainer = _trainer(cls, tiny_dir, tmp_path, row.setting, reward=_varied_reward, max_completion_length=6)
        torch.manual_seed(0)
        outputs[cls] = trainer._generate_and_score_completions(
            [{"prompt": p, "answer": "2"} for p in ("Q: 1+1\nA:", "Q: 1+1\nA:", "Q: 2+3\nA:", "Q: 2+3\nA:")])
    trl, ours = outputs[GRPOTrainer], outputs[GRAILTrainer]
    for key in ("completion_ids", "completion_mask", "advantages"):
        torch.testing.assert_close(ours[key], trl[key], rtol=0, atol=0)
    if "mask_truncated_completions" in row.setting:
        assert (trl["completion_mask"].sum(-1) == 0).any(), "no truncated row: the check is vacuous"
    if "scale_rewards" in row.setting:
        assert trl["advantages"].abs().sum() > 0, "every advantage is 0: the check is vacuous"


def test_a_masked_row_gets_no_weight_and_no_advantage(tiny_dir, tmp_path):
    """What mask_truncated_completions hands the subclass: a row whose completion mask is all 0. GRAIL's probe and
    pipeline must leave it out (no NaN reaching the loss): the loss and gradients are those with its advantage 0."""
    grail = _trainer(GRAILTrainer, tiny_dir, tmp_path, {}, token_weighting="grail")
    batch = _batch(grail)
    batch["completion_mask"] = batch["completion_mask"].clone()
    batch["completion_mask"][0] = 0
    loss, grads = loss_and_grads(grail, batch)
    assert math.isfinite(loss.item()) and all(torch.isfinite(g).all() for g in grads)
    advantages = batch["advantages"].clone()
    advantages[0] = 0.0
    assert_same((loss, grads), loss_and_grads(grail, {**batch, "advantages": advantages}))
