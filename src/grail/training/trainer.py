"""`GRAILTrainer`: TRL's `GRPOTrainer` handed a (B, T) token advantage Â = w · A.

The subclass only chooses weights: it computes them for each micro-batch (`grail.methods.weighting.token_weights`, the
functional API's own function), replaces `inputs["advantages"]` and calls the parent's loss, so clipping, loss
aggregation (`loss_type`), KL, masking and every other TRL option stay TRL's. Weights come in one of three ways:

1. `weights_from="rollout_policy"`: once per rollout batch, right after generation; stored in the batch dict and
   split and shuffled with it by TRL.
2. `weights_from="current_policy"`, separate path: before each micro-batch's loss, with the current policy (every
   reuse pass sees the policy being trained, as in the GRAIL release).
3. `weights_from="current_policy"`, fused path (`saliency_path`): inside TRL's own forward of the micro-batch. For
   the duration of one `super()._compute_loss` call (`_fused_forward`), TRL's log-prob method is wrapped: it
   captures the leaf h with a forward hook, takes the answer NLL as the sum of TRL's per-token log-probs over the
   answer span, gets ∂ℓ/∂h from that graph with `torch.autograd.grad` (no parameter `.grad` is written; the graph
   is retained for the loss), and writes Â into the batch dict TRL is reading. The entropy control reads TRL's
   entropies.

The seam to TRL. Everything this module relies on that TRL does not document, in one list; the contract test
(tests/test_trl_contract.py) drives TRL's real `_prepare_inputs` and `compute_loss` and fails if any breaks:
  S1. `_generate_and_score_completions(inputs) -> dict` is overridable; its dict's extra (B, ...) tensors survive
      `_prepare_inputs`' shuffle and split into micro-batches, row-aligned with `completion_ids`.
  S2. `_compute_loss(model, inputs)` is overridable and reads `inputs["advantages"]`, unsqueezing (B,) to (B, 1)
      and taking (B, T) as is.
  S3. Within `_compute_loss`, `self._get_per_token_logps_and_entropies(model, input_ids, attention_mask,
      logits_to_keep, ...)` is called exactly once, with the micro-batch's prompt ⊕ completion, before
      `advantages` is read, and returns (logps_BT, entropies_BT, aux_loss).
  S4. `self._metrics[mode]` maps metric names to lists that `log()` averages and clears.
  S5. With transformers' generate, `_generate_single_turn(prompt_ids, ...)` calls `generate` on the model
      `unwrap_model_for_generation` yields, which on one process is `accelerator.unwrap_model(self.model)`
      (shared_prompt wraps that object's `generate` for the call, and CPU bf16 casts its weights to bf16 for it:
      tests/test_shared_prompt.py checks the wrapper is called, tests/test_bf16_generation.py that generate sees bf16).
  S6. (transformers' Trainer) every process calls `_save_rng_state(output_dir)` while saving a checkpoint, and
      `_load_rng_state(checkpoint)` once when resuming from one: the trainer's own generator, and a learning
      method's state (`MethodSpec.state`), ride along with the RNG states saved there (tests/test_resume.py resumes
      a `random` run to the uninterrupted result, tests/test_oar_p_amortized.py a learning method's).
The fused path checks S3 at run time too (a wrong count or an early read of `advantages` stops the step). With
shared_prompt, the mixed-in `grail.training.shared_prompt.SharedPromptForward` overrides S3's and S5's methods: each
distinct prompt is computed once, and TRL's own run where nothing is shared. Which path a setup can take, and what is
refused before the first step, are plain functions in `grail.training.paths`.

On a CPU in bf16, where each phase computes and in which precision is the mixed-in
`grail.training.cpu_precision.CPUPrecision`'s (S5's method is wrapped there).
"""

from __future__ import annotations

import os
import time
import warnings
from contextlib import contextmanager, nullcontext

import torch
from accelerate.utils import is_peft_model
from trl import GRPOTrainer

