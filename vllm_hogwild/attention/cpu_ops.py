"""The compiled CPU op for decode rows (``csrc/segment_attention_cpu.cpp``), built on first use.

Built with ``torch.utils.cpp_extension`` (needs a C++ compiler; the build is
cached under ``~/.cache/torch_extensions``). If it cannot be built, :func:`load`
returns ``None``; the engine then runs the PyTorch paths and says so
(:mod:`vllm_hogwild.attention.paths`; ``VLLM_HOGWILD_ATTENTION=torch`` chooses
them explicitly).
"""

from __future__ import annotations

import functools
from pathlib import Path

from vllm_hogwild.core.log import get_logger

logger = get_logger(__name__)

SOURCE = Path(__file__).parent / "csrc" / "segment_attention_cpu.cpp"


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
