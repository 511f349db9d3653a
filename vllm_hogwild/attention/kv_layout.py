"""Read access to vLLM's paged KV caches, whole blocks at a time.

Two layouts are read (never written, never changed):

- :class:`CpuPagedKV`: vLLM's CPU backend cache ``[num_blocks, kv_heads,
  block_size, 2 * head_dim]``; per ``[block, kv_head]`` the first
  ``block_size * head_dim`` elements are the K block and the next as many the
  V block. V is ``[block_size, head_dim]``; K is ``[block_size, head_dim]`` or,
  on the kernels that want it (seen on AVX2 and AVX-512 "vec" builds),
  transposed ``[head_dim, block_size]``. Which one is probed at start-up
  (:mod:`vllm_hogwild.runner.cpu_layout`), not assumed.
- :class:`PlainPagedKV`: separate K and V caches ``[num_blocks, block_size,
  kv_heads, head_dim]`` (any strides), what the GPU backends use.

Both hand out blocks as ``k_t [U, kv_heads, head_dim, block_size]`` (keys
transposed, ready for ``q @ k_t``) and ``v [U, kv_heads, block_size, head_dim]``,
and describe themselves to kernels as :class:`StridedKV`: a K and a V tensor
each addressed by element strides over (block, slot, KV head, dim), so one
kernel reads every layout in place.

**FP8 caches** (vLLM's ``kv_cache_dtype`` ``fp8``, ``fp8_e4m3``, ``fp8_e5m2``):
the cache holds bytes (``torch.uint8``) in the same layouts, each the float8
encoding (:data:`FP8_DTYPES`) of the value divided by its layer's scale, as
vLLM's writers store them. :class:`KVQuant` says which encoding and the two
scales (vLLM's per-layer ``k_scale`` / ``v_scale``); the readers dequantize on
load: ``gather`` hands out ``float8 -> float32`` times the scale, and the
kernels read the bytes in place (a float8 element widens exactly to float32,
bfloat16 or float16; the scales are applied to the scores and the output).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FP8_DTYPES = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
FP8_CODES = {torch.float8_e4m3fn: 1, torch.float8_e5m2: 2}  # the kernels' encoding numbers (0: not FP8)


@dataclass(frozen=True)
class KVQuant:
    """An FP8 cache's encoding and per-layer scales: a stored byte is ``float8(x / scale)``."""

    fp8: torch.dtype  # torch.float8_e4m3fn or torch.float8_e5m2
    k_scale: float = 1.0
    v_scale: float = 1.0

    @classmethod
    def of(cls, kv_cache_dtype: str, k_scale: float = 1.0, v_scale: float = 1.0) -> "KVQuant | None":
        """The quantization of vLLM's ``kv_cache_dtype`` (None: ``auto``, an unquantized cache); a
        ``ValueError`` naming it for any other."""
        if kv_cache_dtype in (None, "auto"):
            return None
        if kv_cache_dtype not in FP8_DTYPES:
            raise ValueError(f"kv_cache_dtype {kv_cache_dtype!r}: Hogwild reads 'auto' and {sorted(FP8_DTYPES)}")
        return cls(FP8_DTYPES[kv_cache_dtype], float(k_scale), float(v_scale))

    @property
    def code(self) -> int:
        return FP8_CODES[self.fp8]

    def dequantize(self, stored: torch.Tensor, scale: float) -> torch.Tensor:
        """Bytes of this encoding -> float32 values."""
        return stored.view(self.fp8).to(torch.float32) * scale

    def quantize(self, x: torch.Tensor, scale: float) -> torch.Tensor:
        """float values -> bytes of this encoding (rounded to nearest; vLLM's CPU writer truncates the
        mantissa instead: the readers decode either the same way)."""
        return (x.to(torch.float32) / scale).to(self.fp8).view(torch.uint8)


@dataclass(frozen=True)
class StridedKV:
    """K and V of a paged cache for a kernel: ``key[b, s, h, d]`` is at element
    ``b * key_strides[0] + s * key_strides[1] + h * key_strides[2] + d * key_strides[3]``
    from ``key.data_ptr()`` (the same for V). Nothing is copied."""

    key: torch.Tensor
    key_strides: tuple[int, int, int, int]
    value: torch.Tensor
    value_strides: tuple[int, int, int, int]
    block_size: int
    num_kv_heads: int
    head_dim: int
    quant: KVQuant | None = None  # an FP8 cache: the bytes' encoding and the scales


