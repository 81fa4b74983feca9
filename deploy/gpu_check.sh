#!/usr/bin/env bash
# GPU check: kernel tests on the GPU, kernel vs torch vs copy bandwidth, blend vs full TTFT -> one JSON.
#   deploy/gpu_check.sh [OUT.json] [--quick]      (default OUT: gpu_check.json; < 5 minutes on one GPU)
# Exits non-zero with a clear message when no CUDA device is visible, or when a kernel test fails.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-gpu_check.json}"
shift || true
PY="${PYTHON:-python}"
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && PY=.venv/bin/python
unset TRITON_INTERPRET RAGKV_FORCE_TORCH
exec timeout 300 "$PY" -m ragkv.bench.gpu --json "$OUT" "$@"
