"""Named sets of config values. `grail train --preset NAME`; precedence defaults < preset < file < flags.

Presets only hold values; every field's meaning is documented once, in `GRAILConfig`.
"""

from __future__ import annotations

from grail.options.fields import SFT_MODEL_PREFIX
from grail.options.prompts import PAPER_PROMPT_SUFFIX
from grail.tasks.chain_problems import ChainConfig
from grail.tasks.chains import ChainSet
from grail.tasks.synthetic import WORDS_SET

__all__ = ["CHAIN_NOTES", "GEMMA_CHAINS", "GEMMA_WORDS", "NOTES", "PAPER", "PAPER_LOSS", "PAPER_NOTES", "preset",
           "PRESETS", "render", "SMOLLM_CHAINS", "SMOLLM_WORDS", "TINY_CPU"]

# The GRAIL release's loss and grouping (docs/methods/none.md): A = r - mean(group) without std scaling,
# Dr. GRPO aggregation, asymmetric clip, no KL, truncated completions masked, 8 completions per prompt.
PAPER_LOSS = {
    "scale_rewards": "none",
    "loss_type": "dr_grpo",
    "epsilon": 0.2,
    "epsilon_high": 0.28,
    "beta": 0.0,
    "mask_truncated_completions": True,
    "num_generations": 8,
}

# The GRAIL release's GRPO recipe (docs/methods/none.md), for Qwen3-4B on DeepMath-103K.
# 32 prompts x 8 completions per optimiser step assumes 4 processes (4 GPUs x per-device 8 x accumulation 8);
# on another GPU count, scale gradient_accumulation_steps to keep 256 completions per step.
PAPER = {
    "model_name_or_path": "Qwen/Qwen3-4B",
    "dataset": "trl-lib/DeepMath-103K",
    # TRL's copy stores the reference answer in `solution` and the prompt as chat messages.
    "answer_column": "solution",
    "prompt_suffix": PAPER_PROMPT_SUFFIX,
    "conversational": True,
    "chat_template_kwargs": {"enable_thinking": False},
    "reward": "math_verify",
    **PAPER_LOSS,
    "num_iterations": 4,
    "learning_rate": 1e-6,
    "lr_scheduler_type": "constant",
    "warmup_steps": 0,
    "optim": "adamw_torch_fused",
    "max_grad_norm": 1.0,
    "bf16": True,
    "model_init_kwargs": {"dtype": "bfloat16"},
    "disable_dropout": True,
    "dataset_shuffle_seed": 42,
    "max_steps": 200,
    "seed": 42,
    "per_device_train_batch_size": 8,
    "gradient_accumulation_steps": 8,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 50,
    "max_completion_length": 4096,
    "logging_steps": 1,
    "save_steps": 50,
}

# The embedded default on a 2-core CPU: the paper's loss settings, with a learning rate, batch and length
# sized for the ~1.7M-parameter tiny model on 2-step arithmetic (what `grail demo` runs).
TINY_CPU = {
    "model_name_or_path": "tiny",
    "dataset": "synthetic",
    "reward": "exact_int",
    **PAPER_LOSS,
    "num_iterations": 1,
    # lr 5e-5: 3e-4 collapsed the policy within 20 steps (Adam's ~lr-sized steps on noisy RL gradients);
    # 1e-4 helped only with twice the batch. 200 steps: 300 added < 1 point of held-out accuracy.
    "learning_rate": 5e-5,
    "lr_scheduler_type": "constant",
    "warmup_steps": 0,
    "optim": "adamw_torch",
    "max_grad_norm": 1.0,
    "max_steps": 200,
    "seed": 42,
    "per_device_train_batch_size": 64,
    "gradient_accumulation_steps": 1,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "max_completion_length": 40,
    "logging_steps": 1,
    "save_steps": 100,
}

