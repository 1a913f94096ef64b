"""`GRAILTrainer`: TRL's `GRPOTrainer` handed a (B, T) token advantage Â = w · A.

The subclass only chooses weights. TRL 1.16's `_compute_loss` accepts a (B, T) `advantages` tensor (it
unsqueezes (B,) ones), so we compute weights for the micro-batch, replace `inputs["advantages"]`, and call
the parent: clipping, loss aggregation (`loss_type`), KL, masking of truncated completions and every
other TRL option stay TRL's. Because this runs per micro-batch and per reuse pass (`num_iterations`),
methods that depend on the current policy see the current policy, as in the GRAIL release.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from trl import GRPOTrainer

from grail.core import advantage_scale_ratio, masked_mean, token_advantages, uniform_weights

# (trainer, model, inputs, mask_BT) -> weights_BT. One entry per `token_weighting` choice; a test keeps the
# keys equal to GRAILConfig's Literal.
WeightFn = Callable[["GRAILTrainer", torch.nn.Module, dict, torch.Tensor], torch.Tensor]
WEIGHTINGS: dict[str, WeightFn] = {
    "none": lambda trainer, model, inputs, mask_BT: uniform_weights(mask_BT),
}


class GRAILTrainer(GRPOTrainer):
    """GRPOTrainer whose policy-gradient advantage is per token: Â_{i,t} = w_{i,t} · A_i."""

    @staticmethod
    def real_token_mask(inputs: dict) -> torch.Tensor:
        """(B, T) bool: completion tokens that enter TRL's loss (tool-output tokens excluded, as TRL does)."""
        mask_BT = inputs["completion_mask"].bool()
        if "tool_mask" in inputs:
            mask_BT = mask_BT & inputs["tool_mask"].bool()
        return mask_BT

    def token_weights(self, model, inputs: dict, mask_BT: torch.Tensor) -> torch.Tensor:
        """(B, T) detached weights for this micro-batch, chosen by `args.token_weighting`."""
        # No no_grad here: gradient-based methods run their own autograd probe; weights leave detached.
        return WEIGHTINGS[self.args.token_weighting](self, model, inputs, mask_BT).detach()

    def _compute_loss(self, model, inputs):
        adv_B = inputs["advantages"]
        if adv_B.dim() != 1:
            raise RuntimeError("GRAILTrainer expects TRL's (B,) advantages; another subclass already made "
                               "them per token.")
        mask_BT = self.real_token_mask(inputs)
        weights_BT = self.token_weights(model, inputs, mask_BT)
        adv_BT = token_advantages(adv_B, weights_BT)  # (B, T)
        self._log_weights(adv_B, adv_BT, weights_BT, mask_BT)
        return super()._compute_loss(model, {**inputs, "advantages": adv_BT})

    def _log_weights(self, adv_B, adv_BT, weights_BT, mask_BT) -> None:
        mode = "train" if self.model.training else "eval"
        metrics = self._metrics[mode]
        gathered = self.accelerator.gather(torch.stack([
            masked_mean(weights_BT, mask_BT), advantage_scale_ratio(adv_B, adv_BT, mask_BT)
        ]).reshape(1, 2)).mean(0)
        metrics["weights/mean"].append(gathered[0].item())
        metrics["weights/adv_scale_ratio"].append(gathered[1].item())
