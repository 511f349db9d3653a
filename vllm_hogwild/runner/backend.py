"""Attention backends that run Hogwild rows through segment attention: one logic, two platforms.

A Hogwild backend is a platform's vLLM backend with two mixins put in front:

- :class:`HogwildBuilderMixin` (metadata builder, once per step): takes the
  step's views (Model Runner V2 passes them to ``build``; on the V1 runner they
  wait in the process's :class:`~vllm_hogwild.runner.context.StepContext`),
  finds this batch's Hogwild rows, builds the native metadata with those rows
  reduced to a context of their own query tokens (so the native kernel never
  reads their whole lane: no row is computed twice), and plans segment attention
  for them once, recording the plan in the context beside the metadata it belongs
  to (:class:`HogwildPlan`, the same type on every platform).
- :class:`HogwildImplMixin` (every layer): runs the native kernel (which also
  writes the step's K/V), then overwrites the Hogwild rows with segment
  attention over the cache read in place, with the plan the context holds for
  the metadata it was handed (none: a plain batch, or a draft model's).

What a platform adds is only the native classes and how its cache tensor is
read (:meth:`HogwildImplMixin.hogwild_kv`): the CPU backend here, FlashAttention
in :mod:`vllm_hogwild.runner.backend_cuda`. Which segment-attention path runs
(compiled CPU op, PyTorch, Triton) was decided by the switch
(:mod:`vllm_hogwild.attention.paths`). Rows of plain requests, and Hogwild rows
whose view is their own lane alone, go through the native kernel untouched.

vLLM's backend registry is per process: an engine without the switch that
lives in a process where a Hogwild engine ran gets these classes too. They then
behave exactly like the stock ones.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

import torch
from vllm.v1.attention.backend import AttentionCGSupport
from vllm.v1.attention.backends.cpu_attn import (
    CPUAttentionBackend,
    CPUAttentionBackendImpl,
    CPUAttentionMetadataBuilder,
)

from vllm_hogwild.attention import segment_attention as sa
from vllm_hogwild.attention.paths import path_of
from vllm_hogwild.attention.step_plan import PlanCapacityError, StepPlanner
from vllm_hogwild.core.options import EngineOptions
from vllm_hogwild.runner.context import StepViews, get_step
from vllm_hogwild.runner.cpu_layout import probe_k_transposed
from vllm_hogwild.attention.kv_layout import CpuPagedKV, KVQuant
from vllm_hogwild.core.views.rope import RopeSpec
from vllm_hogwild.core.views.spans import SegmentColumns

CPU_BACKEND_PATH = "vllm_hogwild.runner.backend.HogwildCPUAttentionBackend"


@dataclass(frozen=True)
class HogwildPlan:
    """A builder's plan for one step's metadata, on every platform: the plan and how to read this cache."""

    plan: sa.SegmentAttentionPlan
    k_transposed: bool = False  # the CPU cache's K blocks (probed at start-up); unused elsewhere


class HogwildViewsMismatch(RuntimeError):
    """The published views do not belong to the batch being built (a bug, never silently ignored)."""


@dataclass
class HogwildRows:
    """The step's Hogwild rows in this batch: as query-row objects by batch row (re-fed tokens, drafts, views
    other than ``contiguous``), and a contiguous group's decoding rows as the views' columns, each with its batch
    row and query token (thousands at scale: no object per row)."""

    rows: dict[int, list[sa.QueryRow]]
    columns: SegmentColumns
    flat_batch: array  # columns row -> its batch row
    flat_token: array  # columns row -> its query token

    def __bool__(self) -> bool:
        return bool(self.rows or self.flat_batch)

    def query_rows(self) -> list[sa.QueryRow]:
        return [q for row in self.rows.values() for q in row]


def rows_for_step(step: StepViews | None, common) -> HogwildRows | None:
    """The step's Hogwild rows in this batch (None when the step has none).

    A decoding worker's row reads one view (its query tokens: its last token and any drafts); a
    resumed group's re-fed row is one single-token row per token, each with the view that token was
    produced under.
    """
    if step is None or not step.segments:
        return None
    segments = step.segments
    general, flat, replays = segments.general, segments.flat, segments.replays
    if (len(step.req_ids) != common.num_reqs or step.num_tokens != common.num_actual_tokens
            or not segments.request_ids() <= set(step.req_ids)):
        raise HogwildViewsMismatch(
            f"Hogwild views for {len(step.req_ids)} requests / {step.num_tokens} tokens, batch of "
            f"{common.num_reqs} / {common.num_actual_tokens}")
    starts = common.query_start_loc_cpu.tolist()
    rows = {}
    flat_batch, flat_token = array("q", bytes(8 * len(flat))), array("q", bytes(8 * len(flat)))
    for i, req_id in enumerate(step.req_ids):
        k = flat.get(req_id)
        if k is not None:
            if starts[i + 1] - starts[i] != 1:
                raise HogwildViewsMismatch(f"{req_id} feeds {starts[i + 1] - starts[i]} tokens, its view one")
            flat_batch[k], flat_token[k] = i, starts[i]
            continue
        row_segments = general.get(req_id)
        if row_segments is not None:
            rows[i] = [sa.QueryRow(starts[i], starts[i + 1] - starts[i], row_segments)]
        tokens = replays.get(req_id)
        if tokens is not None:
            if len(tokens) != starts[i + 1] - starts[i]:
                raise HogwildViewsMismatch(f"{req_id} re-feeds {starts[i + 1] - starts[i]} tokens, its views "
                                           f"cover {len(tokens)}")
            rows[i] = [sa.QueryRow(starts[i] + k, 1, segments) for k, segments in enumerate(tokens)]
    return HogwildRows(rows, segments.columns, flat_batch, flat_token)


def without_native_context(common, rows: HogwildRows):
    """The batch as the native kernel sees it: each Hogwild row's context is its own query length.

    Their native output is overwritten by segment attention anyway; this keeps
    the kernel from reading their whole lane first. The K/V of every row is
    still written (slot mapping untouched). ``max_seq_len`` stays an upper bound.
    """
    index = torch.tensor([*rows.rows, *rows.flat_batch], dtype=torch.long)
    lens = torch.tensor([*(sum(q.num_query_tokens for q in r) for r in rows.rows.values()),
                         *([1] * len(rows.flat_batch))], dtype=common.seq_lens.dtype)
    seq_lens = common.seq_lens.clone()
    seq_lens[index.to(seq_lens.device)] = lens.to(seq_lens.device)
    upper = common.seq_lens_cpu_upper_bound
    if upper is not None:
        upper = upper.clone()
        upper[index] = lens.to(upper.dtype)
    return common.replace(seq_lens=seq_lens, seq_lens_cpu_upper_bound=upper, _num_computed_tokens_cache=None)


class HogwildBuilderMixin:
    """Put first in the bases of a platform's attention metadata builder."""

    @classmethod
    def get_cudagraph_support(cls, vllm_config, kv_cache_spec) -> AttentionCGSupport:
        """Full CUDA graphs for uniform decode batches on the Triton path; piecewise graphs on the others.

        The Triton path's plan lives in buffers a graph captures once (frozen at the first capture, sized for
        the largest capture size) and its kernels read every per-step count from them, so a graph replays any
        decode step whose plan fits (docs/architecture.md, "CUDA graphs"); vLLM keeps its default
        FULL_AND_PIECEWISE. A platform that would replay mixed prefill-decode batches (FlashAttention 3:
        ALWAYS) is held to UNIFORM_BATCH: a prefill chunk or a re-fed row runs piecewise, as stock runs them
        with FlashAttention 2. The torch path plans and reads on the host every step: NEVER (vLLM then
        resolves FULL_AND_PIECEWISE to PIECEWISE). Hogwild off: the platform's own answer.
        """
        native = super().get_cudagraph_support(vllm_config, kv_cache_spec)
        path = path_of(vllm_config.additional_config)
        if path is None:
            return native
        if path == "triton":
            return min(native, AttentionCGSupport.UNIFORM_BATCH, key=lambda support: support.value)
        return AttentionCGSupport.NEVER

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.hogwild_path = path_of(vllm_config.additional_config)  # None: Hogwild is off, stock behaviour
        if self.hogwild_path is not None:
            self.hogwild_rope = RopeSpec.from_hf_config(vllm_config.model_config.hf_text_config)
            self.hogwild_block_size = kv_cache_spec.block_size
            self.hogwild_k_transposed = self.hogwild_cache_layout()
            # The item plan's lane table and buffers, kept from step to step (the torch and Triton paths, and
            # the compiled op's steps with long rows).
            self.hogwild_planner = StepPlanner(self.hogwild_block_size, self.hogwild_rope, device,
                                               num_kv_heads=kv_cache_spec.num_kv_heads)

    def hogwild_cache_layout(self) -> bool:
        """Whether this platform's cache stores K transposed (CPU: probed); False elsewhere."""
        return False

    def build(self, common_prefix_len, common_attn_metadata, fast_build: bool = False,
              hogwild_views: StepViews | None = None):
        """``hogwild_views``: the step's views, as Model Runner V2 passes them (runner/v2.py); the V1 runner's
        adapter leaves them in the step's context instead."""
        step = get_step()
        views = hogwild_views if hogwild_views is not None else step.views
        rows = rows_for_step(views, common_attn_metadata) if self.hogwild_path else None
        planner = self.hogwild_planner if self.hogwild_path else None
        if not rows:
            if planner is not None and planner.frozen:
                planner.empty()  # a replayed graph finds no row of an earlier step
            return super().build(common_prefix_len, common_attn_metadata, fast_build)
        # A step replaying a full graph keeps the native metadata as the graph captured it (its kernels read
        # the buffers the metadata was captured with): the Hogwild rows' native output is then computed over
        # their own lane and overwritten. Otherwise each Hogwild row's native context is its query tokens alone;
        # either way no cascade (shared-prefix) attention.
        native = common_attn_metadata if step.full_graph else without_native_context(common_attn_metadata, rows)
        metadata = super().build(0, native, fast_build)
        plan_rows = lambda p: sa.plan_rows(  # noqa: E731
            self.hogwild_path, rows.query_rows(), self.hogwild_block_size, self.hogwild_rope,
            num_tokens=common_attn_metadata.num_actual_tokens, device=self.device,
            flat=(rows.columns, rows.flat_token), planner=p)
        try:
            plan = plan_rows(planner)
        except PlanCapacityError:
            if step.full_graph:  # the adapter's bound let through a step the captured buffers cannot hold
                raise RuntimeError("Hogwild: a step replaying a full CUDA graph does not fit the plan buffers "
                                   "the graph captured (a bug: the runner's adapter should have kept it eager)")
            plan = plan_rows(None)  # an eager step: a plan of its own
        step.add_plan(metadata, HogwildPlan(plan, self.hogwild_k_transposed))
        return metadata

    def build_for_cudagraph_capture(self, common_attn_metadata):
        """The capture of a full CUDA graph (vLLM's dummy decode batch, no Hogwild row): the native metadata, and
        on the Triton path an empty plan on the frozen buffers, so that the graph records the two segment
        attention launches of every layer; each later step writes its plan into those buffers."""
        metadata = super().build_for_cudagraph_capture(common_attn_metadata)
        if self.hogwild_path == "triton":
            planner = self.hogwild_planner
            if not planner.frozen:
                self.hogwild_freeze()
            plan = sa.SegmentAttentionPlan(sa.PlanMode.TRITON, common_attn_metadata.num_actual_tokens,
                                           self.hogwild_rope, items=planner.empty())
            get_step().add_plan(metadata, HogwildPlan(plan, self.hogwild_k_transposed))
        return metadata

    def hogwild_freeze(self) -> None:
        """Size the plan buffers for the largest batch a full graph replays, and freeze them: decode rows of up
        to ``max_cudagraph_capture_size`` tokens, each reading at most ``2 * (max_workers + 2)`` pairs (a
        ``contiguous`` group's view, any prompt split), over as many lanes as ``max_num_seqs`` groups of
        ``max_workers`` hold, of up to ``max_model_len`` tokens. A step that may need more runs without the
        full graph (the runner's adapter decides from :meth:`~vllm_hogwild.core.views.registry.ViewRegistry.
        max_pairs` before vLLM chooses the step's graph)."""
        config = self.vllm_config
        rows = config.compilation_config.max_cudagraph_capture_size or config.scheduler_config.max_num_seqs
        lanes = EngineOptions.from_additional_config(config.additional_config).max_workers
        pairs = rows * 2 * (lanes + 2)
        slots = config.scheduler_config.max_num_seqs * lanes
        max_blocks = -(-config.model_config.max_model_len // self.hogwild_block_size)
        planner = self.hogwild_planner
        planner.reserve(rows=rows, pairs=pairs, items=pairs, slots=slots, max_blocks=max_blocks)
        planner.freeze(config.model_config.get_num_attention_heads(config.parallel_config),
                       self.kv_cache_spec.head_size)
        step = get_step()
        room = (rows, pairs, slots)
        step.graph_room = room if step.graph_room is None else tuple(min(a, b) for a, b in zip(room, step.graph_room))


class HogwildImplMixin:
    """Put first in the bases of a platform's attention implementation."""

    def hogwild_kv(self, kv_cache: torch.Tensor, plan: HogwildPlan, quant: KVQuant | None):
        """This platform's cache as a :mod:`vllm_hogwild.attention.kv_layout` reader (``quant``: an FP8 cache's
        encoding and this layer's scales)."""
        raise NotImplementedError

    def hogwild_quant(self, layer) -> KVQuant | None:
        """An FP8 cache's encoding and ``layer``'s K/V scales (vLLM's own, per layer); None: unquantized."""
        return KVQuant.of(self.kv_cache_dtype, layer._k_scale_float, layer._v_scale_float)

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs):
        output = super().forward(layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs)
        plan = get_step().plan_for(attn_metadata)
        if plan is not None:
            n = attn_metadata.num_actual_tokens
            out = output[:n].view(n, self.num_heads, self.head_size)
            sa.run(plan.plan, query[:n], self.hogwild_kv(kv_cache, plan, self.hogwild_quant(layer)), self.scale,
                   out=out)
        return output


# -- the CPU ------------------------------------------------------------------------------------------

class HogwildCPUMetadataBuilder(HogwildBuilderMixin, CPUAttentionMetadataBuilder):
    def hogwild_cache_layout(self) -> bool:
        # Probed, not assumed: reading K with the wrong layout is silent garbage.
        return probe_k_transposed(self.isa, self.dtype, self.block_size, self.head_dim, self.kv_cache_dtype)


class HogwildCPUAttentionImpl(HogwildImplMixin, CPUAttentionBackendImpl):
    def hogwild_kv(self, kv_cache: torch.Tensor, plan: HogwildPlan, quant: KVQuant | None) -> CpuPagedKV:
        return CpuPagedKV(kv_cache, plan.k_transposed, quant)


class HogwildCPUAttentionBackend(CPUAttentionBackend):
    @staticmethod
    def get_builder_cls():
        return HogwildCPUMetadataBuilder

    @staticmethod
    def get_impl_cls():
        return HogwildCPUAttentionImpl
