#!/usr/bin/env bash
# The main job: set up .venv (once, scripts/setup.sh), then the demo (vllm_hogwild/tools/demo.py): the merges
# collaborator solves one task with 1 worker, then as a Hogwild group of 4 that ends paths by reference to its
# co-workers'. --links, --roman and --smollm2 run the earlier demos; arguments go to the demo (--help).
set -euo pipefail
cd "$(dirname "$0")"
scripts/setup.sh
exec .venv/bin/python -m vllm_hogwild.tools.demo "$@"
