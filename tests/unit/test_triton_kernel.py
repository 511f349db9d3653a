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

import pytest

from benchmarks.device_cases import FA_LAYOUTS

ROOT = Path(__file__).parents[2]
# The subprocesses' 600 s limits are hang guards: each test took under 50 s in a whole suite's run on 2 cores.


def test_kernel_matches_the_oracle_and_loads_each_block_once() -> None:
    run = subprocess.run([sys.executable, "-m", "tests.triton_check"], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "TRITON_INTERPRET": "1"}, timeout=600)
    lines = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert lines and lines[-1] == {"ok": run.returncode == 0}, run.stdout[-3000:] + run.stderr[-3000:]
    cases = [line for line in lines if "cache" in line]
    assert len(cases) >= 26 and {c["dtype"] for c in cases} == {"float32", "bfloat16", "float16"}
    # Every layout read in place: separate K/V, vLLM's CPU cache (K transposed and plain), and the
    # FlashAttention cache in every physical layout vLLM 0.32 allocates.
    assert {c["cache"] for c in cases} == {"plain", "cpu_k_transposed", "cpu", *(f"fa:{x}" for x in FA_LAYOUTS)}
    for c in cases:
        assert c["rel_err_oracle"] <= c["tolerance"], c
        # One load per (block, KV head) serves every reader of that block in the step.
        assert c["block_loads"] <= c["block_readers"]
        if c["workers"] >= 2 and c["layout"] != "isolated":
            assert c["block_readers"] >= 2 * c["block_loads"], c
        if c["cache"] != "plain":  # strided qkv slice as the query; rows outside the plan keep the sentinel
            assert c["strided_query"] and c["untouched"] is True, c
    # Runs of several blocks (one unit reads them in turn, its softmax running across them) in most cases, and runs
    # of one block (what these small shapes plan by default: many splits, merged) in the others.
    assert sum(c["split_blocks"] > 1 for c in cases) >= 15 and any(c["split_blocks"] == 1 for c in cases)
    assert any(c["splits"] > 1 and c["split_blocks"] > 1 for c in cases)
    # Cases on the plan buffers and lane table another case used before (a step after another).
    assert sum(c["reused_buffers"] for c in cases) >= 10
    # Per-step counts (rows, pairs, items, splits) are no kernel argument; the lane table's stride is not
    # specialized on.
    spec = next(line["specialization"] for line in lines if "specialization" in line)
    assert spec["ok"] and spec["partials_keys"] == 1 and spec["merge_keys"] == 1, spec
    assert spec["partials_keys_without_do_not_specialize"] > 1, spec  # the strides do differ
    assert len({(s["rows"], s["pairs"], s["items"]) for s in spec["steps"]}) == len(spec["steps"]), spec
    assert run.returncode == 0


def test_kernels_compile_for_an_h100_h200_with_tensor_cores(tmp_path: Path) -> None:
    """Triton's real compiler (not the interpreter) and ptxas, for sm_90, without a GPU: both kernels
    compile for every model shape of the device check; bf16/fp16 scores and values use tensor-core
    ``mma`` instructions, fp32 ones stay exact (no tf32)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-m", "tests.triton_check", "--compile-for-gpu", "90"], cwd=ROOT,
                         capture_output=True, text=True, env={**env, "TRITON_CACHE_DIR": str(tmp_path)}, timeout=600)
    lines = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert lines, run.stdout[-3000:] + run.stderr[-3000:]
    if lines[0].get("compile") == "skipped":
        pytest.skip(f"this Triton build has no NVIDIA backend: {lines[0]['reason']}")
    assert lines[-1] == {"ok": True} and run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    partials = [line for line in lines if line.get("compile") == "_segment_partials"]
    assert len(partials) == 5 and len([line for line in lines if line.get("compile") == "_merge_partials"]) == 5
    for line in partials:
        assert line["mma"] > 0 if line["dtype"] != "float32" else not line["tf32"], line


def test_device_check_script_runs_end_to_end_on_the_cpu() -> None:
    """``benchmarks/device_check.py --cpu-smoke``: the GPU script's code paths (FlashAttention cache
    layouts, FP8 caches, block ids past 65,536, strided query, sentinel, torch-only oracle, timings, the table) on
    tiny shapes under the interpreter, so a broken script is caught here and not on a scarce GPU run."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "benchmarks/device_check.py", "--cpu-smoke"], cwd=ROOT,
                         capture_output=True, text=True, env=env, timeout=600)
    out = run.stdout
    assert run.returncode == 0 and out.rstrip().endswith("PASS"), out[-3000:] + run.stderr[-3000:]
    assert "0 failures" in out and "| model | N | view tokens |" in out
    for layout in FA_LAYOUTS:
        assert f" {layout} N=" in out
    for encoding in ("fp8_e4m3", "fp8_e5m2"):  # FP8 caches (uint8 bytes, scales unlike 1) against the oracle
        assert any(line.startswith("ok ") and f"{encoding} cache" in line for line in out.splitlines()), encoding


def test_a_captured_decode_step_replays_step_after_step_equal_to_the_oracle() -> None:
    """A CUDA graph's life on the CPU (``tests/graph_replay_check.py``): a frozen planner's buffers and the
    launches of two layers captured once (two launches a layer, under a guard against allocation and host
    reads), then 24 decode steps replayed on exactly those launches, the plan written into the same buffers each
    step: lanes crossing blocks, a worker that finishes, a group that leaves and one that joins in its slots, a
    combined group's history growing; every row of every layer equal to the float64 oracle. Controls: the
    launches replayed on the step before's plan miss it, and a forward that allocates fails the guard."""
    run = subprocess.run([sys.executable, "-m", "tests.graph_replay_check"], cwd=ROOT, capture_output=True,
                         text=True, env={**os.environ, "TRITON_INTERPRET": "1"}, timeout=600)
    lines = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert lines and lines[-1] == {"ok": True} and run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    steps = [line for line in lines if "step" in line]
    summary = next(line["replay"] for line in lines if "replay" in line)
    assert len(steps) >= 20 and all(s["rel_err"] <= 1e-5 and s["buffers_as_captured"] for s in steps)
    assert summary["launches_captured"] == 2 * summary["layers"]  # two launches a layer
    assert summary["blocks_taken"] >= 6 and 0 < summary["plans_rebuilt"] < summary["steps"]
    assert {"B leaves", "C joins in B's slots", "A: worker 2 finishes"} <= {s["event"] for s in steps}
    assert summary["stale_plan_rel_err"] > 1e-3  # the control: a plan one step old misses
    assert "allocation" in summary["guard_control"] and summary["guard_ops"] == 0
