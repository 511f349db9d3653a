"""Attention backends that run Hogwild rows through segment attention.

Subclasses of vLLM's platform backends, installed over them with
``register_backend`` by the Hogwild worker (so only when Hogwild is switched
on). Rows of plain requests, and Hogwild rows whose view is their own lane
alone, go through the native kernel untouched. The other Hogwild rows are
given the native kernel a context of their own query token only (cheap), then
their outputs are written by segment attention over their views.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import torch
from vllm.v1.attention.backends.cpu_attn import (
    CPUAttentionBackend,
    CPUAttentionBackendImpl,
    CPUAttentionMetadataBuilder,
)

from vllm_hogwild import segment_attention as sa
from vllm_hogwild import step_context
from vllm_hogwild.cpu_layout import probe_k_transposed
from vllm_hogwild.cpu_ops import load as load_cpu_ops
from vllm_hogwild.kv_layout import CpuPagedKV
from vllm_hogwild.options import EngineOptions
from vllm_hogwild.rope import RopeSpec

logger = logging.getLogger(__name__)

CPU_BACKEND_PATH = "vllm_hogwild.backend.HogwildCPUAttentionBackend"



@dataclass
class HogwildStep:
    plan: sa.SegmentAttentionPlan
    k_transposed: bool


def rows_for_step(step: step_context.StepViews | None, common) -> dict[int, sa.QueryRow]:
    """The step's Hogwild rows in this batch, by batch row; empty when the publication does not match it."""
    if step is None or not step.segments:
        return {}
    num_reqs = common.num_reqs
    query_start_loc = common.query_start_loc_cpu
    if (len(step.req_ids) != num_reqs or step.num_tokens != common.num_actual_tokens
            or any(r not in step.req_ids for r in step.segments)):
        logger.warning("Hogwild views do not match the batch; running it without them")
        return {}
    starts = query_start_loc.tolist()
    rows = {}
    for i, req_id in enumerate(step.req_ids):
        segments = step.segments.get(req_id)
        if segments is not None:
            rows[i] = sa.QueryRow(starts[i], starts[i + 1] - starts[i], segments)
    return rows


def without_native_context(common, rows: dict[int, sa.QueryRow]):
    """The batch as the native kernel should see it: Hogwild rows attend their own query token only.

    Their native output is overwritten by segment attention anyway; this keeps
    the kernel from reading their whole lane first (no row computed twice).
    """
    seq_lens = common.seq_lens.clone()
    for i, row in rows.items():
        seq_lens[i] = row.num_query_tokens
    return dataclasses.replace(common, seq_lens=seq_lens)


def write_segment_rows(impl, plan: sa.SegmentAttentionPlan, query: torch.Tensor, kv, attn_metadata,
                       output: torch.Tensor) -> None:
    """Overwrite the planned rows of ``output`` ``[T, Hq * D]`` with segment attention (any backend impl)."""
    n = attn_metadata.num_actual_tokens
    out = output[:n].view(n, impl.num_heads, impl.head_size)
    sa.run(plan, query[:n], kv, impl.scale, out=out)


class HogwildCPUMetadataBuilder(CPUAttentionMetadataBuilder):
    def __init__(self, kv_cache_spec, layer_names, vllm_config, device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        # vLLM's backend registry is per process: an engine without the switch
        # that lives in a process where a Hogwild engine ran gets this class
        # too. It then behaves exactly like the stock backend.
        self.hogwild_on = EngineOptions.from_additional_config(vllm_config.additional_config) is not None
        if not self.hogwild_on:
            return
        self.rope = RopeSpec.from_hf_config(vllm_config.model_config.hf_text_config)
        # Probed, not assumed: reading K with the wrong layout is silent garbage.
        self.k_transposed = probe_k_transposed(self.isa, self.dtype, self.block_size, self.head_dim)
        self.compiled = load_cpu_ops() is not None

    def build(self, common_prefix_len, common_attn_metadata, fast_build: bool = False):
        rows = rows_for_step(step_context.take(), common_attn_metadata) if self.hogwild_on else {}
        if not rows:
            metadata = super().build(common_prefix_len, common_attn_metadata, fast_build)
            metadata.hogwild = None
            return metadata
        metadata = super().build(common_prefix_len, without_native_context(common_attn_metadata, rows), fast_build)
        plan = sa.plan(list(rows.values()), self.block_size, self.rope,
                       num_tokens=common_attn_metadata.num_actual_tokens, compiled=self.compiled)
        metadata.hogwild = HogwildStep(plan, self.k_transposed)
        return metadata


class HogwildCPUAttentionImpl(CPUAttentionBackendImpl):
    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs):
        output = super().forward(layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs)
        step = getattr(attn_metadata, "hogwild", None)
        if step is not None:
            write_segment_rows(self, step.plan, query, CpuPagedKV(kv_cache, step.k_transposed), attn_metadata, output)
        return output


class HogwildCPUAttentionBackend(CPUAttentionBackend):
    @staticmethod
    def get_builder_cls():
        return HogwildCPUMetadataBuilder

    @staticmethod
    def get_impl_cls():
        return HogwildCPUAttentionImpl
