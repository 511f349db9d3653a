"""Hogwild workers: vLLM's workers plus the backend override and the runner hook.

Selected through ``worker_cls`` by the switch, so nothing here runs unless
Hogwild is switched on. The CUDA worker lives in :mod:`vllm_hogwild.worker_cuda`.
"""

from __future__ import annotations

from vllm.v1.attention.backends.registry import AttentionBackendEnum
from vllm.v1.worker.cpu_worker import CPUWorker

from vllm_hogwild.backend import CPU_BACKEND_PATH
from vllm_hogwild.backend_override import override_backend
from vllm_hogwild.step_context import install_runner_hook


class HogwildCPUWorker(CPUWorker):
    def __init__(self, *args, **kwargs) -> None:
        # Before the model is built: its attention layers resolve the backend.
        override_backend(AttentionBackendEnum.CPU_ATTN, CPU_BACKEND_PATH)
        super().__init__(*args, **kwargs)

    def init_device(self) -> None:
        super().init_device()
        install_runner_hook(self.model_runner)

