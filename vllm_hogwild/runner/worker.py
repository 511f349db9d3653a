"""Hogwild workers: vLLM's workers plus the backend override, the model runner's adapter and the start-up checks.

Selected through ``worker_cls`` by the switch, so nothing here runs unless
Hogwild is switched on. The CUDA worker lives in :mod:`vllm_hogwild.runner.worker_cuda`.

Once the model and its KV cache exist, :func:`check_engine_layers` makes sure
every attention layer really runs a Hogwild implementation, over one KV-cache
group whose kernel blocks are the scheduler's blocks; otherwise the engine
refuses to start, naming the setting. A group would otherwise decode as
independent samples, silently.

Which model runner's adapter drives this worker (:func:`adapter_for`): vLLM
chooses the runner; the switch records its choice for the engine, and a
worker that finds another runner, or one the plugin has no adapter for,
refuses to start, naming the setting, before the model loads.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any, Mapping, Sequence

from vllm.v1.attention.backends.registry import AttentionBackendEnum
from vllm.v1.worker.cpu_worker import CPUWorker

from vllm_hogwild.attention.paths import describe, isa_of
from vllm_hogwild.runner.backend import CPU_BACKEND_PATH, HogwildImplMixin
from vllm_hogwild.runner.backend_override import override_backend
from vllm_hogwild.core.errors import HogwildOptionError
from vllm_hogwild.core.options import runner_of
from vllm_hogwild.runner.cpu_sampling import install as install_cpu_sampling_fixes
from vllm_hogwild.core.log import get_logger

logger = get_logger(__name__)

SUPPORTED = ("CPU_ATTN on the CPU (float32, bfloat16, float16); FLASH_ATTN on CUDA (float16, bfloat16; "
             "--attention-backend FLASH_ATTN), with kv_cache_dtype auto, fp8, fp8_e4m3 or fp8_e5m2")


def check_engine_layers(impls: Mapping[str, Any], num_kv_cache_groups: int, kernel_block_sizes: Sequence[int],
                        block_size: int) -> None:
    """Refuse an engine whose attention Hogwild would not drive, naming the setting.

    ``impls``: each attention layer's name and its implementation object.
    """
    if num_kv_cache_groups != 1:
        raise HogwildOptionError(
            "kv_cache_groups", f"this model needs {num_kv_cache_groups} KV-cache groups (layers with different "
            "cache specs); Hogwild's views address one block table per request")
    foreign = {name: type(impl).__name__ for name, impl in impls.items() if not isinstance(impl, HogwildImplMixin)}
    if foreign:
        name, cls = next(iter(foreign.items()))
        raise HogwildOptionError(
            "attention_backend", f"{len(foreign)} attention layer(s) (e.g. {name}: {cls}) run a backend without a "
            f"Hogwild implementation; Hogwild runs on {SUPPORTED}")
    if not impls:
        raise HogwildOptionError("attention_backend", "the model has no attention layer Hogwild can drive")
    if any(size != block_size for size in kernel_block_sizes):
        raise HogwildOptionError(
            "block_size", f"the attention kernel splits the {block_size}-token KV blocks into "
            f"{list(kernel_block_sizes)}-token blocks; Hogwild needs them equal: choose a block size the "
            "backend takes whole")


# The model runners Hogwild drives: runtime name -> (the runner's module and class, the adapter's module).
RUNNERS = {
    "v1": ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "vllm_hogwild.runner.v1"),
    "v2": ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner", "vllm_hogwild.runner.v2"),
}
RUNNER_SETTING = "VLLM_USE_V2_MODEL_RUNNER"


def runner_name(runner: Any) -> str | None:
    """``"v1"`` or ``"v2"``: which of vLLM's model runners ``runner`` is (None: neither)."""
    for name, (module, cls, _) in RUNNERS.items():
        loaded = sys.modules.get(module)  # a runner's module is loaded when one of its runners exists
        if loaded is not None and isinstance(runner, getattr(loaded, cls, ())):
            return name
    return None


def adapter_for(runner: Any, expected: str | None) -> ModuleType:
    """The adapter module for ``runner`` (``expected``: the runner the switch saw vLLM choose for the engine);
    refuses a runner Hogwild has no adapter for, or another one than the engine was configured for."""
    import importlib

    name = runner_name(runner)
    if name is None:
        raise HogwildOptionError(
            "model runner", f"{type(runner).__module__}.{type(runner).__name__}: Hogwild drives vLLM's V1 model runner "
            f"and Model Runner V2 (vllm/v1/worker/gpu/), not this one")
    if expected is not None and name != expected:
        raise HogwildOptionError(
            RUNNER_SETTING, f"the engine was configured for the {expected.upper()} model runner, but this worker "
            f"process runs the {name.upper()} one: set {RUNNER_SETTING} the same for every process of the engine")
    return importlib.import_module(RUNNERS[name][2])


def kernel_block_sizes(runner: Any) -> Sequence[int] | None:
    """The attention kernels' block size per KV-cache group, as the runner chose them (V1 and V2 name them
    differently)."""
    return getattr(runner, "_kernel_block_sizes", None) or getattr(runner, "kernel_block_sizes", None)


class HogwildWorkerMixin:
    """Put first in the bases of a platform's worker; names its native backend and the Hogwild one."""

    hogwild_backend: AttentionBackendEnum
    hogwild_backend_path: str

    def __init__(self, *args, **kwargs) -> None:
        # Before the model is built: its attention layers resolve the backend.
        override_backend(self.hogwild_backend, self.hogwild_backend_path)
        super().__init__(*args, **kwargs)

    def init_device(self) -> None:
        super().init_device()
        # Before the model loads: the runner builds the logits processors the switch chose for its kind.
        self.hogwild_adapter = adapter_for(self.model_runner, runner_of(self.vllm_config.additional_config))

    def load_model(self, *args, **kwargs) -> None:
        super().load_model(*args, **kwargs)
        self.hogwild_adapter.install(self.model_runner)  # (V2 makes its model state and samplers as it loads)

    def initialize_from_config(self, kv_cache_config) -> None:
        super().initialize_from_config(kv_cache_config)
        check_runner = getattr(self.hogwild_adapter, "check_runner", None)
        if check_runner is not None:
            check_runner(self.model_runner)
        from vllm.config import get_layers_from_vllm_config
        from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase

        layers = get_layers_from_vllm_config(self.vllm_config, AttentionLayerBase)
        check_engine_layers(
            {name: getattr(layer, "impl", None) for name, layer in layers.items()},
            len(kv_cache_config.kv_cache_groups),
            kernel_block_sizes(self.model_runner) or [self.cache_config.block_size],
            self.cache_config.block_size,
        )
        logger.info("Hogwild attention: %s (%d layers)", describe(self.vllm_config.additional_config), len(layers))


class HogwildCPUWorker(HogwildWorkerMixin, CPUWorker):
    hogwild_backend = AttentionBackendEnum.CPU_ATTN
    hogwild_backend_path = CPU_BACKEND_PATH

    def init_device(self) -> None:
        isa = isa_of(self.vllm_config.additional_config)
        if isa is not None:  # the switch's choice among the compiled op's vector paths
            from vllm_hogwild.attention import cpu_ops

            cpu_ops.use(isa)
        if self.vllm_config.speculative_config is not None and runner_of(self.vllm_config.additional_config) == "v1":
            # Before the model runner exists: its n-gram proposer loads numba, and vLLM 0.32's kernel-override
            # scan (which re-registering a kernel runs) trips on numba's llvmlite objects.
            install_cpu_sampling_fixes()
        super().init_device()
