"""A Hogwild group with random K/V in a paged cache, for tests and benchmarks.

Lanes share the prompt the way vLLM's prefix caching shares it: the prompt's
full blocks are the same physical blocks in every lane, the partial tail block
and everything after it are private. Physical block ids are shuffled and
spare blocks hold noise, so reading a wrong block shows. With ``quant`` the
cache is an FP8 one (bytes, each ``float8(x / scale)``, as vLLM stores it) and
the group's keys and values are what it holds, dequantized.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from vllm_hogwild.attention.kv_layout import CpuPagedKV, KVQuant, PagedKV, PlainPagedKV, write_tokens
from vllm_hogwild.attention.segment_attention import QueryRow, Segment
from vllm_hogwild.core.views.spans import View

KV_LAYOUTS = ("cpu_k_transposed", "cpu", "plain")


@dataclass
class SyntheticGroup:
    prompt_len: int
    lane_lens: list[int]
    block_tables: list[list[int]]  # per lane, physical block ids from position 0
    keys: list[torch.Tensor]  # per lane [lane_len, Hkv, D] float64: exactly what the cache holds
    values: list[torch.Tensor]
    kv: PagedKV

    @classmethod
    def build(
        cls,
        prompt_len: int,
        gen_lens: Sequence[int],
        num_kv_heads: int,
        head_dim: int,
        block_size: int,
        kv_layout: str = "plain",
        dtype: torch.dtype = torch.float32,
        spare_blocks: int = 3,
        seed: int = 0,
        quant: KVQuant | None = None,
    ) -> "SyntheticGroup":
        gen = torch.Generator().manual_seed(seed)
        lane_lens = [prompt_len + n for n in gen_lens]
        shared = prompt_len // block_size  # full prompt blocks, shared by every lane
        private = [-(-n // block_size) - shared for n in lane_lens]
        num_blocks = shared + sum(private) + spare_blocks
        ids = torch.randperm(num_blocks, generator=gen).tolist()
        shared_ids, rest = ids[:shared], ids[shared:]
        tables = []
        for p in private:
            tables.append(shared_ids + rest[:p])
            rest = rest[p:]
        kv = _empty_cache(kv_layout, num_blocks, block_size, num_kv_heads, head_dim, dtype, gen, quant)

        def rand(n: int, scale: float = 1.0) -> torch.Tensor:  # what the cache holds, kept in float64
            x = torch.randn(n, num_kv_heads, head_dim, generator=gen)
            if quant is not None:  # scaled like the layer's values, stored as FP8 bytes
                return quant.dequantize(quant.quantize(x * scale, scale), scale).to(torch.float64)
            return x.to(dtype).to(torch.float64)

        k_scale, v_scale = (1.0, 1.0) if quant is None else (quant.k_scale, quant.v_scale)
        prompt_k, prompt_v = rand(prompt_len, k_scale), rand(prompt_len, v_scale)
        keys, values = [], []
        for w, n in enumerate(gen_lens):
            k = torch.cat([prompt_k, rand(n, k_scale)])
            v = torch.cat([prompt_v, rand(n, v_scale)])
            pos = torch.arange(lane_lens[w])
            table = torch.tensor(tables[w], dtype=torch.long)
            write_tokens(kv, table[pos // block_size] * block_size + pos % block_size, k, v)
            keys.append(k)
            values.append(v)
        return cls(prompt_len, lane_lens, tables, keys, values, kv)

    def rows(self, views: Sequence[View], num_query_tokens: Sequence[int]) -> list[QueryRow]:
        """One row per view; worker w's queries are the last ``num_query_tokens[w]`` tokens of its view."""
        rows, start = [], 0
        for view, n in zip(views, num_query_tokens):
            segments = tuple(
                Segment(tuple(self.block_tables[s.lane]), s.start, s.end, d)
                for s, d in zip(view.spans, view.deltas())
            )
            rows.append(QueryRow(start, n, segments))
            start += n
        return rows


def _empty_cache(kv_layout, num_blocks, bs, heads, d, dtype, gen, quant: KVQuant | None = None) -> PagedKV:
    def noise(*shape):  # finite values of the cache's type (FP8: the bytes of float8 values)
        x = torch.randn(*shape, generator=gen)
        return x.to(dtype) if quant is None else quant.quantize(x, 1.0)

    if kv_layout == "plain":
        return PlainPagedKV(noise(num_blocks, bs, heads, d), noise(num_blocks, bs, heads, d), quant)
    if kv_layout in ("cpu", "cpu_k_transposed"):
        return CpuPagedKV(noise(num_blocks, heads, bs, 2 * d), kv_layout == "cpu_k_transposed", quant)
    raise ValueError(f"kv_layout: unknown {kv_layout!r}; expected one of {KV_LAYOUTS}")
