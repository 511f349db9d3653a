#!/usr/bin/env bash
# The tests: set up (once), then the whole suite (pure core, then real vLLM on CPU).
set -euo pipefail
cd "$(dirname "$0")"
scripts/setup.sh
# Two pytest workers, a whole module each (the scheduler in tests/conftest.py: a module's engine starts once);
# modules go out in collection order (engines first, the quick unit modules last, to fill the gaps).
# HOGWILD_TEST_WORKERS=0 runs everything in this one process.
workers=${HOGWILD_TEST_WORKERS:-2}
if [ "$workers" = "0" ]; then
  exec .venv/bin/python -m pytest "$@"
fi
# One OpenMP thread per process: every test process (and the engines it starts in-process, whose CPU worker
# keeps torch's thread count) would otherwise run as many threads as the machine has cores, and with two
# workers those threads outnumber the cores; OpenMP's barriers then wait on descheduled threads and torch's
# small ops ran up to 15 times slower (a module that takes 35 s alone took 515 s beside another).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# And no pinning: vLLM's CPU engines in their own processes (servers, Ray replicas) bind their model worker to
# core 0 by default (core 1 reserved), so every engine the two workers start would share one core.
export VLLM_CPU_OMP_THREADS_BIND=${VLLM_CPU_OMP_THREADS_BIND:-nobind}
exec .venv/bin/python -m pytest -n "$workers" --no-loadscope-reorder --durations=15 "$@"
