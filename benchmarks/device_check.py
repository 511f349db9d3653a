"""GPU check of the Triton segment-attention kernel on vLLM FlashAttention's real cache, then one-layer timings.

    bash benchmarks/device_check.sh                 # one H200 (or any CUDA GPU), torch + triton only
    python benchmarks/device_check.py --cpu-smoke   # the same code paths on the CPU, Triton's interpreter

Needs only torch and Triton (no vLLM, no transformers): the float64 oracle
and the RoPE frequencies are computed here from their definitions
(:mod:`benchmarks.device_cases`); the plugin modules it imports
(``segment_attention``, ``triton_attention``, ``kv_layout``, ``rope``,
``views``) import no vLLM, and the script checks that at the end.

1. **Correctness** against the float64 oracle, on vLLM 0.32's FlashAttention
   cache: one ``[num_blocks, kv_heads, block_size, 2 * head_dim]`` tensor per
   layer (two layers per buffer, the second one used), in each of the six
   physical layouts vLLM can allocate for it (``KVCacheLayout``; FlashAttention
   accepts all), split exactly as ``FlashAttentionImpl`` splits it; the group's
   physical block ids start above 80,000 (element offsets past 2**31 for the
   8-KV-head model); the query is a strided slice of a qkv tensor; the output
   is a slice of a wider buffer full of a sentinel, with query rows outside the
   plan, and everything outside the planned rows must keep the sentinel.
   Shapes: 32 query / 8 KV heads with head dim 128 and 64, 28 / 4 (GQA 7) with
   head dim 128, bf16, block 16; plus fp16 with GPT-J pairing and partial
   rotary, fp32 (exact), prefill-like multi-token rows, and FP8 caches (vLLM's
   ``fp8_e4m3`` and ``fp8_e5m2``: uint8 elements, per-layer K and V scales unlike
   1) under a bf16 model, the oracle fed the dequantized values. N = 2, 4, 8 workers,
   views of 1k to 32k tokens (``contiguous``: ``[prompt][co-workers][own]``).
2. **Compiles**: the first-call time of each kernel specialization (Triton's
   cache pointed at an empty directory, so it is a real compile), and a check
   that no later step (other N, view length, reader and pair counts) compiles
   again.
3. **Timings**, one layer, decode (one query token per worker): the kernel
   (partials + merge; the merge alone in its own column) against torch SDPA
   over ONE materialized view (what one worker's dense attention reads) and
   over N copies of the views (N independent sequences), and the HBM floor of
   reading the group's K/V once (unique blocks, bytes / the assumed bandwidth,
   4.8 TB/s for an H200 by default). The partials column is the fp32 traffic
   of the split-KV partial results (written, then read by the merge).

4. **A decode step from a CUDA graph**: one step's attention for ``GRAPH_LAYERS``
   layers (32; one cache, each layer its own output) captured once in a
   ``torch.cuda.CUDAGraph`` on a frozen :class:`~vllm_hogwild.attention.step_plan.StepPlanner`
   (its buffers are the graph's), then replayed for ``GRAPH_STEPS`` steps: each step
   appends a token to every lane (lanes cross blocks and take new ones), copies new
   queries into the captured query tensor and plans the step into the same buffers;
   the first and last layer's output is checked against the oracle every step. Times a
   step eager (every layer from Python), from the graph, and SDPA over N copies from a
   graph; and the host time of the step's plan.

Prints markdown tables ready to paste into ``docs/benchmarks.md`` and a
final ``PASS`` / ``FAIL`` line; exits non-zero on FAIL. ``--budget-s`` stops
starting new rows once spent (the run then FAILs as incomplete).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXTRA_ROWS = 3  # query rows outside the plan, must keep the sentinel
SENTINEL = 7.0


@dataclasses.dataclass(frozen=True)
class Model:
    name: str
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: str = "bfloat16"
    theta: float = 5e5
    block_size: int = 16
    neox: bool = True
    rotary: float = 1.0
    kv_cache: str = "auto"  # vLLM's kv_cache_dtype: "auto" (the model dtype) or an FP8 encoding
    k_scale: float = 1.0  # an FP8 cache's per-layer scales
    v_scale: float = 1.0

    @property
    def gqa(self) -> int:
        return self.num_q_heads // self.num_kv_heads


GPU_MODELS = [
    Model("32q/8kv d128 (Llama-3-8B)", 32, 8, 128),
    Model("28q/4kv d128 (GQA 7, Qwen2-7B)", 28, 4, 128, theta=1e6),
    Model("32q/8kv d64 (Llama-3.2-1B)", 32, 8, 64),
]
GPU_EXTRA = [  # correctness only
    Model("16q/4kv d128 fp16 GPT-J pairs, rotary 1/2", 16, 4, 128, dtype="float16", neox=False, rotary=0.5),
    Model("8q/2kv d128 fp32", 8, 2, 128, dtype="float32", theta=1e4),
]
# FP8 caches (vLLM's kv_cache_dtype fp8_e4m3 / fp8_e5m2; uint8 elements) under a bf16 model, scales unlike 1.
GPU_FP8 = [
    Model("32q/8kv d128 bf16, fp8_e4m3 cache", 32, 8, 128, kv_cache="fp8_e4m3", k_scale=0.37, v_scale=1.9),
    Model("28q/4kv d128 bf16, fp8_e5m2 cache", 28, 4, 128, theta=1e6, kv_cache="fp8_e5m2", k_scale=0.37,
          v_scale=1.9),
]
SMOKE_MODELS = [
    Model("tiny 8q/2kv d32", 8, 2, 32),
    Model("tiny 7q/1kv d16 (GQA 7)", 7, 1, 16),
]
SMOKE_EXTRA = [Model("tiny 4q/2kv d32 fp32 GPT-J, rotary 1/2", 4, 2, 32, dtype="float32", neox=False, rotary=0.5)]
SMOKE_FP8 = [Model("tiny 8q/2kv d32, fp8_e4m3 cache", 8, 2, 32, kv_cache="fp8_e4m3", k_scale=0.37, v_scale=1.9),
             Model("tiny 7q/1kv d16, fp8_e5m2 cache", 7, 1, 16, kv_cache="fp8_e5m2", k_scale=0.37, v_scale=1.9)]


@dataclasses.dataclass(frozen=True)
class Row:
    model: Model
    fa_layout: str
    num_workers: int
    view_len: int
    layout: str = "contiguous"  # or "combined"
    query_tokens: int = 1
    timed: bool = False


def plan_rows(smoke: bool) -> list[Row]:
    fa = ["LBNHC", "LBHNC", "LHBNC", "BLHNC", "BLNHC", "BHLNC"]
    if smoke:
        a, g7 = SMOKE_MODELS
        rows = [Row(a, x, (2, 3)[i % 2], (96, 160)[i % 2], layout=("contiguous", "combined")[i % 2])
                for i, x in enumerate(fa)]
        rows += [Row(g7, "LBNHC", 2, 80), Row(SMOKE_EXTRA[0], "BHLNC", 2, 64),
                 Row(a, "LBNHC", 2, 64, query_tokens=5)]
        rows += [Row(SMOKE_FP8[0], "LBHNC", 3, 96, layout="combined"), Row(SMOKE_FP8[1], "BLNHC", 2, 64)]
        rows += [Row(a, "LBNHC", n, v, timed=True) for n in (2, 4) for v in (64, 128)]
        rows += [Row(g7, "LBNHC", 2, 96, timed=True), Row(SMOKE_FP8[0], "LBNHC", 2, 64, timed=True)]
        return rows
    a = GPU_MODELS[0]
    rows = [Row(a, x, (2, 4, 8)[i % 3], (1024, 4096, 2048)[i % 3], layout=("contiguous", "combined")[i % 2])
            for i, x in enumerate(fa)]
    rows += [Row(a, "LBNHC", 4, 2048, query_tokens=48), Row(GPU_MODELS[1], "BHLNC", 3, 1024, query_tokens=24)]
    rows += [Row(m, "LBNHC", 4, 2048, layout="combined") for m in GPU_EXTRA]
    e4, e5 = GPU_FP8
    rows += [Row(e4, "LBNHC", 4, 2048, layout="combined"), Row(e4, "BHLNC", 2, 4096),
             Row(e4, "LBNHC", 4, 2048, query_tokens=48), Row(e5, "LBHNC", 3, 1024, layout="combined")]
    a, *others = GPU_MODELS
    timed = lambda m, ns, vs: [Row(m, "LBNHC", n, v, timed=True) for n in ns for v in vs]  # noqa: E731
    rows += timed(a, (2, 4, 8), (1024, 4096, 16384, 32768)) + timed(e4, (4, 8), (4096, 32768))
    for m in others:
        rows += timed(m, (2, 4, 8), (1024, 4096, 16384, 32768))
    return rows


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu-smoke", action="store_true",
                   help="tiny shapes on the CPU under TRITON_INTERPRET=1: the same code paths, timings meaningless")
    p.add_argument("--hbm-tbps", type=float, default=4.8, help="assumed HBM bandwidth (H200: 4.8 TB/s)")
    p.add_argument("--budget-s", type=float, default=420.0, help="stop starting rows after this many seconds")
    p.add_argument("--first-block", type=int, default=None,
                   help="first physical block id of every group (default 80,000 on a GPU, 65,537 in the smoke)")
    return p.parse_args()


def main() -> int:  # noqa: C901 - one linear script
    args = parse_args()
    t_start = time.perf_counter()
    if args.cpu_smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # before Triton is imported
    os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="hogwild-triton-cache-"))
    try:
        import torch
        import triton
    except ImportError as e:
        print(f"FAIL: needs torch and triton ({e})")
        return 2
    sys.path.insert(0, str(ROOT))
    from benchmarks.device_cases import (blocks_needed, build_group, default_inv_freq, flash_attn_cache,
                                         flash_attn_split, max_element_offset, qkv_query, rel_err, rope_config,
                                         splits_of, view_oracle)
    from benchmarks.device_timing import GRAPH_LAYERS, graph_decode, split_blocks, time_row
    from vllm_hogwild.attention import segment_attention as sa
    from vllm_hogwild.attention import step_plan
    from vllm_hogwild.attention import triton_attention as ta
    from vllm_hogwild.attention.kv_layout import KVQuant
    from vllm_hogwild.core.views.rope import RopeSpec
    from vllm_hogwild.core.views.spans import build_views, Span

    smoke = args.cpu_smoke
    if smoke:  # tiny views on the interpreter's small grid: force two runs an item, as long views make them
        step_plan.FORCED_SPLITS = 2
    if not smoke and not torch.cuda.is_available():
        print("FAIL: no CUDA device (use --cpu-smoke on a machine without one)")
        return 2
    device = torch.device("cpu" if smoke else "cuda")
    first_block = args.first_block if args.first_block is not None else (65_537 if smoke else 80_000)
    print(f"torch {torch.__version__}, triton {triton.__version__}, "
          + ("CPU, Triton interpreter (cpu-smoke: timings are meaningless)" if smoke else
             f"{torch.cuda.get_device_name()} ({torch.cuda.get_device_properties(0).multi_processor_count} SMs, "
             f"{torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB)"))
    print(f"assumed HBM bandwidth for the floor: {args.hbm_tbps} TB/s (H200 spec); Triton cache: "
          f"{os.environ['TRITON_CACHE_DIR']}; first physical block id: {first_block:,}")
    failures: list[str] = []

    def sync() -> None:
        if not smoke:
            torch.cuda.synchronize()

    # ---- compile accounting through the kernel module's launch seam ---------------------------------
    kernels = {"partials": ta._partials_kernel, "merge": ta._merge_kernel}

    def cache_sizes() -> dict[str, int] | None:
        if smoke:
            return None  # the interpreter keeps no compile cache
        dev = torch.cuda.current_device()
        return {n: len(k.device_caches[dev][0]) for n, k in kernels.items()}

    compile_log: list[str] = []
    state = {"context": "", "skip_merge": False, "timing": False}
    real_launch = ta._launch

    def launch(kernel, grid, *a, **meta):
        name = "partials" if kernel is ta._partials_kernel else "merge"
        if name == "merge" and state["skip_merge"]:
            return
        before = None if state["timing"] else cache_sizes()
        if before is None:  # timing (no syncs in between), or the interpreter (no compile cache)
            real_launch(kernel, grid, *a, **meta)
            return
        sync()
        t0 = time.perf_counter()
        real_launch(kernel, grid, *a, **meta)
        sync()
        after = cache_sizes()
        if after[name] > before[name]:
            consts = ", ".join(f"{k}={v}" for k, v in meta.items() if k not in ("num_warps", "UPCAST", "PRECISION"))
            compile_log.append(f"| {name} | {state['context']} | {consts} | {time.perf_counter() - t0:.2f} |")

    ta._launch = launch

    # ---- one row: build, check against the oracle, time ----------------------------------------------
    caches: dict[tuple, object] = {}  # (model, fa layout) -> PlainPagedKV, fixed size: strides never change

    def kv_for(m: Model, layout: str, max_blocks: int):
        key = (m, layout)
        if key not in caches:
            caches.clear()  # one big cache at a time
            if not smoke:
                torch.cuda.empty_cache()
            gen = torch.Generator(device=device).manual_seed(1)
            quant = KVQuant.of(m.kv_cache, m.k_scale, m.v_scale)
            cache = flash_attn_cache(layout, first_block + max_blocks + 16, m.num_kv_heads, m.block_size,
                                     m.head_dim, getattr(torch, m.dtype) if quant is None else torch.uint8,
                                     device, generator=gen)
            caches[key] = flash_attn_split(cache, m.head_dim, quant)
        return caches[key]

    rows = plan_rows(smoke)
    max_blocks = {}
    for r in rows:
        k = (r.model, r.fa_layout)
        gens = [r.view_len // (2 * r.num_workers)] * r.num_workers
        max_blocks[k] = max(max_blocks.get(k, 0), blocks_needed(r.view_len // 2, gens, r.model.block_size))
    seen_shapes: dict[tuple, dict] = {}
    table: list[str] = []
    results: list[str] = []
    incomplete = 0

    def one_row(i: int, r: Row) -> None:
        m = r.model
        dtype = getattr(torch, m.dtype)
        kv = kv_for(m, r.fa_layout, max_blocks[(m, r.fa_layout)])
        gen = torch.Generator(device=device).manual_seed(100 + i)
        prompt = r.view_len // 2
        gen_lens = [r.view_len // (2 * r.num_workers)] * r.num_workers
        group = build_group(kv, prompt, gen_lens, first_block, gen)
        if r.layout == "contiguous":
            views = build_views("contiguous", prompt, group.lane_lens)
        else:  # the first half of every worker's text finished, in worker order; the rest unfinished
            half = [prompt + n // 2 for n in gen_lens]
            history = [Span(w, prompt, h) for w, h in enumerate(half)]
            views = build_views("combined", prompt, group.lane_lens, history=history, paragraph_starts=half)
        n_q = [min(r.query_tokens, v.own.num_tokens) for v in views]
        rows_q = group.rows(views, n_q)
        t = sum(n_q)
        spec = RopeSpec.from_hf_config(rope_config(m.num_q_heads, m.num_kv_heads, m.head_dim, m.theta, m.rotary),
                                       is_neox_style=m.neox)
        inv_freq = default_inv_freq(spec.rotary_dim, m.theta)
        query = torch.randn(t + EXTRA_ROWS, m.num_q_heads, m.head_dim, generator=gen, device=device).to(dtype)
        q = qkv_query(query, m.num_kv_heads)
        wide = torch.full((t + EXTRA_ROWS, m.num_q_heads * m.head_dim + 64), SENTINEL, dtype=dtype, device=device)
        out = wide[:, : m.num_q_heads * m.head_dim].view(t + EXTRA_ROWS, m.num_q_heads, m.head_dim)
        sync()
        t0 = time.perf_counter()
        plan = sa.plan(rows_q, m.block_size, spec, sa.PlanMode.TRITON, num_tokens=t + EXTRA_ROWS, device=device)
        sync()
        plan_ms = (time.perf_counter() - t0) * 1e3
        # Specialization: model shape, dtype and cache layout; every later step of the same must not compile.
        shape_key = (m, r.fa_layout)
        state["context"] = f"{m.name}, {r.fa_layout}"
        before = cache_sizes()
        sa.run(plan, q, kv, out=out)
        sync()
        after = cache_sizes()
        if before is not None and shape_key in seen_shapes and after != before:
            failures.append(f"recompiled for a new step: {m.name} {r.fa_layout} N={r.num_workers} "
                            f"view={r.view_len} ({before} -> {after})")
        seen_shapes.setdefault(shape_key, after)
        # Oracle, sentinel.
        ref = torch.cat([view_oracle(group, v, query[row.query_start: row.query_start + row.num_query_tokens],
                                     inv_freq, m.neox) for v, row in zip(views, rows_q)])
        err = rel_err(out[:t], ref)
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        it = plan.items
        keep = torch.ones(t + EXTRA_ROWS, dtype=torch.bool, device=device)
        keep[it.ints["row_token"][: it.num_rows].long()] = False
        untouched = bool((wide[keep] == SENTINEL).all()) and bool((wide[:, out.shape[1] * out.shape[2]:]
                                                                    == SENTINEL).all())
        offset = max_element_offset(kv, group.used_blocks)
        chunk = split_blocks(torch, plan)
        ok = err <= tol and untouched
        line = (f"{'ok  ' if ok else 'FAIL'} {m.name:44s} {r.fa_layout} N={r.num_workers} view={r.view_len:>5} "
                f"{r.layout:10s} q/worker={r.query_tokens:<3} rel err {err:.1e} (tol {tol:.0e}) "
                f"untouched={untouched} blocks {min(group.used_blocks):,}-{max(group.used_blocks):,} "
                f"max offset {offset:,}{' >2^31' if offset >= 2**31 else ''} items={it.num_items} "
                f"pairs={it.num_pairs} splits={it.num_splits} blocks/split<={chunk} plan {plan_ms:.1f} ms")
        print(line, flush=True)
        results.append(line)
        if not ok:
            failures.append(line)
        if r.timed:
            with splits_of(1):  # the same step with every item read by one unit (a KV head): no split
                plan1 = sa.plan(rows_q, m.block_size, spec, sa.PlanMode.TRITON, num_tokens=t + EXTRA_ROWS,
                                device=device)
            table.append(time_row(torch, sa, state, r, plan, plan1, q, out, kv, group, plan_ms, chunk, args,
                                  smoke, device, dtype))
            print("    " + table[-1], flush=True)

    for i, r in enumerate(rows):
        if time.perf_counter() - t_start > args.budget_s:
            incomplete += 1
            continue
        try:
            one_row(i, r)
        except Exception as e:  # noqa: BLE001 - one broken row must not lose the others
            line = f"FAIL {r.model.name} {r.fa_layout} N={r.num_workers} view={r.view_len}: {type(e).__name__}: {e}"
            print(line[:2000], flush=True)
            failures.append(line[:300])
            state["timing"] = state["skip_merge"] = False
            if not smoke:
                torch.cuda.synchronize()
                torch.cuda.empty_cache()

    ta._launch = real_launch
    graph_table: list[str] = []
    graph_cases = ([(SMOKE_MODELS[1], 3, 64)] if smoke else
                   [(GPU_MODELS[0], 8, 4096), (GPU_MODELS[0], 8, 32768), (GPU_MODELS[0], 4, 16384)])
    for m, n, view in graph_cases:
        if time.perf_counter() - t_start > args.budget_s + 60:
            incomplete += 1
            continue
        try:
            line, errs = graph_decode(torch, sa, m, n, view, smoke, device, first_block, args)
            graph_table.append(line)
            print("    " + line, flush=True)
            failures.extend(errs)
        except Exception as e:  # noqa: BLE001 - report, go on
            failures.append(f"graph {m.name} N={n} view={view}: {type(e).__name__}: {e}"[:300])
            print(failures[-1], flush=True)
    leaked = sorted(n for n in sys.modules if n.split(".")[0] in ("vllm", "transformers"))
    if leaked:
        failures.append(f"imported {leaked[:5]}: the device machine has neither")

    print("\n## First compile of each kernel specialization\n")
    if smoke:
        print("(the interpreter compiles nothing; on a GPU each new specialization is listed here)")
    else:
        print("| kernel | model, cache layout | compile-time constants | first call incl. compile (s) |")
        print("|---|---|---|---|")
        print("\n".join(compile_log))
        print(f"\n{len(compile_log)} specializations for {len(seen_shapes)} (model, cache layout) pairs; "
              f"no step after the first of a pair compiled: {not any('recompiled' in f for f in failures)}")

    print("\n## One layer, decode (one query token per worker), "
          + ("CPU smoke (interpreter: timings meaningless)" if smoke else torch.cuda.get_device_name()) + "\n")
    print(f"Floor: the group's unique K/V blocks read once at {args.hbm_tbps} TB/s (assumed HBM bandwidth). "
          "SDPA 1 view: torch SDPA over one materialized view (what one worker's dense attention reads); "
          "SDPA N copies: over N materialized views (N independent sequences); both replayed from a CUDA graph "
          "where capture works, K and V distinct tensors. Partials: fp32 split-KV partial "
          "results written by the kernel and read by the merge. Plan: per step (all layers share it).\n")
    print("| model | N | view tokens | blocks a split | kernel µs (eager) | kernel µs (CUDA graph) | "
          "of which merge µs | kernel µs, no split | "
          "SDPA 1 view µs | SDPA N copies µs | N copies / kernel | floor µs | K/V read once MB | N copies MB | "
          "partials MB | plan ms/step |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(table))
    print(f"\nSDPA ran as: {', '.join(sorted(state.get('sdpa', ())))}. Kernel (eager): one `segment_attention.run` "
          "per layer from Python, launch overhead included; (CUDA graph): the same launches replayed from a graph, "
          "GPU time only; N copies / kernel uses the graph time where there is one.")
    for e in sorted(state.get("graph_errors", ())):
        print(f"CUDA graph capture failed: {e}")
    layers = 2 if smoke else GRAPH_LAYERS
    print(f"\n## A decode step's attention, {layers} layers, from a CUDA graph\n")
    print("The step captured once on a frozen planner's buffers, then replayed for each later step with the "
          "plan written into the same buffers (tokens appended, lanes crossing blocks); every step's first and "
          "last layer checked against the oracle. Eager: every layer's two launches from Python. SDPA N copies: "
          "one SDPA call a layer over N materialized views, from a graph. Plan: host ms to write a decode step's "
          "plan (median).\n")
    print("| model | N | view tokens | steps replayed | max rel err | step µs (eager) | step µs (CUDA graph) | "
          "SDPA N copies µs (CUDA graph) | N copies / graph | plan ms/step |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(graph_table))
    if incomplete:
        failures.append(f"incomplete: {incomplete} rows not run within --budget-s {args.budget_s:.0f}")
    print(f"\n{len(results)} oracle rows, {len(failures)} failures, {time.perf_counter() - t_start:.0f} s")
    for f in failures:
        print("  " + f)
    print("PASS" if not failures else "FAIL")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
