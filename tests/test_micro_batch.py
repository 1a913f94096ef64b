"""Splitting a step's loss into micro-batches changes no number: the same 8 completions trained as one micro-batch of 8
or as 4 accumulated micro-batches of 2 (what the real-model presets pick to bound memory) give the same losses and,
after 2 optimiser steps, the same parameters to float rounding. TRL generates the whole rollout at once in both cases
(steps_per_generation = gradient_accumulation_steps), the paper's dr_grpo loss divides each micro-batch by its rows x
max_completion_length and the accumulation by the number of micro-batches, and GRAIL's weights are per row."""

import pytest
import torch
from datasets import Dataset

from grail.training.config import GRAILConfig
from grail.training.trainer import GRAILTrainer

PROMPTS = ["Q: 3+4*5\nA:", "Q: 7*2-9\nA:"]
ANSWERS = ["35", "5"]


def alternating_reward(completions, **kwargs):
    """1, 0, 1, 0, ... down the rollout: every group mixed, so GRAIL probes (the policy is not under test)."""
    return [float(i % 2 == 0) for i in range(len(completions))]


def _train(model_dir, out, method: str, micro_batch: int, accumulation: int, **fields):
    args = GRAILConfig(**{**dict(output_dir=str(out), per_device_train_batch_size=micro_batch,
                                 gradient_accumulation_steps=accumulation, num_generations=8, max_completion_length=32,
                                 max_steps=2, optim="sgd", learning_rate=1e-2, loss_type="dr_grpo",
                                 scale_rewards="none", beta=0.0, report_to="none", save_strategy="no",
                                 logging_steps=1, temperature=1.0, seed=3, use_cpu=True, bf16=False,
                                 token_weighting=method), **fields})  # fields win
    dataset = Dataset.from_list([{"prompt": p, "answer": a} for p, a in zip(PROMPTS, ANSWERS, strict=True)])
    trainer = GRAILTrainer(model=str(model_dir), reward_funcs=[alternating_reward], args=args,
                           train_dataset=dataset)
    before = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return before, dict(trainer.model.named_parameters()), losses, trainer


@pytest.mark.parametrize("method", ["none", "grail"])
def test_four_micro_batches_of_two_train_exactly_as_one_of_eight(warm_cache, tmp_path, method):
    start, whole, whole_losses, whole_trainer = _train(warm_cache[1], tmp_path / "whole", method, 8, 1)
    _, split, split_losses, split_trainer = _train(warm_cache[1], tmp_path / "split", method, 2, 4)
    assert split_trainer.args.steps_per_generation == 4 and whole_trainer.args.steps_per_generation == 1
    assert len(whole_losses) == len(split_losses) == 2
    torch.testing.assert_close(torch.tensor(split_losses), torch.tensor(whole_losses), rtol=1e-5, atol=1e-7)
    moved = 0
    for name, value in whole.items():
        torch.testing.assert_close(split[name], value, rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
        moved += int(not torch.equal(value, start[name]))
    assert moved > len(whole) // 2  # the steps trained: most tensors changed (a comparison of two no-ops passes)
    if method == "grail":  # the probe ran, on the same share of rows in both runs
        probed = [[e["weights/probed_rows"] for e in t.state.log_history if "weights/probed_rows" in e]
                  for t in (whole_trainer, split_trainer)]
        assert probed[0] == pytest.approx(probed[1]) and max(probed[0]) > 0
