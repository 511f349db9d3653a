"""The compiled CPU op for decode rows (``csrc/segment_attention_cpu.cpp``), built on first use.

Built with ``torch.utils.cpp_extension`` (needs a C++ compiler; the build is
cached under ``~/.cache/torch_extensions``). If it cannot be built, or
``VLLM_HOGWILD_CPU_KERNEL=0``, :func:`load` returns ``None`` and segment
attention stays on its PyTorch paths.
"""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "csrc" / "segment_attention_cpu.cpp"


@functools.lru_cache(maxsize=1)
def load():
    if os.environ.get("VLLM_HOGWILD_CPU_KERNEL", "1") == "0":
        return None
    try:
        from torch.utils.cpp_extension import load as build

        return build(name="vllm_hogwild_cpu_ops", sources=[str(SOURCE)],
                     extra_cflags=["-O3", "-march=native", "-ffast-math"], verbose=False)
    except Exception as err:  # a missing compiler must not take the engine down
        logger.warning("vllm-hogwild: CPU kernel unavailable (%s); using the PyTorch path", err)
        return None
