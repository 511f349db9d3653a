"""Segment attention, reference path (PyTorch, any device).

Every query row reads an ordered list of segments of lanes stored in a paged
KV cache; each segment is attended with the query rotated by the segment's
``delta`` (see :mod:`vllm_hogwild.views`). The work is split in two:

- :func:`plan` (once per step): turns the rows into index tensors — one entry
  per (physical KV block, reader), where a reader is one query token rotated
  for one segment. A block that several workers read in the step (the shared
  prompt, every co-worker's lane) appears ONCE with all its readers.
- :func:`run` (every layer): gathers each needed block once, rotates the
  queries, and computes all (block, reader) scores in batched matmuls. Partial
  softmax results of all blocks and segments of a query are merged exactly,
  log-sum-exp style (scatter-max, then scatter-sum of rescaled parts).

No Python loop over workers, segments or tokens per layer; one loop over at
most a few reader-count buckets (blocks read by ~N readers in decode, by a
chunk's tokens in prefill).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from vllm_hogwild.kv_layout import PagedKV
from vllm_hogwild.rope import RopeSpec, rotate


@dataclass(frozen=True)
class Segment:
    """Stored positions ``[start, end)`` of a lane whose block table is ``block_ids``.

    ``block_ids`` covers the lane from position 0 (at least up to ``end``);
    ``delta`` is the query rotation for this segment.
    """

    block_ids: tuple[int, ...]
    start: int
    end: int
    delta: int


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


@dataclass
class _Bucket:
    block_ids: torch.Tensor  # [U] physical block ids, each once
    reader_pair: torch.Tensor  # [U, R] index into the rotated-query pairs (P = padding)
    reader_token: torch.Tensor  # [U, R] query token of each reader (T = padding)
    key_lo: torch.Tensor  # [U, R] first visible offset within the block
    key_hi: torch.Tensor  # [U, R] one past the last visible offset


@dataclass
class SegmentAttentionPlan:
    """Per-step tensors shared by every layer. P: (token, segment) pairs."""

    num_tokens: int  # T: rows of the query tensor this plan may touch
    out_tokens: torch.Tensor  # [T_out] query tokens that get an output
    pair_token: torch.Tensor  # [P] query token of each pair
    pair_cos: torch.Tensor  # [P, rotary_dim / 2]
    pair_sin: torch.Tensor  # [P, rotary_dim / 2]
    buckets: list[_Bucket]
    rope: RopeSpec


def plan(
    rows: Sequence[QueryRow],
    block_size: int,
    rope: RopeSpec,
    num_tokens: int | None = None,
    device: torch.device | str = "cpu",
) -> SegmentAttentionPlan:
    """Build the step's index tensors; ``num_tokens``: rows of the query tensor (default: what the rows use)."""
    entries = [_row_entries(row, block_size) for row in rows]
    pair_token = _cat([e[0] for e in entries])
    pair_delta = _cat([e[1] for e in entries])
    # Offsets of each row's pairs in the flat pair list.
    offsets = torch.tensor([0, *[len(e[0]) for e in entries]]).cumsum(0)
    blk, pair, lo, hi = (
        _cat([e[2][i] + (offsets[r] if i == 1 else 0) for r, e in enumerate(entries)])
        for i in range(4)
    )
    needed = int(max((r.query_start + r.num_query_tokens for r in rows), default=0))
    num_tokens = needed if num_tokens is None else num_tokens
    if num_tokens < needed:
        raise ValueError(f"rows use {needed} query tokens, the query tensor has {num_tokens}")
    cos, sin = rope.cos_sin(pair_delta)
    out_tokens = torch.unique(pair_token)
    buckets = _bucket(blk, pair, pair_token[pair] if len(pair) else pair, lo, hi,
                      len(pair_token), num_tokens)
    to = lambda t: t.to(device)  # noqa: E731
    return SegmentAttentionPlan(
        num_tokens=num_tokens,
        out_tokens=to(out_tokens),
        pair_token=to(pair_token),
        pair_cos=to(cos),
        pair_sin=to(sin),
        buckets=[_Bucket(*(to(getattr(b, f)) for f in _Bucket.__dataclass_fields__)) for b in buckets],
        rope=rope,
    )


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
    num_tokens, num_q_heads, d = query.shape
    heads = kv.num_kv_heads
    g = num_q_heads // heads
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    cdt = query.dtype if query.dtype in (torch.float32, torch.float64) else torch.float32
    if out is None:
        out = torch.zeros_like(query)
    if not p.buckets:
        return out
    q = query.to(cdt)
    pairs = rotate(q.index_select(0, p.pair_token), p.pair_cos.to(cdt), p.pair_sin.to(cdt), p.rope)
    pairs = torch.cat([pairs, pairs.new_zeros(1, num_q_heads, d)])  # [P + 1, Hq, D]; last: padding
    ar = torch.arange(kv.block_size, device=query.device)
    scores = []
    row_max = torch.full((num_tokens + 1, heads, g), -math.inf, dtype=cdt, device=query.device)
    for b in p.buckets:
        u, r = b.reader_pair.shape
        k_t, v = kv.gather(b.block_ids)  # [U, H, D, bs], [U, H, bs, D]
        qb = pairs[b.reader_pair].view(u, r, heads, g, d).permute(0, 2, 1, 3, 4)
        s = torch.matmul(qb.reshape(u, heads, r * g, d), k_t.to(cdt)) * scale  # [U, H, R*g, bs]
        visible = (ar >= b.key_lo[..., None]) & (ar < b.key_hi[..., None])  # [U, R, bs]
        s = s.view(u, heads, r, g, -1).masked_fill(~visible[:, None, :, None, :], -math.inf)
        blk_max = s.amax(-1).permute(0, 2, 1, 3).reshape(u * r, heads, g)
        idx = b.reader_token.reshape(-1, 1, 1).expand(-1, heads, g)
        row_max.scatter_reduce_(0, idx, blk_max, "amax")
        scores.append((s, v, idx))
    row_max = row_max.nan_to_num(neginf=0.0)  # padding rows: keep exp() finite
    denom = torch.zeros(num_tokens + 1, heads, g, dtype=cdt, device=query.device)
    acc = torch.zeros(num_tokens + 1, heads, g, d, dtype=cdt, device=query.device)
    for (s, v, idx), b in zip(scores, p.buckets):
        u, heads_, r, g_, bs = s.shape
        m = row_max[b.reader_token].permute(0, 2, 1, 3)  # [U, H, R, g]
        prob = torch.exp(s - m[..., None])  # [U, H, R, g, bs]
        part = torch.matmul(prob.view(u, heads, r * g, bs), v.to(cdt))  # [U, H, R*g, D]
        denom.index_add_(0, idx[:, 0, 0], prob.sum(-1).permute(0, 2, 1, 3).reshape(u * r, heads, g))
        acc.index_add_(0, idx[:, 0, 0], part.view(u, heads, r, g, d).permute(0, 2, 1, 3, 4).reshape(u * r, heads, g, d))
    rows = p.out_tokens
    result = (acc[rows] / denom[rows][..., None]).reshape(len(rows), num_q_heads, d)
    out[rows] = result.to(out.dtype)
    return out


