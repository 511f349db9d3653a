"""Segment attention in Triton: the block-bucket plan, one program per (physical KV block, KV head).

Same plan and contract as the PyTorch block-bucket path of
:mod:`vllm_hogwild.segment_attention` (``plan(..., triton=True)`` selects it):

- **a block is loaded once for all its readers.** A program loads one K/V
  block of one KV head into registers, then serves every reader the plan
  lists for that block: each reader is one query token rotated for one
  segment, and all ``G`` query heads of the KV head (GQA) are scored together.
  The shared prompt and every lane are read by N-1 or N workers in a step, so
  their blocks are read from memory once per step instead of once per reader;
- **the query is rotated inside the kernel** by the reader's segment delta,
  from the plan's per-pair cos/sin (computed from the model's RoPE frequencies
  by :class:`vllm_hogwild.rope.RopeSpec`, which also decides NeoX or GPT-J
  pairing and a partial ``rotary_dim``; a YaRN attention factor is already in
  the stored q and k and cancels out of a pure rotation);
- **split over KV, merged exactly**: each (block, reader) writes a partial
  softmax (its maximum, its sum of exponentials and its weighted values); the
  partials of a query token are merged log-sum-exp style.

Inputs are read in their dtype (bf16, fp16, fp32) and computed in fp32. With
``TRITON_INTERPRET=1`` set before Triton is imported, the kernel runs on CPU
tensors under Triton's interpreter, which is how the test suite checks it
without a GPU (in a subprocess: the variable changes every Triton kernel of
the process); ``benchmarks/device_check.sh`` checks and times it on a GPU.
"""

from __future__ import annotations

import math

import torch

try:  # Triton is optional: the CUDA extra brings it; the CPU build may carry it too.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where Triton is missing
    triton = None

from vllm_hogwild.kv_layout import PlainPagedKV


def available() -> bool:
    return triton is not None


