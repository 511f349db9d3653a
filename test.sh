#!/usr/bin/env bash
# The tests: set up (once), then the whole suite (pure core, then real vLLM on CPU).
set -euo pipefail
cd "$(dirname "$0")"
scripts/setup.sh
# Two pytest workers, a whole module each (the scheduler in tests/conftest.py: a module's engine starts once).
# The suite is CPU-bound (2026-12-02, 2 cores: 50 min wall, 72 min CPU), so two workers gain little; modules go
# out in collection order (engines first, the quick unit modules last, to fill the gaps).
# HOGWILD_TEST_WORKERS=0 runs everything in this one process.
workers=${HOGWILD_TEST_WORKERS:-2}
if [ "$workers" = "0" ]; then
  exec .venv/bin/python -m pytest "$@"
fi
exec .venv/bin/python -m pytest -n "$workers" --no-loadscope-reorder --durations=15 "$@"
