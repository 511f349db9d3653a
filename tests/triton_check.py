"""The Triton segment-attention kernel against the dense float64 oracle and the PyTorch reference path.

    TRITON_INTERPRET=1 python -m tests.triton_check              # CPU, Triton's interpreter (the test suite)
    python -m tests.triton_check --device cuda                   # a GPU with the test requirements

Prints one JSON line per case: its shape, the cache layout the kernel read in
place, the kernel's maximum relative error against the oracle and against the
PyTorch block-bucket path, the tolerance (1e-5 for float32, 2e-2 for
bf16/fp16), the number of (KV block, KV head) loads the kernel makes and the
number of (block, reader) pairs it serves with them, and for the layout cases
whether every output element outside the planned rows kept its sentinel.
Every case also runs on the same plan buffers after a different step (a
planner that planned another case first), as a step after another does.

Cache layouts: separate K and V caches (``plain``); vLLM's CPU cache with K
transposed and with K plain (``cpu_k_transposed``, ``cpu``); and vLLM 0.32's
FlashAttention cache (``fa:<layout>``), one ``[num_blocks, kv_heads,
block_size, 2 * head_dim]`` tensor in each physical layout vLLM can allocate
for it, split into K and V exactly as the backend does
(:mod:`benchmarks.device_cases`). The layout cases read a query that is a
strided slice of a qkv tensor and write into a slice of a wider output filled
with a sentinel, with query rows outside the plan.

Splits: the kernel cuts every item into runs of blocks, one work unit each. Every
other plain case and every layout case runs with 2 splits forced (``"split_blocks"``:
the longest run of the plan), and a prompt of 101 tokens and lanes of up to 45 where
the case keeps the default lengths: the running softmax across a run's blocks, split
boundaries inside an item, and masks on a run's first and last blocks; the other cases
with 32 splits forced (runs of one block, many partials merged a pair).

Then one ``{"specialization": ...}`` line: steps with different counts of rows,
pairs, items and splits (none of them a kernel argument: the kernels read them from
the plan's buffers) and two lane tables of different row strides give the kernels
one specialization key each, computed with Triton's own binder from the arguments
of every launch (the interpreter keeps no compile cache; on a GPU the compile cache
itself is counted too), while without ``do_not_specialize`` the lane table's stride
would have needed a second compile. The last line is ``{"ok": true|false}``; the
exit status follows it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import torch

from benchmarks.device_cases import FA_LAYOUTS, flash_attn_cache, flash_attn_split, qkv_query, splits_of
from tests.unit.test_segment_attention import Case, config_of, oracle, rel_err, setup
from vllm_hogwild.attention import segment_attention as sa
from vllm_hogwild.attention import triton_attention as ta
from vllm_hogwild.attention.kv_layout import PlainPagedKV
from vllm_hogwild.attention.step_plan import StepPlanner
from vllm_hogwild.core.views.rope import RopeSpec

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
CASES = [(c, "plain") for c in CASES]

# Every cache layout read in place; strided query and sentinel output in all of them.
BF16 = torch.bfloat16
LAYOUT_CASES = [
    (Case(num_workers=3, layout="combined", seed=21), "cpu_k_transposed"),
    (Case(num_workers=4, layout="contiguous", dtype=BF16, neox=False, seed=22), "cpu_k_transposed"),
    (Case(num_workers=3, layout="combined", seed=23), "cpu"),
    (Case(num_workers=2, layout="contiguous", dtype=BF16, partial_rotary=0.5, seed=24), "cpu"),
    (Case(num_workers=4, layout="contiguous", num_kv_heads=2, gqa=4, seed=25), "fa:LBNHC"),
    (Case(num_workers=3, layout="combined", dtype=BF16, num_kv_heads=2, gqa=7, seed=26), "fa:LBNHC"),  # GQA 7
    (Case(num_workers=2, layout="combined", max_query_tokens=4, seed=27), "fa:LBHNC"),  # prefill rows
    (Case(num_workers=4, layout="interleaved", dtype=BF16, seed=28), "fa:LHBNC"),
    (Case(num_workers=2, layout="contiguous", head_dim=80, gqa=2, seed=29), "fa:BLHNC"),
    (Case(num_workers=3, layout="combined", dtype=torch.float16, neox=False, seed=30), "fa:BLNHC"),
    (Case(num_workers=8, layout="contiguous", prompt_len=20, max_gen=6, num_kv_heads=1, gqa=8, seed=31),
     "fa:BHLNC"),
]
assert {cache.removeprefix("fa:") for _, cache in LAYOUT_CASES} >= set(FA_LAYOUTS)

SENTINEL = 7.0
EXTRA_ROWS = 3  # query rows outside the plan


def cache_for(c: Case, cache: str, device: str):
    """The case's group with its K/V in the cache layout ``cache`` on ``device``."""
    kv_layout = cache if cache in ("cpu", "cpu_k_transposed") else "plain"
    group, views, rows, query = setup(dataclasses.replace(c, kv_layout=kv_layout))
    if cache in ("cpu", "cpu_k_transposed"):
        kv = dataclasses.replace(group.kv, cache=group.kv.cache.to(device))
    elif cache == "plain":
        kv = PlainPagedKV(group.kv.key_cache.to(device), group.kv.value_cache.to(device))
    else:
        k, v = group.kv.key_cache, group.kv.value_cache  # [B, N, H, D]
        gen = torch.Generator(device=device).manual_seed(c.seed)
        fa = flash_attn_cache(cache.removeprefix("fa:"), k.shape[0], c.num_kv_heads, c.block_size,
                              c.head_dim, c.dtype, device, generator=gen)
        fa[..., : c.head_dim] = k.transpose(1, 2).to(device)
        fa[..., c.head_dim :] = v.transpose(1, 2).to(device)
        kv = flash_attn_split(fa, c.head_dim)
    return group, views, rows, query, kv


