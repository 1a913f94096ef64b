r"""Where did an update go? The mean log-probability a model gives the critical tokens and the contrast tokens (filler
or format words) of labelled rows, teacher-forced on each row's reference solution.

Read for a trained model and for the start it began from, the two numbers say which tokens training made more likely:
an update that went to the reasoning raises log π of the operators and results more than of the words around them.
`grail compare` records them for every final model and every start (`logp/critical`, `logp/contrast`; paired across
arms by seed, the arms' differences from GRPO are where each method's update went that GRPO's did not). On the
counterbalanced label sets (`grail.analysis.saliency.counterbalanced`) both classes occupy the same positions across a
group's layouts, so a change that depends on position alone moves both means alike.

    logp_c = (1 / |C|) Σ_{n ∈ C} log π(y_n | prompt, y_<n),   C = the critical tokens of every reference trace
    logp_f = the same over the contrast tokens

at temperature 1 (the model's own distribution). Tokens are labelled as the saliency AUROC labels them
(`grail.analysis.saliency.quality.teacher_forced_traces`); unlabelled tokens and the answer box do not count.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from grail.analysis.saliency.quality import SaliencyQualityOptions, teacher_forced_traces, trace_batch
from grail.analysis.saliency.token_labels import CRITICAL, FILLER
from grail.methods.output_layer import token_logprobs_BT
from grail.methods.probes import completion_mask_BT, hidden_states_BLD
from grail.methods.sharding import unsharded
from grail.methods.spans import align_to_completion

__all__ = ["LabelLogprobs", "completion_logprobs_BT", "label_logprobs"]


@dataclass(frozen=True)
class LabelLogprobs:
    """Mean log π over the critical and over the contrast tokens of the reference traces, and their counts."""

    critical: float
    contrast: float
    n_critical: int
    n_contrast: int

    def as_metrics(self, prefix: str = "logp") -> dict[str, float]:
        """{"logp/critical": ..., "logp/contrast": ...}, as `grail compare` records them."""
        return {f"{prefix}/critical": self.critical, f"{prefix}/contrast": self.contrast}


@torch.no_grad()
def completion_logprobs_BT(model, input_ids_BL: torch.Tensor, attention_mask_BL: torch.Tensor,
                           num_completion_tokens: int, chunk_positions: int = 1024) -> torch.Tensor:
    """(B, T) float32 log π(y_t | y_<t) at temperature 1 of each completion token (TRL's layout: the last T columns),
    0 on padding; the output layer runs on at most `chunk_positions` positions at a time."""
    T = num_completion_tokens
    mask_BT = completion_mask_BT(attention_mask_BL, T)
    targets_BT = align_to_completion(input_ids_BL, T, at="token")
    with unsharded(model):
        hidden_BTD = align_to_completion(hidden_states_BLD(model, attention_mask_BL, input_ids=input_ids_BL), T,
                                         at="predicting")
        return token_logprobs_BT(model, hidden_BTD, mask_BT, targets_BT, 1.0, chunk_positions)


def label_logprobs(model, tokenizer, rows: Sequence[dict], options: SaliencyQualityOptions | None = None
                   ) -> LabelLogprobs:
    """`LabelLogprobs` of `model` on the reference traces of `rows` (saliency rows,
    `grail.analysis.saliency.token_labels`); `options`: the tracing settings (batch_size, answer_box; its `traces`
    is set to "reference"). The model is put in eval mode for the call, then restored."""
    options = replace(options or SaliencyQualityOptions(), traces="reference")
    traces = teacher_forced_traces(tokenizer, rows, options)
    device = next(model.parameters()).device
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    sums = {CRITICAL: 0.0, FILLER: 0.0}
    counts = {CRITICAL: 0, FILLER: 0}
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(traces), options.batch_size):
            ids_BL, attn_BL, mask_BT, labels_BT = trace_batch(traces[start:start + options.batch_size], pad_id,
                                                              device)
            logp_BT = completion_logprobs_BT(model, ids_BL, attn_BL, mask_BT.shape[1]).double().cpu()
            for kind in sums:
                keep_BT = labels_BT == kind
                sums[kind] += float(logp_BT[keep_BT].sum())
                counts[kind] += int(keep_BT.sum())
    finally:
        model.train(was_training)
    return LabelLogprobs(sums[CRITICAL] / counts[CRITICAL], sums[FILLER] / counts[FILLER], counts[CRITICAL],
                         counts[FILLER])
