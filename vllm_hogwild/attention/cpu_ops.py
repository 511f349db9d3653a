"""The compiled CPU op for decode rows (``csrc/segment_attention_cpu.cpp``), built on first use.

Built with ``torch.utils.cpp_extension`` (needs a C++ compiler; the build is
cached under ``~/.cache/torch_extensions``) for the CPU it runs on
(``-march=native``). If it cannot be built, :func:`load` returns ``None``; the
engine then runs the PyTorch paths and says so
(:mod:`vllm_hogwild.attention.paths`; ``VLLM_HOGWILD_ATTENTION=torch`` chooses
them explicitly).

The op has a vector path per instruction set it was compiled for:
``avx512_bf16`` (``avx512`` that scores a bfloat16 cache with the CPU's BF16
dot product, where it has AVX512_BF16; the query rounded to bfloat16 for it),
``avx512`` (512-bit registers, where the CPU has AVX-512), ``avx2``, and
``generic`` loops. The widest runs unless ``VLLM_HOGWILD_CPU_ISA`` names another
(:func:`choose`; the switch records the choice for every process of the engine,
and the start-up line and ``/metrics`` name it).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from vllm_hogwild.core.errors import HogwildOptionError
from vllm_hogwild.core.log import get_logger

logger = get_logger(__name__)

SOURCE = Path(__file__).parent / "csrc" / "segment_attention_cpu.cpp"
ISA_ENV = "VLLM_HOGWILD_CPU_ISA"
ISA_CODES = {"generic": 0, "avx2": 1, "avx512": 2, "avx512_bf16": 3}  # the op's Isa enum
_current: str | None = None


@functools.lru_cache(maxsize=1)
def load():
    try:
        from torch.utils.cpp_extension import load as build

        # -fopenmp: at::parallel_for is a header template that runs its loop on
        # OpenMP threads only in code compiled with OpenMP; without it the op ran
        # on one core (3x slower on 2 cores). The extension links libgomp.so.1,
        # which resolves to the copy torch has already loaded (same soname), so
        # the op shares torch's thread pool and vLLM's thread binding.
        return build(name="vllm_hogwild_cpu_ops_omp", sources=[str(SOURCE)],
                     extra_cflags=["-O3", "-march=native", "-ffast-math", "-fopenmp"],
                     extra_ldflags=["-fopenmp"], verbose=False)
    except Exception as err:  # a missing compiler must not take the engine down
        logger.warning("vllm-hogwild: CPU kernel unavailable (%s); using the PyTorch path", err)
        return None


def isas() -> list[str]:
    """The paths the op was compiled with, widest first (``[]`` without the op)."""
    ops = load()
    return [] if ops is None else list(ops.isas())


def choose(requested: str | None = None) -> str:
    """The path to run: ``requested``, else ``VLLM_HOGWILD_CPU_ISA``, else the widest compiled one."""
    have = isas()
    if not have:
        raise HogwildOptionError(ISA_ENV, "the compiled CPU op could not be built here")
    want = requested or os.environ.get(ISA_ENV) or None
    if want is None:
        return have[0]
    if want not in have:
        raise HogwildOptionError(ISA_ENV, f"{want!r}: the CPU op here was compiled with {have} (widest first)")
    return want


def use(name: str | None) -> str:
    """Run the op on path ``name`` in this process (``None``: :func:`choose`'s default); the path chosen."""
    global _current
    _current = choose(name)
    return _current


def current() -> str:
    """The path the op runs in this process (chosen on first use)."""
    return _current if _current is not None else use(None)
