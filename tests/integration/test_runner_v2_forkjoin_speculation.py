"""Fork/join requests, speculative decoding and FP8 caches on Model Runner V2, against their oracles.

How V2 runs here, and what is left out on it: ``tests/integration/runner_v2.py``; the control that proves these
runs ran V2: ``tests/integration/test_runner_v2_groups.py``.
"""

from __future__ import annotations

import pytest

from tests.integration.runner_v2 import check_run

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.mark.parametrize("name", ["forkjoin", "speculative", "fp8"])
def test_the_oracle_modules_pass_on_model_runner_v2(name: str) -> None:
    check_run(name)
