#!/usr/bin/env bash
# The development-seed screen of credit signals (docs/results/credit-screen.md) on the warm-started SmolLM2
# (chain_rollouts needs a model that writes the chain task's format): every candidate and GRAIL and OAR-P on the three
# label sets of the development seed, on the GPU. Environment: SEED (0),
# ROWS (8), METHODS (credit_screen.py's default), MODEL (default: the warm start in $GRAIL_CACHE), DEVICE (cuda).
set -euo pipefail
model=${MODEL:-$(ls -d "$GRAIL_CACHE"/sft/smollm2-135m-*/ | head -n 1)}
out="$JOB_DIR/credit-screen-seed${SEED:-0}.json"
cd perf/experiments
# shellcheck disable=SC2086
python3 credit_screen.py --model "$model" --seed "${SEED:-0}" --rows "${ROWS:-8}" --device "${DEVICE:-cuda}" \
    ${METHODS:+--methods "$METHODS"} --json "$out"