@dataclass(frozen=True)
class CpuPagedKV:
    cache: torch.Tensor  # [num_blocks, kv_heads, block_size, 2 * head_dim]
    k_transposed: bool
    quant: KVQuant | None = None  # an FP8 cache (uint8 elements): its encoding and scales

    @property
    def block_size(self) -> int:
        return self.cache.shape[2]

    @property
    def num_kv_heads(self) -> int:
        return self.cache.shape[1]

    @property
    def head_dim(self) -> int:
        return self.cache.shape[3] // 2

    def gather(self, block_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """block_ids: ``[U]`` -> ``k_t [U, H, D, bs]``, ``v [U, H, bs, D]`` (one copy of each block)."""
        num_blocks, heads, bs, two_d = self.cache.shape
        d = two_d // 2
        blocks = self.cache.view(num_blocks, heads, 2, bs * d).index_select(0, block_ids)
        u = blocks.shape[0]
        k, v = blocks[:, :, 0], blocks[:, :, 1]  # [U, H, bs * D] each
        if self.quant is not None:
            k, v = self.quant.dequantize(k, self.quant.k_scale), self.quant.dequantize(v, self.quant.v_scale)
        if self.k_transposed:
            k_t = k.view(u, heads, d, bs)
        else:
            k_t = k.view(u, heads, bs, d).transpose(-1, -2)
        return k_t, v.view(u, heads, bs, d)

    def strided(self) -> StridedKV:
        """K: the first ``block_size * head_dim`` elements of each (block, head), transposed or not;
        V: the next as many, ``[block_size, head_dim]``."""
        num_blocks, heads, bs, two_d = self.cache.shape
        d = two_d // 2
        if self.cache.stride(3) != 1 or self.cache.stride(2) != two_d:
            raise ValueError("the CPU cache must be contiguous within each (block, head)")
        halves = self.cache.view(num_blocks, heads, 2, bs * d)
        sb, sh = self.cache.stride(0), self.cache.stride(1)
        k_strides = (sb, 1, sh, bs) if self.k_transposed else (sb, d, sh, 1)
        return StridedKV(halves[:, :, 0], k_strides, halves[:, :, 1], (sb, d, sh, 1), bs, heads, d, self.quant)


@dataclass(frozen=True)
class PlainPagedKV:
    key_cache: torch.Tensor  # [num_blocks, block_size, kv_heads, head_dim]
    value_cache: torch.Tensor  # [num_blocks, block_size, kv_heads, head_dim]
    quant: KVQuant | None = None  # an FP8 cache (uint8 elements): its encoding and scales

    @property
    def block_size(self) -> int:
        return self.key_cache.shape[1]

    @property
    def num_kv_heads(self) -> int:
        return self.key_cache.shape[2]

    @property
    def head_dim(self) -> int:
        return self.key_cache.shape[3]

    def gather(self, block_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """block_ids: ``[U]`` -> ``k_t [U, H, D, bs]``, ``v [U, H, bs, D]``."""
        k = self.key_cache.index_select(0, block_ids)  # [U, bs, H, D]
        v = self.value_cache.index_select(0, block_ids)
        if self.quant is not None:
            k, v = self.quant.dequantize(k, self.quant.k_scale), self.quant.dequantize(v, self.quant.v_scale)
        return k.permute(0, 2, 3, 1), v.permute(0, 2, 1, 3)

    def strided(self) -> StridedKV:
        k, v = self.key_cache, self.value_cache
        return StridedKV(k, tuple(k.stride()), v, tuple(v.stride()), self.block_size, self.num_kv_heads,
                         self.head_dim, self.quant)


PagedKV = CpuPagedKV | PlainPagedKV


def write_tokens(kv: PagedKV, slots: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
    """Store ``key``/``value`` ``[T, H, D]`` at flat slots ``[T]`` (block * block_size + offset).

    For tests and benchmarks that build caches without vLLM; vLLM's own
    writers fill the caches in production.
    """
    bs = kv.block_size
    blocks, offsets = slots // bs, slots % bs
    if kv.quant is not None:  # stored as vLLM's writers store an FP8 cache
        key, value = kv.quant.quantize(key, kv.quant.k_scale), kv.quant.quantize(value, kv.quant.v_scale)
    if isinstance(kv, PlainPagedKV):
        kv.key_cache[blocks, offsets] = key.to(kv.key_cache.dtype)
        kv.value_cache[blocks, offsets] = value.to(kv.value_cache.dtype)
        return
    num_blocks, heads, _, two_d = kv.cache.shape
    d = two_d // 2
    halves = kv.cache.view(num_blocks, heads, 2, bs * d)
    k_part = halves[:, :, 0].view(num_blocks, heads, *((d, bs) if kv.k_transposed else (bs, d)))
    v_part = halves[:, :, 1].view(num_blocks, heads, bs, d)
    if kv.k_transposed:  # advanced indices apart: the indexed result is [T, H, D]
        k_part[blocks, :, :, offsets] = key.to(kv.cache.dtype)
    else:
        k_part[blocks, :, offsets, :] = key.to(kv.cache.dtype)
    v_part[blocks, :, offsets, :] = value.to(kv.cache.dtype)
