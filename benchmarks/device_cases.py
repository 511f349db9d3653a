"""Building blocks for checking the Triton segment-attention kernel, with torch only (no vLLM, no transformers).

Shared by ``benchmarks/device_check.py`` (a GPU machine with only torch and
Triton) and ``tests/triton_check.py`` (the CPU, under Triton's interpreter):

- :func:`flash_attn_cache` / :func:`flash_attn_split`: vLLM 0.32's
  FlashAttention cache, one ``[num_blocks, kv_heads, block_size, 2 * head_dim]``
  tensor per layer, in each physical layout vLLM can allocate for it, split
  into K and V exactly as the backend splits it;
- :func:`qkv_query`: a query that is a strided slice of a qkv tensor, as the
  model hands it to the attention layer;
- :func:`build_group`: a Hogwild group written into any paged cache, physical
  block ids from a chosen first id (above 65,536 on the device);
- :func:`view_oracle`: the float64 reference, from the definitions: every
  view materialized, its keys re-rotated from stored to view positions
  (complex multiplication), plain softmax attention.

Where the layouts come from (vLLM 0.32): ``vllm/v1/kv_cache_layout.py``
defines ``KVCacheLayout``, six stride permutations of the logical
``[L, B, H, N, C]`` cache (layers, blocks, KV heads, slots, content: K then V,
``2 * head_dim``); ``vllm/v1/kv_cache_interface.py::create_kv_cache_views``
allocates one buffer per KV cache tensor and views layer ``l`` as
``[B, H, N, C]`` with those strides. ``FlashAttentionBackend`` declares no
``supported_kv_cache_layouts`` (any layout), so
``vllm/v1/attention/backends/utils.py::resolve_kv_cache_layout`` takes
``VLLM_KV_CACHE_LAYOUT`` (any of the six; ``NHD``/``HND`` alias ``LBNHC``/
``LBHNC``) or the default preference, ``LBNHC`` first. ``FlashAttentionImpl``
then reads ``key_cache, value_cache = kv_cache.transpose(1, 2).split(head_size,
dim=-1)``: ``[B, N, H, D]`` views with the layout's strides.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Sequence

import torch

from vllm_hogwild.attention.kv_layout import KVQuant, PlainPagedKV
from vllm_hogwild.attention import step_plan
from vllm_hogwild.attention.segment_attention import QueryRow, Segment
from vllm_hogwild.core.views.spans import View

# vLLM 0.32 KVCacheLayout: physical order of the logical axes [L, B, H, N, C].
FA_LAYOUTS = {
    "LBNHC": (0, 1, 3, 2, 4),  # the default (NHD)
    "LBHNC": (0, 1, 2, 3, 4),  # HND
    "LHBNC": (0, 2, 1, 3, 4),
    "BLHNC": (1, 0, 2, 3, 4),
    "BLNHC": (1, 0, 3, 2, 4),
    "BHLNC": (1, 2, 0, 3, 4),
}


def flash_attn_cache(layout: str, num_blocks: int, num_kv_heads: int, block_size: int, head_dim: int,
                     dtype: torch.dtype, device, num_layers: int = 2, layer: int = 1,
                     generator: torch.Generator | None = None) -> torch.Tensor:
    """Layer ``layer`` of an ``num_layers``-layer cache as vLLM allocates it: ``[B, H, N, 2D]`` with the
    layout's strides; the whole buffer (every layer) is filled with noise, so a wrong read shows. An FP8
    cache is ``torch.uint8`` elements, as vLLM allocates it; its noise is finite bytes of either encoding
    (0x00-0x77: no infinity or NaN in e4m3fn or e5m2)."""
    order = FA_LAYOUTS[layout]
    logical = (num_layers, num_blocks, num_kv_heads, block_size, 2 * head_dim)
    physical = torch.empty([logical[i] for i in order], dtype=dtype, device=device)
    if dtype == torch.uint8:
        physical.random_(0, 0x78, generator=generator)
    else:
        physical.normal_(generator=generator)
    per_layer = physical.permute(*[order.index(i) for i in range(5)])  # logical axis order
    return per_layer[layer]


def flash_attn_split(cache: torch.Tensor, head_dim: int, quant: KVQuant | None = None) -> PlainPagedKV:
    """Exactly ``FlashAttentionImpl.forward``'s split (vllm/v1/attention/backends/flash_attn.py); ``quant``:
    an FP8 cache's encoding and per-layer scales."""
    key_cache, value_cache = cache.transpose(1, 2).split(head_dim, dim=-1)
    return PlainPagedKV(key_cache, value_cache, quant)


@contextlib.contextmanager
def splits_of(splits: int | None):
    """Item plans made inside cut every item into ``splits`` runs of blocks (as many as it has blocks, at most;
    None: the planner's own rule). Small test shapes, which the rule on the CPU reads whole, then also get runs
    of a block and several runs merged."""
    saved = step_plan.FORCED_SPLITS
    step_plan.FORCED_SPLITS = splits
    try:
        yield
    finally:
        step_plan.FORCED_SPLITS = saved


