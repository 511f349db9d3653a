"""Every segment-attention path in the real engine, and the engine's refusals (CPU, tiny random Llama).

``VLLM_HOGWILD_ATTENTION=triton`` with ``TRITON_INTERPRET=1`` runs the very flow
the CUDA backend uses (the shared metadata builder, the block-bucket plan, the
Triton kernel, the log-sum-exp merge, rows written into the output) on the CPU,
under Triton's interpreter; ``torch`` runs the PyTorch paths. Each in its own
engine process (tests/integration/path_run.py), in a KV cache small enough that
groups are preempted and resume by replay, scored against the dense oracle.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.conftest import make_llm

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ROOT = Path(__file__).parents[2]
PATHS = {"triton": {"VLLM_HOGWILD_ATTENTION": "triton", "TRITON_INTERPRET": "1"},
         "torch": {"VLLM_HOGWILD_ATTENTION": "torch"}}


@pytest.fixture(scope="module")
def runs(tiny_model, tmp_path_factory) -> dict:
    """Both engines at once (one process each), then their results."""
    tmp = tmp_path_factory.mktemp("paths")
    procs = {}
    for name, env in PATHS.items():
        procs[name] = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.path_run", str(tiny_model), str(tmp / f"{name}.json")],
            cwd=ROOT, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    results = {}
    for name, proc in procs.items():
        # A hang guard: both runs took 147-161 s in a whole suite's run on 2 cores; 1,800 s is 11 times that.
        log, _ = proc.communicate(timeout=1800)
        assert proc.returncode == 0, log[-4000:]
        results[name] = json.loads((tmp / f"{name}.json").read_text())
    return results


@pytest.mark.parametrize("path", sorted(PATHS))
def test_the_path_in_the_engine_matches_the_dense_oracle(runs, path) -> None:
    result = runs[path]
    assert result["path"] == path
    print(f"\n{path}: " + "; ".join(f"{c['case']}: {c['err']:.1e}" for c in result["cases"])
          + f"; {result['group_preemptions']} group preemptions, {result['replayed_tokens']} tokens replayed")
    assert result["group_preemptions"] >= 1 and result["replayed_tokens"] > 0  # replay rows ran on this path
    assert [c["case"] for c in result["cases"]] == ["raw contiguous n=2", "raw contiguous n=4",
                                                    "collab combined n=2", "collab combined n=4"]
    for case in result["cases"]:
        assert case["err"] <= 1e-4, case
        if "without_headers" in case:
            assert case["without_headers"] > 1e-3 and case["steps"] >= 4, case


@pytest.mark.parametrize("env,message", [
    ({"VLLM_HOGWILD_ATTENTION": "triton", "TRITON_INTERPRET": "0"}, "TRITON_INTERPRET=1"),
    ({"VLLM_HOGWILD_ATTENTION": "flash"}, "unknown path 'flash'"),
])
def test_a_path_that_cannot_run_here_is_refused_naming_the_variable(tiny_model, monkeypatch, env, message) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ValueError, match=f"^VLLM_HOGWILD_ATTENTION: .*{message}"):
        make_llm(tiny_model, additional_config={"hogwild": {}})


def test_an_attention_backend_without_hogwild_rows_is_refused_at_start(tiny_model, monkeypatch) -> None:
    """The worker's layers run vLLM's own CPU_ATTN (as if the override had not taken): the engine refuses to
    start, naming attention_backend, instead of serving groups as independent samples."""
    from vllm_hogwild.runner import worker

    def stock_backend(backend, class_path) -> None:
        from vllm.v1.attention.backends.registry import register_backend
        from vllm.v1.attention.selector import _cached_get_attn_backend

        register_backend(backend, "vllm.v1.attention.backends.cpu_attn.CPUAttentionBackend")
        _cached_get_attn_backend.cache_clear()

    monkeypatch.setattr(worker, "override_backend", stock_backend)
    with pytest.raises(Exception) as info:  # the worker's HogwildOptionError, raised in this process
        make_llm(tiny_model, additional_config={"hogwild": {}}, distributed_executor_backend="uni")
    chain, err = [], info.value
    while err is not None:
        chain.append(err)
        err = err.__cause__ or err.__context__
    named = [e for e in chain if getattr(e, "parameter", None) == "attention_backend"]
    assert named, [repr(e) for e in chain]
    assert "CPUAttentionBackendImpl" in str(named[0]) and "CPU_ATTN" in str(named[0])
