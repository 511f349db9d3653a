"""Probe how vLLM's CPU attention kernels store K inside a cache block.

The CPU backend's cache is ``[num_blocks, kv_heads, block_size, 2 * head_dim]``
with the K block first and the V block second per ``[block, kv_head]``; the K
block is plain ``[block_size, head_dim]`` or transposed ``[head_dim,
block_size]`` depending on the kernel ISA. Instead of assuming, the probe writes
known keys through vLLM's own cache-writing op on a scratch cache and looks
where they landed. An unknown layout is refused loudly: reading K/V wrong
would silently produce garbage attention. One is known and refused: on a CPU
with AMX, vLLM 0.32 stores a bfloat16 cache of block size a multiple of 32
packed for AMX tiles (ISA ``amx``: K in VNNI pairs of 16-token tiles, V in
pairs of tokens), which Hogwild's readers do not read yet. An FP8 cache
(``kv_cache_dtype`` fp8, fp8_e4m3, fp8_e5m2) is probed the same way, through the
same op writing bytes: values it stores exactly, read back decoded.
"""

from __future__ import annotations

import functools

import torch


class UnknownCacheLayout(RuntimeError):
    pass


def _refusal(isa: str, dtype: torch.dtype, block_size: int, what: str) -> UnknownCacheLayout:
    return UnknownCacheLayout(
        f"dtype {str(dtype).removeprefix('torch.')}, block_size {block_size}: vLLM's CPU attention (ISA {isa!r}) "
        f"{what}; Hogwild reads K/V blocks stored [block_size, head_dim] (K also transposed) only. Use "
        f"--dtype float32{', or a block size that is not a multiple of 32' if isa == 'amx' else ''}.")


@functools.lru_cache(maxsize=None)
def probe_k_transposed(isa: str, dtype: torch.dtype, block_size: int, head_dim: int,
                       kv_cache_dtype: str = "auto") -> bool:
    """True when ``isa`` stores K transposed; raises :class:`UnknownCacheLayout` otherwise unknown."""
    try:  # vLLM 0.34 moved the CPU ops out of _custom_ops
        from vllm import _cpu_ops as ops
    except ImportError:
        from vllm import _custom_ops as ops

    from vllm_hogwild.attention.kv_layout import KVQuant

    quant = KVQuant.of(kv_cache_dtype)
    heads, num_blocks = 2, 3
    cache = torch.zeros(num_blocks, heads, block_size, 2 * head_dim, dtype=dtype if quant is None else torch.uint8)
    key_cache, value_cache = cache.view(num_blocks, heads, 2 * block_size, head_dim).chunk(2, dim=2)
    slots = torch.tensor([block_size + 1, 2 * block_size + block_size - 1, 0])
    n = len(slots)
    if quant is None:  # small distinct integers: exact in every cache dtype
        key = (torch.arange(n * heads * head_dim) % 199 + 1).view(n, heads, head_dim).to(dtype)
    else:  # integers 1-8, exact in both FP8 encodings, in a fixed random order (a misread does not match)
        key = torch.randint(1, 9, (n, heads, head_dim), generator=torch.Generator().manual_seed(0)).to(dtype)
    value = -key
    ops.cpu_attn_reshape_and_cache(key, value, key_cache, value_cache, slots, isa,
                                   kv_cache_dtype="auto" if quant is None else kv_cache_dtype)

    def read(x: torch.Tensor) -> torch.Tensor:
        return x if quant is None else quant.dequantize(x, 1.0).to(dtype)

    found = set()
    for t, slot in enumerate(slots.tolist()):
        b, o = divmod(slot, block_size)
        k_block = read(key_cache[b].reshape(heads, -1))
        v_block = read(value_cache[b].reshape(heads, -1)).view(heads, block_size, head_dim)
        if not torch.equal(v_block[:, o], value[t]):
            raise _refusal(isa, dtype, block_size, "does not store V [block_size, head_dim]")
        plain = torch.equal(k_block.view(heads, block_size, head_dim)[:, o], key[t])
        transposed = torch.equal(k_block.view(heads, head_dim, block_size)[:, :, o], key[t])
        if plain == transposed:
            raise _refusal(isa, dtype, block_size, "stores K in a layout of its own")
        found.add(transposed)
    if len(found) != 1:
        raise _refusal(isa, dtype, block_size, "stores K in no consistent layout")
    return found.pop()
