"""Segment attention: every query row reads an ordered list of segments of lanes in a paged KV cache.

Each segment is attended with the query rotated by the segment's ``delta``
(see :mod:`vllm_hogwild.core.views.spans`); the keys are read as stored. The work is
split in two: :func:`plan` (once per step) turns the rows into index tensors,
:func:`run` (every layer) executes them. Four paths, all exact against the
dense oracle in the tests (the Triton one on CPU through Triton's interpreter):

- **block buckets** (PyTorch, any device, any rows): one entry per (physical KV
  block, reader), where a reader is one query token rotated for one segment. A
  block several workers read in the step (the shared prompt, every co-worker's
  lane) is gathered ONCE for all its readers; scores in padded batched matmuls;
  partial softmax results of all blocks and segments of a query merged exactly,
  log-sum-exp style (scatter-max, then scatter-sum of rescaled parts).
- **batched decode** (PyTorch, single-token rows, small views): rows batched by
  the lanes they read; every (row, segment) pair scores all of its batch's keys
  under an additive mask; one softmax per row. Few large ops per layer.
- **compiled** (vLLM's CPU cache layout; single-token rows, and rows of up to
  :data:`CPU_OP_MAX_ROW_TOKENS` tokens such as speculative verify rows, split
  into one row per token by :func:`single_token_rows`): the C++ op of
  :mod:`vllm_hogwild.attention.cpu_ops` reads the cache in place, one online softmax per
  (row, query head) over all segments.
- **Triton** (any cache layout, read through its strides; any rows): the block
  buckets run by the kernel of :mod:`vllm_hogwild.attention.triton_attention`, one
  program per (block, KV head) serving all the block's readers.

No Python loop over workers, segments or tokens per layer in any path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

import torch

from vllm_hogwild.attention import cpu_plan
from vllm_hogwild.attention.kv_layout import PagedKV
from vllm_hogwild.attention.plan_types import Bucket, DecodeBatch, PlanMode, SegmentAttentionPlan
from vllm_hogwild.core.views.spans import Segment, SegmentColumns
from vllm_hogwild.core.views.rope import RopeSpec, rotate


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
# chunks, replay) go to the block buckets, which read each block once for all
# of a row's tokens and plan without a Python loop per token.
CPU_OP_MAX_ROW_TOKENS = 16


def _cpu_op_takes(rows: Sequence[QueryRow]) -> bool:
    return all(r.num_query_tokens <= CPU_OP_MAX_ROW_TOKENS for r in rows)


def mode_for(path: str, rows: Sequence[QueryRow], block_size: int) -> PlanMode:
    """The plan an attention path (:mod:`vllm_hogwild.attention.paths`) uses for this step's rows."""
    single = bool(rows) and all(r.num_query_tokens == 1 for r in rows)
    if path == "triton":
        return PlanMode.TRITON
    if path == "cpu-op" and rows and _cpu_op_takes(rows):
        return PlanMode.CPU_OP
    if path == "torch" and single and _dense_scores(rows, block_size) <= DENSE_DECODE_MAX_SCORES:
        return PlanMode.DENSE_DECODE
    return PlanMode.BUCKETS


