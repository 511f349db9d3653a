"""Segment attention: every query row reads an ordered list of segments of lanes in a paged KV cache.

Each segment is attended with the query rotated by the segment's ``delta``
(see :mod:`vllm_hogwild.core.views.spans`); the keys are read as stored. The work is
split in two: a plan (once per step) from the step's rows as columns
(:class:`~vllm_hogwild.core.views.spans.SegmentColumns`, every row one query token), and
:func:`run` (every layer). Three paths, all exact against the dense oracle in the
tests (the Triton one on CPU through Triton's interpreter), planned from the same
columns in tensor ops, with no Python object and no Python loop per row or segment:

- **items** (:mod:`vllm_hogwild.attention.step_plan`), for the torch and Triton paths:
  the pairs (row, segment) that read one lane from one position are one item, read once
  for all its readers; the plan names lanes and positions, and the kernels walk each lane's
  blocks through the device lane table (:mod:`vllm_hogwild.attention.lane_table`), which a
  step updates by what changed. The plan's tensors persist from step to step (CUDA graphs
  replay them). PyTorch runs items in a few padded batches; the Triton kernels of
  :mod:`vllm_hogwild.attention.triton_attention` in two launches a layer.
- **compiled** (vLLM's CPU cache layout; rows of up to :data:`CPU_OP_MAX_ROW_TOKENS`
  tokens, such as speculative verify rows): the C++ op of
  :mod:`vllm_hogwild.attention.cpu_ops` reads the cache in place, one online softmax per
  (row, query head) over all segments (:mod:`vllm_hogwild.attention.cpu_plan`).

Rows given as :class:`QueryRow` objects (a verify row, a re-fed token, a view other than
``contiguous``: the few general rows of a step, and the tests) join the columns first,
one row per query token (:func:`single_token_rows`).
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, replace
from typing import Sequence

import torch

from vllm_hogwild.attention import cpu_plan
from vllm_hogwild.attention.kv_layout import PagedKV
from vllm_hogwild.attention.plan_types import PlanMode, SegmentAttentionPlan
from vllm_hogwild.attention.step_plan import StepPlanner
from vllm_hogwild.core.views.rope import RopeSpec, rotate
from vllm_hogwild.core.views.spans import Segment, SegmentColumns


@dataclass(frozen=True)
class QueryRow:
    """``num_query_tokens`` consecutive query tokens from ``query_start`` reading ``segments``.

    The tokens are the last ``num_query_tokens`` tokens of the LAST segment
    (the reader's own text), which they attend causally; every other segment
    is visible whole.
    """

    query_start: int
    num_query_tokens: int
    segments: tuple[Segment, ...]


# The compiled op takes a multi-token row as one row per token (each reads the
# whole view again): a verify row (1 + the speculative tokens) costs its tokens'
# decode rows, as a stock verify row costs its tokens. Longer rows (prefill
# chunks, replay) go to the item plan, which reads each block once for all of a
# row's tokens.
CPU_OP_MAX_ROW_TOKENS = 16


def _cpu_op_takes(rows: Sequence[QueryRow]) -> bool:
    return all(r.num_query_tokens <= CPU_OP_MAX_ROW_TOKENS for r in rows)


def mode_for(path: str, rows: Sequence[QueryRow]) -> PlanMode:
    """The plan an attention path (:mod:`vllm_hogwild.attention.paths`) uses for this step's rows."""
    if path == "triton":
        return PlanMode.TRITON
    if path == "cpu-op" and rows and _cpu_op_takes(rows):
        return PlanMode.CPU_OP
    return PlanMode.TORCH


def single_token_rows(rows: Sequence[QueryRow], block_size: int) -> list[QueryRow]:
    """Every row as one row per query token: token ``t`` of a row of ``T`` reads the other segments whole and its
    own text up to itself (the row's causal mask, as segments). Each row is checked as it is split."""
    split = []
    for row in rows:
        _check_row(row, block_size)
        if row.num_query_tokens == 1:
            split.append(row)
            continue
        *others, own = row.segments
        last = row.num_query_tokens - 1
        split += [QueryRow(row.query_start + t, 1, (*others, replace(own, end=own.end - (last - t))))
                  for t in range(row.num_query_tokens)]
    return split


def _as_columns(rows: Sequence[QueryRow], block_size: int,
                flat: tuple[SegmentColumns, Sequence[int]] | None) -> tuple[SegmentColumns, array]:
    """``rows`` (one row per token) then the ``flat`` columns, as one set of columns and their query tokens."""
    single = single_token_rows(rows, block_size)
    tokens = array("q", (row.query_start for row in single))
    if not single and flat is not None:
        return flat[0], flat[1] if isinstance(flat[1], array) else array("q", flat[1])
    columns = SegmentColumns()
    for row in single:
        columns.add_row(row.segments)
    if flat is not None and len(flat[0]):
        columns.extend(flat[0])
        tokens.extend(flat[1])
    return columns, tokens


def _num_tokens(tokens: Sequence[int], num_tokens: int | None) -> int:
    """Rows of the query tensor: ``num_tokens``, checked to hold every row, or just enough."""
    needed = max(tokens) + 1 if len(tokens) else 0
    if num_tokens is not None and num_tokens < needed:
        raise ValueError(f"rows use {needed} query tokens, the query tensor has {num_tokens}")
    return needed if num_tokens is None else num_tokens


def plan_rows(path: str, rows: Sequence[QueryRow], block_size: int, rope: RopeSpec, num_tokens: int | None = None,
              device: torch.device | str = "cpu", flat: tuple[SegmentColumns, Sequence[int]] | None = None,
              planner: StepPlanner | None = None) -> SegmentAttentionPlan:
    """The step's plan on an attention path (:mod:`vllm_hogwild.attention.paths`): ``rows`` as objects and
    ``flat`` single-token rows as columns with each one's query token. ``planner``: the builder's (its lane
    table and buffers persist from step to step; None: a planner for this plan alone)."""
    flat_rows = len(flat[0]) if flat is not None else 0
    if path == "cpu-op" and (rows or flat_rows) and _cpu_op_takes(rows):
        return cpu_plan.plan_csr(single_token_rows(rows, block_size), block_size, rope, num_tokens,
                                 flat if flat_rows else None)
    mode = PlanMode.TRITON if path == "triton" else PlanMode.TORCH
    columns, tokens = _as_columns(rows, block_size, flat if flat_rows else None)
    return plan_columns(columns, tokens, block_size, rope, mode, num_tokens, device, planner)


def plan_columns(columns: SegmentColumns, tokens: Sequence[int], block_size: int, rope: RopeSpec,
                 mode: PlanMode, num_tokens: int | None = None, device: torch.device | str = "cpu",
                 planner: StepPlanner | None = None) -> SegmentAttentionPlan:
    """An item plan (``TORCH`` or ``TRITON``) of single-token rows given as columns."""
    if mode is PlanMode.CPU_OP:
        raise ValueError("a cpu-op plan is made by cpu_plan.plan_csr")
    num_tokens = _num_tokens(tokens, num_tokens)
    if planner is None:
        planner = StepPlanner(block_size, rope, device)
    if planner.block_size != block_size:
        raise ValueError(f"the planner plans blocks of {planner.block_size}, not {block_size}")
    items = planner.plan(columns, tokens, for_torch=mode is PlanMode.TORCH)
    return SegmentAttentionPlan(mode=mode, num_tokens=num_tokens, rope=rope, items=items)


def plan(
    rows: Sequence[QueryRow],
    block_size: int,
    rope: RopeSpec,
    mode: PlanMode = PlanMode.TORCH,
    num_tokens: int | None = None,
    device: torch.device | str = "cpu",
    planner: StepPlanner | None = None,
) -> SegmentAttentionPlan:
    """The plan of rows given as objects for ``mode``; ``num_tokens``: rows of the query tensor (default: what
    the rows use). ``CPU_OP`` takes rows of up to :data:`CPU_OP_MAX_ROW_TOKENS` tokens (``run`` then needs vLLM's
    CPU cache layout); ``TORCH`` and ``TRITON`` any rows (``run`` reads any cache layout)."""
    if mode is PlanMode.CPU_OP:
        if not _cpu_op_takes(rows):
            raise ValueError(f"a {mode.value} plan takes rows of up to {CPU_OP_MAX_ROW_TOKENS} tokens")
        return cpu_plan.plan_csr(single_token_rows(rows, block_size), block_size, rope, num_tokens)
    columns, tokens = _as_columns(rows, block_size, None)
    return plan_columns(columns, tokens, block_size, rope, mode, num_tokens, device, planner)


def _run_torch(p: SegmentAttentionPlan, q: torch.Tensor, kv: PagedKV, scale: float, out: torch.Tensor) -> None:
    """The item plan in PyTorch: each bucket of items read whole for all its readers (one partial softmax per
    pair), then every row's pairs merged exactly, log-sum-exp style."""
    it = p.items
    num_pairs, num_rows = it.num_pairs, it.num_rows
    if not num_pairs:
        return
    _, num_q_heads, d = q.shape
    heads = kv.num_kv_heads
    g = num_q_heads // heads
    bs = kv.block_size
    cdt = q.dtype
    ints = it.ints
    pair_token = ints["pair_token"][:num_pairs].long()
    pairs = rotate(q.index_select(0, pair_token), it.pair_cos.to(cdt), it.pair_sin.to(cdt), p.rope)
    pairs = torch.cat([pairs, pairs.new_zeros(1, num_q_heads, d)])  # [P + 1, Hq, D]; last: padding
    m = torch.full((num_pairs + 1, heads, g), -math.inf, dtype=cdt, device=q.device)
    l = torch.zeros(num_pairs + 1, heads, g, dtype=cdt, device=q.device)
    acc = torch.zeros(num_pairs + 1, heads, g, d, dtype=cdt, device=q.device)
    for b in it.torch_buckets:
        w, nb = b.block_ids.shape
        r = b.reader_pair.shape[1]
        length = nb * bs
        k_t, v = kv.gather(b.block_ids.reshape(-1))  # [W*NB, H, D, bs], [W*NB, H, bs, D]
        k_t = k_t.view(w, nb, heads, d, bs).permute(0, 2, 3, 1, 4).reshape(w, heads, d, length).to(cdt)
        v = v.view(w, nb, heads, bs, d).permute(0, 2, 1, 3, 4).reshape(w, heads, length, d).to(cdt)
        qb = pairs[b.reader_pair].view(w, r, heads, g, d).permute(0, 2, 1, 3, 4).reshape(w, heads, r * g, d)
        s = torch.matmul(qb, k_t) * scale  # [W, H, R*g, L]
        pos = b.item_first_block[:, None] * bs + torch.arange(length, device=q.device)  # [W, L]
        visible = (pos[:, None, :] >= b.reader_start[:, :, None]) & (pos[:, None, :] < b.reader_end[:, :, None])
        s = s.view(w, heads, r, g, length).masked_fill(~visible[:, None, :, None, :], -math.inf)
        mx = s.amax(-1)  # [W, H, R, g]; -inf for a reader that sees nothing here
        prob = torch.exp(s - mx.nan_to_num(neginf=0.0)[..., None])
        part = torch.matmul(prob.view(w, heads, r * g, length), v).view(w, heads, r, g, d)
        at = b.reader_pair.reshape(-1)  # every real pair once, in exactly one bucket (padding: the last row)
        m[at] = mx.permute(0, 2, 1, 3).reshape(w * r, heads, g)
        l[at] = prob.sum(-1).permute(0, 2, 1, 3).reshape(w * r, heads, g)
        acc[at] = part.permute(0, 2, 1, 3, 4).reshape(w * r, heads, g, d)
    m, l, acc = m[:num_pairs], l[:num_pairs], acc[:num_pairs]
    row = it.pair_row
    row_max = torch.full((num_rows, heads, g), -math.inf, dtype=cdt, device=q.device)
    row_max.scatter_reduce_(0, row[:, None, None].expand(-1, heads, g), m, "amax")
    weight = torch.exp(m - row_max[row])  # 0 for a pair that sees nothing
    denom = torch.zeros(num_rows, heads, g, dtype=cdt, device=q.device).index_add_(0, row, weight * l)
    num = torch.zeros(num_rows, heads, g, d, dtype=cdt, device=q.device).index_add_(0, row, weight[..., None] * acc)
    out[ints["row_token"][:num_rows].long()] = (num / denom[..., None]).reshape(num_rows, num_q_heads, d).to(out.dtype)


def run(
    p: SegmentAttentionPlan,
    query: torch.Tensor,
    kv: PagedKV,
    scale: float | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Segment attention of the planned rows.

    query: ``[T, Hq, D]`` rotated at stored positions -> ``out [T, Hq, D]``;
    only the planned rows of ``out`` are written.
    """
    d = query.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    if out is None:
        out = torch.zeros_like(query)
    if p.mode is PlanMode.CPU_OP:
        cpu_plan.run_csr(p, query, kv, scale, out)
        return out
    if p.mode is PlanMode.TRITON:
        from vllm_hogwild.attention import triton_attention

        return triton_attention.run(p, query, kv, scale, out)
    cdt = query.dtype if query.dtype in (torch.float32, torch.float64) else torch.float32
    _run_torch(p, query.to(cdt), kv, scale, out)
    return out


def _check_row(row: QueryRow, bs: int) -> None:
    if row.num_query_tokens <= 0 or not row.segments:
        raise ValueError("a query row needs tokens and segments")
    own = row.segments[-1]
    if own.end - own.start < row.num_query_tokens:
        raise ValueError("the row's query tokens must lie in its last segment")
    for seg in row.segments:
        if len(seg.block_ids) * bs < seg.end:
            raise ValueError(f"segment ends at {seg.end} past its {len(seg.block_ids)} blocks")
