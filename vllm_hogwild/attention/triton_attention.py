"""Segment attention in Triton: the block-bucket plan, one program per (chunk of KV blocks, KV head).

Same plan and contract as the PyTorch block-bucket path of
:mod:`vllm_hogwild.attention.segment_attention` (``plan(..., PlanMode.TRITON)`` selects it):

- **a block is loaded once for all its readers.** A program serves every
  reader the plan lists for a chunk of blocks (for one KV head): each reader
  is one query token rotated for one segment, and all ``G`` query heads of
  the KV head (GQA) are scored together. The shared prompt and every lane are
  read by N-1 or N workers in a step, so their blocks are read from memory
  once per step instead of once per reader;
- **chunks**: the plan puts blocks with the same readers side by side and
  cuts them into chunks (``segment_attention.chunk_length``: up to 16 blocks,
  about 128 chunks per KV head at least, so short views keep one block a
  program); a program rotates each reader's query once, walks the chunk's
  blocks keeping the reader's softmax running, and writes one partial per
  (chunk, reader), not one per (block, reader). On an H200 this made 32k-token
  views 2.2x-3.6x faster (``docs/benchmarks.md``);
- **tensor cores**: the readers of a block are taken in tiles of
  ``BLOCK_M = max(16, G)`` rows (``BLOCK_M // G`` readers times the ``G`` query
  heads of the KV head), so both products are ``tl.dot``: scores
  ``[BLOCK_M, head_dim] x [head_dim, block_size]`` and values
  ``[BLOCK_M, block_size] x [block_size, head_dim]``. bf16 and fp16 inputs go
  to the tensor cores in their dtype with fp32 accumulation; fp32 inputs use
  ``input_precision="ieee"`` (exact fp32, no tf32);
- **the query is rotated inside the kernel**, in fp32, by the reader's segment
  delta from the plan's per-pair cos/sin (computed from the model's RoPE
  frequencies by :class:`vllm_hogwild.core.views.rope.RopeSpec`, which also decides NeoX
  or GPT-J pairing and a partial ``rotary_dim``; a YaRN attention factor is
  already in the stored q and k and cancels out of a pure rotation), then
  rounded to the cache dtype for the product;
- **any cache layout, read in place**: the kernel addresses K and V through
  element strides over (block, slot, KV head, dim) (:class:`~vllm_hogwild.
  kv_layout.StridedKV`), so vLLM's CPU cache (K transposed or not), the
  FlashAttention cache split into K and V views in any physical layout vLLM
  allocates, and separate K and V tensors are all read without a copy. The
  query and the output are addressed by their strides too (a slice of a qkv
  tensor is fine);
- **split over KV, merged exactly**: each (chunk, reader) writes a partial
  softmax (its maximum, its sum of exponentials and its weighted values, fp32)
  into a slot of a token-major buffer (the slots of one query token are
  contiguous, so the merge reads them without an index); a second kernel, one
  program per (output row, query head, 32 dims), merges a row's slots
  log-sum-exp style (a reader that sees no key of a block contributes
  nothing; padding readers are never written nor merged) and writes only the
  planned rows of ``out``, in its dtype. Per step, the index tensors, the slot
  map and the partial buffers are built once (on the first layer, kept on the
  plan, no host sync) and serve every layer.

Compiles: only model shapes are compile-time constants (heads per KV head,
head dim, block size, rotary dim, NeoX, the dtype); Triton also specializes
the strides of the cache, query and output (fixed for a deployment); per-step
counts (readers per bucket, number of pairs, a bucket's offset in the
partials) are passed with ``do_not_specialize``, so a new step never
compiles a new kernel. Offsets
that can pass 2**31 (block id times block stride, head times head stride,
token times query stride, partial-output offsets) are computed in int64.

With ``TRITON_INTERPRET=1`` set before Triton is imported, the kernels run on
CPU tensors under Triton's interpreter, which is how the test suite checks
them without a GPU (in a subprocess: the variable changes every Triton kernel
of the process). The interpreter computes a bf16 ``tl.dot`` on the raw bits
(Triton 3.9), so under the interpreter the bf16 operands, already rounded to
bf16, are widened to fp32 before the product: the same operands, whose
products are exact in fp32 either way; only the order of the fp32 sums
differs. The test suite also compiles both kernels for sm_90 with Triton's
real compiler and ptxas (no GPU needed) and checks that the bf16/fp16
products are tensor-core ``mma`` instructions and the fp32 ones not tf32;
``benchmarks/device_check.sh`` checks and times the kernels on a GPU.
"""