def item_reads(plan, num_kv_heads: int) -> tuple[int, int]:
    """(KV block, KV head) loads of the kernel for the plan (every block of every item, once), and the (block,
    reader) pairs they serve (every block each pair reads)."""
    it = plan.items
    ints = {k: v[: {"item": it.num_items, "pair": it.num_pairs}[k.split("_")[0]]].long()
            for k, v in it.ints.items() if k.startswith(("item_start", "item_end", "pair_end", "pair_item"))}
    bs = it.block_size
    first = ints["item_start"] // bs
    item_blocks = (ints["item_end"] + bs - 1) // bs - first
    pair_blocks = (ints["pair_end"] + bs - 1) // bs - first[ints["pair_item"]]
    return int(item_blocks.sum()) * num_kv_heads, int(pair_blocks.sum()) * num_kv_heads


def check(c: Case, device: str, cache: str = "plain", layout_case: bool = False,
          max_splits: int | None = None, planner: StepPlanner | None = None) -> dict:
    group, views, rows, query, kv = cache_for(c, cache, device)
    ref = oracle(c, group, views, rows, query)
    spec = RopeSpec.from_hf_config(config_of(c), is_neox_style=c.neox)
    q = query.to(device)
    untouched = None
    if layout_case:
        gen = torch.Generator().manual_seed(c.seed + 2)
        extra = torch.randn(EXTRA_ROWS, *q.shape[1:], generator=gen).to(q.dtype).to(device)
        q = qkv_query(torch.cat([q, extra]), c.num_kv_heads)
        t, hq, d = q.shape
        wide = torch.full((t, hq * d + 40), SENTINEL, dtype=q.dtype, device=device)
        out = wide[:, : hq * d].view(t, hq, d)
    else:
        out = None
    reused = planner is not None
    if planner is None:
        planner = StepPlanner(c.block_size, spec, device, num_kv_heads=c.num_kv_heads)
    with splits_of(max_splits):
        plan = sa.plan(rows, c.block_size, spec, sa.PlanMode.TRITON, num_tokens=q.shape[0], device=device,
                       planner=planner)
    got = sa.run(plan, q, kv, out=out).cpu()
    rows_out = plan.items.ints["row_token"][: plan.items.num_rows].long().cpu()
    if layout_case:
        keep = torch.ones(q.shape[0], dtype=torch.bool)
        keep[rows_out] = False
        wide = wide.cpu()
        untouched = bool((wide[keep] == SENTINEL).all() and (wide[:, q.shape[1] * q.shape[2] :] == SENTINEL).all())
    torch_plan = sa.plan(rows, c.block_size, spec, sa.PlanMode.TORCH, num_tokens=q.shape[0], device=device)
    reference = sa.run(torch_plan, q, kv).cpu()
    tol = 1e-5 if c.dtype == torch.float32 else 2e-2
    err = rel_err(got[rows_out], ref)
    loads, readers = item_reads(plan, c.num_kv_heads)
    it = plan.items
    item_blocks = (it.ints["item_end"][: it.num_items].long() + c.block_size - 1) // c.block_size \
        - it.ints["item_start"][: it.num_items].long() // c.block_size
    return {
        "cache": cache, "strided_query": layout_case, "untouched": untouched,
        "workers": c.num_workers, "layout": c.layout, "dtype": str(c.dtype).removeprefix("torch."),
        "head_dim": c.head_dim, "gqa": c.gqa, "block_size": c.block_size, "neox": c.neox,
        "rotary": c.partial_rotary, "rope": c.rope, "query_tokens": c.max_query_tokens,
        "rel_err_oracle": err,
        "rel_err_torch": ((got[rows_out].double() - reference[rows_out].double()).abs().max()
                          / reference[rows_out].double().abs().max()).item(),
        "tolerance": tol, "block_loads": loads, "block_readers": readers,
        "items": it.num_items, "pairs": it.num_pairs, "splits": it.num_splits,
        "split_blocks": int(((item_blocks + it.num_splits - 1) // it.num_splits).max()),
        "reused_buffers": reused,
        "ok": err <= tol and untouched is not False,
    }


def specialization_keys(launches) -> dict:
    """Triton's specialization key of every recorded launch, with the kernels' ``do_not_specialize``
    and without it (what the same launches would have compiled with plain int arguments)."""
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import JITFunction, create_function_from_signature

    fns = {id(ta._partials_kernel): (ta._segment_partials, list(ta.PARTIALS_DYNAMIC)),
           id(ta._merge_kernel): (ta._merge_partials, [])}
    binders = {}
    keys = {"partials": set(), "merge": set(), "partials_plain_ints": set()}
    for kernel, args, meta in launches:
        fn, dns = fns[id(kernel)]
        name = "partials" if fn is ta._segment_partials else "merge"
        for label, d in ((name, dns), (f"{name}_plain_ints", [])):
            if label not in keys:
                continue
            if label not in binders:
                jf = JITFunction(fn, do_not_specialize=d)
                binders[label] = create_function_from_signature(jf.signature, jf.params, BaseBackend)
            keys[label].add(str(binders[label](*args, **meta)[1]))
    return keys


def specialization_check(device: str) -> dict:
    """Steps of one model shape with different counts, and lane tables of different strides: no new
    specialization."""
    steps = [Case(num_workers=2, layout="contiguous", seed=41),
             Case(num_workers=5, layout="combined", max_query_tokens=3, prompt_len=50, seed=42),
             Case(num_workers=3, layout="contiguous", seed=43)]
    launches, counts = [], []
    real_launch = ta._launch

    def record(kernel, grid, *args, **meta):
        launches.append((kernel, args, meta))
        real_launch(kernel, grid, *args, **meta)

    def compiled() -> int | None:  # the real compile cache (not kept by the interpreter)
        if device == "cpu":
            return None
        dev = torch.device(device).index or torch.cuda.current_device()
        return sum(len(k.device_caches[dev][0]) for k in (ta._partials_kernel, ta._merge_kernel))

    shapes = []
    ta._launch = record
    try:
        for i, c in enumerate(steps):
            group, views, rows, query, kv = cache_for(c, "plain", device)
            spec = RopeSpec.from_hf_config(config_of(c), is_neox_style=c.neox)
            planner = StepPlanner(c.block_size, spec, device, num_kv_heads=c.num_kv_heads)
            if i == 2:
                planner.lanes.reserve(0, 301)  # a row stride no multiple of 16 (one Triton would specialize on)
            plan = sa.plan(rows, c.block_size, spec, sa.PlanMode.TRITON, num_tokens=query.shape[0], device=device,
                           planner=planner)
            it = plan.items
            shapes.append({"rows": it.num_rows, "pairs": it.num_pairs, "items": it.num_items,
                           "splits": it.num_splits, "lane_stride": int(it.lanes.blocks.stride(0)),
                           "tokens": int(query.shape[0])})
            sa.run(plan, query.to(device), kv)
            counts.append(compiled())
    finally:
        ta._launch = real_launch
    keys = specialization_keys(launches)
    ok = (len(keys["partials"]) == 1 and len(keys["merge"]) == 1 and len(keys["partials_plain_ints"]) > 1
          and (counts[0] is None or counts[0] == counts[-1]))
    return {"specialization": {
        "steps": shapes, "launches": len(launches), "partials_keys": len(keys["partials"]),
        "merge_keys": len(keys["merge"]), "partials_keys_without_do_not_specialize": len(keys["partials_plain_ints"]),
        "compiled_after_each_step": counts, "ok": ok}}


# Model shapes compiled for a GPU target by --compile-for-gpu (no GPU needed: Triton's compiler and ptxas).
COMPILE_CASES = [
    Case(num_kv_heads=8, gqa=4, head_dim=128, dtype=BF16),  # 32q/8kv d128
    Case(num_kv_heads=4, gqa=7, head_dim=128, dtype=BF16),  # 28q/4kv, GQA 7
    Case(num_kv_heads=8, gqa=4, head_dim=64, dtype=BF16),  # 32q/8kv d64
    Case(num_kv_heads=2, gqa=2, head_dim=80, dtype=torch.float16, neox=False, partial_rotary=0.5),
    Case(num_kv_heads=2, gqa=4, head_dim=128, dtype=torch.float32),
]


def compile_check(arch: int) -> list[dict]:
    """Both kernels through Triton's real compiler for ``cuda:sm_<arch>`` (TTIR, TTGIR, LLVM, PTX, ptxas),
    from the arguments of launches recorded on CPU tensors (nothing runs). bf16/fp16 products must be
    tensor-core instructions (``mma``), fp32 ones must not be tf32."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature
    import time

    import triton

    if triton.knobs.runtime.interpret:
        raise SystemExit("--compile-for-gpu compiles for a GPU: run it without TRITON_INTERPRET")
    target = GPUTarget("cuda", arch, 32)
    try:
        backend = make_backend(target)
    except Exception as e:  # noqa: BLE001 - a Triton build without the NVIDIA backend
        return [{"compile": "skipped", "reason": repr(e)}]
    launches = []
    ta_check, ta_launch = ta._check_device, ta._launch
    ta._check_device = lambda device: None  # record CPU launches without running them
    ta._launch = lambda kernel, grid, *a, **meta: launches.append((c, kernel, a, meta))
    try:
        for c in COMPILE_CASES:
            group, views, rows, query, kv = cache_for(dataclasses.replace(c, num_workers=3), "fa:LBNHC", "cpu")
            spec = RopeSpec.from_hf_config(config_of(c), is_neox_style=c.neox)
            plan = sa.plan(rows, c.block_size, spec, sa.PlanMode.TRITON, num_tokens=query.shape[0])
            sa.run(plan, qkv_query(query, c.num_kv_heads), kv)
    finally:
        ta._check_device, ta._launch = ta_check, ta_launch
    results, done = [], set()
    for c, kernel, a, meta in launches:
        if (id(c), id(kernel)) in done:
            continue
        done.add((id(c), id(kernel)))
        binder = create_function_from_signature(kernel.signature, kernel.params, backend)
        bound, specialization, options = binder(*a, **meta)
        options, signature, constexprs, attrs = kernel._pack_args(backend, meta, bound, specialization, options)
        t0 = time.perf_counter()
        compiled = triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=target,
                                  options=options.__dict__)
        ptx = compiled.asm["ptx"]
        results.append({
            "compile": kernel.fn.__name__, "target": f"sm_{arch}", "dtype": str(c.dtype).removeprefix("torch."),
            "heads": f"{c.num_kv_heads * c.gqa}q/{c.num_kv_heads}kv", "head_dim": c.head_dim,
            "seconds": round(time.perf_counter() - t0, 2), "cubin_bytes": len(compiled.asm["cubin"]),
            "mma": ptx.count("mma.sync") + ptx.count("wgmma."), "tf32": "tf32" in ptx,
            "shared_bytes": compiled.metadata.shared,
        })
    return results


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--compile-for-gpu", type=int, metavar="SM", default=None,
                        help="only compile the kernels for cuda:sm_SM (e.g. 90), without a GPU")
    args = parser.parse_args()
    ok = True
    if args.compile_for_gpu is not None:
        for result in compile_check(args.compile_for_gpu):
            if "dtype" in result and result["compile"] == "_segment_partials":
                good = result["mma"] > 0 if result["dtype"] != "float32" else not result["tf32"]
                result["ok"] = good
                ok &= good
            print(json.dumps(result), flush=True)
        print(json.dumps({"ok": ok}))
        return 0 if ok else 1
    planners: dict = {}  # a case runs on the plan buffers of the last case with its block size and RoPE, if any
    for i, ((c, cache), layout_case) in enumerate([*((x, False) for x in CASES),
                                                    *((x, True) for x in LAYOUT_CASES)]):
        few_splits = layout_case or i % 2
        if few_splits and c.prompt_len == Case.prompt_len:  # a longer prompt and lanes: several blocks a split
            c = dataclasses.replace(c, prompt_len=101, max_gen=45)
        key = (c.block_size, c.rope, c.neox, c.partial_rotary, c.head_dim)
        result = check(c, args.device, cache, layout_case, max_splits=2 if few_splits else 32,
                       planner=planners.get(key))
        planners.setdefault(key, StepPlanner(c.block_size, RopeSpec.from_hf_config(config_of(c), is_neox_style=c.neox),
                                             args.device, num_kv_heads=c.num_kv_heads))
        ok &= result["ok"]
        print(json.dumps(result), flush=True)
    result = specialization_check(args.device)
    ok &= result["specialization"]["ok"]
    print(json.dumps(result), flush=True)
    print(json.dumps({"ok": ok}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
