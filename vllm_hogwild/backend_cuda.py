"""The CUDA counterpart: vLLM's FlashAttention backend plus segment attention for Hogwild rows.

Same contract as :mod:`vllm_hogwild.backend`: plain rows (and Hogwild rows
whose view is their own lane) through the native kernel, then the other
Hogwild rows overwritten with segment attention: the Triton kernel of
:mod:`vllm_hogwild.triton_attention` when Triton is installed (the PyTorch
reference path otherwise, or with ``VLLM_HOGWILD_ATTENTION=torch``). The FlashAttention
cache is ``[num_blocks, kv_heads, block_size, 2 * head_dim]`` with K and V
side by side per token, read as two strided ``[num_blocks, block_size,
kv_heads, head_dim]`` views (exactly how the backend itself splits it).

Not exercised in CI (no GPU there): ``benchmarks/device_check.sh`` runs the
oracle checks of both paths on a GPU machine.
"""

from __future__ import annotations

from vllm.v1.attention.backends.flash_attn import (
    FlashAttentionBackend,
    FlashAttentionImpl,
    FlashAttentionMetadataBuilder,
)

import os

from vllm_hogwild import segment_attention as sa
from vllm_hogwild import step_context, triton_attention
from vllm_hogwild.backend import rows_for_step, write_segment_rows
from vllm_hogwild.kv_layout import PlainPagedKV
from vllm_hogwild.options import EngineOptions
from vllm_hogwild.rope import RopeSpec

CUDA_BACKEND_PATH = "vllm_hogwild.backend_cuda.HogwildFlashAttentionBackend"


class HogwildFlashAttentionMetadataBuilder(FlashAttentionMetadataBuilder):
    def __init__(self, kv_cache_spec, layer_names, vllm_config, device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.hogwild_on = EngineOptions.from_additional_config(vllm_config.additional_config) is not None
        self.rope = RopeSpec.from_hf_config(vllm_config.model_config.hf_text_config) if self.hogwild_on else None
        self.hogwild_block_size = kv_cache_spec.block_size
        self.hogwild_triton = triton_attention.available() and os.environ.get("VLLM_HOGWILD_ATTENTION") != "torch"

    def build(self, common_prefix_len, common_attn_metadata, fast_build: bool = False):
        metadata = super().build(common_prefix_len, common_attn_metadata, fast_build)
        rows = rows_for_step(step_context.take(), common_attn_metadata) if self.hogwild_on else {}
        metadata.hogwild = None
        if rows:
            metadata.hogwild = sa.plan(list(rows.values()), self.hogwild_block_size, self.rope,
                                       num_tokens=common_attn_metadata.num_actual_tokens, device=self.device,
                                       triton=self.hogwild_triton)
        return metadata


class HogwildFlashAttentionImpl(FlashAttentionImpl):
    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs):
        output = super().forward(layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs)
        plan = getattr(attn_metadata, "hogwild", None)
        if plan is not None:
            key_cache, value_cache = kv_cache.transpose(1, 2).split(self.head_size, dim=-1)
            write_segment_rows(self, plan, query, PlainPagedKV(key_cache, value_cache), attn_metadata, output)
        return output


class HogwildFlashAttentionBackend(FlashAttentionBackend):
    @staticmethod
    def get_builder_cls():
        return HogwildFlashAttentionMetadataBuilder

    @staticmethod
    def get_impl_cls():
        return HogwildFlashAttentionImpl
