#!/usr/bin/env bash
# One ready GPU check (a few minutes): segment attention (PyTorch paths and the Triton kernel) on CUDA
# against the dense oracle, then one-layer timings. Needs torch with CUDA and
# transformers (for the oracle's RoPE frequencies) on the GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -c "import torch, transformers; assert torch.cuda.is_available()" 2>/dev/null \
  || python3 -m pip install -q transformers hypothesis
python3 -c "import triton" 2>/dev/null || python3 -m pip install -q triton
PYTHONUNBUFFERED=1 python3 benchmarks/device_check.py
