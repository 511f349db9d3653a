"""The CUDA Hogwild backend: vLLM's FlashAttention backend with the shared Hogwild logic.

Everything but the native classes and the cache view is in
:mod:`vllm_hogwild.runner.backend` and runs, checked, on the CPU. The FlashAttention
cache is one tensor ``[num_blocks, kv_heads, block_size, 2 * head_dim]``, read
as K and V ``[num_blocks, block_size, kv_heads, head_dim]`` views exactly as the
backend itself splits it. Segment attention runs the Triton kernel
(``VLLM_HOGWILD_ATTENTION=triton``, the default) or the PyTorch path (``torch``).

Not run in CI (no GPU there): ``benchmarks/device_check.sh`` checks the kernel on
a GPU with this very cache split.
"""

from __future__ import annotations

import torch
from vllm.v1.attention.backends.flash_attn import (
    FlashAttentionBackend,
    FlashAttentionImpl,
    FlashAttentionMetadataBuilder,
)

from vllm_hogwild.runner.backend import HogwildBuilderMixin, HogwildImplMixin, HogwildPlan
from vllm_hogwild.attention.kv_layout import KVQuant, PlainPagedKV

CUDA_BACKEND_PATH = "vllm_hogwild.runner.backend_cuda.HogwildFlashAttentionBackend"


class HogwildFlashAttentionMetadataBuilder(HogwildBuilderMixin, FlashAttentionMetadataBuilder):
    pass


class HogwildFlashAttentionImpl(HogwildImplMixin, FlashAttentionImpl):
    def hogwild_kv(self, kv_cache: torch.Tensor, plan: HogwildPlan, quant: KVQuant | None) -> PlainPagedKV:
        key_cache, value_cache = kv_cache.transpose(1, 2).split(self.head_size, dim=-1)
        return PlainPagedKV(key_cache, value_cache, quant)


class HogwildFlashAttentionBackend(FlashAttentionBackend):
    @staticmethod
    def get_builder_cls():
        return HogwildFlashAttentionMetadataBuilder

    @staticmethod
    def get_impl_cls():
        return HogwildFlashAttentionImpl
