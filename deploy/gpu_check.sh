#!/usr/bin/env bash
# GPU check: kernel tests on the GPU, kernel vs torch vs copy bandwidth, block encode/decode on the device,
# blend vs full TTFT at 8 and 16 chunks -> one JSON with the device name.
#   deploy/gpu_check.sh [OUT.json] [--quick]      (default OUT: research/results/gpu.json; < 8 minutes on one GPU)
# Exits non-zero with a clear message when no CUDA device is visible, or when a kernel test fails.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-research/results/gpu.json}"
shift || true
PY="${PYTHON:-python}"
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && PY=.venv/bin/python
unset TRITON_INTERPRET RAGKV_FORCE_TORCH
exec timeout 470 "$PY" -m ragkv.bench.gpu --json "$OUT" "$@"
