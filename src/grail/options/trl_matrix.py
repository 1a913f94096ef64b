"""Which of TRL's GRPOConfig options work with a per-token advantage Â = w · A, which are refused, and why.

TRL's `_compute_loss` takes `inputs["advantages"]` as (B,) or (B, T); grail-rl always hands it (B, T). Every option of
TRL 1.16 that reads or reshapes the advantage, or changes how the per-token loss is aggregated, is one row of
`TRL_OPTIONS`: what it does to Â, whether grail-rl supports it, and where its formula comes from. The rows are the one
source of three things: the config's refusal (`refusal`, called by `GRAILConfig` before any model is loaded), the
tests (tests/test_trl_matrix.py builds each row's `setting` and checks it against TRL's own trainer and against a
reference written from `source`), and the docs table (docs/reference/trl-options.md, generated from these rows).

The weights are never negative (`weight_min >= 0`), so sign(Â_t) = sign(A) wherever w_t > 0: the loss types and
options that branch on the advantage's sign (sapo, vespo, the off-policy mask) take each token down its row's branch,
and a token with w_t = 0 contributes nothing to the policy term whichever branch it takes.

`tested` says how a row is checked: "loss" (TRL's loss on one batch: uniform w reproduces `GRPOTrainer`, a
non-uniform w matches the reference), "rollout" (the option acts before the subclass sees the batch; the rollout
must equal `GRPOTrainer`'s), "seam" (nothing to run on a CPU; a guard on TRL's source keeps the row true). No torch
here: the docs build reads this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["LOSS_TYPES", "RATIO_GRADIENT_LOSSES", "TRLOption", "TRL_OPTIONS", "refusal"]

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo", "cispo", "sapo", "vespo")  # every loss_type of TRL 1.16
# the loss types whose gradient flows through the importance ratio (clipped or soft-gated), not through log π directly
RATIO_GRADIENT_LOSSES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo", "sapo")


@dataclass(frozen=True)
class TRLOption:
    """One row of the matrix: `setting` (GRPOConfig values) switches the option on; `support` is "supported" or
    "refused" (then `refusal` names the condition); `why` is what the option does to Â; `source` is where the formula
    the tests check comes from; `tested` is "loss", "rollout" or "seam" (module docstring)."""

    name: str
    setting: Mapping[str, object]
    support: str
    why: str
    source: str
    tested: str = "loss"
    extra: Mapping[str, object] = field(default_factory=dict)  # test-only values (e.g. an attribute vLLM would set)


_CLIP = "The loss -min(r_t Â_t, clip(r_t, 1-ε_low, 1+ε_high) Â_t) per token"
TRL_OPTIONS: tuple[TRLOption, ...] = (
    TRLOption("loss_type=grpo", {"loss_type": "grpo"}, "supported",
              f"{_CLIP}; each row's mean over its tokens, then the mean over rows.",
              "DeepSeekMath, arXiv 2402.03300; TRL's `loss_type` help"),
    TRLOption("loss_type=bnpo", {"loss_type": "bnpo"}, "supported",
              f"{_CLIP}; summed over the micro-batch's tokens, over their count.", "TRL's `loss_type` help"),
    TRLOption("loss_type=dr_grpo", {"loss_type": "dr_grpo"}, "supported",
              f"{_CLIP}; summed, over rows × max_completion_length.",
              "Dr. GRPO, arXiv 2503.20783; TRL's `loss_type` help"),
    TRLOption("loss_type=dapo", {"loss_type": "dapo"}, "supported",
              f"{_CLIP}; summed, over the generation batch's token count (`num_items_in_batch`).",
              "DAPO, arXiv 2503.14476; TRL's `loss_type` help"),
    TRLOption("loss_type=luspo", {"loss_type": "luspo"}, "supported",
              f"{_CLIP}; each row's sum, then the mean over rows. With importance_sampling_level='token'; the "
              "sequence level LUSPO recommends is refused (below).",
              "LUSPO, arXiv 2602.05261; TRL's `loss_type` help"),
    TRLOption("loss_type=cispo", {"loss_type": "cispo", "epsilon_high": 1.2}, "supported",
              "-sg(min(r_t, ε_high)) · Â_t · log π_t: the clipped ratio is detached, so each token's log-prob gradient "
              "is scaled by its own Â_t; tokens of the generation batch as the normaliser.",
              "MiniMax-M1, arXiv 2506.13585; TRL's `loss_type` help"),
    TRLOption("loss_type=sapo", {"loss_type": "sapo"}, "supported",
              "-σ(τ (r_t - 1)) · 4/τ · Â_t, with τ = τ_pos where Â_t > 0 and τ_neg elsewhere: w ≥ 0 keeps each "
              "token on its row's side; each row's mean, then the mean over rows.",
              "SAPO, arXiv 2511.20347; TRL's `loss_type` help"),
    TRLOption("loss_type=vespo", {"loss_type": "vespo"}, "supported",
              "-φ(w_seq) · Â_t · log π_t, φ a detached Gamma weight of the row's summed log-ratio, its k and λ by the "
              "sign of Â_t: each token's log-prob gradient is scaled by its own Â_t.",
              "VESPO, arXiv 2602.10693; TRL's `get_gamma_weights` docstring"),
    TRLOption("importance_sampling_level=sequence, ratio-gradient loss types",
              {"importance_sampling_level": "sequence", "loss_type": "dr_grpo"}, "refused",
              "GSPO's one ratio per row carries the gradient of every token: the gradient is r_seq · Σ_t Â_t · "
              "mean_t ∇log π_t, so the loss reads only the row's mean of Â and token weights change nothing but the "
              "row's scale. Refused for grpo, bnpo, dr_grpo, dapo, luspo and sapo unless token_weighting='none'.",
              "GSPO, arXiv 2507.18071; TRL's `importance_sampling_level` help"),
    TRLOption("importance_sampling_level=sequence, cispo",
              {"importance_sampling_level": "sequence", "loss_type": "cispo", "epsilon_high": 1.2}, "supported",
              "cispo detaches the ratio, so each token's log-prob gradient keeps its own Â_t (vespo does not read "
              "this option: its φ is sequence-level already).",
              "MiniMax-M1, arXiv 2506.13585; GSPO, arXiv 2507.18071"),
    TRLOption("off_policy_mask_threshold", {"off_policy_mask_threshold": 0.05}, "supported",
              "Keeps a token where Â_t ≥ 0 or its row's mean KL to the sampler is at most the threshold: with w ≥ 0 "
              "that is the row's own mask.",
              "DeepSeek-V3.2, arXiv 2512.02556, eq. 9; TRL's `get_off_policy_mask` docstring"),
    TRLOption("delta (two-sided clipping)", {"delta": 1.05}, "supported",
              "Caps r_t at δ inside the clipped term; acts on the ratio, per token, before Â_t multiplies it.",
              "INTELLECT-2, arXiv 2505.07291; TRL's `delta` help"),
    TRLOption("epsilon_high (clip-higher)", {"epsilon_high": 0.05}, "supported",
              "The upper clip bound 1+ε_high of the ratio, per token.", "DAPO, arXiv 2503.14476 (clip-higher)"),
    TRLOption("top_entropy_quantile", {"top_entropy_quantile": 0.5}, "supported",
              "Multiplies each token's loss by 1 where its entropy is in the top quantile, else 0: a token mask, "
              "applied after Â.", "Beyond the 80/20 Rule, arXiv 2506.01939; TRL's `top_entropy_quantile` help"),
    TRLOption("entropy_coef", {"entropy_coef": 0.01}, "supported",
              "Subtracts coef × the mean entropy over the loss's tokens: independent of Â.",
              "TRL's `entropy_coef` help (L = L_policy - coef · H)"),
    TRLOption("use_adaptive_entropy", {"entropy_coef": 0.01, "use_adaptive_entropy": True}, "supported",
              "The entropy bonus's coefficient follows a schedule of the measured entropy: independent of Â.",
              "Skywork-OR1, arXiv 2505.22312; TRL's `use_adaptive_entropy` help"),
    TRLOption("num_iterations > 1", {"num_iterations": 2}, "supported",
              "A reused batch has r_t ≠ 1; weights_from='current_policy' recomputes w at every pass, "
              "'rollout_policy' weights ride with the batch. Checked at a ratio away from 1.",
              "DeepSeekMath, arXiv 2402.03300 (μ iterations per batch)"),
    TRLOption("mask_truncated_completions", {"mask_truncated_completions": True}, "supported",
              "TRL zeroes a truncated row's completion mask when it scores the rollout, before the subclass sees it; "
              "the row then gets no weight and no Â.", "DAPO, arXiv 2503.14476 (overlong filtering)",
              tested="rollout"),
    TRLOption("vllm_importance_sampling_correction", {"vllm_importance_sampling_correction": True}, "supported",
              "Multiplies each token's loss by the detached sampler ratio (truncated or masked) after Â; vLLM cannot "
              "run on a CPU, so the test sets `use_vllm` on the built trainer and hands the ratio in the batch.",
              "TRL's `vllm_importance_sampling_mode` help (TIS/MIS)", extra={"use_vllm": True}),
    TRLOption("scale_rewards", {"scale_rewards": "batch"}, "supported",
              "Scales A when the rollout is scored, before the subclass sees it; Â = w · A of TRL's A.",
              "TRL's `scale_rewards` help; Dr. GRPO, arXiv 2503.20783 (no std scaling)", tested="rollout"),
    TRLOption("beta > 0 (KL to the reference)", {"beta": 0.04}, "supported",
              "Adds β × the per-token KL (k3, times the ratio with use_bias_correction_kl) after Â: independent of w.",
              "DeepSeekMath, arXiv 2402.03300; TRL's `use_bias_correction_kl` help"),
    TRLOption("use_liger_kernel", {"use_liger_kernel": True}, "supported",
              "TRL 1.16 applies Liger's layer kernels only (it refuses Liger's fused linear cross-entropy), so the "
              "loss that reads Â is TRL's own. Not run on a CPU (Liger needs Triton); the seam guard fails if TRL's "
              "loss hands the advantage to a new function.", "TRL 1.16 GRPOTrainer.__init__ (`use_liger_kernel`)",
              tested="seam"),
)


def refusal(values: Mapping[str, object], token_weighting: str) -> str | None:
    """Why TRL options `values` (GRPOConfig field values) cannot carry token_weighting's per-token advantage, naming
    both options and the fix; None when they can (`TRL_OPTIONS`)."""
    level, loss = values.get("importance_sampling_level", "token"), values.get("loss_type")
    if level == "sequence" and loss in RATIO_GRADIENT_LOSSES and token_weighting != "none":
        return (f"importance_sampling_level='sequence' with loss_type={loss!r} and "
                f"token_weighting={token_weighting!r}: one importance ratio per row carries every token's gradient, "
                f"so the loss reads only the row's mean of the token advantage and the method's weights would change "
                f"nothing but each row's scale; use importance_sampling_level='token', or loss_type='cispo' or "
                f"'vespo' (their ratio is detached), or token_weighting='none' for GSPO itself")
    return None
