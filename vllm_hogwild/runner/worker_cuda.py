"""The CUDA Hogwild worker: vLLM's GPU worker with :class:`~vllm_hogwild.runner.worker.HogwildWorkerMixin`.

Selected through ``worker_cls`` by the switch on CUDA platforms. Not run in CI
(no GPU there); the shared logic runs on the CPU and ``benchmarks/device_check.sh``
checks the kernel on a GPU.
"""

from __future__ import annotations

from vllm.v1.attention.backends.registry import AttentionBackendEnum
from vllm.v1.worker.gpu_worker import Worker

from vllm_hogwild.runner.backend_cuda import CUDA_BACKEND_PATH
from vllm_hogwild.runner.worker import HogwildWorkerMixin


class HogwildGPUWorker(HogwildWorkerMixin, Worker):
    hogwild_backend = AttentionBackendEnum.FLASH_ATTN
    hogwild_backend_path = CUDA_BACKEND_PATH
