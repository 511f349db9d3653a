"""The compiled CPU op's plan (compressed rows -> pairs -> pieces) and its run, for :mod:`segment_attention`.

The plan is built in tensor ops over flat columns of segments (:class:`~vllm_hogwild.core.views.spans.SegmentColumns`),
with no Python loop per segment: a step at scale has thousands of decoding rows.
"""

from __future__ import annotations

from array import array
from typing import Sequence

import torch

from vllm_hogwild.attention.kv_layout import CpuPagedKV, PagedKV
from vllm_hogwild.attention.plan_types import DecodeCSR, PlanMode, SegmentAttentionPlan
from vllm_hogwild.core.views.rope import RopeSpec
from vllm_hogwild.core.views.spans import SegmentColumns


def plan_csr(rows, bs: int, rope: RopeSpec, num_tokens: int | None,
              flat: tuple[SegmentColumns, Sequence[int]] | None = None) -> SegmentAttentionPlan:
    """``rows``: single-token rows that :func:`single_token_rows` checked; ``flat``: more single-token rows as
    columns, with each row's query token. One pass of tensor ops over all segments, no loop per segment."""
    columns = SegmentColumns()
    for row in rows:
        columns.add_row(row.segments)
    tokens = array("q", (row.query_start for row in rows))
    if flat is not None:
        flat_columns, flat_tokens = flat
        tokens.extend(flat_tokens)
        if len(columns):
            columns.extend(flat_columns)
        else:
            columns = flat_columns
    needed = max(tokens) + 1 if tokens else 0
    if num_tokens is not None and num_tokens < needed:
        raise ValueError(f"rows use {needed} query tokens, the query tensor has {num_tokens}")
    num_tokens = needed if num_tokens is None else num_tokens
    t = _long
    start, end, table, delta = t(columns.start), t(columns.end), t(columns.table), t(columns.delta)
    row_pair_ptr = t(columns.row_ptr)
    table_blocks = array("q")  # every table, one after another
    table_at = array("q")  # where each one starts there
    table_len = array("q")
    for blocks in columns.tables:
        table_at.append(len(table_blocks))
        table_len.append(len(blocks))
        table_blocks.extend(blocks)
    if len(start) and bool((t(table_len)[table] * bs < end).any()):
        s = int((t(table_len)[table] * bs < end).nonzero()[0, 0])
        raise ValueError(f"segment ends at {int(end[s])} past its {table_len[int(table[s])]} blocks")
    first, last = start // bs, (end + bs - 1) // bs
    count = torch.where(end > start, last - first, 0)
    pair_piece_ptr = torch.cat([torch.zeros(1, dtype=torch.long), count.cumsum(0)])
    seg = torch.repeat_interleave(torch.arange(len(start)), count)  # each piece's segment
    block = first[seg] + torch.arange(len(seg)) - pair_piece_ptr[:-1][seg]  # its logical block in the lane
    piece_block = t(table_blocks)[t(table_at)[table[seg]] + block] if len(seg) else block
    piece_lo = (start[seg] - block * bs).clamp(min=0)
    piece_hi = (end[seg] - block * bs).clamp(max=bs)
    row_token = t(tokens)
    pair_token = torch.repeat_interleave(row_token, row_pair_ptr.diff())
    cos, sin = rope.cos_sin(delta)
    csr = DecodeCSR(row_token, row_pair_ptr, pair_piece_ptr, piece_block, piece_lo, piece_hi)
    return SegmentAttentionPlan(mode=PlanMode.CPU_OP, num_tokens=num_tokens, out_tokens=row_token,
                                pair_token=pair_token, pair_cos=cos.contiguous(), pair_sin=sin.contiguous(),
                                rope=rope, csr=csr)


def _long(a: array) -> torch.Tensor:
    """An ``array('q')`` as a long tensor (copied)."""
    return torch.frombuffer(a, dtype=torch.long).clone() if len(a) else torch.zeros(0, dtype=torch.long)


def run_csr(p: SegmentAttentionPlan, query: torch.Tensor, kv: PagedKV, scale: float, out: torch.Tensor) -> None:
    from vllm_hogwild.attention.cpu_ops import ISA_CODES, current, load

    ops = load()
    if ops is None or not isinstance(kv, CpuPagedKV):
        raise RuntimeError("a compiled plan needs the CPU op and vLLM's CPU cache layout")
    c = p.csr
    q = query if query.dtype == torch.float32 and query.is_contiguous() else query.float().contiguous()
    direct = out.dtype == torch.float32 and out.is_contiguous()
    dst = out if direct else torch.empty_like(q)
    quant = kv.quant
    ops.segment_attention_decode(q, kv.cache, kv.k_transposed, c.row_token, c.row_pair_ptr,
                                 p.pair_cos, p.pair_sin, c.pair_piece_ptr, c.piece_block, c.piece_lo,
                                 c.piece_hi, p.rope.rotary_dim, p.rope.is_neox_style, scale, dst,
                                 ISA_CODES[current()], 0 if quant is None else quant.code,
                                 1.0 if quant is None else quant.k_scale, 1.0 if quant is None else quant.v_scale)
    if not direct:
        out[c.row_token] = dst[c.row_token].to(out.dtype)


