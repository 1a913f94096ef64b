"""TRL's side of the seam, read from TRL's source: an upgrade that changes how `_compute_loss` consumes the advantage
fails here by name, before it can silently turn token credit into GRPO. Each frozen set below is what TRL 1.16 does;
a change means: read the new code, decide whether it takes a (B, T) advantage, add or change the row of
grail.options.trl_matrix (and its test in tests/test_trl_matrix.py), then update the set."""

import ast
import inspect
import textwrap

import torch
from trl import GRPOTrainer

from batches import loss_and_grads, make_trainer, trl_batch
from grail.options.trl_matrix import LOSS_TYPES, TRL_OPTIONS

TREE = ast.parse(textwrap.dedent(inspect.getsource(GRPOTrainer._compute_loss)))
FIX = ("read TRL's new _compute_loss, decide whether it takes a (B, T) advantage, update grail.options.trl_matrix "
       "and tests/test_trl_matrix.py, then this set")

# the functions TRL hands the advantage tensor to (both take (B, T): the matrix's off-policy-mask and vespo rows)
ADVANTAGE_CONSUMERS = {"self.get_gamma_weights", "self.get_off_policy_mask"}
# every trainer attribute and config field the loss reads
LOSS_READS = {
    "_entropy_bonus_enabled", "_entropy_window_stats", "_get_per_token_logps_and_entropies", "_last_world_entropy",
    "_metrics", "accelerator", "args", "aux_loss_enabled", "beta", "current_gradient_accumulation_steps",
    "entropy_coef", "epsilon_high", "epsilon_low", "get_gamma_weights", "get_high_entropy_mask",
    "get_off_policy_mask", "importance_sampling_level", "loss_type", "max_completion_length", "model",
    "off_policy_mask_threshold", "router_aux_loss_coef", "top_entropy_quantile", "use_adaptive_entropy", "use_vllm",
    "vllm_importance_sampling_correction",
    "args.delta", "args.entropy_coef_delta", "args.entropy_coef_max", "args.entropy_coef_min", "args.entropy_target",
    "args.sapo_temperature_neg", "args.sapo_temperature_pos", "args.steps_per_generation",
    "args.use_bias_correction_kl", "args.vespo_k_neg", "args.vespo_k_pos", "args.vespo_lambda_neg",
    "args.vespo_lambda_pos"}
# the batch entries the loss reads (`advantages` is the one the subclass fills)
BATCH_READS = {"advantages", "completion_ids", "completion_mask", "importance_sampling_ratio", "num_items_in_batch",
               "old_per_token_logps", "prompt_ids", "prompt_mask", "ref_per_token_logps", "sampling_per_token_logps",
               "tool_mask", "image_grid_thw", "image_position_ids", "image_sizes", "mm_token_type_ids", "num_images",
               "num_tiles", "pixel_attention_mask", "pixel_values", "spatial_shapes", "token_type_ids"}


def _names(node) -> set[str]:
    return {ast.unparse(n) for n in ast.walk(node)}


def test_trls_loss_hands_the_advantage_to_no_new_function():
    consumers = {ast.unparse(n.func) for n in ast.walk(TREE) if isinstance(n, ast.Call)
                 and any(isinstance(v, ast.Name) and v.id == "advantages"
                         for v in [*n.args, *(k.value for k in n.keywords)])}
    assert consumers == ADVANTAGE_CONSUMERS, f"TRL's loss now hands the advantage to {consumers}: {FIX}"


def test_trls_loss_reads_no_new_option_and_no_new_batch_entry():
    reads = set()
    for n in ast.walk(TREE):
        if isinstance(n, ast.Attribute) and ast.unparse(n.value) == "self":
            reads.add(n.attr)
        if isinstance(n, ast.Attribute) and ast.unparse(n.value) == "self.args":
            reads.add(f"args.{n.attr}")
    assert reads == LOSS_READS, f"TRL's loss reads {sorted(reads ^ LOSS_READS)} differently: {FIX}"
    entries = {n.slice.value for n in ast.walk(TREE) if isinstance(n, ast.Subscript)
               and ast.unparse(n.value) == "inputs" and isinstance(n.slice, ast.Constant)}
    entries |= {n.args[0].value for n in ast.walk(TREE) if isinstance(n, ast.Call)
                and ast.unparse(n.func) == "inputs.get"}
    assert entries == BATCH_READS, f"TRL's loss reads batch entries {sorted(entries ^ BATCH_READS)} otherwise: {FIX}"
    assert "advantages" in entries, "TRL's loss no longer reads inputs['advantages'], the entry GRAILTrainer fills"


def test_trls_loss_types_are_the_matrixs():
    types = {c.value for n in ast.walk(TREE) if isinstance(n, ast.Compare) and ast.unparse(n.left) == "self.loss_type"
             for comparator in n.comparators for c in ast.walk(comparator)
             if isinstance(c, ast.Constant) and isinstance(c.value, str)}
    assert types == set(LOSS_TYPES), f"TRL's loss types are {sorted(types)}, the matrix's {sorted(LOSS_TYPES)}: {FIX}"


def test_trl_applies_no_liger_loss():
    """The matrix's use_liger_kernel row: TRL 1.16 keeps Liger's fused linear cross-entropy off, so the loss that
    reads the advantage stays TRL's own."""
    init = inspect.getsource(GRPOTrainer.__init__)
    assert '"fused_linear_cross_entropy": False' in init, f"TRL changed how it applies Liger: {FIX}"
    assert "liger" not in _names(TREE).__repr__().lower(), f"TRL's loss now calls Liger: {FIX}"
    assert any(row.name == "use_liger_kernel" for row in TRL_OPTIONS)


def test_trls_loss_takes_a_per_token_advantage_as_is_and_a_per_row_one_broadcast(tiny_dir, tmp_path):
    """(B,) and the same values broadcast to (B, T) give one loss; zeroing one token's advantage changes it (TRL
    reads the (B, T) tensor per token, without reducing it to a row)."""
    trainer = make_trainer(GRPOTrainer, tiny_dir, tmp_path)
    batch = trl_batch(trainer.processing_class)
    adv_B = batch["advantages"]
    adv_BT = adv_B[:, None].expand_as(batch["completion_mask"]).clone()
    per_row, _ = loss_and_grads(trainer, batch)
    per_token, _ = loss_and_grads(trainer, {**batch, "advantages": adv_BT})
    torch.testing.assert_close(per_token, per_row, rtol=0, atol=0)
    adv_BT[0, 0] = 0.0
    changed, _ = loss_and_grads(trainer, {**batch, "advantages": adv_BT})
    assert not torch.allclose(changed, per_row), "TRL's loss ignored a per-token change of the advantage"
