"""FP8 KV caches (vLLM's ``kv_cache_dtype`` fp8 / fp8_e4m3 / fp8_e5m2) read by every attention path.

Synthetic caches of bytes, each ``float8(x / scale)`` as vLLM's writers store them (where vLLM's CPU
cache op runs, its own bytes are read back too: its layout, encoding and scales), against the dense float64
oracle fed the values the cache holds: the dequantized bytes times the layer's scales. The paths
read in float32 what the oracle reads in float64, so the bound is float32's (1e-5 relative); the
control reads the same bytes with the scales ignored and must miss. The Triton kernel runs under
Triton's interpreter in a subprocess.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.unit.test_segment_attention import Case, oracle, ours, paths_for, rel_err, setup
from tools.synthetic import KV_LAYOUTS
from vllm_hogwild.attention.kv_layout import FP8_DTYPES, KVQuant

ROOT = Path(__file__).parents[2]
ENCODINGS = ("fp8_e4m3", "fp8_e5m2")
BOUND = 1e-5  # float32 arithmetic on exactly the values the oracle reads
K_SCALE, V_SCALE = 0.37, 1.9  # per-layer scales unlike 1, so that a path that drops one misses


def fp8_case(encoding: str, kv_layout: str, **kw) -> Case:
    return Case(num_workers=3, layout="combined", kv_layout=kv_layout, block_size=16, prompt_len=37, max_gen=20,
                quant=KVQuant.of(encoding, K_SCALE, V_SCALE), **kw)


@pytest.mark.parametrize("kv_layout", KV_LAYOUTS)
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_every_path_reads_an_fp8_cache_as_the_oracle_does(encoding: str, kv_layout: str) -> None:
    c = fp8_case(encoding, kv_layout)
    group, views, rows, query = setup(c)
    assert group.kv.quant.fp8 == FP8_DTYPES[encoding]
    cache = group.kv.cache if kv_layout != "plain" else group.kv.key_cache
    assert cache.dtype == torch.uint8
    ref = oracle(c, group, views, rows, query)
    paths = paths_for(c, rows)
    assert any(p.startswith("compiled") for p in paths) == (kv_layout != "plain")
    for path in paths:
        assert rel_err(ours(c, group, rows, query, path), ref) <= BOUND, (encoding, kv_layout, path)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_the_scales_matter_a_path_that_ignores_them_misses(encoding: str) -> None:
    """Control: the same bytes read with both scales 1 (what a reader that skips them computes)."""
    c = fp8_case(encoding, "cpu_k_transposed")
    group, views, rows, query = setup(c)
    ref = oracle(c, group, views, rows, query)
    unscaled = dataclasses.replace(group, kv=dataclasses.replace(group.kv, quant=KVQuant.of(encoding)))
    for path in paths_for(c, rows):
        assert rel_err(ours(c, unscaled, rows, query, path), ref) > 100 * BOUND, path


def test_multi_token_rows_gqa_and_wide_tiles_read_fp8_too() -> None:
    """Rows of several tokens, 1-4 query heads per KV head, and 32-token blocks (the op's AVX-512 tiles; 16-token
    blocks take its AVX2 tiles)."""
    for gqa, tokens, bs, encoding in ((1, 3, 16, "fp8_e4m3"), (4, 2, 16, "fp8_e5m2"), (2, 1, 32, "fp8_e4m3"),
                                      (3, 1, 32, "fp8_e5m2")):
        c = dataclasses.replace(fp8_case(encoding, "cpu_k_transposed", gqa=gqa, max_query_tokens=tokens,
                                         head_dim=32 if bs == 16 else 64), block_size=bs)
        group, views, rows, query = setup(c)
        ref = oracle(c, group, views, rows, query)
        for path in paths_for(c, rows):
            assert rel_err(ours(c, group, rows, query, path), ref) <= BOUND, (gqa, tokens, bs, path)


def test_the_bytes_are_vllms_own_fp8_encoding() -> None:
    """What vLLM's CPU cache op writes for an FP8 cache (where it runs: x86 with AVX-512) is what the readers
    decode: the float8 encoding of the value over the scale, K transposed and V plain in each block."""
    pytest.importorskip("vllm")
    if not torch.cpu._is_avx512_supported():
        pytest.skip("vLLM 0.32 writes an FP8 CPU cache only on x86 with AVX-512 or AMX; this CPU has neither")
    from vllm import _custom_ops as ops

    from vllm_hogwild.attention.kv_layout import CpuPagedKV

    bs, d, heads, blocks = 32, 64, 2, 3
    for encoding in ENCODINGS:
        quant = KVQuant.of(encoding, K_SCALE, V_SCALE)
        cache = torch.zeros(blocks, heads, bs, 2 * d, dtype=torch.uint8)
        key_cache, value_cache = cache.view(blocks, heads, 2 * bs, d).chunk(2, dim=2)
        slots = torch.tensor([bs + 1, 2 * bs + bs - 1, 0])
        key, value = torch.randn(3, heads, d), torch.randn(3, heads, d)
        ops.cpu_attn_reshape_and_cache(key, value, key_cache, value_cache, slots, "vec", k_scale=K_SCALE,
                                       v_scale=V_SCALE, kv_cache_dtype=encoding)
        k_t, v = CpuPagedKV(cache, True, quant).gather(torch.tensor([1, 2, 0]))
        # One step of the encoding (vLLM's CPU writer truncates the mantissa; torch rounds to nearest):
        # 3 mantissa bits for e4m3, 2 for e5m2; plus the subnormal step near 0.
        step = 2.0 ** -(3 if encoding == "fp8_e4m3" else 2)
        for t, (b, o) in enumerate(((0, 1), (1, bs - 1), (2, 0))):
            assert torch.allclose(k_t[b, :, :, o], key[t], rtol=step, atol=1e-2 * K_SCALE), (encoding, t)
            assert torch.allclose(v[b, :, o], value[t], rtol=step, atol=1e-2 * V_SCALE), (encoding, t)
        control = CpuPagedKV(cache, False, quant).gather(torch.tensor([1]))[0]  # K read untransposed: wrong
        assert not torch.allclose(control[0, :, :, 1], key[0], rtol=step, atol=1e-2 * K_SCALE)


def test_kv_cache_dtypes_hogwild_does_not_read_are_named() -> None:
    assert KVQuant.of("auto") is None
    with pytest.raises(ValueError, match="kv_cache_dtype 'fp8_ds_mla'"):
        KVQuant.of("fp8_ds_mla")


def triton_errors() -> dict[str, float]:
    """Run in the subprocess: the Triton path's relative error per encoding and cache layout (and the
    control's, scales ignored)."""
    from tests.unit import test_segment_attention as tsa
    from vllm_hogwild.attention import segment_attention as sa
    from vllm_hogwild.core.views.rope import RopeSpec

    out = {}
    for encoding in ENCODINGS:
        for kv_layout in KV_LAYOUTS:
            c = fp8_case(encoding, kv_layout)
            group, views, rows, query = setup(c)
            ref = oracle(c, group, views, rows, query)
            spec = RopeSpec.from_hf_config(tsa.config_of(c), is_neox_style=c.neox)
            plan = sa.plan(rows, c.block_size, spec, sa.PlanMode.TRITON, num_tokens=query.shape[0])
            out[f"{encoding}/{kv_layout}"] = rel_err(sa.run(plan, query, group.kv), ref)
            if kv_layout == "plain":
                unscaled = dataclasses.replace(group.kv, quant=KVQuant.of(encoding))
                out[f"{encoding}/control"] = rel_err(sa.run(plan, query, unscaled), ref)
    return out


def test_the_triton_kernel_reads_an_fp8_cache_in_place() -> None:
    code = "import json; from tests.unit.test_fp8_cache import triton_errors; print(json.dumps(triton_errors()))"
    # A hang guard: under 50 s on 2 cores in a whole suite's run; 600 s is 12 times that.
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "TRITON_INTERPRET": "1"})
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    errors = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(errors) == len(ENCODINGS) * (len(KV_LAYOUTS) + 1)
    for name, err in errors.items():
        assert (err > 100 * BOUND) if name.endswith("control") else (err <= BOUND), (name, err)