def max_element_offset(kv: PlainPagedKV, block_ids: Sequence[int]) -> int:
    """The largest element offset the kernel computes from the K/V base pointers for these blocks."""
    top = max(block_ids)
    worst = 0
    for t in (kv.key_cache, kv.value_cache):
        sb, ss, sh, sd = t.stride()
        worst = max(worst, top * sb + (t.shape[1] - 1) * ss + (t.shape[2] - 1) * sh + (t.shape[3] - 1) * sd)
    return worst


def qkv_query(query: torch.Tensor, num_kv_heads: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """``query [T, Hq, D]`` copied into the q part of a ``[T, (Hq + 2 Hkv) D]`` qkv tensor; returns
    ``qkv[:, :Hq * D].view(T, Hq, D)`` (row stride ``(Hq + 2 Hkv) D``, not contiguous)."""
    t, hq, d = query.shape
    qkv = torch.randn(t, (hq + 2 * num_kv_heads) * d, generator=generator, device=query.device).to(query.dtype)
    qkv[:, : hq * d] = query.reshape(t, hq * d)
    q = qkv[:, : hq * d].view(t, hq, d)
    assert q.stride(0) == (hq + 2 * num_kv_heads) * d and torch.equal(q, query)
    return q


@dataclass
class Group:
    """A Hogwild group in a paged cache: the prompt's full blocks shared by every lane, the rest private."""

    prompt_len: int
    lane_lens: list[int]
    block_tables: list[list[int]]
    keys: list[torch.Tensor]  # per lane [len, Hkv, D] float64: exactly what the cache holds
    values: list[torch.Tensor]

    def rows(self, views: Sequence[View], num_query_tokens: Sequence[int]) -> list[QueryRow]:
        rows, start = [], 0
        for view, n in zip(views, num_query_tokens):
            segments = tuple(Segment(tuple(self.block_tables[s.lane]), s.start, s.end, d)
                             for s, d in zip(view.spans, view.deltas()))
            rows.append(QueryRow(start, n, segments))
            start += n
        return rows

    @property
    def used_blocks(self) -> list[int]:
        return sorted({b for t in self.block_tables for b in t})


def blocks_needed(prompt_len: int, gen_lens: Sequence[int], block_size: int) -> int:
    shared = prompt_len // block_size
    return shared + sum(-(-(prompt_len + n) // block_size) - shared for n in gen_lens)


def build_group(kv: PlainPagedKV, prompt_len: int, gen_lens: Sequence[int], first_block: int,
                generator: torch.Generator) -> Group:
    """Write random K/V of every lane into ``kv`` at shuffled physical blocks from ``first_block`` on (an
    FP8 cache: quantized with its scales; the float64 copies then hold the dequantized values)."""
    bs, heads, d = kv.block_size, kv.num_kv_heads, kv.head_dim
    device, dtype = kv.key_cache.device, kv.key_cache.dtype
    lane_lens = [prompt_len + n for n in gen_lens]
    needed = blocks_needed(prompt_len, gen_lens, bs)
    if first_block + needed > kv.key_cache.shape[0]:
        raise ValueError(f"the cache has {kv.key_cache.shape[0]} blocks, the group needs {first_block + needed}")
    ids = (first_block + torch.randperm(needed, generator=generator, device=generator.device)).tolist()
    shared = prompt_len // bs
    shared_ids, rest = ids[:shared], ids[shared:]
    tables = []
    for n in lane_lens:
        p = -(-n // bs) - shared
        tables.append(shared_ids + rest[:p])
        rest = rest[p:]

    quant = kv.quant

    def stored(x: torch.Tensor, scale: float) -> torch.Tensor:  # what the cache holds for x
        return x.to(dtype) if quant is None else quant.quantize(x, scale)

    def rand(n: int, scale: float) -> torch.Tensor:  # rounded as the cache stores it, kept in float64
        x = stored(torch.randn(n, heads, d, generator=generator, device=generator.device).to(device), scale)
        return (x if quant is None else quant.dequantize(x, scale)).to(torch.float64)

    k_scale, v_scale = (1.0, 1.0) if quant is None else (quant.k_scale, quant.v_scale)
    prompt_k, prompt_v = rand(prompt_len, k_scale), rand(prompt_len, v_scale)
    keys, values = [], []
    for w, n in enumerate(gen_lens):
        k, v = torch.cat([prompt_k, rand(n, k_scale)]), torch.cat([prompt_v, rand(n, v_scale)])
        pos = torch.arange(lane_lens[w], device=device)
        table = torch.tensor(tables[w], dtype=torch.long, device=device)
        blocks, offsets = table[pos // bs], pos % bs
        kv.key_cache[blocks, offsets] = stored(k, k_scale)  # exact: k holds representable values
        kv.value_cache[blocks, offsets] = stored(v, v_scale)
        keys.append(k)
        values.append(v)
    return Group(prompt_len, lane_lens, tables, keys, values)


def grow(kv: PlainPagedKV, group: Group, lanes: Sequence[int], spare: list[int], generator: torch.Generator) -> int:
    """One new token on each of ``lanes`` (random K/V written into ``kv``; a lane that fills its last block takes
    one from ``spare``), as a decode step writes it. Returns the blocks taken."""
    bs, heads, d = kv.block_size, kv.num_kv_heads, kv.head_dim
    device, dtype = kv.key_cache.device, kv.key_cache.dtype
    quant = kv.quant
    taken = 0
    for w in lanes:
        n = group.lane_lens[w]
        if n == len(group.block_tables[w]) * bs:
            group.block_tables[w].append(spare.pop())
            taken += 1
        new = []
        for scale in ((1.0, 1.0) if quant is None else (quant.k_scale, quant.v_scale)):
            x = torch.randn(1, heads, d, generator=generator, device=generator.device).to(device)
            x = x.to(dtype) if quant is None else quant.quantize(x, scale)
            new.append((x, (x if quant is None else quant.dequantize(x, scale)).to(torch.float64)))
        block, offset = group.block_tables[w][n // bs], n % bs
        kv.key_cache[block, offset] = new[0][0][0]
        kv.value_cache[block, offset] = new[1][0][0]
        group.keys[w] = torch.cat([group.keys[w], new[0][1]])
        group.values[w] = torch.cat([group.values[w], new[1][1]])
        group.lane_lens[w] = n + 1
    return taken


def default_inv_freq(rotary_dim: int, theta: float) -> torch.Tensor:
    """Plain RoPE frequencies, from the definition: ``theta ** (-2i / rotary_dim)``, float64."""
    return 1.0 / theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)


def rope_config(num_q_heads: int, num_kv_heads: int, head_dim: int, theta: float,
                partial_rotary: float = 1.0) -> dict:
    """A Llama-like config mapping for :meth:`vllm_hogwild.core.views.rope.RopeSpec.from_hf_config` (no transformers)."""
    params = {"rope_type": "default", "rope_theta": theta}
    if partial_rotary != 1.0:
        params["partial_rotary_factor"] = partial_rotary
    return {"model_type": "llama", "head_dim": head_dim, "hidden_size": num_q_heads * head_dim,
            "num_attention_heads": num_q_heads, "num_key_value_heads": num_kv_heads,
            "max_position_embeddings": 1 << 20, "rope_parameters": params}


def rotate_by(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, neox: bool) -> torch.Tensor:
    """Rotate ``x [T, H, D]`` (float64) by ``positions [T]``: each frequency pair as one complex number."""
    r = 2 * inv_freq.numel()
    x = x.to(torch.float64).clone()
    if neox:
        pairs = torch.complex(x[..., : r // 2], x[..., r // 2 : r])
    else:
        pairs = torch.complex(x[..., 0:r:2], x[..., 1:r:2])
    angle = positions.to(torch.float64)[:, None] * inv_freq.to(x.device)[None, :]
    pairs = pairs * torch.polar(torch.ones_like(angle), angle)[:, None, :]
    if neox:
        x[..., : r // 2], x[..., r // 2 : r] = pairs.real, pairs.imag
    else:
        x[..., 0:r:2], x[..., 1:r:2] = pairs.real, pairs.imag
    return x


def view_oracle(group: Group, view: View, q_stored: torch.Tensor, inv_freq: torch.Tensor, neox: bool,
                scale: float | None = None) -> torch.Tensor:
    """Attention of the view's last ``n`` own tokens (``q_stored [n, Hq, D]``, rotated at their stored
    positions) over the materialized view, float64: keys re-rotated to view positions, the query to
    its view position, causal within the own span."""
    device = q_stored.device
    n, hq, d = q_stored.shape
    k = torch.cat([group.keys[s.lane][s.start : s.end] for s in view.spans])
    v = torch.cat([group.values[s.lane][s.start : s.end] for s in view.spans])
    stored = torch.cat([torch.arange(s.start, s.end, device=device) for s in view.spans])
    view_pos = torch.arange(view.num_tokens, device=device)
    is_own = torch.zeros(view.num_tokens, dtype=torch.bool, device=device)
    is_own[view.num_tokens - view.own.num_tokens :] = True
    q_pos = torch.arange(view.own.end - n, view.own.end, device=device)
    own_start = view.view_starts()[-1]
    q_view = rotate_by(q_stored, own_start + q_pos - view.own.start - q_pos, inv_freq, neox)
    k_view = rotate_by(k, view_pos - stored, inv_freq, neox)
    heads = k.shape[1]
    g = hq // heads
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    scores = torch.einsum("nhgd,lhd->hgnl", q_view.view(n, heads, g, d), k_view) * scale
    visible = ~is_own[None, :] | (stored[None, :] <= q_pos[:, None])  # [n, L]
    scores = scores.masked_fill(~visible[None, None], float("-inf"))
    return torch.einsum("hgnl,lhd->nhgd", scores.softmax(-1), v).reshape(n, hq, d)


def rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.to(torch.float64) - ref).abs().max() / ref.abs().max()).item()
