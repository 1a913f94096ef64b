"""A prompt computed once for the rows that share it (`shared_prompt=true`): in the loss's forward
(`shared_prompt_logps`), and in generation's and the evaluation's prefill (`shared_prefill`, below).

GRPO's G completions of a prompt sit in a batch as G rows of prompt ⊕ completion, so TRL's log-prob forward computes
the same prompt G times, forward and backward. Here the distinct prompts of a micro-batch run once (`use_cache=True`,
logits of the last position only), their KV cache is indexed out to the rows (`Cache.reorder_cache`, an index_select
that autograd follows), and each row runs only its suffix [last prompt token, completion] against that cache, with
the row's full attention mask and TRL's fused LM head. The suffix's positions continue the prompt's, as in the plain
forward, so the completion tokens' log-probs and entropies, and the gradient of any function of them (the gradient
reaches the prompt's positions through the cache), are the plain forward's to float rounding:
tests/test_shared_prompt.py holds them equal on Llama, Qwen3 and Gemma 3 (a sliding window shorter than the prompt),
left padding and two prompts in one micro-batch included.

What it saves: with a prompt of P tokens, completions of T and a micro-batch of B rows of one prompt, the loss computes
P + B·(T + 1) positions instead of B·(P + T).

`SharedPromptForward` is the trainer's side: the overrides of TRL's log-prob forward and generation that call these.

What it needs (`GRAILTrainer` refuses the rest before training: `grail.training.paths.check_shared_prompt`): one
process (no DDP, DeepSpeed or FSDP wrapper between the two passes) and activation checkpointing off (transformers turns
the cache off under it). Micro-batches with multimodal inputs or an MoE aux loss, and micro-batches where no two rows
share a prompt, take TRL's plain forward.
"""

from __future__ import annotations

import torch

__all__ = ["SharedPromptForward", "prompt_groups", "shared_prefill", "shared_prompt_logps"]


def prompt_groups(input_ids_BL: torch.Tensor, attention_mask_BL: torch.Tensor,
                  logits_to_keep: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(first_U, inverse_B): the first row of each distinct prompt (same ids and same padding) and each row's prompt
    index into them; None when no two rows share a prompt or the prompt is shorter than 2 positions (nothing to
    cache before the last prompt token, which the suffix carries)."""
    batch, length = input_ids_BL.shape
    prompt = length - logits_to_keep  # logits_to_keep 0: the whole row is the prompt (generation)
    if prompt < 2 or batch < 2:
        return None
    key_BK = torch.cat([input_ids_BL[:, :prompt], attention_mask_BL[:, :prompt].to(input_ids_BL.dtype)], dim=1)
    _, inverse_B = torch.unique(key_BK, dim=0, return_inverse=True)
    groups = int(inverse_B.max()) + 1
    if groups == batch:
        return None
    rows_B = torch.arange(batch, device=input_ids_BL.device)
    first_U = torch.full((groups,), batch, device=input_ids_BL.device).scatter_reduce(0, inverse_B, rows_B, "amin")
    return first_U, inverse_B


def shared_prompt_logps(model, input_ids_BL: torch.Tensor, attention_mask_BL: torch.Tensor, logits_to_keep: int,
                        first_U: torch.Tensor, inverse_B: torch.Tensor, compute_entropy: bool,
                        autocast) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The (B, T) completion log-probs (and entropies) of TRL's fused-head forward, each distinct prompt computed once.

    Args:
        model: the policy with TRL's fused LM head (`add_fused_lm_head`), as TRL's log-prob method calls it.
        input_ids_BL, attention_mask_BL: prompt ⊕ completion, TRL's layout (prompt left-padded, width L − T).
        logits_to_keep: T, the completion width.
        first_U, inverse_B: `prompt_groups`' result.
        autocast: the accelerator's autocast context factory.
    """
    T = logits_to_keep
    prompt = input_ids_BL.shape[1] - T
    with autocast():
        cache = model(input_ids=input_ids_BL[first_U, :prompt - 1],
                      attention_mask=attention_mask_BL[first_U, :prompt - 1], use_cache=True,
                      logits_to_keep=1).past_key_values
    cache.reorder_cache(inverse_B)  # (U, ...) → (B, ...): index_select, differentiable
    suffix_BS = input_ids_BL[:, prompt - 1:]  # [last prompt token, completion]
    labels_BS = suffix_BS.masked_fill(attention_mask_BL[:, prompt - 1:] == 0, -100)
    labels_BS[:, 0] = -100  # as TRL: only the completion tokens are scored
    with autocast():
        outputs = model(input_ids=suffix_BS, attention_mask=attention_mask_BL, past_key_values=cache,
                        labels=labels_BS, fused_lm_head=True)
    return outputs.log_probs[:, -T:], (outputs.entropy[:, -T:] if compute_entropy else None)


def shared_prefill(model, generate):
    """`generate` (the model's own, with its signature) made to compute each distinct prompt's prefill once: the
    prompt less its last token runs once per distinct prompt, with generate's positions (the attention mask's running
    count, so left padding matches), its cache is indexed out to the rows and handed to `generate`, which then runs
    only the last prompt token before sampling. `num_return_sequences=n` is applied here, as generate applies it
    (each row repeated n times in place), so that a prompt's n samples share its prefill. Calls with a cache,
    without an attention mask, with a cache implementation named, or without two rows sharing a prompt go to
    `generate` unchanged."""
    def call(input_ids=None, attention_mask=None, generation_config=None, num_return_sequences=1, **kwargs):
        if num_return_sequences > 1 and input_ids is not None and attention_mask is not None:
            input_ids = input_ids.repeat_interleave(num_return_sequences, dim=0)  # generate's own expansion
            attention_mask = attention_mask.repeat_interleave(num_return_sequences, dim=0)
            num_return_sequences = 1
        kwargs["num_return_sequences"] = num_return_sequences
        groups = None
        if (input_ids is not None and attention_mask is not None and "past_key_values" not in kwargs
                and getattr(generation_config, "cache_implementation", None) is None):
            groups = prompt_groups(input_ids, attention_mask, 0)
        if groups is None:
            return generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=generation_config,
                            **kwargs)
        first_U, inverse_B = groups
        ids_UP, mask_UP = input_ids[first_U, :-1], attention_mask[first_U, :-1]
        positions_UP = (mask_UP.long().cumsum(-1) - 1).masked_fill(mask_UP == 0, 0)  # as generate's own
        with torch.no_grad():
            cache = model(input_ids=ids_UP, attention_mask=mask_UP, position_ids=positions_UP, use_cache=True,
                          logits_to_keep=1).past_key_values
        cache.reorder_cache(inverse_B)
        return generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=generation_config,
                        past_key_values=cache, **kwargs)
    return call


