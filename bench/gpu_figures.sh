#!/bin/bash
# The GPU figures issues 36 and 37 still need, beside what tools/gpu_check.py measures, in one call (at most 8.5
# minutes: every step is time-capped):
#   bash bench/gpu_figures.sh [OUT]
# OUT (default: $OUT, else work_dirs/gpu_figures) gets one log per step and figures.md, their tables. Runs each
# command through the lent machine's kit (.gpu-kit/run.sh, ../shared/device/README.md) when that is present, else
# with this checkout's .venv, else python3.
#   1. the training step: the toy config (issue 36's 100 it/s) and the paper setting with the CAM pass in bf16, with
#      each stage eager and as a CUDA graph against its bound (the energy kernel's autotuner picks its blocks here);
#   2. inference at VOC and COCO size (issue 37): the loop, the model alone, single scale, ms + flip, + CRF;
#   3. the CRF alone, both kernels, batch 1 and 16, with its peak CUDA memory;
#   4. the Triton kernels and the fake-CUDA tests on the real device.
repo=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-${OUT:-$repo/work_dirs/gpu_figures}}
mkdir -p "$out" && cd "$repo" || exit 2
if [ -f .gpu-kit/run.sh ]; then runner=(bash .gpu-kit/run.sh python3)
elif [ -x .venv/bin/python ]; then runner=(.venv/bin/python)
else runner=(python3); fi
parallel=(); "${runner[@]}" -c "import xdist" 2> /dev/null && parallel=(-n 8)  # pytest-xdist where installed
step() {  # step NAME SECONDS ARGS...: one command, its output in OUT/NAME.log, its exit status in figures.md
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  timeout "$limit" "${runner[@]}" "$@" > "$out/$name.log" 2>&1
  local rc=$? command
  printf -v command '%q ' "$@"
  printf '\n## %s (exit %s, %s s)\n\n    %s\n\n' "$name" "$rc" "$((SECONDS - start))" "$command" >> "$out/figures.md"
  grep -E '^\|' "$out/$name.log" >> "$out/figures.md"
  grep -E '(passed|failed|error)' "$out/$name.log" | tail -3 >> "$out/figures.md"
}
{ echo "# GPU figures, $(date -u +%F\ %H:%M) UTC, $(git rev-parse --short HEAD 2>/dev/null)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/    /'; } > "$out/figures.md"
step train_toy 60 bench/bench_train.py --device cuda --config configs/toy_centered.py --steps 100 --repeats 3
step train_bf16 90 bench/bench_train.py --device cuda --steps 30 --repeats 3 --cfg-options train.cam_dtype=bfloat16
step infer_voc 75 bench/bench_inference.py --device cuda --case voc --num 128 --batch-size 8 \
  --rows loop "model alone" --modes single ms+flip ms+flip+crf --max-workers 0
step infer_coco 75 bench/bench_inference.py --device cuda --case coco --num 64 --batch-size 8 \
  --rows loop "model alone" --modes single ms+flip ms+flip+crf --max-workers 0
step crf 60 bench/bench_crf.py --cuda-only --cuda-batches 1 16
step tests 150 -m pytest -q -p no:cacheprovider -o addopts= "${parallel[@]}" -rfEs tests/inference/test_crf_kernels.py \
  tests/test_par_kernel.py tests/test_energy_kernel.py tests/engine/test_cuda_step.py \
  tests/inference/test_cuda_inference.py tests/engine/test_graphs.py
cat "$out/figures.md"
