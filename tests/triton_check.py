"""The Triton segment-attention kernel against the dense float64 oracle and the PyTorch reference path.

    TRITON_INTERPRET=1 python -m tests.triton_check              # CPU, Triton's interpreter (the test suite)
    python -m tests.triton_check --device cuda                   # a GPU (benchmarks/device_check.sh)

Prints one JSON line per case: its shape, the kernel's maximum relative error
against the oracle and against the PyTorch block-bucket path, the tolerance
(1e-5 for float32, 2e-2 for bf16/fp16), the number of (KV block, KV head)
loads the kernel makes and the number of (block, reader) pairs it serves with
them. The last line is ``{"ok": true|false}``; the exit status follows it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import torch

from tests.unit.test_segment_attention import Case, config_of, oracle, rel_err, setup
from vllm_hogwild import segment_attention as sa
from vllm_hogwild.kv_layout import PlainPagedKV
from vllm_hogwild.rope import RopeSpec

# Small shapes (the interpreter runs every program in numpy); every axis the kernel branches on.
CASES = [
    Case(num_workers=1, layout="contiguous"),
    Case(num_workers=2, layout="contiguous"),
    Case(num_workers=4, layout="contiguous", gqa=4, block_size=32),
    Case(num_workers=3, layout="combined", neox=False),
    Case(num_workers=4, layout="combined", partial_rotary=0.5, rope="llama3"),
    Case(num_workers=2, layout="interleaved", gqa=1, rope="yarn"),
    Case(num_workers=2, layout="isolated", head_dim=80, gqa=2),  # D not a power of two
    Case(num_workers=3, layout="combined", max_query_tokens=4, rope="linear"),  # multi-token rows (prefill)
    Case(num_workers=8, layout="contiguous", prompt_len=20, max_gen=6, num_kv_heads=1, gqa=8),
    Case(num_workers=2, layout="combined", prompt_len=64, max_gen=9),  # prompt on a block boundary
]
CASES += [dataclasses.replace(c, dtype=torch.bfloat16, seed=c.seed + 7) for c in CASES[1:6]]
CASES += [dataclasses.replace(CASES[3], dtype=torch.float16, seed=11)]


def check(c: Case, device: str) -> dict:
    c = dataclasses.replace(c, kv_layout="plain")
    group, views, rows, query = setup(c)
    ref = oracle(c, group, views, rows, query)
    spec = RopeSpec.from_hf_config(config_of(c), is_neox_style=c.neox)
    kv = PlainPagedKV(group.kv.key_cache.to(device), group.kv.value_cache.to(device))
    q = query.to(device)
    plan = sa.plan(rows, c.block_size, spec, num_tokens=q.shape[0], device=device, triton=True)
    got = sa.run(plan, q, kv).cpu()
    torch_plan = sa.plan(rows, c.block_size, spec, num_tokens=q.shape[0], device=device, batched_decode=False)
    reference = sa.run(torch_plan, q, kv).cpu()
    rows_out = plan.out_tokens.cpu()
    tol = 1e-5 if c.dtype == torch.float32 else 2e-2
    err = rel_err(got[rows_out], ref)
    loads = sum(len(b.block_ids) for b in plan.buckets) * c.num_kv_heads
    readers = sum(int((b.key_hi > b.key_lo).sum()) for b in plan.buckets)
    return {
        "workers": c.num_workers, "layout": c.layout, "dtype": str(c.dtype).removeprefix("torch."),
        "head_dim": c.head_dim, "gqa": c.gqa, "block_size": c.block_size, "neox": c.neox,
        "rotary": c.partial_rotary, "rope": c.rope, "query_tokens": c.max_query_tokens,
        "rel_err_oracle": err,
        "rel_err_torch": ((got[rows_out].double() - reference[rows_out].double()).abs().max()
                          / reference[rows_out].double().abs().max()).item(),
        "tolerance": tol, "block_loads": loads, "block_readers": readers * c.num_kv_heads,
        "ok": err <= tol,
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    ok = True
    for c in CASES:
        result = check(c, args.device)
        ok &= result["ok"]
        print(json.dumps(result), flush=True)
    print(json.dumps({"ok": ok}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
