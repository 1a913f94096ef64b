"""GRAILTrainer hands TRL a (B, T) advantage: with uniform weights it IS TRL's GRPO loss and gradient."""

import pytest
import torch
from datasets import Dataset
from trl import GRPOTrainer

from grail import trainer as trainer_module
from grail.config import GRAILConfig
from grail.rewards import exact_int_reward
from grail.trainer import GRAILTrainer


def _inputs(tokenizer):
    prompts = ["Q: 1+2\nA:", "Q: 3*4\nA:", "Q: 5-1\nA:", "Q: 2+2\nA:"]
    completions = [" 1+2=3. \\boxed{3}", " 3*4=1", " 5-1=4. \\boxed{4}", " 2+2"]
    p = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    c = tokenizer(completions, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False)
    return {"prompt_ids": p["input_ids"], "prompt_mask": p["attention_mask"], "completion_ids": c["input_ids"],
            "completion_mask": c["attention_mask"], "advantages": torch.tensor([0.5, -0.5, 0.25, -0.25]),
            "num_items_in_batch": c["attention_mask"].sum()}


def _loss_and_grads(trainer, inputs):
    trainer.current_gradient_accumulation_steps = 1
    trainer.model.train()  # metrics go to the 'train' bucket, as inside trainer.train()
    trainer.model.zero_grad()
    loss = trainer._compute_loss(trainer.model, inputs)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in trainer.model.parameters() if p.grad is not None]


def _trainers(tiny_dir, tmp_path, loss_type):
    args = GRAILConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=2,
                       max_completion_length=24, loss_type=loss_type, report_to="none", beta=0.0)
    dataset = Dataset.from_list([{"prompt": "Q: 1+1\nA:", "answer": "2"}] * 4)
    make = lambda cls: cls(model=str(tiny_dir), reward_funcs=[exact_int_reward], args=args,  # noqa: E731
                           train_dataset=dataset)
    return make(GRPOTrainer), make(GRAILTrainer)


@pytest.mark.parametrize("loss_type", ["dr_grpo", "dapo", "grpo"])
def test_uniform_weighting_reproduces_trl_grpo_exactly(tiny_dir, tmp_path, loss_type):
    grpo, grail = _trainers(tiny_dir, tmp_path, loss_type)
    inputs = _inputs(grail.processing_class)
    loss_ref, grads_ref = _loss_and_grads(grpo, inputs)
    loss, grads = _loss_and_grads(grail, inputs)
    assert any(g.abs().sum() > 0 for g in grads_ref)  # a real gradient, not a vacuous comparison
    torch.testing.assert_close(loss, loss_ref, rtol=0, atol=0)
    for g, g_ref in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(g, g_ref, rtol=0, atol=0)
    assert grail._metrics["train"]["weights/mean"] == [1.0]
    assert grail._metrics["train"]["weights/adv_scale_ratio"] == [pytest.approx(1.0)]


def test_the_weights_reach_trls_loss(tiny_dir, tmp_path, monkeypatch):
    """Doubling every weight doubles the dr_grpo loss at ratio 1 (the loss is linear in Â there)."""
    _, grail = _trainers(tiny_dir, tmp_path, "dr_grpo")
    inputs = _inputs(grail.processing_class)
    loss_uniform, _ = _loss_and_grads(grail, inputs)
    monkeypatch.setitem(trainer_module.WEIGHTINGS, "none", lambda tr, model, inp, mask_BT: 2.0 * mask_BT.float())
    loss_doubled, _ = _loss_and_grads(grail, inputs)
    torch.testing.assert_close(loss_doubled, 2 * loss_uniform)
    assert grail._metrics["train"]["weights/mean"][-1] == 2.0
