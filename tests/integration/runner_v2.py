"""The oracle modules on vLLM's Model Runner V2 (the only runner of vLLM 0.34), in pytest processes of their own.

vLLM 0.32's CPU build ships Model Runner V2 but takes it only where Triton has a CPU backend. With Triton's
interpreter and a test-only shim (``tests/runner_v2_shim/sitecustomize.py``), V2 runs here; ``tests/conftest.py``
sets both up when ``VLLM_HOGWILD_TEST_RUNNER=v2``, before vLLM is imported, so each run is a pytest process of
its own. Its engines run a tiny model with a 1,024-token vocabulary (V2's samplers scan the vocabulary in
interpreted kernels). Every engine those modules build checks that its worker runs V2's runner class
(``tests/integration/conftest.check_runner``); the control (``test_runner_v2_groups.py``) runs one of them with V1
forced and must fail there. Nothing here is a speed measurement. The runs are split over two test modules, so
that the suite's two workers can take them side by side.

Left out on V2, each still running on V1 with SmolLM2's whole vocabulary: tests whose precondition is a property
of the tiny model's random text rather than of the engine (``SKIP_ON_V2``), and tests of vLLM kernels that
Triton's interpreter cannot run (``NOT_IN_THE_INTERPRETER``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Tests whose precondition fails with the cut vocabulary's text, not with the engine (the same assertion on the
# same engine path holds in their sibling cases).
SKIP_ON_V2 = {
    "multiverse-2-isolated": "its precondition, branches of different lengths, fails for V2's draw with this seed "
                             "(the other isolated cases check the oracle on the same path)",
    "does_not_fork_equals": "the 1,024-token model writes Multiverse's tags (1% of its vocabulary) into a plain "
                            "request's text; fails the same way on V1 with that model",
    "prompt_goal_that_does_not_fork": "the 1,024-token model writes Multiverse's tags (1% of its vocabulary): V2's "
                                      "draw writes a goal the test does not expect",
    "plain_re_prefill_on_resumption": "(fork/join) its precondition, three requests preempted where a plain prefill "
                                      "differs, depends on the model's text; fails the same way on V1 with this model "
                                      "(test_preemption's control of the same kind runs on V2)",
}
# Tests of vLLM kernels that Triton 3.9's interpreter cannot run: V2's n-gram proposer (``_ngram_finalize_kernel``:
# "mask has unsupported dtype") and its top-k/top-p sampler (``topk_topp_triton``). The proposer-agnostic cases of
# speculative decoding run with the draft model instead (tests/integration/speculative_cases.py, NGRAM_RUNS_HERE).
NOT_IN_THE_INTERPRETER = ("ngram", "top_k_and_top_p", "blocks_come_back")

# name -> (the pytest arguments, the fewest tests that must pass)
RUNS = {
    # raw contiguous at N = 2 and 4, the combined and interleaved layouts, one worker equal to a plain request,
    # isolated equal to plain seeded requests, plain requests beside groups, named and collab protocols, the
    # training forward equal to the engine
    "offline": (["tests/integration/test_offline.py"], 24),
    # groups preempted whole under a small cache and resumed by exact replay; the plain re-prefill control
    "preemption": (["tests/integration/test_preemption.py", "-k", "resume_exactly or plain_re_prefill"], 2),
    # fork/join: isolated and hogwild branches, nested forks, forced headers fed ahead with their log-probabilities,
    # and preempted mid-fork
    "forkjoin": (["tests/integration/test_forkjoin.py", "tests/integration/test_forkjoin_preemption.py", "-k",
                  " and ".join(f"not {key}" for key in SKIP_ON_V2)], 10),
    # speculative decoding (a draft model: see NOT_IN_THE_INTERPRETER) against the oracle given every lane's accept
    # steps, fork/join with hogwild branches, one worker equal to a plain request, the same-step control, collab with
    # forced prefixes and the finisher (accepted runs cut where the engine forces text); an FP8 cache
    "speculative": (["tests/integration/speculative_cases.py", "-k",
                     " and ".join(f"not {key}" for key in NOT_IN_THE_INTERPRETER)], 10),
    "fp8": (["tests/integration/test_fp8_engine.py"], 3),
    # vLLM's async scheduling (forced on on the CPU): groups against the oracle, plain requests equal to a stock
    # engine's (stock V2)
    "async": (["tests/integration/test_async_scheduling.py"], 6),
}


def run_on_v2(args: list[str], **env: str) -> tuple[int, str]:
    """A pytest process whose engines run Model Runner V2: its exit status and its report."""
    # A hang guard: the longest run took 139 s in a whole suite's run on 2 cores; 1,800 s is 13 times that.
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:logging", "-p", "no:xdist", "-rA", *args],
                          cwd=ROOT, env={**os.environ, "VLLM_HOGWILD_TEST_RUNNER": "v2", **env},
                          capture_output=True, text=True, timeout=1800)
    lines = [line for line in proc.stdout.splitlines() if not line.startswith(("(", "[", "INFO", "WARNING", "DEBUG"))]
    return proc.returncode, "\n".join(line for line in lines if line.strip())


def cpu_skips(report: str) -> int:
    """The tests of a run's report skipped because this CPU cannot run vLLM's FP8 cache (no AVX-512 or AMX: the
    one skip a machine, not the code, decides); 0 on a CPU that can, where such a skip would be a defect."""
    from tests.integration.test_fp8_engine import _fp8_runs_here

    why = _fp8_runs_here()
    if why is None:
        return 0
    return sum(int(k) for k in re.findall(r"^SKIPPED \[(\d+)\] .*" + re.escape(why), report, re.M))


def check_run(name: str) -> None:
    """Run ``RUNS[name]`` on V2: it passes, with at least its number of tests (those this CPU cannot run, skipped
    for it by name, counted: :func:`cpu_skips`)."""
    args, min_passed = RUNS[name]
    code, report = run_on_v2(args)
    print(report[-6000:])
    assert code == 0, report[-8000:]
    found = re.search(r"(\d+) passed", report)
    passed = int(found.group(1)) if found else 0
    assert passed + cpu_skips(report) >= min_passed, report[-3000:]  # every run's fewest is at least 2
