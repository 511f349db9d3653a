"""TEST-ONLY: lets vLLM 0.32 run Model Runner V2 on a CPU, with Triton's interpreter. Never loaded by the package.

vLLM 0.32 ships Model Runner V2 for the CPU (``vllm/v1/worker/cpu/model_runner.py``) but takes it only where
Triton has a CPU backend (``vllm/triton_utils/importing.py``), which needs triton-cpu, and no registry here
serves it. With ``TRITON_INTERPRET=1`` V2's Triton kernels run in Triton's interpreter on CPU tensors; what is
missing is only the entry vLLM looks for. This module registers an inactive ``"cpu"`` backend in
``triton.backends.backends`` before vLLM is imported. Python imports ``sitecustomize`` at start-up from
``PYTHONPATH``, so every process of the engine (the engine core, the model worker) gets it; the tests put this
folder there (``tests/conftest.py``, ``VLLM_HOGWILD_TEST_RUNNER=v2``). Nothing here is a speed measurement.
"""

import os

if os.environ.get("TRITON_INTERPRET") == "1":
    try:
        from triton.backends import Backend, backends
    except ImportError:  # no Triton: vLLM runs V1, and the V2 tests' runner check says so
        backends = None

    class _InactiveCPUDriver:
        """A driver that is never active: Triton never picks it; vLLM only looks for the "cpu" entry."""

        @staticmethod
        def is_active() -> bool:
            return False

    if backends is not None and "cpu" not in backends:
        backends["cpu"] = Backend(compiler=None, driver=_InactiveCPUDriver)