def _row_entries(row: QueryRow, bs: int):
    """Pairs and (block, reader) entries of one row, vectorized over its tokens.

    Returns ``pair_token [P_r]``, ``pair_delta [P_r]`` and four ``[E_r]`` tensors:
    physical block, pair (row-local), first and one-past-last visible offset.
    """
    n = row.num_query_tokens
    if n <= 0 or not row.segments:
        raise ValueError("a query row needs tokens and segments")
    own = row.segments[-1]
    if own.end - own.start < n:
        raise ValueError("the row's query tokens must lie in its last segment")
    tokens = torch.arange(row.query_start, row.query_start + n)
    q_pos = torch.arange(own.end - n, own.end)  # stored positions of the query tokens
    pair_token, pair_delta, ents = [], [], []
    for j, seg in enumerate(row.segments):
        pair_token.append(tokens)
        pair_delta.append(torch.full((n,), seg.delta, dtype=torch.int64))
        if seg.end <= seg.start:
            continue
        if len(seg.block_ids) * bs < seg.end:
            raise ValueError(f"segment ends at {seg.end} past its {len(seg.block_ids)} blocks")
        first, last = seg.start // bs, (seg.end - 1) // bs
        k = torch.arange(first, last + 1)  # logical blocks of the segment
        base = k * bs  # [K]
        lo = (seg.start - base).clamp(min=0)[:, None].expand(-1, n)  # [K, n]
        hi = (seg.end - base).clamp(max=bs)[:, None].expand(-1, n)
        if j == len(row.segments) - 1:  # own text: causal
            hi = torch.minimum(hi, q_pos[None, :] - base[:, None] + 1)
        phys = torch.tensor(seg.block_ids[first : last + 1])[:, None].expand(-1, n)
        pair = (j * n + torch.arange(n))[None, :].expand(len(k), -1)
        keep = hi > lo
        ents.append([t[keep] for t in (phys, pair, lo, hi)])
    cols = [_cat([e[i] for e in ents]) for i in range(4)]
    return torch.cat(pair_token), torch.cat(pair_delta), cols


def _bucket(blk, pair, token, lo, hi, num_pairs: int, num_tokens: int) -> list[_Bucket]:
    """Group entries by physical block; blocks with similar reader counts share a padded batch."""
    if blk.numel() == 0:
        return []
    order = torch.argsort(blk, stable=True)
    blk, pair, token, lo, hi = blk[order], pair[order], token[order], lo[order], hi[order]
    uniq, counts = torch.unique_consecutive(blk, return_counts=True)
    first = counts.cumsum(0) - counts
    slot = torch.arange(len(blk)) - torch.repeat_interleave(first, counts)  # rank within block
    ublock = torch.repeat_interleave(torch.arange(len(uniq)), counts)
    # Power-of-two reader counts: padding at most doubles a bucket.
    width = (2 ** torch.ceil(torch.log2(counts.double()))).long()
    buckets = []
    for w in torch.unique(width).tolist():
        members = (width == w).nonzero().flatten()  # unique-block indices
        pos = torch.full((len(uniq),), -1, dtype=torch.long)
        pos[members] = torch.arange(len(members))
        sel = pos[ublock] >= 0
        u, s = pos[ublock][sel], slot[sel]
        shape = (len(members), w)
        reader_pair = torch.full(shape, num_pairs, dtype=torch.long)
        reader_token = torch.full(shape, num_tokens, dtype=torch.long)
        key_lo = torch.zeros(shape, dtype=torch.long)
        key_hi = torch.zeros(shape, dtype=torch.long)  # padding sees nothing
        reader_pair[u, s], reader_token[u, s] = pair[sel], token[sel]
        key_lo[u, s], key_hi[u, s] = lo[sel], hi[sel]
        buckets.append(_Bucket(uniq[members], reader_pair, reader_token, key_lo, key_hi))
    return buckets


def _cat(parts: list[torch.Tensor]) -> torch.Tensor:
    parts = [p for p in parts if p.numel()]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)