class SharedPromptForward:
    """The trainer's side of shared_prompt (`GRAILTrainer` mixes it in before TRL's `GRPOTrainer`): TRL's log-prob
    forward (the trainer's seam S3) and generation (S5), each computing a distinct prompt once when shared_prompt is
    on, and TRL's own otherwise. `forward_chunks`: the model passes of each chunk of the latest log-prob forward (2:
    the prompt shared)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.forward_chunks: list[int] = []

    @property
    def forward_passes(self) -> int:
        """Model passes of the latest log-prob forward (a chunk with its prompt shared makes 2)."""
        return sum(self.forward_chunks)

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                                           compute_entropy=False, compute_aux_loss=False, **extra):  # S3
        """TRL's log-prob forward; with shared_prompt, each distinct prompt of a chunk runs once and its rows run only
        their completions against its cache (`shared_prompt_logps`). Multimodal inputs, the MoE aux loss, and
        chunks where no two rows share a prompt take TRL's own forward. `forward_chunks`: the passes of each chunk."""
        plain = super()._get_per_token_logps_and_entropies
        size = batch_size or input_ids.size(0)
        if not self.args.shared_prompt or compute_aux_loss or any(value is not None for value in extra.values()):
            self.forward_chunks = [1] * -(-input_ids.size(0) // size)  # TRL's chunks, one pass each
            return plain(model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy,
                         compute_aux_loss, **extra)
        logps, entropies, self.forward_chunks = [], [], []
        for start in range(0, input_ids.size(0), size):
            ids_BL, mask_BL = input_ids[start:start + size], attention_mask[start:start + size]
            groups = prompt_groups(ids_BL, mask_BL, logits_to_keep)
            if groups is None:
                part = plain(model, ids_BL, mask_BL, logits_to_keep, compute_entropy=compute_entropy)[:2]
            else:
                part = shared_prompt_logps(model, ids_BL, mask_BL, logits_to_keep, *groups,
                                                         compute_entropy, self.accelerator.autocast)
            self.forward_chunks.append(1 if groups is None else 2)
            logps.append(part[0])
            entropies.append(part[1])
        return torch.cat(logps), (torch.cat(entropies) if compute_entropy else None), None

    def _generate_single_turn(self, prompt_ids, *args, **kwargs):
        """TRL's generation; with shared_prompt and transformers' own generate (no vLLM, no continuous batching), each
        distinct prompt's prefill runs once for its rows (`shared_prefill`)."""
        if not self.args.shared_prompt or self.use_vllm or self.use_transformers_continuous_batching:
            return super()._generate_single_turn(prompt_ids, *args, **kwargs)
        model = self.accelerator.unwrap_model(self.model)  # what TRL's unwrap_model_for_generation yields here
        model.generate = shared_prefill(model, model.generate)  # an instance attribute, this call only
        try:
            return super()._generate_single_turn(prompt_ids, *args, **kwargs)
        finally:
            del model.generate
