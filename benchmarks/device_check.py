"""GPU check of segment attention: the PyTorch paths and the Triton kernel on CUDA against the dense oracle.

    python benchmarks/device_check.py        # on a machine with a CUDA GPU, torch and triton

Runs the oracle cases of tests/unit/test_segment_attention.py with the plain
GPU cache layout ([num_blocks, block_size, kv_heads, head_dim]) on the GPU
(both PyTorch paths; float32 and bf16), the Triton kernel's cases of
tests/triton_check.py, then times one decode layer at N=2/4/8 and view
lengths 1k-8k: the Triton kernel against the PyTorch block-bucket path and
against dense attention over N materialized copies of the views (what N
independent sequences would read). Prints one line per case and a final
PASS/FAIL.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.unit.test_segment_attention import GRID, ROPES, Case, config_of, oracle, rel_err, setup  # noqa: E402
from vllm_hogwild import segment_attention as sa  # noqa: E402
from vllm_hogwild.kv_layout import PlainPagedKV  # noqa: E402
from vllm_hogwild.rope import RopeSpec  # noqa: E402


def on_gpu(kv: PlainPagedKV) -> PlainPagedKV:
    return PlainPagedKV(kv.key_cache.cuda(), kv.value_cache.cuda())


def check(c: Case) -> float:
    group, views, rows, query = setup(c)
    ref = oracle(c, group, views, rows, query)
    spec = RopeSpec.from_hf_config(config_of(c), is_neox_style=c.neox)
    errs = []
    for batched in (True, False):
        plan = sa.plan(rows, c.block_size, spec, num_tokens=query.shape[0], device="cuda", batched_decode=batched)
        out = sa.run(plan, query.cuda(), on_gpu(group.kv))
        errs.append(rel_err(out.cpu(), ref))
    return max(errs)


def _time(fn, reps: int = 20) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps * 1e3


def main() -> int:
    assert torch.cuda.is_available(), "no CUDA device"
    ok = True
    cases = [Case(num_workers=n, layout=layout, kv_layout="plain", seed=i, rope=list(ROPES)[i % 4])
             for i, (n, layout, _) in enumerate(GRID[::3])]
    cases += [dataclasses.replace(c, dtype=torch.bfloat16) for c in cases[:5]]
    for c in cases:
        err = check(c)
        tol = 1e-5 if c.dtype == torch.float32 else 1e-2
        ok &= err <= tol
        print(f"N={c.num_workers} {c.layout:10s} {str(c.dtype):15s} rel err {err:.2e} {'ok' if err <= tol else 'FAIL'}")
    from tests.triton_check import CASES as TRITON_CASES
    from tests.triton_check import check as triton_check

    for c in TRITON_CASES:
        result = triton_check(c, "cuda")
        ok &= result["ok"]
        print(f"triton N={result['workers']} {result['layout']:10s} {result['dtype']:9s} "
              f"rel err {result['rel_err_oracle']:.2e} {'ok' if result['ok'] else 'FAIL'}")
    for n in (2, 4, 8):
        for length in (1024, 2048, 4096, 8192):
            c = Case(num_workers=n, kv_layout="plain", prompt_len=length // 2, max_gen=length // (2 * n),
                     block_size=16, head_dim=128, num_kv_heads=8, gqa=4, dtype=torch.bfloat16)
            group, views, rows, query = setup(dataclasses.replace(c, max_query_tokens=1))
            spec = RopeSpec.from_hf_config(config_of(c))
            kv, q = on_gpu(group.kv), query.cuda()
            timings = {}
            for name, kw in (("triton", dict(triton=True)), ("torch", dict(batched_decode=False))):
                plan = sa.plan(rows, c.block_size, spec, num_tokens=query.shape[0], device="cuda", **kw)
                timings[name] = _time(lambda: sa.run(plan, q, kv))
            dense_k = torch.randn(n, c.num_kv_heads * c.gqa, length, c.head_dim, dtype=q.dtype, device="cuda")
            dense_q = torch.randn(n, c.num_kv_heads * c.gqa, 1, c.head_dim, dtype=q.dtype, device="cuda")
            timings["dense"] = _time(lambda: torch.nn.functional.scaled_dot_product_attention(
                dense_q, dense_k, dense_k))
            print(f"N={n} view~{length} bf16: triton {timings['triton']:.3f} ms/layer, torch buckets "
                  f"{timings['torch']:.3f} ({timings['torch'] / timings['triton']:.1f}x), dense SDPA over N "
                  f"copies {timings['dense']:.3f} ({timings['dense'] / timings['triton']:.2f}x)")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
