"""GRAIL's saliency divided by the token's surprise (`--token_weighting grail_over_surprise`).

Why: on real models GRAIL's saliency s_t = ‖∂ℓ/∂h ⊙ h‖₂ (ℓ the answer's NLL, h the leaf at the position that
predicts token t) tracks how much the token surprised the model: it ranks inserted filler words above the arithmetic
(docs/results/credit-lands.md, credit-screen.md). This method divides the surprise out:

    signal_t = s_t / (σ_t + c),   σ_t = −log π(y_t | y_<t) at the sampling temperature,   c = grail_over_surprise_offset

σ_t is read at the same predicting position as s_t. The offset c (0.1 nats by default) keeps a near-certain token
(σ → 0) from dividing by 0 and keeps the map smooth and monotone in σ. The signal then goes through GRAIL's own
pipeline (log → per-row z-score → affine map → clip, the answer-span overrides, GRAIL's rows), where the division is a
subtraction: log s_t − log(σ_t + c). So its weights have GRAIL's form and differ only in where the credit goes.

Cost: GRAIL's. Fused with TRL's forward (the default where GRAIL fuses), σ_t is TRL's own log-prob of the token,
already computed for the loss: the method adds nothing to GRAIL's fused cost but an element-wise division. The
separate probe (`saliency_path: separate`, and wherever GRAIL cannot fuse) runs GRAIL's forward and backward and the
output layer at every completion position without a graph.

Found by screening nine candidates against position-held-fixed label sets on the warm-started SmolLM2 (0.70 and
0.71 against inserted filler and the solution's own frame words, where GRAIL scores 0.28 and 0.43); its result on a
fresh seed and both families is on docs/results/credit-fresh.md.
"""

from __future__ import annotations

import torch

from grail.methods import probes
from grail.methods.builtin import GRAIL_PROBE_READS, SALIENCY_READS, saliency_pipeline
from grail.methods.spec import MethodOption, MethodSpec, ProbeBatch
from grail.options.choices import WeightingOptions

__all__ = ["SPEC", "over_surprise"]

OFFSET = "grail_over_surprise_offset"


def over_surprise(saliency_BT: torch.Tensor, surprise_BT: torch.Tensor, options: WeightingOptions) -> torch.Tensor:
    """(B, T) s / (max(σ, 0) + c): 0 where the saliency is 0 (padding, rows not probed)."""
    return saliency_BT / (surprise_BT.clamp(min=0) + options.method_options[OFFSET])


def _probe(model, rows: ProbeBatch, options: WeightingOptions, generator) -> torch.Tensor:
    saliency_BT, surprise_BT = probes.answer_nll_saliency(
        model, rows.input_ids_BL, rows.attention_mask_BL, rows.answer_BT, temperature=options.temperature,
        leaf=options.saliency_leaf, with_surprise=True)
    return over_surprise(saliency_BT, surprise_BT, options)


SPEC = MethodSpec(
    "grail_over_surprise", "GRAIL / surprise", _probe, saliency_pipeline, rows="saliency", fuse="saliency",
    per_surprise=over_surprise, reads=SALIENCY_READS + GRAIL_PROBE_READS, preserves_mass=False,
    options=(MethodOption(OFFSET, 0.1, "c in s / (−log π(token) + c), nats: keeps near-certain tokens from dividing "
                          "by 0", minimum=1e-6),),
    title="GRAIL's saliency divided by the token's surprise (s / (−log π(token) + c))",
    summary="GRAIL's gradient × activation saliency of the answer's NLL at the predicting position, divided by the "
            "token's surprise −log π(token) + c read at the same position, through GRAIL's pipeline: GRAIL with the "
            "surprise that its saliency tracks taken out (grail-rl's own signal, chosen by a position-fixed screen).",
    example="grail_over_surprise_offset=0.5",
    cost="as GRAIL's: fused, an element-wise division by TRL's own log-probs; separate, GRAIL's forward and "
         "backward plus the output layer at every completion position without a graph",
    reference="grail-rl (the credit-signal screen, docs/results/credit-screen.md); the saliency: Pala et al. 2026, "
              "arXiv 2606.04889 (GRAIL)",
)
