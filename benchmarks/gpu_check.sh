#!/usr/bin/env bash
# The GPU checks this project has not been able to run on its CPU-only machines, as ONE short
# script for a session that has a GPU machine (the device tool: run it with a timeout that leaves
# time for a rerun). Everything it prints goes to $OUT/gpu_check.log when $OUT is set.
#   bash benchmarks/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
LOG=${OUT:-/tmp}/gpu_check.log
export PYTHONUNBUFFERED=1
{
  nvidia-smi --query-gpu=name,memory.total,power.limit --format=csv
  python -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
  # 1. CUDA tests: encode on the device, fp32 parity with the CPU, fp16+GradScaler and bf16 steps.
  python -m pytest -q tests/test_cuda.py tests/test_codecs.py -k "cuda or Cuda or gpu" -p no:cacheprovider
  # 2. Model speed: fp32 and autocast (bf16, then fp16 with a scaler), batch 64 as in the recipe.
  python benchmarks/bench_model.py --device cuda --batch 64 --amp --amp-dtype bf16
  python benchmarks/bench_model.py --device cuda --batch 64 --amp --amp-dtype fp16
  # 3. Evaluation throughput with the flip test (one 2B batch vs two passes) on the GPU.
  python benchmarks/bench_eval.py --device cuda --batch-sizes 32 64 --amp bf16
  # 4. Loader + train step sweep on a synthetic set (loader-bound vs GPU-bound verdict).
  vitpose tune --config configs/vitpose-s_coco_256x192.yaml --synthetic 256 --steps \
      --workers 2,4,8,12 --batch-sizes 64 --batches 20 --no-progress --out "${OUT:-/tmp}/tune"
  # 5. The demo end to end on the GPU with fp16 + GradScaler and NVML telemetry.
  python train.py --demo --amp --work-dir /tmp/demo_gpu --set train.log_every=20
} 2>&1 | tee "$LOG"