# What each `paper` value is for, printed by `grail presets paper` (the fields' help says what they do).
PAPER_NOTES = {
    "model_name_or_path": "one of the paper's five models (Qwen3-4B/8B, OctoThinker-3B/8B-Short, R1-Distill-Llama-8B)",
    "dataset": "the release's training set, DeepMath-103K (TRL's copy)",
    "answer_column": "TRL's copy keeps the reference answer in `solution`",
    "prompt_suffix": "the paper's instruction with a literal \\boxed{} (the release's own text has a backspace: "
                     "`release` selects it)",
    "conversational": "prompts go through the model's chat template, as in the release",
    "chat_template_kwargs": "Qwen3 template with thinking disabled",
    "reward": "1.0 iff the last \\boxed{} matches the reference under math-verify",
    "scale_rewards": "A = r - mean(group), no division by the std",
    "loss_type": "Dr. GRPO aggregation: token-loss sum / (batch x max_completion_length)",
    "epsilon": "clip range low (0.2)",
    "epsilon_high": "clip range high (0.28)",
    "beta": "no KL term, no reference model",
    "mask_truncated_completions": "completions cut at max_completion_length carry no loss",
    "num_generations": "8 completions per prompt",
    "num_iterations": "mu = 4 optimisation passes per rollout batch",
    "learning_rate": "the release's 1e-6",
    "lr_scheduler_type": "constant learning rate",
    "warmup_steps": "no warm-up",
    "optim": "fused AdamW",
    "max_grad_norm": "gradient-norm clip 1.0",
    "bf16": "bf16 autocast, as the release",
    "model_init_kwargs": "the policy is loaded in bf16 (the release's `dtype: bfloat16`), not float32",
    "disable_dropout": "dropout off, as the release (`disable_dropout: true`)",
    "dataset_shuffle_seed": "the release shuffles the training set once with seed 42 before training",
    "max_steps": "200 optimiser steps",
    "seed": "the release's seed",
    "per_device_train_batch_size": "8 per GPU ...",
    "gradient_accumulation_steps": "... x 8 steps x 4 GPUs = 32 prompts x 8 completions per step; scale for "
                                   "other GPU counts",
    "temperature": "rollout sampling: temperature 1.0",
    "top_p": "top-p 1.0",
    "top_k": "top-k 50",
    "max_completion_length": "at most 4096 new tokens per rollout",
    "logging_steps": "log every step",
    "save_steps": "checkpoint every 50 steps",
}

# The synthetic task as word problems for the real chat model SmolLM2-135M-Instruct: the task values measured in
# grail.tasks.word_problems (its docstring: sampled accuracy at T=1 inside the 20-60% band GRPO needs, where the
# symbolic default's 2 steps give the model a few percent), the paper's loss and grouping, TRL's sampling. The optimiser
# settings are TRL's defaults: not tuned for this model.
SMOLLM_WORDS = {
    "model_name_or_path": "smollm2-135m",
    "dataset": "synthetic",
    "task_style": "words",
    "task_num_steps": WORDS_SET.task.num_steps,
    "task_operand_min": WORDS_SET.task.operand_min,
    "task_operand_max": WORDS_SET.task.operand_max,
    "task_max_value": WORDS_SET.task.max_value,
    "task_num_train": WORDS_SET.num_train,
    "task_num_heldout": WORDS_SET.num_heldout,
    "reward": "exact_int",
    **PAPER_LOSS,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "max_completion_length": 64,  # completions average ~27 tokens; 64 holds ~95% of them whole
    # One prompt x 8 completions per optimiser step, as TRL's default batch of 8, but the loss runs on micro-batches of
    # 2 rows, 4 accumulated: the loss forward keeps every layer's activations of its rows for the backward, and that
    # sets a step's memory peak (docs/results/step-cost.md). The same numbers to float rounding
    # (tests/test_micro_batch.py); TRL still generates the 8 completions at once (steps_per_generation = 4).
    "per_device_train_batch_size": 2,
    "gradient_accumulation_steps": 4,
    "logging_steps": 1,
}

# The same task for the base model Gemma 3 270M (`grail models fetch gemma3-270m --accept_gemma_terms`): no chat
# template, so the few-shot turns are rendered as plain text (grail.options.prompts.render_plain: "Question: ...",
# "Answer: ..."). A base model rarely ends its answer with EOS (it goes on to write the next question: 4% of
# completions stopped in the measurements of grail.tasks.word_problems' docstring), so truncated completions keep
# their loss here (the paper masks them, which would mask almost every completion) and completions are cut at 48
# tokens, enough for the one-sentence answer and its box (~20 tokens); at 64 the next question's own empty
# "\boxed{}" often became the last box, which the reward reads (5-6% accuracy, against 16% at 48).
GEMMA_WORDS = {
    **SMOLLM_WORDS,
    "model_name_or_path": "gemma3-270m",
    "conversational": False,
    "mask_truncated_completions": False,
    "max_completion_length": 48,
}