def plan(
    rows: Sequence[QueryRow],
    block_size: int,
    rope: RopeSpec,
    mode: PlanMode = PlanMode.BUCKETS,
    num_tokens: int | None = None,
    device: torch.device | str = "cpu",
) -> SegmentAttentionPlan:
    """Build the step's index tensors for ``mode``; ``num_tokens``: rows of the query tensor (default: what the rows use).

    ``DENSE_DECODE`` takes single-token rows only, ``CPU_OP`` rows of up to
    :data:`CPU_OP_MAX_ROW_TOKENS` tokens (:func:`mode_for` chooses); ``CPU_OP`` plans for the compiled CPU op
    (:mod:`vllm_hogwild.attention.cpu_ops`; ``run`` then needs vLLM's CPU cache
    layout); ``TRITON`` plans block buckets for the Triton kernel
    (:mod:`vllm_hogwild.attention.triton_attention`; ``run`` then reads any cache
    layout through its strides).
    """
    if mode is PlanMode.DENSE_DECODE and not all(r.num_query_tokens == 1 for r in rows):
        raise ValueError(f"a {mode.value} plan takes single-token rows only")
    if mode is PlanMode.CPU_OP:
        if not _cpu_op_takes(rows):
            raise ValueError(f"a {mode.value} plan takes rows of up to {CPU_OP_MAX_ROW_TOKENS} tokens")
        return cpu_plan.plan_csr(single_token_rows(rows, block_size), block_size, rope, num_tokens)
    if mode is PlanMode.DENSE_DECODE:
        return _plan_decode(rows, block_size, rope, num_tokens, device)
    tables: dict[tuple[int, ...], torch.Tensor] = {}  # each lane's block table as a tensor, once a step
    entries = [_row_entries(row, block_size, tables) for row in rows]
    pair_token = _cat([e[0] for e in entries])
    pair_delta = _cat([e[1] for e in entries])
    # Offsets of each row's pairs in the flat pair list.
    offsets = torch.tensor([0, *[len(e[0]) for e in entries]]).cumsum(0)
    blk, pair, lo, hi = (
        _cat([e[2][i] + (offsets[r] if i == 1 else 0) for r, e in enumerate(entries)])
        for i in range(4)
    )
    num_tokens = _query_rows(rows, num_tokens)
    cos, sin = rope.cos_sin(pair_delta)
    out_tokens = torch.unique(pair_token)
    buckets = _bucket(blk, pair, pair_token[pair] if len(pair) else pair, lo, hi,
                      len(pair_token), num_tokens)
    if mode is PlanMode.TRITON:
        max_blocks = chunk_length(sum(len(b.block_ids) for b in buckets))
        buckets = [_chunk(b, max_blocks) for b in buckets]
    to = lambda t: t if t is None else t.to(device)  # noqa: E731
    return SegmentAttentionPlan(
        mode=mode,
        num_tokens=num_tokens,
        out_tokens=to(out_tokens),
        pair_token=to(pair_token),
        pair_cos=to(cos),
        pair_sin=to(sin),
        buckets=[Bucket(*(to(getattr(b, f)) for f in Bucket.__dataclass_fields__)) for b in buckets],
        rope=rope,
    )


# The batched decode path scores every (row, segment) pair against all keys its
# rows read: cheap in ops, wasteful in FLOPs once views grow. Past this many
# scores per KV head (measured on CPU: ~crossover at N=4, 2.5k-token views),
# the block-bucket path is faster.
DENSE_DECODE_MAX_SCORES = 24_576


