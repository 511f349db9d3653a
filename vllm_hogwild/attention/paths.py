"""Which implementation runs Hogwild rows: ``VLLM_HOGWILD_ATTENTION=cpu-op|torch|triton``, or the platform's default.

Decided once, by the switch, in the process that builds the engine's config,
and carried to every process in ``additional_config`` (:data:`vllm_hogwild.core.options.RUNTIME_KEY`):
the workers run exactly this path or refuse to start, and ``/metrics`` labels
it. No vLLM import.

- ``cpu-op``: the compiled CPU op for decode and speculative verify rows (up
  to 16 tokens; the PyTorch item plan for steps with longer rows:
  prefill chunks, replay). CPU only. The default on the CPU
  when the op builds.
- ``torch``: the PyTorch paths (any device). The CPU's fallback when the op
  cannot be built (logged as a warning), and CUDA's when Triton is missing.
- ``triton``: the Triton kernel (any rows). The default on CUDA. On the CPU it
  runs under Triton's interpreter and so needs ``TRITON_INTERPRET=1`` (a
  testing aid: the very flow the CUDA backend uses, checked without a GPU).

An explicit choice that cannot run on this platform is refused, naming
``VLLM_HOGWILD_ATTENTION``; nothing falls back silently.
"""

from __future__ import annotations

import os
from typing import Callable

from vllm_hogwild.core.errors import HogwildOptionError
from vllm_hogwild.core.log import get_logger
from vllm_hogwild.core.options import runtime_of

ENV = "VLLM_HOGWILD_ATTENTION"
PATHS = ("cpu-op", "torch", "triton")

logger = get_logger(__name__)


def resolve(platform: str, requested: str | None, *, cpu_op_loads: Callable[[], bool],
            triton_imports: Callable[[], bool], interpreting: bool) -> str:
    """The path for ``platform`` (``"cpu"`` or ``"cuda"``) and the requested one (``None``: the default).

    ``cpu_op_loads`` / ``triton_imports`` are asked only when their answer matters.
    """
    if requested is not None and requested not in PATHS:
        raise HogwildOptionError(ENV, f"unknown path {requested!r}; expected one of {list(PATHS)}")
    if platform == "cpu":
        if requested is None:
            if cpu_op_loads():
                return "cpu-op"
            logger.warning("Hogwild attention: the compiled CPU op could not be built; using the PyTorch path "
                           "(set %s=torch to choose it explicitly)", ENV)
            return "torch"
        if requested == "cpu-op" and not cpu_op_loads():
            raise HogwildOptionError(ENV, "cpu-op: the compiled CPU op could not be built here (a C++ compiler "
                                          "with OpenMP is needed); use torch")
        if requested == "triton" and not (triton_imports() and interpreting):
            raise HogwildOptionError(ENV, "triton on the CPU runs under Triton's interpreter: install triton and "
                                          "set TRITON_INTERPRET=1 (a testing aid), or use cpu-op or torch")
        return requested
    if platform == "cuda":
        if requested == "cpu-op":
            raise HogwildOptionError(ENV, "cpu-op runs on the CPU only; on CUDA use triton or torch")
        if requested is None:
            if triton_imports():
                return "triton"
            logger.warning("Hogwild attention: Triton is not installed; using the PyTorch path "
                           "(set %s=torch to choose it explicitly)", ENV)
            return "torch"
        if requested == "triton" and not triton_imports():
            raise HogwildOptionError(ENV, "triton: the triton package is not installed; use torch")
        return requested
    raise HogwildOptionError("additional_config.hogwild", f"no Hogwild attention for platform {platform!r}")


def resolve_here(platform: str) -> str:
    """:func:`resolve` for this process: the environment variable, the CPU op and Triton as installed."""
    def cpu_op_loads() -> bool:
        from vllm_hogwild.attention.cpu_ops import load

        return load() is not None

    def triton_imports() -> bool:
        from vllm_hogwild.attention import triton_attention

        return triton_attention.available()

    requested = os.environ.get(ENV) or None
    return resolve(platform, requested, cpu_op_loads=cpu_op_loads, triton_imports=triton_imports,
                   interpreting=os.environ.get("TRITON_INTERPRET") == "1")


def path_of(additional_config) -> str | None:
    """The path the switch chose for this engine (``None``: Hogwild is off)."""
    return runtime_of(additional_config).get("attention")


def isa_of(additional_config) -> str | None:
    """The compiled CPU op's vector path the switch chose (``None``: another path, or Hogwild off)."""
    return runtime_of(additional_config).get("isa")


def describe(additional_config) -> str:
    """The path as the start-up line and ``/metrics`` name it: ``cpu-op (avx512)``, ``torch``, ..."""
    path, isa = path_of(additional_config), isa_of(additional_config)
    return f"{path} ({isa})" if isa else str(path)
