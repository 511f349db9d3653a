"""The Triton kernel on CPU under Triton's interpreter, against the oracle (tests/triton_check.py).

In a subprocess: ``TRITON_INTERPRET=1`` must be set before Triton is imported
and turns every Triton kernel of the process into interpreted Python. Triton
is in the CPU set-up (pinned in requirements/cpu-constraints.txt, required by
vLLM's xgrammar), so the test always runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def test_kernel_matches_the_oracle_and_loads_each_block_once() -> None:
    root = Path(__file__).parents[2]
    run = subprocess.run([sys.executable, "-m", "tests.triton_check"], cwd=root, capture_output=True, text=True,
                         env={**os.environ, "TRITON_INTERPRET": "1"}, timeout=600)
    lines = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert lines and lines[-1] == {"ok": run.returncode == 0}, run.stdout[-3000:] + run.stderr[-3000:]
    cases = lines[:-1]
    assert len(cases) >= 15 and {c["dtype"] for c in cases} == {"float32", "bfloat16", "float16"}
    for c in cases:
        assert c["rel_err_oracle"] <= c["tolerance"], c
        # One load per (block, KV head) serves every reader of that block in the step.
        assert c["block_loads"] <= c["block_readers"]
        if c["workers"] >= 2 and c["layout"] != "isolated":
            assert c["block_readers"] >= 2 * c["block_loads"], c
    assert run.returncode == 0