def _dense_scores(rows, bs: int) -> int:
    keys = sum(-(-(seg.end - seg.start) // bs) * bs for seg in rows[0].segments)
    return len(rows) * max(len(r.segments) for r in rows) * keys


def _plan_decode(rows, bs: int, rope: RopeSpec, num_tokens: int | None, device) -> SegmentAttentionPlan:
    num_tokens = _query_rows(rows, num_tokens)
    batches: dict[frozenset, list[QueryRow]] = {}
    for row in rows:
        _check_row(row, bs)
        batches.setdefault(frozenset(seg.block_ids for seg in row.segments), []).append(row)
    # Pairs in row order; per batch the blocks its rows read, each once.
    pair_token, pair_delta, layout = [], [], []
    for batch in batches.values():
        blocks: dict[int, int] = {}
        spans = []  # (r, k, pair, [(u, lo, hi)])
        for r, row in enumerate(batch):
            for k, seg in enumerate(row.segments):
                pieces = []
                for b in range(seg.start // bs, -(-seg.end // bs)) if seg.end > seg.start else ():
                    u = blocks.setdefault(seg.block_ids[b], len(blocks))
                    pieces.append((u, max(seg.start - b * bs, 0), min(seg.end - b * bs, bs)))
                spans.append((r, k, len(pair_token), pieces))
                pair_token.append(row.query_start)
                pair_delta.append(seg.delta)
        layout.append((batch, blocks, spans))
    num_pairs = len(pair_token)
    g_n = len(layout)
    r_n = max(len(b) for b, _, _ in layout)
    k_n = max(len(row.segments) for row in rows)
    u_n = max(len(blocks) for _, blocks, _ in layout)
    block_ids = torch.zeros(g_n, u_n, dtype=torch.long)
    pair_index = torch.full((g_n, r_n, k_n), num_pairs, dtype=torch.long)
    bias = torch.full((g_n, r_n, k_n, u_n * bs), -math.inf)
    row_select, row_token = [], []
    for g, (batch, blocks, spans) in enumerate(layout):
        block_ids[g, : len(blocks)] = torch.tensor(list(blocks))
        for r, k, pair, pieces in spans:
            pair_index[g, r, k] = pair
            for u, lo, hi in pieces:
                bias[g, r, k, u * bs + lo : u * bs + hi] = 0.0
        row_select += [g * r_n + r for r in range(len(batch))]
        row_token += [row.query_start for row in batch]
    cos, sin = rope.cos_sin(torch.tensor(pair_delta, dtype=torch.long))
    to = lambda t: t.to(device)  # noqa: E731
    decode = DecodeBatch(to(block_ids), to(pair_index), to(bias),
                          to(torch.tensor(row_select)), to(torch.tensor(row_token)))
    return SegmentAttentionPlan(
        mode=PlanMode.DENSE_DECODE, num_tokens=num_tokens, out_tokens=decode.row_token,
        pair_token=to(torch.tensor(pair_token)), pair_cos=to(cos), pair_sin=to(sin), buckets=[], rope=rope,
        decode=decode,
    )


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


def plan_rows(path: str, rows: Sequence[QueryRow], block_size: int, rope: RopeSpec, num_tokens: int | None = None,
              device: torch.device | str = "cpu",
              flat: tuple[SegmentColumns, Sequence[int]] | None = None) -> SegmentAttentionPlan:
    """The step's plan on an attention path (:mod:`vllm_hogwild.attention.paths`): ``rows`` as objects and
    ``flat`` single-token rows as columns with each one's query token. The compiled path plans the columns as
    they are; the others take them as rows."""
    flat_rows = len(flat[0]) if flat is not None else 0
    if path == "cpu-op" and (rows or flat_rows) and _cpu_op_takes(rows):
        return cpu_plan.plan_csr(single_token_rows(rows, block_size), block_size, rope, num_tokens,
                                 flat if flat_rows else None)
    if flat_rows:
        columns, tokens = flat
        rows = [*rows, *(QueryRow(tokens[k], 1, columns.segments(k)) for k in range(flat_rows))]
    return plan(rows, block_size, rope, mode_for(path, rows, block_size), num_tokens=num_tokens, device=device)


def _run_decode(p: SegmentAttentionPlan, q: torch.Tensor, kv: PagedKV, scale: float, out: torch.Tensor) -> None:
    d_b = p.decode
    _, num_q_heads, d = q.shape
    heads = kv.num_kv_heads
    g = num_q_heads // heads
    cdt = q.dtype
    pairs = rotate(q.index_select(0, p.pair_token), p.pair_cos.to(cdt), p.pair_sin.to(cdt), p.rope)
    pairs = torch.cat([pairs, pairs.new_zeros(1, num_q_heads, d)])  # [P + 1, Hq, D]; last: padding
    gb, u = d_b.block_ids.shape
    _, r, k = d_b.pair_index.shape
    bs = kv.block_size
    k_t, v = kv.gather(d_b.block_ids.reshape(-1))  # [G*U, H, D, bs], [G*U, H, bs, D]
    k_t = k_t.view(gb, u, heads, d, bs).permute(0, 2, 3, 1, 4).reshape(gb, heads, d, u * bs).to(cdt)
    v = v.view(gb, u, heads, bs, d).permute(0, 2, 1, 3, 4).reshape(gb, heads, u * bs, d).to(cdt)
    qb = pairs[d_b.pair_index].view(gb, r, k, heads, g, d).permute(0, 3, 1, 4, 2, 5)  # [G, H, R, g, K, D]
    s = torch.matmul(qb.reshape(gb, heads, r * g * k, d), k_t) * scale  # [G, H, R*g*K, U*bs]
    s = s.view(gb, heads, r, g, k, u * bs) + d_b.bias.to(cdt).view(gb, 1, r, 1, k, u * bs)
    prob = torch.softmax(s.view(gb, heads, r, g, k * u * bs), dim=-1)
    prob = prob.view(gb, heads, r, g, k, u * bs).sum(4)  # [G, H, R, g, U*bs]
    o = torch.matmul(prob.view(gb, heads, r * g, u * bs), v)  # [G, H, R*g, D]
    o = o.view(gb, heads, r, g, d).permute(0, 2, 1, 3, 4).reshape(gb * r, num_q_heads, d)
    out.index_copy_(0, d_b.row_token, o.index_select(0, d_b.row_select).to(out.dtype))


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
    if p.mode is PlanMode.CPU_OP:
        cpu_plan.run_csr(p, query, kv, scale, out)
        return out
    if p.mode is PlanMode.TRITON:
        from vllm_hogwild.attention import triton_attention

        return triton_attention.run(p, query, kv, scale, out)
    if p.mode is PlanMode.DENSE_DECODE:
        _run_decode(p, query.to(cdt), kv, scale, out)
        return out
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


def _row_entries(row: QueryRow, bs: int, tables: dict[tuple[int, ...], torch.Tensor]):
    """Pairs and (block, reader) entries of one row, vectorized over its tokens.

    Returns ``pair_token [P_r]``, ``pair_delta [P_r]`` and four ``[E_r]`` tensors:
    physical block, pair (row-local), first and one-past-last visible offset. ``tables``: block tables
    already made tensors this step (the rows of a group read the same lanes), filled as it goes.
    """
    _check_row(row, bs)
    n = row.num_query_tokens
    own = row.segments[-1]
    tokens = torch.arange(row.query_start, row.query_start + n)
    q_pos = torch.arange(own.end - n, own.end)  # stored positions of the query tokens
    pair_token, pair_delta, ents = [], [], []
    for j, seg in enumerate(row.segments):
        pair_token.append(tokens)
        pair_delta.append(torch.full((n,), seg.delta, dtype=torch.int64))
        if seg.end <= seg.start:
            continue
        first, last = seg.start // bs, (seg.end - 1) // bs
        k = torch.arange(first, last + 1)  # logical blocks of the segment
        base = k * bs  # [K]
        lo = (seg.start - base).clamp(min=0)[:, None].expand(-1, n)  # [K, n]
        hi = (seg.end - base).clamp(max=bs)[:, None].expand(-1, n)
        if j == len(row.segments) - 1:  # own text: causal
            hi = torch.minimum(hi, q_pos[None, :] - base[:, None] + 1)
        table = tables.get(seg.block_ids)
        if table is None:
            table = tables[seg.block_ids] = torch.tensor(seg.block_ids, dtype=torch.long)
        phys = table[first : last + 1][:, None].expand(-1, n)
        pair = (j * n + torch.arange(n))[None, :].expand(len(k), -1)
        keep = hi > lo
        if bool(keep.all()):  # the usual case (a decode row sees every key of its segments' blocks)
            ents.append([t.reshape(-1) for t in (phys, pair, lo, hi)])
        else:
            ents.append([t[keep] for t in (phys, pair, lo, hi)])
    cols = [_cat([e[i] for e in ents]) for i in range(4)]
    return torch.cat(pair_token), torch.cat(pair_delta), cols


def _query_rows(rows: Sequence[QueryRow], num_tokens: int | None) -> int:
    """Rows of the query tensor: ``num_tokens``, checked to hold every row, or just enough."""
    needed = max((r.query_start + r.num_query_tokens for r in rows), default=0)
    if num_tokens is not None and num_tokens < needed:
        raise ValueError(f"rows use {needed} query tokens, the query tensor has {num_tokens}")
    return needed if num_tokens is None else num_tokens


def _check_row(row: QueryRow, bs: int) -> None:
    if row.num_query_tokens <= 0 or not row.segments:
        raise ValueError("a query row needs tokens and segments")
    own = row.segments[-1]
    if own.end - own.start < row.num_query_tokens:
        raise ValueError("the row's query tokens must lie in its last segment")
    for seg in row.segments:
        if len(seg.block_ids) * bs < seg.end:
            raise ValueError(f"segment ends at {seg.end} past its {len(seg.block_ids)} blocks")


def _bucket(blk, pair, token, lo, hi, num_pairs: int, num_tokens: int) -> list[Bucket]:
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
        buckets.append(Bucket(uniq[members], reader_pair, reader_token, key_lo, key_hi))
    return buckets


# The Triton kernel reads a chunk of blocks that share their readers in one program, keeping each reader's
# softmax running across them: one partial result per (chunk, reader) instead of one per (block, reader), and
# the query rotated once per chunk. Chunks of at most TRITON_CHUNK_MAX_BLOCKS blocks, and short enough that a
# step has about TRITON_CHUNK_MIN_COUNT of them per KV head (programs for every SM of a GPU while views are
# short).
TRITON_CHUNK_MAX_BLOCKS = 16
TRITON_CHUNK_MIN_COUNT = 128


_CHUNK_SORT_MAX_READERS = 16  # one sort a reader column up to this many readers a block


def chunk_length(num_blocks: int) -> int:
    """Blocks per chunk for a step reading ``num_blocks`` distinct blocks."""
    return max(1, min(TRITON_CHUNK_MAX_BLOCKS, num_blocks // TRITON_CHUNK_MIN_COUNT))


def _chunk(b: Bucket, max_blocks: int) -> Bucket:
    """The bucket's blocks reordered so that blocks with the same readers are adjacent (in block order
    within a reader set), cut into chunks of at most ``max_blocks``. Without a Python loop over blocks or
    reader sets: a stable sort on each reader column, last column first, orders the rows (a few readers a
    block, decode); with many (long prefill or replay rows), ``torch.unique`` over the rows does."""
    u, r = b.reader_pair.shape
    if max_blocks == 1 or u <= 1:
        return replace(b, chunk_starts=torch.arange(u + 1))
    if r <= _CHUNK_SORT_MAX_READERS:
        order = torch.arange(u)
        for j in reversed(range(r)):
            order = order[torch.argsort(b.reader_pair[order, j], stable=True)]
    else:
        _, same = torch.unique(b.reader_pair, dim=0, return_inverse=True)
        order = torch.argsort(same, stable=True)
    rows = b.reader_pair[order]
    new_set = torch.ones(u, dtype=torch.bool)
    new_set[1:] = (rows[1:] != rows[:-1]).any(1)
    set_start = torch.cummax(torch.where(new_set, torch.arange(u), 0), 0).values  # first row of each row's set
    cut = (torch.arange(u) - set_start) % max_blocks == 0  # a set's first row, and every max_blocks-th after
    starts = torch.cat([cut.nonzero().flatten(), torch.tensor([u])])
    return Bucket(b.block_ids[order], rows, b.reader_token[order], b.key_lo[order], b.key_hi[order], starts)


def _cat(parts: list[torch.Tensor]) -> torch.Tensor:
    parts = [p for p in parts if p.numel()]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)