from grail.methods import core, probes
from grail.methods.spans import AnswerSpans
from grail.methods.spec import TokenWeights
from grail.methods.weight_metrics import WeightSums, pooled_metrics
from grail.methods.weighting import (
    batch_spans,
    fused_leaf_name,
    fused_probe_signal,
    fused_signal,
    probe_rows,
    token_weights,
    weights_from_signal,
)
from grail.models.precision import check_cpu_master_weights
from grail.training import paths
from grail.training.cpu_precision import CPUPrecision
from grail.training.engines import dropped_engine, refuse_if_unshardable, sharded_by
from grail.training.resume import load_generator, load_method_state, save_generator, save_method_state
from grail.training.shared_prompt import SharedPromptForward

__all__ = ["GRAILTrainer"]

SPAN_KEYS = tuple(f"grail_spans_{name}" for name in AnswerSpans._fields)  # the spans in TRL's batch dict


class _AdvantagesWatch(dict):
    """The batch dict handed to TRL's `_compute_loss` on the fused path: records reads of `advantages` before and
    after the fused forward writes them (S3)."""

    def __init__(self, inputs: dict):
        super().__init__(inputs)
        self.written = self.read_before = self.read_after = False

    def __getitem__(self, key):
        if key == "advantages":
            self.read_after |= self.written
            self.read_before |= not self.written
        return super().__getitem__(key)


