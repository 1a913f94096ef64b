"""The seam to TRL (grail/training/trainer.py, S1-S4), checked against TRL's real `_prepare_inputs` and `compute_loss`.

A TRL upgrade that changes any of these behaviours fails here, by name, instead of silently training with the
wrong advantages. The spy subclass only records; the training code under test is GRAILTrainer's and TRL's own.
"""

import pytest
import torch
from datasets import Dataset
from trl import GRPOTrainer

from grail.methods.table import TokenWeights
from grail.methods.weighting import batch_spans
from grail.training.config import GRAILConfig
from grail.training.trainer import SPAN_KEYS, GRAILTrainer

PROMPTS = ["Q: 3+4*5\nA:", "Q: 7*2-9\nA:", "Q: 9-5*3\nA:", "Q: 6+8-7\nA:"]  # two-step problems, as trained
ANSWERS = ["35", "5", "12", "7"]
GENERATIONS, MICRO_BATCH, STEPS_PER_GENERATION = 4, 8, 2  # 16 rows per rollout, two micro-batches


def alternating_reward(completions, **kwargs):
    """1, 0, 1, 0, ... down the rollout, so every group of GENERATIONS rows holds both signs of advantage. The seam
    is under test here, not the policy: how many of 16 samples a 200-step warm start gets right differs from one CPU
    to another (a CI runner once drew 16 wrong answers at seed 3, leaving every advantage 0 and nothing to probe)."""
    return [float(i % 2 == 0) for i in range(len(completions))]


class SpyTrainer(GRAILTrainer):
    """Records what TRL hands between the seam's methods; changes nothing."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.rollouts, self.events = [], []

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        output["spy_row"] = torch.arange(len(output["completion_ids"]))  # an extra key, like ours (S1)
        self.rollouts.append({k: v.clone() for k, v in output.items() if isinstance(v, torch.Tensor)})
        return output

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        result = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        self.events.append(("forward", result))
        return result


def _trainer(model_dir, tmp_path, cls=SpyTrainer, **fields):
    args = GRAILConfig(output_dir=str(tmp_path), per_device_train_batch_size=MICRO_BATCH, num_generations=GENERATIONS,
                       steps_per_generation=STEPS_PER_GENERATION, max_completion_length=32, report_to="none",
                       temperature=1.0, seed=3, **fields)
    dataset = Dataset.from_list([{"prompt": p, "answer": a} for p, a in zip(PROMPTS, ANSWERS, strict=True)])
    trainer = cls(model=str(model_dir), reward_funcs=[alternating_reward], args=args, train_dataset=dataset)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = STEPS_PER_GENERATION
    return trainer


def _generation_batch():
    """What TRL's repeat sampler hands `_prepare_inputs`: each prompt `GENERATIONS` times, 16 rows in all."""
    rows = [{"prompt": p, "answer": a} for p, a in zip(PROMPTS, ANSWERS, strict=True)]
    return [row for row in rows for _ in range(GENERATIONS)]


def _micro_batches(trainer):
    """TRL's real `_prepare_inputs` for one rollout's micro-batches (it generates on the first)."""
    trainer._step, trainer._buffered_inputs = 0, None
    batches = []
    for _ in range(STEPS_PER_GENERATION):
        batches.append(trainer._prepare_inputs(_generation_batch()))
        trainer._step += 1
    return batches


def test_s1_extra_keys_survive_the_shuffle_and_split_row_aligned(warm_cache, tmp_path):
    """Our spans and rollout weights travel in the batch dict; after TRL shuffles and splits it, every row of every
    micro-batch still carries its own completion's entries (weights_from=rollout_policy, the rollout-time path)."""
    trainer = _trainer(warm_cache[1], tmp_path, token_weighting="grail", weights_from="rollout_policy",
                       rollout_symmetry="both")
    batches = _micro_batches(trainer)
    (rollout,) = trainer.rollouts
    assert sorted(torch.cat([b["spy_row"] for b in batches]).tolist()) == list(range(2 * MICRO_BATCH))
    stored = [k for k in rollout if k.startswith("grail_")]
    assert set(SPAN_KEYS) <= set(stored) and any(k.startswith(TokenWeights.BATCH_PREFIX) for k in stored)
    for batch in batches:
        assert len(batch["completion_ids"]) == MICRO_BATCH
        rows = batch["spy_row"]
        for key in ["completion_ids", "advantages", *stored]:
            assert torch.equal(batch[key], rollout[key][rows]), key
        # the spans a micro-batch carries are the spans of its own completions
        spans = batch_spans(trainer.tokenizer, batch["completion_ids"], trainer.real_token_mask(batch),
                            trainer.weighting)
        for key, value in zip(SPAN_KEYS, spans, strict=True):
            assert torch.equal(batch[key], value), key
    # the warm-started policy closes boxes and every group is mixed: the weights are not trivially uniform
    has_box, adv = rollout["grail_tw_has_box_B"], rollout["advantages"]
    assert has_box.any() and (adv != 0).any()
    loss = trainer.compute_loss(trainer.model, batches[0])
    assert torch.isfinite(loss) and trainer.last_token_weights.path == "rollout"
    torch.testing.assert_close(trainer.last_token_weights.weights_BT, batches[0][TokenWeights.BATCH_PREFIX
                                                                                 + "weights_BT"])


