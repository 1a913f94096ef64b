#!/usr/bin/env bash
# The GRPO check of docs/results/regime-grpo.md: its command, the seeds at once on the one GPU. Environment: STEPS
# (120), LR (5e-6), SEEDS (3), JOBS (SEEDS: runs at once on the GPU), PER_DEVICE (8: completions a micro-batch, 8 a
# prompt), ACCUMULATION (4: micro-batches a step; prompts a step = PER_DEVICE / 8 x ACCUMULATION), EXTRA (more
# `grail compare` flags; a dry run on a CPU: EXTRA="--task_num_heldout 4").
set -euo pipefail
# shellcheck disable=SC2086
python3 -m grail compare --preset smollm-chains \
    --max_steps "${STEPS:-120}" --learning_rate "${LR:-5e-6}" --per_device_train_batch_size "${PER_DEVICE:-8}" \
    --gradient_accumulation_steps "${ACCUMULATION:-4}" --shared_prompt true --save_steps 20 --save_total_limit 1 \
    --auroc-rows 0 --activation_checkpointing false --arms none --seeds "${SEEDS:-3}" --jobs "${JOBS:-${SEEDS:-3}}" \
    --output_dir "$JOB_DIR/grpo" ${EXTRA:-}