from __future__ import annotations

import math

import torch

try:  # Triton is optional: the CUDA extra brings it; the CPU build may carry it too.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where Triton is missing
    triton = None

LOG2E = 1.4426950408889634

# Per-step int arguments of the partials kernel: never part of its specialization key (Triton would
# otherwise specialize ints equal to 1 or divisible by 16 and compile again as they change). The merge
# kernel takes no per-step ints.
PARTIALS_DYNAMIC = ("R", "num_pairs", "entry_base")


def available() -> bool:
    return triton is not None


if triton is not None:

    def _segment_partials(
        q_ptr, q_st, q_sh, q_sd,  # query [T, Hq, D] (rotated at stored positions), any strides
        k_ptr, k_sb, k_ss, k_sh, k_sd,  # K: element strides over (block, slot, KV head, dim)
        v_ptr, v_sb, v_ss, v_sh, v_sd,  # V: the same
        blocks_ptr,  # [U] physical blocks of this bucket, each chunk's blocks adjacent
        chunk_ptr,  # [C + 1] chunk c reads blocks [chunk[c], chunk[c + 1]), all with the same readers
        pair_ptr, lo_ptr, hi_ptr,  # [U, R] each reader's pair (num_pairs: padding) and visible offsets [lo, hi)
        pair_token_ptr, cos_ptr, sin_ptr,  # [P] query token of each pair; [P, ROT // 2] its rotation (fp32)
        slot_ptr,  # [entries of all buckets] where each (chunk, real reader)'s partial goes (token-major)
        m_ptr, l_ptr, acc_ptr,  # out: [S, Hq], [S, Hq], [S, Hq, D] partial softmax (base 2) per slot
        R, num_pairs, entry_base,  # per step (do_not_specialize); entry_base: this bucket's first entry
        qk_scale,  # softmax scale times log2(e) (times an FP8 cache's K scale)
        v_scale,  # an FP8 cache's V scale (1.0 otherwise)
        HQ: tl.constexpr, G: tl.constexpr, D: tl.constexpr, DP: tl.constexpr, BS: tl.constexpr,
        ROT: tl.constexpr, NEOX: tl.constexpr, BLOCK_M: tl.constexpr,
        OP_DTYPE: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
        KV_FP8: tl.constexpr,  # 0: a float cache; 1: FP8 e4m3fn bytes; 2: FP8 e5m2 bytes
    ):
        c = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1).to(tl.int64)
        u0 = tl.load(chunk_ptr + c).to(tl.int64)
        u1 = tl.load(chunk_ptr + c + 1).to(tl.int64)
        offs_s = tl.arange(0, BS)
        offs_d = tl.arange(0, DP)
        dmask = offs_d < D
        # Rows of a tile: reader (row // G) of the tile, query head h * G + row % G.
        READERS: tl.constexpr = BLOCK_M // G
        rows = tl.arange(0, BLOCK_M)
        row_reader = rows // G
        head = (h * G + rows % G).to(tl.int64)
        row_in_tile = row_reader < READERS
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
        for t in range(0, tl.cdiv(R, READERS)):
            r = t * READERS + row_reader
            in_range = row_in_tile & (r < R)
            # The chunk's readers are its first block's (every block of the chunk has the same).
            pair = tl.load(pair_ptr + u0 * R + r, mask=in_range, other=num_pairs)
            real = pair < num_pairs  # padding readers: no load, no store, never merged
            pair = tl.where(real, pair, 0).to(tl.int64)
            token = tl.load(pair_token_ptr + pair, mask=real, other=0).to(tl.int64)
            q_row = q_ptr + token * q_st + head * q_sh  # [BLOCK_M] pointers
            qmask = real[:, None] & dmask[None, :]
            q = tl.load(q_row[:, None] + offs_d[None, :] * q_sd, mask=qmask, other=0.0).to(tl.float32)
            rot = real[:, None] & rmask[None, :]
            qp = tl.load(q_row[:, None] + partner[None, :] * q_sd, mask=rot, other=0.0).to(tl.float32)
            cs = pair[:, None] * HALF + freq[None, :]
            cos = tl.load(cos_ptr + cs, mask=rot, other=1.0)
            sin = tl.load(sin_ptr + cs, mask=rot, other=0.0)
            q = tl.where(rmask[None, :], q * cos + sign[None, :] * qp * sin, q)  # fp32 rotation, once a chunk
            q = q.to(OP_DTYPE)
            if UPCAST:
                q = q.to(tl.float32)
            run_m = tl.full([BLOCK_M], float("-inf"), tl.float32)
            run_l = tl.zeros([BLOCK_M], tl.float32)
            acc = tl.zeros([BLOCK_M, DP], tl.float32)
            for u in range(u0, u1):
                block = tl.load(blocks_ptr + u).to(tl.int64)
                # The block of this KV head: K as [DP, BS] (ready for q @ k^T), V as [BS, DP].
                kt = tl.load(k_ptr + block * k_sb + h * k_sh + offs_d[:, None] * k_sd + offs_s[None, :] * k_ss,
                             mask=dmask[:, None], other=0)
                v = tl.load(v_ptr + block * v_sb + h * v_sh + offs_s[:, None] * v_ss + offs_d[None, :] * v_sd,
                            mask=dmask[None, :], other=0)
                # An FP8 cache: its bytes as float8 (exact in every operand dtype); the K scale is in
                # qk_scale, the V scale multiplies V here.
                if KV_FP8 == 1:
                    kt = kt.to(tl.float8e4nv, bitcast=True)
                    v = (v.to(tl.float8e4nv, bitcast=True).to(tl.float32) * v_scale)
                elif KV_FP8 == 2:
                    kt = kt.to(tl.float8e5, bitcast=True)
                    v = (v.to(tl.float8e5, bitcast=True).to(tl.float32) * v_scale)
                kt = kt.to(OP_DTYPE)
                v = v.to(OP_DTYPE)
                if UPCAST:
                    kt = kt.to(tl.float32)
                    v = v.to(tl.float32)
                s = tl.dot(q, kt, input_precision=PRECISION) * qk_scale  # [BLOCK_M, BS], log2 units
                lo = tl.load(lo_ptr + u * R + r, mask=in_range, other=0)
                hi = tl.load(hi_ptr + u * R + r, mask=in_range, other=0)
                visible = (offs_s[None, :] >= lo[:, None]) & (offs_s[None, :] < hi[:, None])
                s = tl.where(visible, s, float("-inf"))
                new_m = tl.maximum(run_m, tl.max(s, axis=1))  # -inf while a reader has seen nothing
                base = tl.where(new_m == float("-inf"), 0.0, new_m)
                alpha = tl.exp2(run_m - base)
                p = tl.exp2(s - base[:, None])
                run_l = run_l * alpha + tl.sum(p, axis=1)
                p = p.to(OP_DTYPE)
                if UPCAST:
                    p = p.to(tl.float32)
                acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=PRECISION)  # fp32 accumulation
                run_m = new_m
            slot = tl.load(slot_ptr + entry_base + c * R + r, mask=real, other=0)
            out = slot * HQ + head  # int64
            tl.store(m_ptr + out, run_m, mask=real)
            tl.store(l_ptr + out, run_l, mask=real)
            tl.store(acc_ptr + out[:, None] * D + offs_d[None, :], acc, mask=qmask)

    def _merge_partials(
        m_ptr, l_ptr, acc_ptr,  # [S, Hq], [S, Hq], [S, Hq, D] partials (base 2), token-major slots
        start_ptr, end_ptr,  # output row i merges slots [start[i], end[i])
        token_ptr,  # [T_out] the query token of output row i
        o_ptr, o_st, o_sh, o_sd,  # out [T, Hq, D], any strides; only rows token[i] written
        HQ: tl.constexpr, D: tl.constexpr, DB: tl.constexpr, EB: tl.constexpr,
    ):
        """Program (output row, query head, chunk of DB dims): log-sum-exp merge of the row's slots."""
        i = tl.program_id(0)
        hq = tl.program_id(1).to(tl.int64)
        offs_d = tl.program_id(2) * DB + tl.arange(0, DB)
        dmask = offs_d < D
        start = tl.load(start_ptr + i)
        end = tl.load(end_ptr + i)
        token = tl.load(token_ptr + i).to(tl.int64)
        offs_e = tl.arange(0, EB)
        run_m = tl.full([1], float("-inf"), tl.float32)
        run_l = tl.zeros([1], tl.float32)
        run_acc = tl.zeros([DB], tl.float32)
        for e0 in range(start, end, EB):
            slot = (e0 + offs_e).to(tl.int64)
            emask = slot < end
            at = slot * HQ + hq
            m = tl.load(m_ptr + at, mask=emask, other=float("-inf"))
            l = tl.load(l_ptr + at, mask=emask, other=0.0)
            a = tl.load(acc_ptr + at[:, None] * D + offs_d[None, :], mask=emask[:, None] & dmask[None, :], other=0.0)
            new_m = tl.maximum(run_m, tl.max(m, axis=0))  # [1]
            base = tl.where(new_m == float("-inf"), 0.0, new_m)
            alpha = tl.exp2(run_m - base)  # 0 while nothing was seen
            w = tl.exp2(m - base)  # [EB]; 0 for readers that saw nothing in their block
            run_l = run_l * alpha + tl.sum(w * l, axis=0)
            run_acc = run_acc * alpha + tl.sum(w[:, None] * a, axis=0)
            run_m = new_m
        o = run_acc / run_l
        tl.store(o_ptr + token * o_st + hq * o_sh + offs_d * o_sd, o.to(o_ptr.dtype.element_ty), mask=dmask)

    # Under TRITON_INTERPRET=1 these are the interpreter's versions.
    _partials_kernel = triton.jit(_segment_partials, do_not_specialize=list(PARTIALS_DYNAMIC))
    _merge_kernel = triton.jit(_merge_partials)

    _OP_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}

    def _check_device(device: torch.device) -> None:
        if device.type == "cpu" and not triton.knobs.runtime.interpret:
            raise RuntimeError("the Triton kernel runs on CPU tensors only under Triton's interpreter: "
                               "set TRITON_INTERPRET=1 before Triton is imported")


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _launch(kernel, grid, *args, **meta) -> None:
    """One kernel launch (a seam for the checks, which record the arguments of each launch)."""
    kernel[grid](*args, **meta)


