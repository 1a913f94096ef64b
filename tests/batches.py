"""Trainers and one TRL batch for the trainer tests: the embedded tokenizer's text, in TRL's layout."""

import torch
from datasets import Dataset

from grail.evaluation.rewards import exact_int_reward
from grail.methods.table import method_spec, scoped_values
from grail.training.config import GRAILConfig
from grail.training.trainer import GRAILTrainer

PROMPTS = ["Q: 1+2\nA:", "Q: 3*4\nA:", "Q: 5-1\nA:", "Q: 2+2\nA:"]
# rows 0 and 2 have a box; advantages: one correct and one wrong row with a box
COMPLETIONS = [" 1+2=3. \\boxed{3}", " 3*4=1", " 5-1=4. 4-1=3. \\boxed{3}", " 2+2"]


def trl_batch(tokenizer, prompts=PROMPTS, completions=COMPLETIONS):
    """Four rows in TRL's layout (prompts left-padded, completions right-padded) with advantages 0.5, -0.5, -0.25,
    0.25."""
    p = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    c = tokenizer(completions, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False)
    return {"prompt_ids": p["input_ids"], "prompt_mask": p["attention_mask"], "completion_ids": c["input_ids"],
            "completion_mask": c["attention_mask"], "advantages": torch.tensor([0.5, -0.5, -0.25, 0.25]),
            "num_items_in_batch": c["attention_mask"].sum()}


def loss_and_grads(trainer, inputs):
    trainer.current_gradient_accumulation_steps = 1
    trainer.model.train()  # metrics go to the 'train' bucket, as inside trainer.train()
    trainer.model.zero_grad(set_to_none=True)
    loss = trainer._compute_loss(trainer.model, inputs)
    loss.backward()
    if isinstance(trainer, GRAILTrainer):  # what log() does once per logging step
        trainer.reduce_weight_metrics("train")
    return loss.detach(), [p.grad.clone() for p in trainer.model.parameters() if p.grad is not None]


def make_trainer(cls, tiny_dir, tmp_path, loss_type="dr_grpo", peft_config=None, **fields):
    """A trainer on the tiny model; `fields` are config fields, less the option fields its method does not read (the
    tests loop over methods with shared options, as `grail compare` does)."""
    fields = scoped_values(fields, method_spec(fields.get("token_weighting", "none")))
    args = GRAILConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=2,
                       max_completion_length=24, loss_type=loss_type, report_to="none", beta=0.0, **fields)
    dataset = Dataset.from_list([{"prompt": "Q: 1+1\nA:", "answer": "2"}] * 4)
    extra = {"peft_config": peft_config} if peft_config is not None else {}
    return cls(model=str(tiny_dir), reward_funcs=[exact_int_reward], args=args, train_dataset=dataset, **extra)


def assert_same(a, b, atol=0.0):
    (loss_a, grads_a), (loss_b, grads_b) = a, b
    assert any(g.abs().sum() > 0 for g in grads_b)  # a real gradient, not a vacuous comparison
    torch.testing.assert_close(loss_a, loss_b, rtol=0, atol=atol)
    assert len(grads_a) == len(grads_b)
    for g, g_ref in zip(grads_a, grads_b, strict=True):
        torch.testing.assert_close(g, g_ref, rtol=0, atol=atol)
