#!/bin/bash
# The GPU figures issues 36 and 37 still need, beside what tools/gpu_check.py measures, in one call; every step is
# time-capped (the default steps at most 9 minutes in all):
#   bash bench/gpu_figures.sh [OUT [STEP ...]]
# OUT (default: $OUT, else work_dirs/gpu_figures) gets one log per step and figures.md, their tables. STEPs (default:
# all but train_exact, the two train_fp32 steps, infer_profile, the two bf16 inference steps, loader, export and
# suite) choose among:
#   train_toy, train_bf16  the training step, the toy config (issue 36's 100 it/s) and the paper setting with the
#                          forward pass and the CAM pass in bf16 (train.amp, train.cam_dtype), each stage eager and as
#                          a CUDA graph against its bound (the exact energy kernel's autotuner picks its blocks
#                          here, for its stage's row);
#   train_exact            (not by default) the same bf16 step with the exact energy kernel instead of the reference's
#                          lattice (loss.reg_kernel=auto, the default before 2026-11-28): the whole step with it;
#   train_fp32             the paper setting as configured: the reference's float32 step and CAM pass, their
#                          products in TF32 (train.fp32_precision, the reference's), each stage against its bound;
#   train_fp32_explicit    (not by default) the same with the attention's explicit path (the n x n matrix by matrix
#                          products, the reference's computation: one TF32 product each where SDPA's float32 kernel
#                          takes three), against train_fp32;
#   infer_voc, infer_coco  inference at VOC and COCO size (issue 37) at the batch of 16 the tools take on a GPU: the
#                          loop and the model alone, single scale, ms + flip, + CRF, the best of 2 runs (a first run
#                          pays the kernels' compilation); at COCO size (81 classes, every class: the reference) with
#                          the peak GPU memory of each mode;
#   infer_profile          (not by default) where the VOC-sized loop's time goes, DeiT-S, single scale and + CRF: the
#                          loop's thread profiled on its CPU clock (a wait for the device spins there, so it shows as
#                          the CPU time of the call that waits), its 15 costliest functions per image, and the GPU's
#                          busy share of the wall;
#   infer_voc_bf16, infer_coco_bf16
#                          (not by default) the same with the model in bf16 autocast (infer.dtype, docs/reference.md
#                          row 23);
#   crf                    the CRF alone, infer.crf.kernel auto (the simplices kernel beside PyTorch's products)
#                          against torch (PyTorch's operations alone; the Triton products lost everywhere on the
#                          H200), batch 1 and 16, at the default memory budget and at 4 times it (runs
#                          of more images, which share each run's fixed cost), with its peak CUDA memory and traffic
#                          bound, the cases by their need (COCO's 81 classes first, VOC's 3 last), and after each
#                          case, at batch 16, the 12 longest kernels of the construction and of a whole call, with the
#                          GPU's busy share;
#   loader                 (not by default) the training loader alone on the GPU host's cores, 0-8 workers, against
#                          what 30 it/s needs (bench/bench_loader.py), at most 120 s;
#   export                 (not by default) the pseudo-label export (with and without --crf) and eval_cams --pseudo
#                          at batch 1 and 16 (issue 37): operations per image, images/s at VOC size, at most 120 s;
#   tests                  the Triton kernels' and the fake-CUDA tests on the real device;
#   suite                  the whole test suite (issue 36: green on a GPU machine), at most 7 minutes (on an H200
#                          with 14 workers 90 % of it ran in 190 s, 2026-11-28).
# The two test steps append each failure's traceback to OUT/failures.log as it happens.
# Runs each command through the lent machine's kit (.gpu-kit/run.sh, ../shared/device/README.md) when that is
# present, else with this checkout's .venv, else python3.
repo=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-${OUT:-$repo/work_dirs/gpu_figures}}
steps=("${@:2}")
[ ${#steps[@]} -gt 0 ] || steps=(train_toy train_bf16 infer_voc infer_coco crf tests)
mkdir -p "$out" && cd "$repo" || exit 2
if [ -f .gpu-kit/run.sh ]; then runner=(bash .gpu-kit/run.sh python3)
elif [ -x .venv/bin/python ]; then runner=(.venv/bin/python)
else runner=(python3); fi
parallel=(); "${runner[@]}" -c "import xdist" 2> /dev/null && parallel=(-n 12)  # pytest-xdist where installed
# each failure's traceback in OUT/failures.log as it happens (tests/failure_log.py): a step cut at its cap keeps them
pytest=(-m pytest -q -p no:cacheprovider -o addopts= "${parallel[@]}" -rfEs -p tests.failure_log --failure-log
  "$out/failures.log")
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
for name in "${steps[@]}"; do
  case $name in
    train_toy) step "$name" 40 bench/bench_train.py --device cuda --config configs/toy_centered.py --steps 100 \
      --repeats 3 ;;
    train_bf16) step "$name" 50 bench/bench_train.py --device cuda --steps 30 --repeats 3 --kernels 8 \
      --cfg-options train.amp=true train.cam_dtype=bfloat16 ;;
    train_exact) step "$name" 40 bench/bench_train.py --device cuda --steps 30 --repeats 2 \
      --cfg-options train.amp=true train.cam_dtype=bfloat16 loss.reg_kernel=auto ;;
    train_fp32) step "$name" 40 bench/bench_train.py --device cuda --steps 20 --repeats 2 --kernels 8 ;;
    train_fp32_explicit) step "$name" 40 bench/bench_train.py --device cuda --steps 20 --repeats 2 \
      --attention explicit ;;
    infer_voc) step "$name" 90 bench/bench_inference.py --device cuda --case voc --num 128 --batch-size 16 \
      --rows loop "model alone" --modes single ms+flip ms+flip+crf --max-workers 0 --repeats 2 ;;
    infer_coco) step "$name" 120 bench/bench_inference.py --device cuda --case coco --num 64 --batch-size 16 \
      --rows loop "model alone" --modes single ms+flip ms+flip+crf --mask-classes all --memory --max-workers 0 \
      --repeats 2 ;;
    infer_profile) step "$name" 60 bench/bench_inference.py --device cuda --case voc --configs configs/voc_centered.py \
      --num 128 --batch-size 16 --rows loop --modes single ms+flip+crf --max-workers 0 --profile 15 ;;
    infer_voc_bf16) step "$name" 90 bench/bench_inference.py --device cuda --case voc --num 128 --batch-size 16 \
      --rows loop "model alone" --modes single ms+flip ms+flip+crf --max-workers 0 --repeats 2 --dtype bfloat16 ;;
    infer_coco_bf16) step "$name" 120 bench/bench_inference.py --device cuda --case coco --num 64 --batch-size 16 \
      --rows loop "model alone" --modes single ms+flip ms+flip+crf --mask-classes all --memory --max-workers 0 \
      --repeats 2 --dtype bfloat16 ;;
    crf) step "$name" 120 bench/bench_crf.py --cuda-only --cuda-batches 1 16 --cuda-memory-mib 3072 12288 \
      --cuda-kernels auto torch --cases coco81 voc21 voc3 --profile 12 ;;
    loader) step "$name" 120 bench/bench_loader.py --workers 0 1 2 4 8 --batches 48 ;;
    export) step "$name" 120 bench/bench_export.py --device cuda --time --crf --num 256 --batch-sizes 1 16 ;;
    tests) step "$name" 120 "${pytest[@]}" tests/inference/test_crf_kernels.py tests/test_par_kernel.py \
      tests/test_energy_kernel.py tests/test_energy_lattice.py tests/engine/test_cuda_step.py \
      tests/inference/test_cuda_inference.py tests/engine/test_graphs.py ;;
    suite) step "$name" 420 "${pytest[@]}" tests ;;
    *) echo "gpu_figures.sh: unknown step '$name' (train_toy train_bf16 train_exact train_fp32 train_fp32_explicit" \
      "infer_voc infer_coco infer_profile infer_voc_bf16 infer_coco_bf16 crf tests loader export suite)" >&2
      exit 2 ;;
  esac
done
cat "$out/figures.md"