class _Prepared:
    """What every layer of a step shares: bucket tensors on the device, cos/sin, the merge lists, buffers."""

    def __init__(self, p, device: torch.device) -> None:
        self.device = device
        self.cos = p.pair_cos.to(device=device, dtype=torch.float32).contiguous()
        self.sin = p.pair_sin.to(device=device, dtype=torch.float32).contiguous()
        self.pair_token = p.pair_token.to(device).contiguous()
        self.num_pairs = int(self.pair_token.shape[0])
        self.buckets = []  # (block_ids, chunk_starts, reader_pair, key_lo, key_hi, C, R, entry_base)
        tokens, base = [], 0
        for b in p.buckets:
            u, r = b.reader_pair.shape
            starts = b.chunk_starts if b.chunk_starts is not None else torch.arange(u + 1)
            starts = starts.to(device).contiguous()
            chunks = int(starts.shape[0]) - 1
            self.buckets.append((b.block_ids.to(device).contiguous(), starts, b.reader_pair.to(device).contiguous(),
                                 b.key_lo.to(device).contiguous(), b.key_hi.to(device).contiguous(), chunks, r, base))
            tokens.append(b.reader_token.to(device)[starts[:-1]].reshape(-1))  # a partial per (chunk, reader)
            base += chunks * r
        self.num_entries = base
        # Token-major slots: entries sorted by query token (padding, token T, sorts last and is never
        # written); output row i merges slots [start[i], end[i]). No host sync: sizes are known.
        token = torch.cat(tokens) if tokens else torch.zeros(0, dtype=torch.long, device=device)
        sorted_tokens, order = torch.sort(token, stable=True)
        self.slot = torch.empty_like(order)
        self.slot[order] = torch.arange(base, device=device)
        self.out_tokens = p.out_tokens.to(device).contiguous()
        self.start = torch.searchsorted(sorted_tokens, self.out_tokens).contiguous()
        self.end = torch.searchsorted(sorted_tokens, self.out_tokens, right=True).contiguous()
        self._buffers: dict = {}

    def buffers(self, num_q_heads: int, d: int):
        key = (num_q_heads, d)
        if key not in self._buffers:  # layers run one after another on one stream: one set serves them all
            e = self.num_entries
            self._buffers[key] = (torch.empty(e, num_q_heads, dtype=torch.float32, device=self.device),
                                  torch.empty(e, num_q_heads, dtype=torch.float32, device=self.device),
                                  torch.empty(e, num_q_heads, d, dtype=torch.float32, device=self.device))
        return self._buffers[key]


