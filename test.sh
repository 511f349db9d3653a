#!/usr/bin/env bash
# The tests: set up (once), then the whole suite (pure core, then real vLLM on CPU).
set -euo pipefail
cd "$(dirname "$0")"
scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
