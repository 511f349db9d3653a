"""Hogwild groups on Model Runner V2: the offline oracle module, preemption with exact replay, async scheduling.

How V2 runs here, and what is left out on it: ``tests/integration/runner_v2.py``. The control below runs one of
these tests with vLLM's V1 runner forced under a run that asks for V2, and must see it fail: the runs really ran
V2.
"""

from __future__ import annotations

import pytest

from tests.integration.runner_v2 import check_run, run_on_v2

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.mark.parametrize("name", ["offline", "preemption", "async"])
def test_the_oracle_modules_pass_on_model_runner_v2(name: str) -> None:
    check_run(name)


def test_a_control_that_forces_v1_fails_the_v2_tests() -> None:
    """The same V2 run with vLLM's V1 runner forced under it fails: the V2 runs really ran V2."""
    code, report = run_on_v2(["tests/integration/test_offline.py::test_one_worker_equals_plain_request"],
                             VLLM_HOGWILD_TEST_FORCE_V1="1")
    assert code != 0, report[-3000:]
    assert "the tests ask for the V2 model runner; the engine runs vllm.v1.worker.cpu_model_runner.CPUModelRunner" \
        in report, report[-3000:]
