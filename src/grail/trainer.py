"""`GRAILTrainer`: TRL's `GRPOTrainer` handed a (B, T) token advantage Â = w · A.

The subclass only chooses weights. TRL 1.16's `_compute_loss` accepts a (B, T) `advantages` tensor (it
unsqueezes (B,) ones), so we compute weights for the micro-batch, replace `inputs["advantages"]`, and call
the parent: clipping, loss aggregation (`loss_type`), KL, masking of truncated completions and every other
TRL option stay TRL's. Weights come from `grail.weighting.token_weights`, the same function the functional API
exposes, in one of three ways:

1. `weights_from="rollout_policy"`: once per rollout batch, right after generation
   (`_generate_and_score_completions`); stored in the batch dict, split and shuffled with it by TRL.
2. `weights_from="current_policy"`, separate path: before each micro-batch's loss, with the current policy
   (every reuse pass sees the policy being trained, as in the GRAIL release).
3. `weights_from="current_policy"`, fused path (`saliency_path`): inside TRL's own forward of the micro-batch.
   `_compute_loss` hands TRL a batch dict whose `advantages` are still (B,); our override of
   `_get_per_token_logps_and_entropies` captures the leaf h with a forward hook, takes the answer NLL as the sum
   of TRL's per-token log-probs over the answer span, gets ∂ℓ/∂h from that graph with `torch.autograd.grad`
   (no parameter `.grad` is written; the graph is retained for the loss), and writes Â into the dict before TRL
   reads `advantages` (TRL 1.16 reads it after the forward). The entropy control reads TRL's entropies.
The answer spans are found once per rollout batch (they depend on the completion ids only).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from accelerate.utils import is_peft_model
from trl import GRPOTrainer

from grail import core, probes
from grail.spans import AnswerSpans, align_to_completion
from grail.weighting import (
    SALIENCY_METHODS,
    SIGNAL_METHODS,
    TokenWeights,
    batch_spans,
    probe_rows,
    token_weights,
)

SPAN_KEYS = tuple(f"spans_{name}" for name in AnswerSpans._fields)
# Metric keys, logged under `weights/`. README "Metrics" explains each.
DIAGNOSTIC_KEYS = ("mean", "max", "clip_low_frac", "clip_high_frac", "adv_scale_ratio", "ess_ratio", "top10_mass")
RELEASE_KEYS = ("clip_low_frac", "clip_high_frac", "adv_scale_ratio")  # weights/release/*: the GRAIL release's own


@dataclass
class _FusedRequest:
    """What `_compute_loss` hands to the forward override for one micro-batch."""

    call_inputs: dict  # the dict TRL's _compute_loss is reading; we write `advantages` into it
    adv_B: torch.Tensor
    mask_BT: torch.Tensor
    spans: AnswerSpans
    done: bool = False


class GRAILTrainer(GRPOTrainer):
    """GRPOTrainer whose policy-gradient advantage is per token: Â_{i,t} = w_{i,t} · A_i."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not hasattr(self.args, "weighting_options"):
            raise TypeError(f"GRAILTrainer needs a grail.config.GRAILConfig as args (it carries the token-weighting "
                            f"fields), got {type(self.args).__name__}; build one with GRAILConfig(...).")
        self.weighting = self.args.weighting_options()
        device = self.accelerator.device
        self._generator = torch.Generator(device=device).manual_seed(self.args.seed + self.accelerator.process_index)
        self._fused_request: _FusedRequest | None = None
        self.fused_unavailable = self._fused_unavailable_reason()
        if self.args.saliency_path == "fused" and self.fused_unavailable:
            raise ValueError(f"saliency_path='fused' cannot work here: {self.fused_unavailable}. Use "
                             f"saliency_path='auto' (falls back to a separate pass) or 'separate'.")
        self.last_token_weights: TokenWeights | None = None  # the latest micro-batch's weights (inspection, tests)

    # ---- which path ---------------------------------------------------------------------------------------
    def _fused_unavailable_reason(self) -> str | None:
        """None if the fused path can run for this method and setup, else why not."""
        method = self.weighting.token_weighting
        if method not in SIGNAL_METHODS:
            return f"token_weighting={method!r} has no saliency or entropy signal to fuse"
        if self.args.saliency_path == "separate":
            return "saliency_path='separate'"
        if self.args.weights_from != "current_policy":
            return "weights_from='rollout_policy' computes weights at generation time, outside the training forward"
        if method == "entropy":
            return None  # TRL's forward computes the entropies anyway
        model = self.accelerator.unwrap_model(self.model)
        if is_peft_model(model):
            return "a PEFT/LoRA model (frozen base embeddings, adapter-wrapped modules)"
        plugin = getattr(self.accelerator.state, "deepspeed_plugin", None)
        if plugin is not None and plugin.zero_stage == 3:
            return "DeepSpeed ZeRO-3 (parameters are gathered and released around each module)"
        if getattr(self, "is_fsdp_enabled", False):
            return "FSDP (sharded parameters)"
        if self.args.activation_checkpointing or self.args.gradient_checkpointing:
            return "activation checkpointing (recomputed segments do not support a second gradient query)"
        leaf = probes.leaf_module(model, self.weighting.saliency_leaf)
        upstream = [model.get_input_embeddings(), leaf]
        if not any(p.requires_grad for module in upstream for p in module.parameters()):
            return "frozen embeddings (the leaf is not part of the training graph)"
        return None

    def _use_fused(self) -> bool:
        return self.fused_unavailable is None

    # ---- masks and spans ------------------------------------------------------------------------------------
    @staticmethod
    def real_token_mask(inputs: dict) -> torch.Tensor:
        """(B, T) bool: completion tokens that enter TRL's loss (tool-output tokens excluded, as TRL does)."""
        mask_BT = inputs["completion_mask"].bool()
        if "tool_mask" in inputs:
            mask_BT = mask_BT & inputs["tool_mask"].bool()
        return mask_BT

    @property
    def tokenizer(self):
        return getattr(self.processing_class, "tokenizer", self.processing_class)

    def _spans(self, inputs: dict, mask_BT: torch.Tensor) -> AnswerSpans:
        if all(key in inputs for key in SPAN_KEYS):
            return AnswerSpans(*(inputs[key] for key in SPAN_KEYS))
        return batch_spans(self.tokenizer, inputs["completion_ids"], mask_BT, self.weighting)

    def _any_process(self, local: bool) -> bool:
        if self.accelerator.num_processes == 1:
            return local
        flag = torch.tensor([local], device=self.accelerator.device)
        return bool(self.accelerator.gather(flag).any())

    # ---- rollout time ---------------------------------------------------------------------------------------
    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        mask_BT = self.real_token_mask(output)
        spans = batch_spans(self.tokenizer, output["completion_ids"], mask_BT, self.weighting)
        output.update(zip(SPAN_KEYS, spans, strict=True))
        if self.args.weights_from == "rollout_policy":
            output.update(self._rollout_weights(output, mask_BT, spans).as_batch_entries())
        return output

    def _rollout_weights(self, batch: dict, mask_BT: torch.Tensor, spans: AnswerSpans) -> TokenWeights:
        """Weights for a whole generation batch, with the rollout policy, in micro-batch-sized chunks."""
        input_ids_BL = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        attention_mask_BL = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        model = self.accelerator.unwrap_model(self.model)
        size = self.args.per_device_train_batch_size
        parts = []
        for start in range(0, input_ids_BL.shape[0], size):
            rows = slice(start, start + size)
            parts.append(token_weights(
                model, self.tokenizer, input_ids_BL[rows], attention_mask_BL[rows], mask_BT[rows],
                batch["advantages"][rows], self.weighting, spans=AnswerSpans(*(s[rows] for s in spans)),
                generator=self._generator, any_process=self._any_process))
        merged = TokenWeights.concat(parts, path="rollout")
        self._metrics["train" if self.model.training else "eval"]["weights/seconds"].append(merged.seconds)
        return merged

    # ---- loss time ------------------------------------------------------------------------------------------
    def _compute_loss(self, model, inputs):
        adv_B = inputs["advantages"]
        if adv_B.dim() != 1:
            raise RuntimeError("GRAILTrainer expects TRL's (B,) advantages; another subclass already made "
                               "them per token.")
        mask_BT = self.real_token_mask(inputs)
        spans = self._spans(inputs, mask_BT)
        if "weights_weights_BT" in inputs:  # weights_from="rollout_policy"
            weights = TokenWeights.from_batch(inputs, path="rollout")
        elif self._use_fused() and torch.is_grad_enabled():  # evaluation runs the loss under no_grad: no graph
            call_inputs = dict(inputs)
            self._fused_request = _FusedRequest(call_inputs, adv_B, mask_BT, spans)
            try:
                loss = super()._compute_loss(model, call_inputs)
                if not self._fused_request.done:
                    raise RuntimeError("fused saliency: TRL's _compute_loss did not call "
                                       "_get_per_token_logps_and_entropies; set saliency_path='separate'.")
            finally:
                self._fused_request = None
            return loss
        else:
            input_ids_BL = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
            attention_mask_BL = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
            weights = token_weights(self.accelerator.unwrap_model(model), self.tokenizer, input_ids_BL,
                                    attention_mask_BL, mask_BT, adv_B, self.weighting, spans=spans,
                                    generator=self._generator, any_process=self._any_process)
        adv_BT = self._token_advantages(adv_B, mask_BT, weights)
        return super()._compute_loss(model, {**inputs, "advantages": adv_BT})

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args,
                                           **kwargs):
        request = self._fused_request
        if request is None or request.done:
            return super()._get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep,
                                                               *args, **kwargs)
        request.done = True
        options = self.weighting
        rows_B = probe_rows(request.adv_B, request.spans, request.mask_BT, options)
        need_grad = options.token_weighting in SALIENCY_METHODS and bool(rows_B.any())
        captured: list[torch.Tensor] = []
        handle = None
        if need_grad:
            leaf = probes.leaf_module(self.accelerator.unwrap_model(model), options.saliency_leaf)
            handle = leaf.register_forward_hook(
                lambda module, args, out: captured.append(probes.leaf_output_tensor(out)))
        try:
            logps_BT, entropies_BT, aux_loss = super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, *args, **kwargs)
        finally:
            if handle is not None:
                handle.remove()
        start = time.perf_counter()
        if options.token_weighting == "entropy":
            signal_BT = entropies_BT.detach().float()
        elif need_grad:
            if len(captured) != 1:
                raise RuntimeError(f"fused saliency: the leaf module ran {len(captured)} times in one forward "
                                   f"(expected 1); set saliency_path='separate'.")
            hidden_BLD = captured[0]
            answer_BT = request.spans.probe_span(options.answer_nll_span) & rows_B[:, None]
            nll = -(logps_BT * answer_BT).sum()  # the answer NLL: a sum of the log-probs TRL computed
            (grad_BLD,) = torch.autograd.grad(nll, hidden_BLD, retain_graph=True)
            saliency_BL = core.gradient_activation_saliency(grad_BLD, hidden_BLD)
            signal_BT = align_to_completion(saliency_BL, logits_to_keep, at="predicting")
        else:
            signal_BT = torch.zeros_like(logps_BT, dtype=torch.float32)
        weights = token_weights(None, self.tokenizer, input_ids, attention_mask, request.mask_BT, request.adv_B,
                                options, spans=request.spans, signal_BT=signal_BT, generator=self._generator)
        weights.seconds += time.perf_counter() - start
        request.call_inputs["advantages"] = self._token_advantages(request.adv_B, request.mask_BT, weights)
        return logps_BT, entropies_BT, aux_loss

    def _token_advantages(self, adv_B, mask_BT, weights: TokenWeights) -> torch.Tensor:
        self.last_token_weights = weights
        adv_BT = core.token_advantages(adv_B, weights.weights_BT)  # (B, T)
        self._log_weights(adv_B, mask_BT, weights)
        return adv_BT

    # ---- metrics --------------------------------------------------------------------------------------------
    def _log_weights(self, adv_B: torch.Tensor, mask_BT: torch.Tensor, weights: TokenWeights) -> None:
        """Append the `weights/*` metrics (README "Metrics"); one gather per micro-batch."""
        options = self.weighting
        diag = core.weight_diagnostics(weights.weights_BT, adv_B, mask_BT, weights.reasoning_BT & mask_BT,
                                       weights.normalised_BT, weight_min=options.weight_min,
                                       weight_max=options.weight_max)
        rows_B = mask_BT.any(1)
        grad_rows = (rows_B & (adv_B != 0)).sum()  # the rows the diagnostics describe (A = 0 rows carry no signal)
        release = core.release_diagnostics(weights.weights_BT, adv_B, mask_BT, weights.clip_BT, weights.reweighted_BT)
        local = torch.cat([
            torch.stack([release[key].float() for key in RELEASE_KEYS]),
            torch.stack([diag[key].float() for key in DIAGNOSTIC_KEYS]) * grad_rows,
            torch.stack([(rows_B & ~weights.has_box_B).sum(), rows_B.sum(), weights.fallback_B.sum(),
                         weights.probed_B.sum(), grad_rows]).float(),
            diag["position_profile"].float() * diag["position_count"].float(),
            diag["position_count"].float(),
        ]).to(self.accelerator.device)
        gathered = self.accelerator.gather(local.reshape(1, -1)).cpu()  # (processes, K)
        metrics = self._metrics["train" if self.model.training else "eval"]
        release_values, gathered = gathered[:, : len(RELEASE_KEYS)], gathered[:, len(RELEASE_KEYS):]
        # As the release: per-process values, NaN-mean over processes. Clip fractions are NaN (not logged) where
        # no row was normalised, which is always the case outside GRAIL's pipeline.
        for i, key in enumerate(RELEASE_KEYS):
            if not torch.isnan(release_values[:, i]).all():
                metrics[f"weights/release/{key}"].append(release_values[:, i].nanmean().item())
        total = gathered.sum(0)
        k = len(DIAGNOSTIC_KEYS)
        without_box, rows, fallback, probed, described = total[k : k + 5].tolist()
        if described > 0:  # a micro-batch whose advantages are all 0 has nothing to describe: log nothing
            for i, key in enumerate(DIAGNOSTIC_KEYS):
                if key == "max":
                    value = max((gathered[j, i] / gathered[j, k + 4]).item() for j in range(len(gathered))
                                if gathered[j, k + 4] > 0)
                else:
                    value = (total[i] / described).item()  # mean over processes, weighted by rows described
                metrics[f"weights/{key}"].append(value)
        metrics["weights/rows_without_box"].append(without_box / max(rows, 1.0))
        metrics["weights/fallback_rows"].append(fallback)
        metrics["weights/probed_rows"].append(probed / max(rows, 1.0))
        if weights.path != "rollout":  # rollout weights log their seconds once per rollout batch
            metrics["weights/seconds"].append(weights.seconds)
        metrics["weights/fused"].append(1.0 if weights.path == "fused" else 0.0)
        bins = diag["position_count"].numel()
        sums, counts = total[k + 5 : k + 5 + bins], total[k + 5 + bins :]
        for b in range(bins):
            if counts[b] > 0:
                metrics[f"weights/position_{b}"].append(float(sums[b] / counts[b]))