def prepare(p, device: torch.device | str) -> _Prepared:
    """The step's device tensors for the kernels, built on the first layer and kept on the plan."""
    device = torch.device(device)
    prep = getattr(p, "_triton_prepared", None)
    if prep is None or prep.device != device:
        prep = _Prepared(p, device)
        p._triton_prepared = prep
    return prep


def meta_for(num_q_heads: int, kv, rope, dtype: torch.dtype, interpret: bool) -> tuple[dict, dict]:
    """Compile-time constants of the two kernels: model shapes and dtype flags only."""
    g = num_q_heads // kv.num_kv_heads
    d = kv.head_dim
    block_m = max(16, _pow2(g))
    op = _OP_DTYPES[dtype]
    partials = dict(
        HQ=num_q_heads, G=g, D=d, DP=max(16, _pow2(d)), BS=kv.block_size, ROT=rope.rotary_dim,
        NEOX=bool(rope.is_neox_style), BLOCK_M=block_m, OP_DTYPE=op,
        # The interpreter multiplies bf16 tl.dot operands as raw bits: widen them (exactly) first.
        UPCAST=bool(interpret and dtype != torch.float32),
        PRECISION="ieee" if dtype == torch.float32 or interpret else "tf32",
        # One warp for a 16-row tile: on an H200, 4k-32k-token views ran 1.4x-2x faster than with 4 warps
        # (8 KV heads), about as fast with GQA 7; 8 warps were 2x slower (docs/benchmarks.md, "On an H200").
        num_warps=1,
    )
    # Merge: a program per (output row, query head, 32 dims), 128 slots per step of its loop.
    merge = dict(HQ=num_q_heads, D=d, DB=32, EB=128, num_warps=4)
    return partials, merge