if triton is not None:

    def _block_partials(
        q_ptr, q_stride_t, q_stride_h,  # query [T, Hq, D], rotated at stored positions
        k_ptr, v_ptr, kv_stride_b, kv_stride_s, kv_stride_h,  # caches [blocks, block_size, H, D], D contiguous
        blocks_ptr,  # [U] physical blocks of this bucket
        pair_ptr, lo_ptr, hi_ptr,  # [U, R] each reader's pair (P: padding) and visible offsets [lo, hi)
        pair_token_ptr, cos_ptr, sin_ptr,  # [P] query token of each pair; [P, ROT // 2] its rotation
        m_ptr, l_ptr, acc_ptr,  # out: [U * R, Hq], [U * R, Hq], [U * R, Hq, D] partial softmax of each reader
        R, num_pairs, num_q_heads, scale,
        G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, DP: tl.constexpr, BS: tl.constexpr,
        ROT: tl.constexpr, NEOX: tl.constexpr,
    ):
        u = tl.program_id(0)
        h = tl.program_id(1)
        block = tl.load(blocks_ptr + u).to(tl.int64)
        offs_s = tl.arange(0, BS)
        offs_d = tl.arange(0, DP)
        dmask = offs_d < D
        kv_off = block * kv_stride_b + offs_s[:, None] * kv_stride_s + h * kv_stride_h + offs_d[None, :]
        k = tl.load(k_ptr + kv_off, mask=dmask[None, :], other=0.0).to(tl.float32)  # [BS, DP], loaded once
        v = tl.load(v_ptr + kv_off, mask=dmask[None, :], other=0.0).to(tl.float32)
        offs_g = tl.arange(0, GP)
        gmask = offs_g < G
        heads = h * G + offs_g
        # The rotation pairs dimension d with a partner; dimensions past ROT pass through.
        HALF: tl.constexpr = ROT // 2
        rmask = offs_d < ROT
        if NEOX:
            partner = tl.where(offs_d < HALF, offs_d + HALF, offs_d - HALF)
            sign = tl.where(offs_d < HALF, -1.0, 1.0)
            freq = tl.where(offs_d < HALF, offs_d, offs_d - HALF)
        else:
            partner = tl.where(offs_d % 2 == 0, offs_d + 1, offs_d - 1)
            sign = tl.where(offs_d % 2 == 0, -1.0, 1.0)
            freq = offs_d // 2
        qmask = gmask[:, None] & dmask[None, :]
        for r in range(R):
            entry = u * R + r
            pair = tl.load(pair_ptr + entry)
            lo = tl.load(lo_ptr + entry)
            hi = tl.load(hi_ptr + entry)
            pair = tl.where(pair < num_pairs, pair, 0)  # padding reads pair 0 and sees no key (lo = hi = 0)
            token = tl.load(pair_token_ptr + pair).to(tl.int64)
            q_base = q_ptr + token * q_stride_t + heads[:, None] * q_stride_h
            q = tl.load(q_base + offs_d[None, :], mask=qmask, other=0.0).to(tl.float32)  # [GP, DP]
            qp = tl.load(q_base + partner[None, :], mask=qmask & rmask[None, :], other=0.0).to(tl.float32)
            cos = tl.load(cos_ptr + pair * HALF + freq, mask=rmask, other=1.0)
            sin = tl.load(sin_ptr + pair * HALF + freq, mask=rmask, other=0.0)
            q = tl.where(rmask[None, :], q * cos[None, :] + sign[None, :] * qp * sin[None, :], q)
            s = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale  # [GP, BS]
            visible = (offs_s >= lo) & (offs_s < hi)
            s = tl.where(visible[None, :], s, float("-inf"))
            m = tl.max(s, axis=1)  # [GP]; -inf for a reader that sees nothing here
            p = tl.exp(s - tl.where(m == float("-inf"), 0.0, m)[:, None])
            l = tl.sum(p, axis=1)
            acc = tl.sum(p[:, :, None] * v[None, :, :], axis=1)  # [GP, DP]
            out = entry * num_q_heads + heads
            tl.store(m_ptr + out, m, mask=gmask)
            tl.store(l_ptr + out, l, mask=gmask)
            tl.store(acc_ptr + out[:, None] * D + offs_d[None, :], acc, mask=qmask)

    _block_partials_kernel = triton.jit(_block_partials)  # the interpreter's version under TRITON_INTERPRET=1

    def _kernel(device: torch.device):
        if device.type == "cpu" and not triton.knobs.runtime.interpret:
            raise RuntimeError("the Triton kernel runs on CPU tensors only under Triton's interpreter: "
                               "set TRITON_INTERPRET=1 before Triton is imported")
        return _block_partials_kernel


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def run(p, query: torch.Tensor, kv: PlainPagedKV, scale: float | None = None,
        out: torch.Tensor | None = None) -> torch.Tensor:
    """Segment attention of a block-bucket plan (``p.buckets``) with the Triton kernel.

    query: ``[T, Hq, D]`` rotated at stored positions; kv: separate K and V
    caches ``[num_blocks, block_size, H, D]`` (last dim contiguous) -> ``out``,
    only the planned rows written.
    """
    if triton is None:
        raise RuntimeError("the Triton segment-attention kernel needs the `triton` package")
    num_tokens, num_q_heads, d = query.shape
    heads, bs = kv.num_kv_heads, kv.block_size
    g = num_q_heads // heads
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    if out is None:
        out = torch.zeros_like(query)
    if not p.buckets:
        return out
    k_cache, v_cache = kv.key_cache, kv.value_cache
    if k_cache.stride(-1) != 1 or v_cache.stride() != k_cache.stride():
        raise ValueError("the Triton kernel reads K and V caches with the same strides and a contiguous last dim")
    if bs & (bs - 1):
        raise ValueError(f"block_size: the Triton kernel needs a power of two, not {bs}")
    rot = p.rope.rotary_dim
    cos = p.pair_cos.to(device=query.device, dtype=torch.float32).contiguous()
    sin = p.pair_sin.to(device=query.device, dtype=torch.float32).contiguous()
    pair_token = p.pair_token.contiguous()
    num_pairs = pair_token.shape[0]
    kernel = _kernel(query.device)
    ms, ls, accs, tokens = [], [], [], []
    for b in p.buckets:
        u, r = b.reader_pair.shape
        m = torch.empty(u * r, num_q_heads, dtype=torch.float32, device=query.device)
        l = torch.empty_like(m)
        acc = torch.empty(u * r, num_q_heads, d, dtype=torch.float32, device=query.device)
        kernel[(u, heads)](
            query, query.stride(0), query.stride(1),
            k_cache, v_cache, k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            b.block_ids.contiguous(), b.reader_pair.contiguous(), b.key_lo.contiguous(), b.key_hi.contiguous(),
            pair_token, cos, sin, m, l, acc,
            r, num_pairs, num_q_heads, scale,
            G=g, GP=_pow2(g), D=d, DP=_pow2(d), BS=bs, ROT=rot, NEOX=p.rope.is_neox_style,
        )
        ms.append(m)
        ls.append(l)
        accs.append(acc)
        tokens.append(b.reader_token.reshape(-1))
    _merge(torch.cat(ms), torch.cat(ls), torch.cat(accs), torch.cat(tokens), p.out_tokens, num_tokens, out)
    return out


def _merge(m, l, acc, token, rows, num_tokens: int, out: torch.Tensor) -> None:
    """Log-sum-exp merge of the partials of each query token (padding readers carry token ``T``)."""
    hq = m.shape[1]
    index = token[:, None].expand(-1, hq)
    row_max = torch.full((num_tokens + 1, hq), -math.inf, dtype=m.dtype, device=m.device)
    row_max.scatter_reduce_(0, index, m, "amax")
    row_max = torch.where(torch.isinf(row_max), torch.zeros_like(row_max), row_max)
    w = torch.exp(m - row_max[token])  # 0 for partials that saw nothing
    denom = torch.zeros(num_tokens + 1, hq, dtype=m.dtype, device=m.device).index_add_(0, token, w * l)
    total = torch.zeros(num_tokens + 1, hq, acc.shape[2], dtype=m.dtype, device=m.device)
    total.index_add_(0, token, w[..., None] * acc)
    out[rows] = (total[rows] / denom[rows][..., None]).to(out.dtype)
