"""Named sets of config values. `grail train --preset NAME`; precedence defaults < preset < file < flags.

Presets only hold values; every field's meaning is documented once, in `GRAILConfig`.
"""

from __future__ import annotations

from grail.prompts import PAPER_PROMPT_SUFFIX

# The GRAIL release's loss and grouping (METHODS.md section 1): A = r - mean(group) without std scaling,
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

# The GRAIL release's GRPO recipe (../shared/METHODS.md section 1), for Qwen3-4B on DeepMath-103K.
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

PRESETS: dict[str, dict] = {"paper": PAPER, "tiny-cpu": TINY_CPU}


def preset(name: str) -> dict:
    """A copy of the named preset's values; ValueError naming the choices for an unknown name."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(sorted(PRESETS))}.")
    return dict(PRESETS[name])