class GRAILTrainer(CPUPrecision, SharedPromptForward, GRPOTrainer):
    """GRPOTrainer whose policy-gradient advantage is per token: Â_{i,t} = w_{i,t} · A_i."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not hasattr(self.args, "resolved"):
            raise TypeError(f"GRAILTrainer needs a grail.training.config.GRAILConfig as args (it carries the "
                            f"token-weighting fields), got {type(self.args).__name__}; build one with "
                            "GRAILConfig(...).")
        self.method, self.weighting = self.args.resolved  # resolved once, by the config
        dropped = dropped_engine(os.environ, self.accelerator.distributed_type.name)
        if dropped and self.accelerator.is_main_process:
            warnings.warn(f"grail: {dropped}.", stacklevel=2)
        sharded = sharded_by(self)
        refuse_if_unshardable(self.method, sharded)
        paths.check_probe_reaches_the_model(self.method, self.accelerator.unwrap_model(self.model),
                                            self.weighting.saliency_leaf)
        device = self.accelerator.device
        if device.type == "cpu":  # bf16 on CPU trains fp32 master weights; bf16 only ever holds casts of them
            check_cpu_master_weights(self.accelerator.unwrap_model(self.model), self.args.learning_rate)
        self._generator = torch.Generator(device=device).manual_seed(self.args.seed + self.accelerator.process_index)
        # what a learning method has learned so far (`MethodSpec.state`), saved with each checkpoint (S6)
        self.method_state = self.method.state() if self.method.state is not None else None
        self.weight_sums = WeightSums(self.weighting.weight_min, self.weighting.weight_max,
                                      count_clips=self.weighting.weight_rescale != "none")
        self.choose_cpu_precision(device)  # grail.training.cpu_precision
        self.fused_unavailable = self._fused_unavailable_reason()
        paths.check_fused_request(self.args.saliency_path, self.fused_unavailable)
        self.last_token_weights: TokenWeights | None = None  # the latest micro-batch's weights (inspection, tests)
        paths.check_shared_prompt(self.args.shared_prompt, self.accelerator.num_processes,
                                  sharded or ("DeepSpeed" if getattr(self, "is_deepspeed_enabled", False) else None),
                                  self._checkpointing())

    # ---- which path (grail.training.paths) ---------------------------------------------------------------------
    def _fused_unavailable_reason(self) -> str | None:
        """None if the fused path can run for this method and setup, else why not."""
        if self.fp32_probe:
            return (f"CPU bf16: {self.method.name}'s weights do not hold in bf16, so its probe runs separately in fp32 "
                    f"(grail.models.precision.FP32_PROBES)")
        model = self.accelerator.unwrap_model(self.model)

        def leaf_trainable() -> bool:
            upstream = [model.get_input_embeddings(), probes.leaf_module(model, self.weighting.saliency_leaf)]
            return any(p.requires_grad for module in upstream for p in module.parameters())

        return paths.fused_unavailable_reason(
            self.method, self.args.saliency_path, self.args.weights_from, peft=is_peft_model(model),
            sharded=sharded_by(self), deepspeed=getattr(self, "is_deepspeed_enabled", False),
            reentrant=self.reentrant_checkpointing(), leaf_trainable=leaf_trainable)

    def _checkpointing(self) -> bool:
        return bool(self.args.activation_checkpointing or self.args.gradient_checkpointing)

    def reentrant_checkpointing(self) -> bool:
        """Activation checkpointing is on with use_reentrant=True (`paths.reentrant_checkpointing`)."""
        return paths.reentrant_checkpointing(self._checkpointing(), self.args.activation_checkpointing_kwargs
                                             or self.args.gradient_checkpointing_kwargs)

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

    def _mode(self) -> str:
        return "train" if self.model.training else "eval"

    @contextmanager
    def _probe_context(self, model):
        """Around a separate probe: reentrant checkpointing refuses `torch.autograd.grad`, so it is switched off on
        the model for the probe (which then stores the probed rows' activations) and restored after."""
        if not (self.reentrant_checkpointing() and getattr(model, "is_activation_checkpointing", False)):
            yield
            return
        kwargs = dict(self.args.activation_checkpointing_kwargs or self.args.gradient_checkpointing_kwargs or {})
        layout = {"every_n_layers": kwargs.pop("every_n_layers", 1), "offload": kwargs.pop("offload", False)}
        model.activation_checkpointing_disable()
        try:
            yield
        finally:  # as transformers' Trainer.train() enabled it
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs or None, **layout)

    # ---- the seam to TRL (module docstring, S1-S4) ---------------------------------------------------------------
    def _generate_and_score_completions(self, inputs):  # S1
        output = super()._generate_and_score_completions(inputs)
        mask_BT = self.real_token_mask(output)
        spans = batch_spans(self.tokenizer, output["completion_ids"], mask_BT, self.weighting)
        output.update(zip(SPAN_KEYS, spans, strict=True))
        if self.args.weights_from == "rollout_policy":
            output.update(self._rollout_weights(output, mask_BT, spans).as_batch_entries())
        return output

    def _compute_loss(self, model, inputs):  # S2
        with self._cast_once():
            return self._weighted_loss(model, inputs)

    def _weighted_loss(self, model, inputs):
        adv_B = inputs["advantages"]
        if adv_B.dim() != 1:
            raise RuntimeError("GRAILTrainer expects TRL's (B,) advantages; another subclass already made "
                               "them per token.")
        mask_BT = self.real_token_mask(inputs)
        spans = self._spans(inputs, mask_BT)
        if TokenWeights.in_batch(inputs):  # weights_from="rollout_policy"
            weights = TokenWeights.from_batch(inputs, path="rollout")
        elif self.fused_unavailable is None and torch.is_grad_enabled():  # evaluation runs under no_grad: no graph
            call_inputs = _AdvantagesWatch(inputs)
            with self._fused_forward(call_inputs, adv_B, mask_BT, spans):
                loss = super()._compute_loss(model, call_inputs)
            if call_inputs.read_before or not call_inputs.read_after:
                raise RuntimeError("fused saliency: TRL's _compute_loss did not read the advantages from the batch "
                                   "dict after its forward (a TRL change); set saliency_path='separate'.")
            return loss
        else:
            input_ids_BL = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
            attention_mask_BL = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
            unwrapped = self.accelerator.unwrap_model(model)
            with self._probe_context(unwrapped), self._probe_precision(unwrapped):
                weights = token_weights(unwrapped, self.tokenizer, input_ids_BL, attention_mask_BL, mask_BT, adv_B,
                                        self.weighting, spans=spans, generator=self._generator,
                                        any_process=self._any_process, spec=self.method, state=self.method_state)
        return super()._compute_loss(model, {**inputs, "advantages": self._token_advantages(adv_B, mask_BT, weights)})

    @contextmanager
    def _fused_forward(self, call_inputs: _AdvantagesWatch, adv_B: torch.Tensor, mask_BT: torch.Tensor,
                       spans: AnswerSpans):  # S3
        """For one `super()._compute_loss` call: TRL's log-prob method, wrapped to compute the weights from its
        forward and write Â into `call_inputs`. It must run exactly once."""
        trl_forward = self._get_per_token_logps_and_entropies
        calls = []

        def forward(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
            calls.append(logits_to_keep)
            if len(calls) > 1:
                raise RuntimeError("fused saliency: TRL's _compute_loss ran its log-prob forward more than once "
                                   "(a TRL change); set saliency_path='separate'.")
            return self._fused_weights(trl_forward, call_inputs, adv_B, mask_BT, spans, model, input_ids,
                                       attention_mask, logits_to_keep, *args, **kwargs)

        self._get_per_token_logps_and_entropies = forward  # an instance attribute: shadows the method, this call only
        try:
            yield
        finally:
            del self._get_per_token_logps_and_entropies
        if not calls:
            raise RuntimeError("fused saliency: TRL's _compute_loss did not call _get_per_token_logps_and_entropies "
                               "(a TRL change); set saliency_path='separate'.")

    def _fused_weights(self, trl_forward, call_inputs, adv_B, mask_BT, spans, model, input_ids, attention_mask,
                       logits_to_keep, *args, **kwargs):
        options, method = self.weighting, self.method
        rows_B = probe_rows(adv_B, spans, mask_BT, options, spec=method)
        leaf_name = fused_leaf_name(method, options)
        need_leaf = leaf_name is not None and bool(rows_B.any())
        unwrapped = self.accelerator.unwrap_model(model)
        leaf = probes.leaf_module(unwrapped, leaf_name) if need_leaf else None
        with probes.output_of(leaf) if need_leaf else nullcontext([]) as captured:
            result = trl_forward(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs)
        if not (isinstance(result, tuple) and len(result) == 3):
            raise RuntimeError(f"fused saliency: TRL's _get_per_token_logps_and_entropies returned "
                               f"{type(result).__name__}, not (logps, entropies, aux_loss) (a TRL change); set "
                               f"saliency_path='separate'.")
        logps_BT, entropies_BT, _ = result
        start = time.perf_counter()
        chunks = self.forward_chunks  # [1], or [2] with a shared prompt: the prompt's pass, then the rows' suffixes
        if need_leaf and (len(chunks) != 1 or len(captured) != chunks[0]):
            raise RuntimeError(f"fused saliency: the leaf module ran {len(captured)} times in a forward of "
                               f"{len(chunks)} chunk(s) (expected one forward of the micro-batch); set "
                               f"saliency_path='separate'.")
        # the last pass holds every completion position (with a shared prompt: the rows' suffixes, which is all the
        # signal reads: align_to_completion counts from the end)
        hidden_BLD = captured[-1] if need_leaf else None
        floor = 0.0  # a signal read from the forward alone has no probe's rounding floor
        if method.fuse == "probe":  # the method's own probe, on the forward's reads (it may call the model too)
            with torch.no_grad():
                signal_BT = fused_probe_signal(method, unwrapped, input_ids, attention_mask, spans, mask_BT, rows_B,
                                               options, logps_BT, entropies_BT, hidden_BLD, self._generator,
                                               adv_B=adv_B, tokenizer=self.tokenizer, state=self.method_state)
            floor = method.rounding_floor(unwrapped, options)
        else:
            answer_BT = spans.probe_span(options.answer_nll_span) & rows_B[:, None]
            signal_BT = fused_signal(method, logps_BT, entropies_BT, hidden_BLD, answer_BT, options)
        weights = weights_from_signal(signal_BT, adv_B, spans, mask_BT, rows_B, options, self._generator, floor,
                                      spec=method)
        weights.path, weights.seconds = "fused", time.perf_counter() - start  # the signal and the pipeline, once
        call_inputs["advantages"] = self._token_advantages(adv_B, mask_BT, weights)
        call_inputs.written = True
        return result

    def _metric_lists(self, mode: str) -> dict[str, list[float]]:  # S4
        return self._metrics[mode]

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:  # S4
        self.reduce_weight_metrics(self._mode())
        super().log(logs, start_time)

    # ---- rollout time ---------------------------------------------------------------------------------------
    def _rollout_weights(self, batch: dict, mask_BT: torch.Tensor, spans: AnswerSpans) -> TokenWeights:
        """Weights for a whole generation batch, with the rollout policy, in micro-batch-sized chunks."""
        input_ids_BL = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        attention_mask_BL = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        model = self.accelerator.unwrap_model(self.model)
        # chunks bound a probe's memory; a method that reads whole groups gets the whole batch (it calls no model)
        size = input_ids_BL.shape[0] if self.method.groups else self.args.per_device_train_batch_size
        parts = []
        for start in range(0, input_ids_BL.shape[0], size):
            rows = slice(start, start + size)
            with self._probe_context(model), self._probe_precision(model):
                parts.append(token_weights(
                    model, self.tokenizer, input_ids_BL[rows], attention_mask_BL[rows], mask_BT[rows],
                    batch["advantages"][rows], self.weighting, spans=AnswerSpans(*(s[rows] for s in spans)),
                    generator=self._generator, any_process=self._any_process, spec=self.method,
                    state=self.method_state))
        merged = TokenWeights.concat(parts, path="rollout")
        self._metric_lists(self._mode())["weights/seconds"].append(merged.seconds)
        return merged

    # ---- checkpoints (S6) -------------------------------------------------------------------------------------
    def _save_rng_state(self, output_dir: str) -> None:
        super()._save_rng_state(output_dir)
        save_generator(self._generator, output_dir, self.accelerator.process_index)
        if self.method_state is not None:
            save_method_state(self.method_state, output_dir, self.accelerator.process_index)

    def _load_rng_state(self, checkpoint: str | None) -> None:
        super()._load_rng_state(checkpoint)
        if checkpoint is not None:
            load_generator(self._generator, checkpoint, self.accelerator.process_index, self.method.name)
            if self.method_state is not None:
                load_method_state(self.method_state, checkpoint, self.accelerator.process_index, self.method.name)

    # ---- Â and its statistics ---------------------------------------------------------------------------------
    def _token_advantages(self, adv_B, mask_BT, weights: TokenWeights) -> torch.Tensor:
        """Â = w · A (B, T), computed once per micro-batch; its statistics are accumulated on the device."""
        self.last_token_weights = weights
        adv_BT = core.token_advantages(adv_B, weights.weights_BT)
        self._accumulate(adv_B, adv_BT, mask_BT, weights)
        return adv_BT

    def _accumulate(self, adv_B, adv_BT, mask_BT, weights: TokenWeights) -> None:
        """Add this micro-batch's weight statistics to the mode's device sums (no host synchronisation)."""
        self.weight_sums.add(self._mode(), adv_B, adv_BT, mask_BT, weights)
        metrics = self._metric_lists(self._mode())
        if weights.path != "rollout":  # rollout weights log their seconds once per rollout batch
            metrics["weights/seconds"].append(weights.seconds)
        metrics["weights/fused"].append(1.0 if weights.path == "fused" else 0.0)

    def reduce_weight_metrics(self, mode: str) -> dict[str, float]:
        """Pool the mode's accumulated statistics over processes (one gather) and append the `weights/*` metrics
        (docs/reference/metrics.md) to TRL's lists; called by `log` once per logging step, on every process."""
        local = self.weight_sums.local(mode, self.accelerator.device)
        out = pooled_metrics(self.accelerator.gather(local) if self.accelerator.num_processes > 1 else local)
        metrics = self._metric_lists(mode)
        for key, value in out.items():
            metrics[key].append(value)
        return out
