"""Segment attention in Triton: the item plan, in two launches a layer, on a fixed grid.

Same plan and contract as the torch path of :mod:`vllm_hogwild.attention.segment_attention`
(:mod:`vllm_hogwild.attention.step_plan` makes it):

- **an item is read once for all its readers.** An item is one lane read from one
  position (the shared prompt, a co-worker's text, a finished paragraph); its readers are
  the (row, segment) pairs that read it, each with its own end. A work unit is (item,
  split, KV head): it walks its run of the item's blocks through the lane table (the
  physical block of each of the lane's logical blocks), scoring all its readers and all
  ``G`` query heads of the KV head (GQA) together, so each KV block is read from memory
  once per step instead of once per reader;
- **splits**: every item is cut into ``num_splits`` runs of blocks (the plan chooses how
  many: more when a step has few items, so a GPU has programs for its SMs), and each (pair,
  split) writes a partial softmax: its maximum, its sum of exponentials and its weighted
  values (fp32, base 2), in slot ``pair * num_splits + split``;
- **a fixed grid, counts from memory**: both kernels are persistent (``NUM_PROGRAMS``
  programs, each taking units ``pid, pid + NUM_PROGRAMS, ...``) and read the step's counts
  (rows, pairs, items, splits) from the plan's buffers, so a launch neither depends on the
  step nor needs the host to know the counts: a CUDA graph captured once replays any step
  whose plan fits the buffers (a step with no Hogwild row runs no unit);
- **tensor cores**: the readers of a unit are taken in tiles of ``BLOCK_M = max(16, G)``
  rows (``BLOCK_M // G`` readers times the ``G`` query heads of the KV head), so both
  products are ``tl.dot``: scores ``[BLOCK_M, head_dim] x [head_dim, block_size]`` and
  values ``[BLOCK_M, block_size] x [block_size, head_dim]``. bf16 and fp16 inputs go to
  the tensor cores in their dtype with fp32 accumulation; fp32 inputs use
  ``input_precision="ieee"`` (exact fp32, no tf32);
- **the query is rotated inside the kernel**, in fp32, by the reader's segment delta: the
  angle ``delta * inv_freq`` (the model's RoPE frequencies from
  :class:`vllm_hogwild.core.views.rope.RopeSpec`, which also decides NeoX or GPT-J pairing
  and a partial ``rotary_dim``; a YaRN attention factor is already in the stored q and k
  and cancels out of a pure rotation) is formed and reduced to ``[-pi, pi]`` in float64,
  its cos/sin taken in float32, so the plan carries one integer per pair and computes
  nothing per step for the rotations; the rotated query is rounded to the cache dtype
  for the product;
- **any cache layout, read in place**: the kernel addresses K and V through element
  strides over (block, slot, KV head, dim) (:class:`~vllm_hogwild.attention.kv_layout.StridedKV`),
  so vLLM's CPU cache (K transposed or not), the FlashAttention cache split into K and V
  views in any physical layout vLLM allocates, and separate K and V tensors are all read
  without a copy. The query and the output are addressed by their strides too (a slice of
  a qkv tensor is fine);
- **the merge**: a unit (output row, query head, 32 dims) combines the row's partials,
  log-sum-exp style (a reader that sees no key of a split contributes nothing), and writes
  only the planned rows of ``out``, in its dtype. A row's pairs are contiguous, so its
  slots are too.

Compiles: only model shapes and the grid are compile-time constants (heads per KV head,
head dim, block size, rotary dim, NeoX, the dtype, ``NUM_PROGRAMS``); Triton also
specializes the strides of the cache, query, output and lane table (fixed for a
deployment, except the lane table's row stride, passed with ``do_not_specialize`` since
the table grows until it is frozen). Nothing per step is an argument, so a new step never
compiles a new kernel. Offsets that can pass 2**31 (block id times block stride, head
times head stride, token times query stride, partial offsets) are computed in int64.

With ``TRITON_INTERPRET=1`` set before Triton is imported, the kernels run on CPU tensors
under Triton's interpreter, which is how the test suite checks them without a GPU (in a
subprocess: the variable changes every Triton kernel of the process). The interpreter
computes a bf16 ``tl.dot`` on the raw bits (Triton 3.9), so under the interpreter the bf16
operands, already rounded to bf16, are widened to fp32 before the product: the same
operands, whose products are exact in fp32 either way; only the order of the fp32 sums
differs. The test suite also compiles both kernels for sm_90 with Triton's real compiler
and ptxas (no GPU needed) and checks that the bf16/fp16 products are tensor-core ``mma``
instructions and the fp32 ones not tf32; ``benchmarks/device_check.sh`` checks and times
the kernels on a GPU, from a CUDA graph too.
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

# The only int argument that may change in a deployment: the lane table's row stride (the table grows until a
# CUDA graph freezes it). Never part of the partials kernel's specialization key.
PARTIALS_DYNAMIC = ("lanes_stride",)


def available() -> bool:
    return triton is not None


if triton is not None:

    def _segment_partials(
        q_ptr, q_st, q_sh, q_sd,  # query [T, Hq, D] (rotated at stored positions), any strides
        k_ptr, k_sb, k_ss, k_sh, k_sd,  # K: element strides over (block, slot, KV head, dim)
        v_ptr, v_sb, v_ss, v_sh, v_sd,  # V: the same
        lanes_ptr, lanes_stride,  # lane table [rows, max_blocks] int32: a lane's logical block -> physical block
        counts_ptr,  # [4] rows, pairs, items, splits of this step
        item_lane_ptr, item_start_ptr, item_end_ptr,  # [W] an item's lane-table row and positions [start, end)
        item_reader_ptr, reader_pair_ptr,  # [W + 1] -> [P]: an item's readers
        pair_token_ptr, pair_start_ptr, pair_end_ptr,  # [P] a pair's query token and its positions [start, end)
        pair_delta_ptr,  # [P] its rotation (positions)
        inv_freq_ptr,  # [ROT // 2] float64: the model's RoPE frequencies
        m_ptr, l_ptr, acc_ptr,  # out: [S, Hq], [S, Hq], [S, Hq, D] partial softmax (base 2) per slot
        qk_scale,  # softmax scale times log2(e) (times an FP8 cache's K scale)
        v_scale,  # an FP8 cache's V scale (1.0 otherwise)
        HQ: tl.constexpr, H: tl.constexpr, G: tl.constexpr, D: tl.constexpr, DP: tl.constexpr,
        BS: tl.constexpr, ROT: tl.constexpr, NEOX: tl.constexpr, BLOCK_M: tl.constexpr,
        OP_DTYPE: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
        KV_FP8: tl.constexpr,  # 0: a float cache; 1: FP8 e4m3fn bytes; 2: FP8 e5m2 bytes
        NUM_PROGRAMS: tl.constexpr,
    ):
        pid = tl.program_id(0)
        PI: tl.constexpr = 3.141592653589793
        num_items = tl.load(counts_ptr + 2)
        num_splits = tl.load(counts_ptr + 3)
        offs_s = tl.arange(0, BS)
        offs_d = tl.arange(0, DP)
        dmask = offs_d < D
        # Rows of a tile: reader (row // G) of the tile, query head h * G + row % G.
        READERS: tl.constexpr = BLOCK_M // G
        rows = tl.arange(0, BLOCK_M)
        row_reader = rows // G
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
        for unit in range(pid, num_items * num_splits * H, NUM_PROGRAMS):
            h = tl.cast(unit % H, tl.int64)
            split = (unit // H) % num_splits
            w = unit // H // num_splits
            lane = tl.load(item_lane_ptr + w).to(tl.int64)
            start = tl.load(item_start_ptr + w)
            end = tl.load(item_end_ptr + w)
            first = start // BS
            last = (end + BS - 1) // BS
            per_split = (last - first + num_splits - 1) // num_splits
            b0 = first + split * per_split
            b1 = tl.minimum(b0 + per_split, last)
            head = h * G + rows % G  # int64
            if b0 < b1:  # a split past an item's last block has no unit of work (the merge skips its slot)
                r0 = tl.load(item_reader_ptr + w)
                r1 = tl.load(item_reader_ptr + w + 1)
                for t in range(r0, r1, READERS):
                    r = t + row_reader
                    real = row_in_tile & (r < r1)  # padding rows of the last tile: no load, no store
                    pair = tl.load(reader_pair_ptr + r, mask=real, other=0).to(tl.int64)
                    token = tl.load(pair_token_ptr + pair, mask=real, other=0).to(tl.int64)
                    lo = tl.load(pair_start_ptr + pair, mask=real, other=0)
                    hi = tl.load(pair_end_ptr + pair, mask=real, other=0)
                    q_row = q_ptr + token * q_st + head * q_sh  # [BLOCK_M] pointers
                    qmask = real[:, None] & dmask[None, :]
                    q = tl.load(q_row[:, None] + offs_d[None, :] * q_sd, mask=qmask, other=0.0).to(tl.float32)
                    rot = real[:, None] & rmask[None, :]
                    qp = tl.load(q_row[:, None] + partner[None, :] * q_sd, mask=rot, other=0.0).to(tl.float32)
                    # The angle delta * inv_freq reaches 1e5 radians: formed and reduced to [-pi, pi] in float64,
                    # then cos/sin in float32 (within 2e-7 of the float64 values).
                    delta = tl.load(pair_delta_ptr + pair, mask=real, other=0).to(tl.float64)
                    angle = delta[:, None] * tl.load(inv_freq_ptr + freq, mask=rmask, other=0.0)[None, :]
                    angle = (angle - tl.floor(angle * (0.5 / PI) + 0.5) * (2.0 * PI)).to(tl.float32)
                    cos = tl.cos(angle)
                    sin = tl.sin(angle)
                    q = tl.where(rmask[None, :], q * cos + sign[None, :] * qp * sin, q)  # fp32 rotation, once
                    q = q.to(OP_DTYPE)
                    if UPCAST:
                        q = q.to(tl.float32)
                    run_m = tl.full([BLOCK_M], float("-inf"), tl.float32)
                    run_l = tl.zeros([BLOCK_M], tl.float32)
                    acc = tl.zeros([BLOCK_M, DP], tl.float32)
                    for b in range(b0, b1):
                        block = tl.load(lanes_ptr + lane * lanes_stride + b).to(tl.int64)
                        # The block of this KV head: K as [DP, BS] (ready for q @ k^T), V as [BS, DP].
                        kt = tl.load(k_ptr + block * k_sb + h * k_sh + offs_d[:, None] * k_sd
                                     + offs_s[None, :] * k_ss, mask=dmask[:, None], other=0)
                        v = tl.load(v_ptr + block * v_sb + h * v_sh + offs_s[:, None] * v_ss
                                    + offs_d[None, :] * v_sd, mask=dmask[None, :], other=0)
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
                        pos = b * BS + offs_s
                        visible = (pos[None, :] >= lo[:, None]) & (pos[None, :] < hi[:, None])
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
                    out = (pair * num_splits + split) * HQ + head  # int64
                    tl.store(m_ptr + out, run_m, mask=real)
                    tl.store(l_ptr + out, run_l, mask=real)
                    tl.store(acc_ptr + out[:, None] * D + offs_d[None, :], acc, mask=qmask)

    def _merge_partials(
        m_ptr, l_ptr, acc_ptr,  # [S, Hq], [S, Hq], [S, Hq, D] partials (base 2), slot pair * splits + split
        counts_ptr,  # [4] rows, pairs, items, splits of this step
        row_token_ptr, row_pair_ptr,  # [R] the query token of row i; [R + 1] its pairs
        pair_item_ptr, item_start_ptr, item_end_ptr,  # a pair's item, whose blocks say how many splits it wrote
        o_ptr, o_st, o_sh, o_sd,  # out [T, Hq, D], any strides; only rows token[i] written
        HQ: tl.constexpr, D: tl.constexpr, DB: tl.constexpr, EB: tl.constexpr, BS: tl.constexpr,
        NUM_PROGRAMS: tl.constexpr,
    ):
        """Unit (output row, query head, chunk of DB dims): log-sum-exp merge of the row's partials. A row's pairs
        are contiguous, so its slots are ``[p0 * splits, p1 * splits)``, read EB at a time; a slot whose split
        has no block of its pair's item was never written and is masked out."""
        pid = tl.program_id(0)
        num_rows = tl.load(counts_ptr)
        num_splits = tl.load(counts_ptr + 3)
        ND: tl.constexpr = (D + DB - 1) // DB
        offs_e = tl.arange(0, EB)
        for unit in range(pid, num_rows * HQ * ND, NUM_PROGRAMS):
            offs_d = (unit % ND) * DB + tl.arange(0, DB)
            hq = tl.cast((unit // ND) % HQ, tl.int64)
            i = unit // ND // HQ
            dmask = offs_d < D
            token = tl.load(row_token_ptr + i).to(tl.int64)
            s0 = tl.load(row_pair_ptr + i).to(tl.int64) * num_splits
            s1 = tl.load(row_pair_ptr + i + 1).to(tl.int64) * num_splits
            run_m = tl.full([1], float("-inf"), tl.float32)
            run_l = tl.zeros([1], tl.float32)
            run_acc = tl.zeros([DB], tl.float32)
            for e0 in range(s0, s1, EB):
                slot = e0 + offs_e
                inside = slot < s1
                pair = slot // num_splits
                w = tl.load(pair_item_ptr + pair, mask=inside, other=0)
                first = tl.load(item_start_ptr + w, mask=inside, other=0) // BS
                blocks = (tl.load(item_end_ptr + w, mask=inside, other=0) + BS - 1) // BS - first
                per_split = tl.maximum((blocks + num_splits - 1) // num_splits, 1)
                emask = inside & (slot % num_splits < (blocks + per_split - 1) // per_split)
                at = slot * HQ + hq
                m = tl.load(m_ptr + at, mask=emask, other=float("-inf"))
                l = tl.load(l_ptr + at, mask=emask, other=0.0)
                a = tl.load(acc_ptr + at[:, None] * D + offs_d[None, :], mask=emask[:, None] & dmask[None, :],
                            other=0.0)
                new_m = tl.maximum(run_m, tl.max(m, axis=0))  # [1]
                base = tl.where(new_m == float("-inf"), 0.0, new_m)
                alpha = tl.exp2(run_m - base)  # 0 while nothing was seen
                wt = tl.exp2(m - base)  # [EB]; 0 for a split whose readers saw nothing
                run_l = run_l * alpha + tl.sum(wt * l, axis=0)
                run_acc = run_acc * alpha + tl.sum(wt[:, None] * a, axis=0)
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


def meta_for(num_q_heads: int, kv, rope, dtype: torch.dtype, interpret: bool, programs: int) -> tuple[dict, dict]:
    """Compile-time constants of the two kernels: model shapes, dtype flags and the grid."""
    g = num_q_heads // kv.num_kv_heads
    d = kv.head_dim
    block_m = max(16, _pow2(g))
    op = _OP_DTYPES[dtype]
    partials = dict(
        HQ=num_q_heads, H=kv.num_kv_heads, G=g, D=d, DP=max(16, _pow2(d)), BS=kv.block_size, ROT=rope.rotary_dim,
        NEOX=bool(rope.is_neox_style), BLOCK_M=block_m, OP_DTYPE=op,
        # The interpreter multiplies bf16 tl.dot operands as raw bits: widen them (exactly) first.
        UPCAST=bool(interpret and dtype != torch.float32),
        PRECISION="ieee" if dtype == torch.float32 or interpret else "tf32",
        NUM_PROGRAMS=programs,
        # One warp for a 16-row tile: on an H200, 4k-32k-token views ran 1.4x-2x faster than with 4 warps
        # (8 KV heads), about as fast with GQA 7; 8 warps were 2x slower (docs/benchmarks.md, "On an H200").
        num_warps=1,
    )
    # Merge: a unit per (output row, query head, 32 dims); 64 slots of the row a step of its loop.
    merge = dict(HQ=num_q_heads, D=d, DB=32, EB=64, BS=kv.block_size, NUM_PROGRAMS=programs, num_warps=4)
    return partials, merge


def run(p, query: torch.Tensor, kv, scale: float | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Segment attention of an item plan (``p.items``) with the Triton kernels: two launches.

    query: ``[T, Hq, D]`` rotated at stored positions, any strides (a slice of
    a qkv tensor is fine); kv: any paged cache with ``.strided()``
    (:class:`~vllm_hogwild.attention.kv_layout.CpuPagedKV`, :class:`~vllm_hogwild.
    kv_layout.PlainPagedKV`) -> ``out [T, Hq, D]``, only the planned rows written (the
    others are left as they are). No host synchronisation and no allocation: the plan's
    buffers hold everything (a CUDA graph may capture this call). A plan with no pair
    launches nothing unless ``p.items.always_launch`` (a captured plan: later steps
    replay the launches).
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
    it = p.items
    if not it.num_pairs and not it.always_launch:
        return out
    _check_device(query.device)
    b = it.buffers
    m, l, acc = b.partial_buffers(num_q_heads, d)
    # An FP8 cache's values widen exactly to the query's dtype, the operands' dtype then.
    op_dtype = s.key.dtype if quant is None else (query.dtype if query.dtype in _OP_DTYPES else torch.float32)
    meta, merge_meta = meta_for(num_q_heads, s, p.rope, op_dtype, bool(triton.knobs.runtime.interpret),
                                it.num_programs)
    meta["KV_FP8"] = 0 if quant is None else quant.code
    k_scale, v_scale = (1.0, 1.0) if quant is None else (quant.k_scale, quant.v_scale)
    ints = b.ints
    lanes = it.lanes.blocks
    _launch(_partials_kernel, (it.num_programs,),
            query, *query.stride(), s.key, *s.key_strides, s.value, *s.value_strides,
            lanes, lanes.stride(0), ints["counts"], ints["item_lane"], ints["item_start"], ints["item_end"],
            ints["item_reader_ptr"], ints["reader_pair"], ints["pair_token"], ints["pair_start"], ints["pair_end"],
            ints["pair_delta"], it.inv_freq, m, l, acc, scale * k_scale * LOG2E, v_scale, **meta)
    _launch(_merge_kernel, (it.num_programs,), m, l, acc, ints["counts"], ints["row_token"], ints["row_pair_ptr"],
            ints["pair_item"], ints["item_start"], ints["item_end"], out, *out.stride(), **merge_meta)
    return out