def run(p, query: torch.Tensor, kv, scale: float | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Segment attention of a block-bucket plan (``p.buckets``) with the Triton kernels.

    query: ``[T, Hq, D]`` rotated at stored positions, any strides (a slice of
    a qkv tensor is fine); kv: any paged cache with ``.strided()``
    (:class:`~vllm_hogwild.attention.kv_layout.CpuPagedKV`, :class:`~vllm_hogwild.
    kv_layout.PlainPagedKV`) -> ``out [T, Hq, D]``, only the rows of
    ``p.out_tokens`` written (the others are left as they are).
    """
    if triton is None:
        raise RuntimeError("the Triton segment-attention kernel needs the `triton` package")
    num_tokens, num_q_heads, d = query.shape
    s = kv.strided()
    if s.head_dim != d or num_q_heads % s.num_kv_heads:
        raise ValueError(f"query [*, {num_q_heads}, {d}] does not fit the cache "
                         f"({s.num_kv_heads} KV heads of dim {s.head_dim})")
    bs = s.block_size
    if bs & (bs - 1) or bs < 16:
        raise ValueError(f"block_size: the Triton kernel needs a power of two >= 16, not {bs}")
    quant = s.quant
    if quant is not None:
        if s.key.dtype not in (torch.uint8, quant.fp8) or s.value.dtype != s.key.dtype:
            raise ValueError(f"an FP8 cache is bytes (uint8) or {quant.fp8}, not {s.key.dtype}/{s.value.dtype}")
    elif s.key.dtype not in _OP_DTYPES or s.value.dtype != s.key.dtype:
        raise ValueError(f"the Triton kernel reads bf16, fp16, fp32 or FP8 caches, not {s.key.dtype}/{s.value.dtype}")
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    if out is None:
        out = torch.zeros_like(query)
    if not p.buckets:
        return out
    _check_device(query.device)
    prep = prepare(p, query.device)
    m, l, acc = prep.buffers(num_q_heads, d)
    # An FP8 cache's values widen exactly to the query's dtype, the operands' dtype then.
    op_dtype = s.key.dtype if quant is None else (query.dtype if query.dtype in _OP_DTYPES else torch.float32)
    meta, merge_meta = meta_for(num_q_heads, s, p.rope, op_dtype, bool(triton.knobs.runtime.interpret))
    meta["KV_FP8"] = 0 if quant is None else quant.code
    k_scale, v_scale = (1.0, 1.0) if quant is None else (quant.k_scale, quant.v_scale)
    for blocks, starts, pair, lo, hi, chunks, r, base in prep.buckets:
        _launch(_partials_kernel, (chunks, s.num_kv_heads),
                query, *query.stride(), s.key, *s.key_strides, s.value, *s.value_strides,
                blocks, starts, pair, lo, hi, prep.pair_token, prep.cos, prep.sin, prep.slot, m, l, acc,
                r, prep.num_pairs, base, scale * k_scale * LOG2E, v_scale, **meta)
    rows = prep.out_tokens.shape[0]
    if rows:
        _launch(_merge_kernel, (rows, num_q_heads, triton.cdiv(d, merge_meta["DB"])), m, l, acc, prep.start,
                prep.end, prep.out_tokens, out, *out.stride(), **merge_meta)
    return out
