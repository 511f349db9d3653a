#!/usr/bin/env bash
# The main job: set up (once), prepare the embedded default model (once), run a generation.
set -euo pipefail
cd "$(dirname "$0")"
scripts/setup.sh
exec .venv/bin/python -m vllm_hogwild.tools.demo "$@"