# The chain task (grail.tasks.chains, answers that cannot be guessed) for SmolLM2-135M-Instruct, from its `grail sft`
# warm start on the task's sft split (`sft:NAME`: a run names the `grail models fetch` or `grail sft` command that is
# missing). The warm start and the task are measured (docs/results/regime.md: on SmolLM2 they qualify); the RL values
# are smollm-words' and NOT TUNED; CHAIN_NOTES says so with each value.
SMOLLM_CHAINS = {
    "model_name_or_path": f"{SFT_MODEL_PREFIX}smollm2-135m:sft_steps=30",
    "dataset": "synthetic",
    "task_style": "chains",
    "task_num_steps": ChainConfig.num_steps,
    "task_operand_min": ChainConfig.operand_min,
    "task_operand_max": ChainConfig.operand_max,
    "task_max_value": ChainConfig.max_value,
    "task_operations": ",".join(ChainConfig.operations),
    "task_num_sft": ChainSet.num_sft,
    "task_num_train": ChainSet.num_train,
    "task_num_heldout": ChainSet.num_heldout,
    "reward": "exact_int",
    **PAPER_LOSS,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "max_completion_length": 128,
    "learning_rate": 5e-6,
    "max_steps": 60,
    "per_device_train_batch_size": 8,
    "gradient_accumulation_steps": 8,
    "shared_prompt": True,
    "logging_steps": 1,
}
# The same for the base model Gemma 3 270M: no chat template, so the prompts are plain text (render_plain) in both
# stages; its warm start learned to end the solution with EOS, so truncated completions stay masked (not measured).
# Its warm start is 100 SFT steps: after the default 40 it solved too few problems (docs/results/regime.md).
GEMMA_CHAINS = {**SMOLLM_CHAINS, "model_name_or_path": f"{SFT_MODEL_PREFIX}gemma3-270m:sft_steps=100"}
_UNTUNED = "untuned: "
CHAIN_NOTES = {
    "model_name_or_path": "the `grail sft` warm start of the model on this task after 30 SFT steps, found in the "
                          "cache; a run without it names the command that makes it. On SmolLM2 it solves 25.3% of "
                          "held-out problems sampled, 37.9% greedy, 62.5% of groups of 8 mixed, and its gradient is "
                          "the quietest of the qualifying starts (docs/results/regime-search.md)",
    "task_num_steps": "the chain task's defaults (grail.tasks.chain_problems.ChainConfig), down to task_operations: "
                      "120 distinct held-out answers, the best constant 2.0%",
    "task_num_sft": "the chain task's split sizes (grail.tasks.chains.ChainSet)",
    "reward": "the answer is an integer: exact match of the last box",
    "temperature": _UNTUNED + "TRL's sampling",
    "max_completion_length": "the default solutions take 56 SmolLM2 tokens on average, 62 at most (300 sft problems, "
                             "with the end of turn); 128 leave room",
    "learning_rate": "measured on SmolLM2 (3 seeds, these 60 steps of 8 prompts): sampled accuracy +6.5 points "
                     "[3.1, 9.9], greedy +1.0 [-0.4, +2.5], pass@4 unchanged; at 1e-5 greedy fell 2.3, at 2e-5 the "
                     "warm start came undone (docs/results/regime-check-sft30.md)",
    "max_steps": "480 prompts in all: about three times the start's gradient noise scale, so the summed update is "
                 "mostly signal; about 1.8 hours of one CPU core for SmolLM2",
    "per_device_train_batch_size": "8 prompts × 8 completions a step, the loss in 8 micro-batches of one prompt's "
                                   "group (with shared_prompt, the prompt is computed once per group)",
}

GEMMA_CHAIN_NOTES = {**CHAIN_NOTES,
                     "model_name_or_path": "the `grail sft` warm start of the model on this task after 100 SFT steps "
                                           "(the default 40 left it solving 11.5%), found in the cache; a run without "
                                           "it names the command that makes it. It solves 45.4% of held-out problems "
                                           "sampled, 64.1% of groups of 8 mixed (docs/results/regime.md)",
                     **{key: _UNTUNED + "SmolLM2's measured value; no GRPO check has run on Gemma"
                        for key in ("learning_rate", "max_steps", "per_device_train_batch_size")}}

PRESETS: dict[str, dict] = {"paper": PAPER, "tiny-cpu": TINY_CPU, "smollm-words": SMOLLM_WORDS,
                            "gemma-words": GEMMA_WORDS, "smollm-chains": SMOLLM_CHAINS, "gemma-chains": GEMMA_CHAINS}
NOTES: dict[str, dict[str, str]] = {"paper": PAPER_NOTES, "smollm-chains": CHAIN_NOTES,
                                     "gemma-chains": GEMMA_CHAIN_NOTES}


def render(names: list[str]) -> str:
    """The named presets as YAML, each value preceded by a comment saying what it is for (where noted)."""
    import yaml

    lines = []
    for name in names:
        lines.append(f"{name}:")
        notes = NOTES.get(name, {})
        for key, value in PRESETS[name].items():
            if key in notes:
                lines.append(f"  # {notes[key]}")
            dumped = yaml.safe_dump(value, default_flow_style=True, width=10_000).removesuffix("\n...\n")
            lines.append(f"  {key}: {dumped.strip()}")
    return "\n".join(lines) + "\n"


def preset(name: str) -> dict:
    """A copy of the named preset's values; ValueError naming the choices for an unknown name."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(sorted(PRESETS))}.")
    return dict(PRESETS[name])
