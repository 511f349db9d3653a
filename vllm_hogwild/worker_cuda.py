"""The CUDA Hogwild worker: vLLM's GPU worker plus the backend override and the runner hook.

Selected through ``worker_cls`` by the switch on CUDA platforms. Not exercised
in CI (no GPU there); see ``benchmarks/device_check.sh``.
"""

from __future__ import annotations

from vllm.v1.attention.backends.registry import AttentionBackendEnum
from vllm.v1.worker.gpu_worker import Worker

from vllm_hogwild.backend_override import override_backend
from vllm_hogwild.backend_cuda import CUDA_BACKEND_PATH
from vllm_hogwild.step_context import install_runner_hook


class HogwildGPUWorker(Worker):
    def __init__(self, *args, **kwargs) -> None:
        override_backend(AttentionBackendEnum.FLASH_ATTN, CUDA_BACKEND_PATH)
        super().__init__(*args, **kwargs)

    def init_device(self) -> None:
        super().init_device()
        install_runner_hook(self.model_runner)
