#!/usr/bin/env bash
# The tests: set up (once), then the whole suite (pure core, then real vLLM on CPU).
set -euo pipefail
cd "$(dirname "$0")"
scripts/setup.sh
# Two pytest workers, a whole module each (the scheduler in tests/conftest.py: a module's engine starts once).
# Most of an engine's start-up is single-threaded Python, so two modules at a time use both cores; modules go
# out in collection order (engines first, the quick unit modules last, to fill the gaps).
# HOGWILD_TEST_WORKERS=0 runs everything in this one process.
workers=${HOGWILD_TEST_WORKERS:-2}
if [ "$workers" = "0" ]; then
  exec .venv/bin/python -m pytest "$@"
fi
exec .venv/bin/python -m pytest -n "$workers" --no-loadscope-reorder --durations=15 "$@"