def test_s2_a_per_token_advantage_passes_through_trls_loss(warm_cache, tmp_path):
    """TRL's loss takes (B, T) advantages as is: A broadcast over T gives exactly the (B,) loss, and doubling one
    token's advantage changes it."""
    trainer = _trainer(warm_cache[1], tmp_path)
    batch = _micro_batches(trainer)[0]
    adv_B = batch["advantages"]
    assert (adv_B != 0).any()
    T = batch["completion_ids"].shape[1]

    def trl_loss(advantages):
        return GRPOTrainer._compute_loss(trainer, trainer.model, {**batch, "advantages": advantages}).detach()

    assert torch.equal(trl_loss(adv_B[:, None].expand(-1, T).clone()), trl_loss(adv_B))
    bumped = adv_B[:, None].expand(-1, T).clone()
    row = int((adv_B != 0).nonzero()[0])
    bumped[row, 0] *= 2
    assert not torch.equal(trl_loss(bumped), trl_loss(adv_B))


class _ReadLog(dict):
    def __init__(self, inputs, events):
        super().__init__(inputs)
        self.events = events

    def __getitem__(self, key):
        if key == "advantages":
            self.events.append(("advantages", None))
        return super().__getitem__(key)


def test_s3_one_forward_returning_three_values_before_advantages_are_read(warm_cache, tmp_path):
    """Inside TRL's `_compute_loss`, the log-prob method runs exactly once, on the micro-batch, returns
    (logps, entropies, aux_loss), and `advantages` is read only after it."""
    trainer = _trainer(warm_cache[1], tmp_path)
    batch = _micro_batches(trainer)[0]
    trainer.events.clear()
    GRPOTrainer._compute_loss(trainer, trainer.model, _ReadLog(batch, trainer.events))
    kinds = [kind for kind, _ in trainer.events]
    assert kinds == ["forward", "advantages"]
    logps, entropies, _ = trainer.events[0][1]
    assert logps.shape == entropies.shape == batch["completion_ids"].shape


def test_the_fused_path_runs_through_trls_real_compute_loss(warm_cache, tmp_path):
    """GRAIL's fused path inside TRL's public compute_loss: one forward, Â written before TRL reads it (the
    run-time checks of S3 pass), the same weights as the separate pass."""
    fused = _trainer(warm_cache[1], tmp_path, token_weighting="grail", rollout_symmetry="both")
    batch = _micro_batches(fused)[0]
    fused.events.clear()
    fused.compute_loss(fused.model, batch)
    assert [kind for kind, _ in fused.events] == ["forward"]
    assert fused.last_token_weights.path == "fused" and fused.last_token_weights.probed_B.any()
    separate = _trainer(warm_cache[1], tmp_path, token_weighting="grail", rollout_symmetry="both",
                        saliency_path="separate")
    separate.compute_loss(separate.model, batch)
    torch.testing.assert_close(fused.last_token_weights.weights_BT, separate.last_token_weights.weights_BT,
                               atol=1e-4, rtol=1e-4)


def test_the_fused_path_stops_when_trl_reads_the_advantages_first(warm_cache, tmp_path, monkeypatch):
    """If a TRL version read `advantages` before its forward, the weights would silently not apply: it stops."""
    trainer = _trainer(warm_cache[1], tmp_path, token_weighting="grail", rollout_symmetry="both")
    batch = _micro_batches(trainer)[0]
    real = GRPOTrainer._compute_loss

    def reads_early(self, model, inputs):
        inputs["advantages"]
        return real(self, model, inputs)

    monkeypatch.setattr(GRPOTrainer, "_compute_loss", reads_early)
    with pytest.raises(RuntimeError, match="did not read the advantages"):
        trainer.compute_loss(trainer.model, batch)


def test_s4_metric_lists_are_averaged_and_cleared_by_log(warm_cache, tmp_path):
    """`log()` pools the accumulated weight statistics into TRL's metric lists, TRL averages them into the log
    record and clears the lists."""
    trainer = _trainer(warm_cache[1], tmp_path, token_weighting="grail", rollout_symmetry="both")
    for batch in _micro_batches(trainer):
        trainer.compute_loss(trainer.model, batch)
    assert "weights/mean" not in trainer._metrics["train"]  # nothing reduced yet: no host sync in the loss
    records = []
    monkeypatched = trainer.callback_handler.on_log
    trainer.callback_handler.on_log = lambda args, state, control, logs: records.append(dict(logs)) or \
        monkeypatched(args, state, control, logs)
    trainer.log({})
    (record,) = records
    assert {"weights/mean", "weights/probed_rows", "weights/fused", "reward"} <= set(record)
    assert record["weights/fused"] == 1.0
    assert not trainer._metrics["train"]


def test_the_pinned_trl_field_names_are_trls():
    """grail.options.trl_fields lists GRPOConfig's fields so that registration can refuse a shadowing method option
    without importing TRL; a TRL upgrade that adds or renames a field must update it."""
    from dataclasses import fields

    from trl import GRPOConfig

    from grail.options.trl_fields import TRL_CONFIG_FIELDS

    assert TRL_CONFIG_FIELDS == {f.name for f in fields(GRPOConfig)}
