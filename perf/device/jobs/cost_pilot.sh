#!/usr/bin/env bash
# The cost pilot of docs/results/credit-pays-cost.md on the GPU: one micro-batch of the comparison's runs (8 rows of
# 64 tokens, the shared prompt, coin rewards) per method and round, in bf16, on the warm start the runs start from
# (run with SFT_STEPS=30). Writes pilot.json and pilot.log (its `round ...` lines feed perf/experiments/pilot_cost.py).
# Environment: METHODS (none,grail,grail_over_surprise,oar_g,oar_p), ROUNDS (5), SFT_STEPS (the warm start's steps),
# DEVICE (cuda, in bf16; a dry run on a CPU: DEVICE=cpu, in fp32).
set -euo pipefail
device=${DEVICE:-cuda}
precision=(); [ "$device" = cuda ] && precision=(--bf16)
python3 perf/benchmarks/step_overhead.py --model "sft:smollm2-135m:sft_steps=${SFT_STEPS:-40}" --short \
    --set task_style=chains --set shared_prompt=true --completion-tokens 64 --rows 8 --generations 8 \
    --methods "${METHODS:-none,grail,grail_over_surprise,oar_g,oar_p}" --reward coin --warmup 1 \
    --rounds "${ROUNDS:-5}" --device "$device" "${precision[@]}" > "$JOB_DIR/pilot.json" 2> "$JOB_DIR/pilot.log"
grep '^round' "$JOB_DIR/pilot.log" || true
