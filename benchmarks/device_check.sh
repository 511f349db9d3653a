#!/usr/bin/env bash
# One GPU check of the Triton segment-attention kernel (a few minutes, well under 8 on one H200):
# correctness against a float64 oracle on vLLM FlashAttention's cache in every physical layout, compile
# times, one-layer timings against torch SDPA, a markdown table and a final PASS/FAIL line.
#
#   bash benchmarks/device_check.sh                # on the GPU machine: torch + triton, nothing else
#   PYTHON=.venv/bin/python bash benchmarks/device_check.sh --cpu-smoke   # same code paths on a CPU
#
# Installs nothing (the GPU machine has no internet): fails clearly when torch or triton is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if ! "$PY" -c "import torch, triton" 2>/dev/null; then
  echo "device_check: FAIL: $PY cannot import torch and triton; install them first (nothing is installed here)" >&2
  exit 2
fi
if [[ " $* " != *" --cpu-smoke "* ]] && ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "device_check: FAIL: torch sees no CUDA device (use --cpu-smoke to run the code paths on a CPU)" >&2
  exit 2
fi
PYTHONUNBUFFERED=1 exec "$PY" benchmarks/device_check.py "$@"
