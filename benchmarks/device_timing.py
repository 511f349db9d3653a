"""Timings and the decode-step CUDA graph of ``benchmarks/device_check.py`` (sections 3 and 4 of its docstring).

Torch and Triton only, like the script; every function takes the modules it needs (torch, the plugin's
``segment_attention``) from its caller, which imports them once Triton's interpreter is set or not.
"""

from __future__ import annotations

import statistics
import time

GRAPH_LAYERS, GRAPH_STEPS = 32, 10  # the decode-step graph (the CPU smoke: 2 layers, 10 steps)


def graph_decode(torch, sa, m, n: int, view_len: int, smoke: bool, device, first_block: int,
                 args) -> tuple[str, list[str]]:
    """Section 4: a decode step's attention for every layer, captured once, replayed step after step."""
    from benchmarks.device_cases import (blocks_needed, build_group, default_inv_freq, flash_attn_cache,
                                         flash_attn_split, grow, rel_err, rope_config, view_oracle)
    from vllm_hogwild.attention.kv_layout import KVQuant
    from vllm_hogwild.attention.step_plan import StepPlanner
    from vllm_hogwild.core.views.rope import RopeSpec
    from vllm_hogwild.core.views.spans import SegmentColumns, build_views

    layers, steps = (2, 10) if smoke else (GRAPH_LAYERS, GRAPH_STEPS)
    dtype = getattr(torch, m.dtype)
    gen = torch.Generator(device=device).manual_seed(11)
    prompt = view_len // 2
    gen_lens = [view_len // (2 * n)] * n
    base = blocks_needed(prompt, gen_lens, m.block_size)
    extra = n * (steps // m.block_size + 2)
    quant = KVQuant.of(m.kv_cache, m.k_scale, m.v_scale)
    cache = flash_attn_cache("LBNHC", first_block + base + extra + 1, m.num_kv_heads, m.block_size, m.head_dim,
                             dtype if quant is None else torch.uint8, device, generator=gen)
    kv = flash_attn_split(cache, m.head_dim, quant)
    group = build_group(kv, prompt, gen_lens, first_block, gen)
    spare = list(range(first_block + base, first_block + base + extra))
    spec = RopeSpec.from_hf_config(rope_config(m.num_q_heads, m.num_kv_heads, m.head_dim, m.theta, m.rotary),
                                   is_neox_style=m.neox)
    inv_freq = default_inv_freq(spec.rotary_dim, m.theta)
    planner = StepPlanner(m.block_size, spec, device, num_kv_heads=m.num_kv_heads)
    planner.reserve(rows=n, pairs=4 * n * (n + 2), items=4 * n * (n + 2), slots=n, max_blocks=base + extra)
    planner.freeze(m.num_q_heads, m.head_dim)
    slots = [(w, 1) for w in range(n)]
    q = torch.randn(n, m.num_q_heads, m.head_dim, generator=gen, device=device).to(dtype)
    outs = [torch.zeros(n, m.num_q_heads, m.head_dim, dtype=dtype, device=device) for _ in range(layers)]

    def plan_step():
        columns = SegmentColumns()
        at = columns.add_tables(group.block_tables, slots)
        for w in range(n):
            columns.add_contiguous(w, prompt, group.lane_lens, at)
        return sa.SegmentAttentionPlan(sa.PlanMode.TRITON, n, spec, items=planner.plan(columns, list(range(n))))

    def forward(plan):
        for layer in range(layers):
            sa.run(plan, q, kv, out=outs[layer])

    def sync():
        if not smoke:
            torch.cuda.synchronize()

    plan = plan_step()
    forward(plan)  # compiles before the capture
    sync()
    graph = None
    if not smoke:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            forward(plan)
    replay = graph.replay if graph is not None else (lambda: forward(plan))
    errs, failures, plan_ms, taken = [], [], [], 0
    for step in range(steps):
        taken += grow(kv, group, range(n), spare, gen)
        q.copy_(torch.randn(q.shape, generator=gen, device=device).to(dtype))
        sync()
        t0 = time.perf_counter()
        plan_step()
        plan_ms.append((time.perf_counter() - t0) * 1e3)
        replay()
        sync()
        views = build_views("contiguous", prompt, group.lane_lens)
        ref = torch.cat([view_oracle(group, v, q[w: w + 1], inv_freq, m.neox) for w, v in enumerate(views)])
        errs.append(max(rel_err(outs[i], ref) for i in (0, layers - 1)))
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    if max(errs) > tol or taken == 0:
        failures.append(f"graph {m.name} N={n} view={view_len}: max rel err {max(errs):.1e} (tol {tol:.0e}), "
                        f"blocks taken {taken}")

    def timed(fn) -> float:
        fn()
        sync()
        reps = 1 if smoke else 20
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        sync()
        return (time.perf_counter() - t0) / reps * 1e6

    eager_us = timed(lambda: forward(plan))
    graph_us = timed(graph.replay) if graph is not None else None
    sdpa_us = None
    if not smoke:
        lv = group.lane_lens[0] + sum(group.lane_lens[1:]) - (n - 1) * prompt
        qs = torch.randn(n, m.num_q_heads, 1, m.head_dim, device=device).to(dtype)
        ks = torch.randn(n, m.num_kv_heads, lv, m.head_dim, device=device).to(dtype)
        vs = torch.randn_like(ks)
        call, _ = sdpa_call(torch, qs, ks, vs, m.gqa)
        call()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(layers):
                call()
        sdpa_us = timed(g.replay)
    fmt = lambda x: "-" if x is None else f"{x:.1f}"  # noqa: E731
    ratio = "-" if sdpa_us is None or graph_us is None else f"{sdpa_us / graph_us:.2f}x"
    line = (f"| {m.name} | {n} | {view_len:,} | {steps} | {max(errs):.1e} | {eager_us:.1f} | {fmt(graph_us)} | "
            f"{fmt(sdpa_us)} | {ratio} | {statistics.median(plan_ms):.3f} |")
    return line, failures


def item_blocks(torch, plan):
    """Blocks of each item of an item plan ``[W]`` (host)."""
    it = plan.items
    bs = it.block_size
    start = it.ints["item_start"][: it.num_items].long().cpu()
    end = it.ints["item_end"][: it.num_items].long().cpu()
    return (end + bs - 1) // bs - start // bs


def split_blocks(torch, plan) -> int:
    """The longest run of blocks one work unit reads."""
    s = plan.items.num_splits
    return int(((item_blocks(torch, plan) + s - 1) // s).max())


def splits_written(torch, plan):
    """Splits each pair's item has blocks in (the partials the pair writes) ``[P]``."""
    it = plan.items
    blocks = item_blocks(torch, plan)
    per = (blocks + it.num_splits - 1) // it.num_splits
    written = (blocks + per - 1) // per
    return written[it.ints["pair_item"][: it.num_pairs].long().cpu()]


def sdpa_call(torch, q, k, v, gqa: int):
    """torch SDPA on q, k, v (distinct tensors: the same one twice would let V's reads hit L2), restricted
    to the fused GPU kernels (never the math fallback, which would expand the KV heads), with GQA in the
    kernel when it supports it, else K/V heads repeated up front (outside the timing). Returns the call
    and how it runs."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    sdpa = torch.nn.functional.scaled_dot_product_attention
    fused = [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]

    def restricted(fn):
        def call():
            with sdpa_kernel(fused):
                return fn()
        return call

    def repeated():
        k_rep, v_rep = k.repeat_interleave(gqa, 1), v.repeat_interleave(gqa, 1)
        return restricted(lambda: sdpa(q, k_rep, v_rep))

    attempts = [("fused kernel, enable_gqa", lambda: restricted(lambda: sdpa(q, k, v, enable_gqa=True))),
                ("fused kernel, K/V heads repeated before timing", repeated),
                ("default backend, enable_gqa", lambda: lambda: sdpa(q, k, v, enable_gqa=True))]
    for how, make in attempts:
        try:
            fn = make()
            fn()
            return fn, how
        except (RuntimeError, TypeError):
            continue
    raise RuntimeError("no SDPA call works here")


def time_row(torch, sa, state, r, plan, plan1, q, out, kv, group, plan_ms, chunk, args, smoke, device,
             dtype) -> str:
    m = r.model
    n, lv = r.num_workers, r.view_len
    reps = 2 if smoke else 30

    def timed(fn) -> float:
        fn()
        if smoke:
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            return (time.perf_counter() - t0) / reps * 1e6
        samples = []
        for _ in range(5):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                fn()
            end.record()
            torch.cuda.synchronize()
            samples.append(start.elapsed_time(end) / reps * 1e3)
        return statistics.median(samples)

    def graphed(fn):
        """``fn`` captured in a CUDA graph: GPU time without the Python launch overhead (None on the CPU)."""
        if smoke:
            return None
        try:
            fn()  # warm: nothing left to allocate or compile
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fn()
            return graph.replay
        except Exception as e:  # noqa: BLE001 - report and go on without the graph column
            state.setdefault("graph_errors", set()).add(repr(e)[:200])
            return None

    layer = lambda: sa.run(plan, q, kv, out=out)  # noqa: E731
    state["timing"] = True
    eager_us = timed(layer)
    full = graphed(layer)
    state["skip_merge"] = True
    partials = graphed(layer)
    state["skip_merge"] = state["timing"] = False
    graph_us = timed(full) if full else None
    merge_us = graph_us - timed(partials) if full and partials else None
    one_block = lambda: sa.run(plan1, q, kv, out=out)  # noqa: E731
    state["timing"] = True
    one_block_us = timed(graphed(one_block) or one_block)
    state["timing"] = False
    def sdpa_inputs(b: int):
        return (torch.randn(b, m.num_q_heads, 1, m.head_dim, device=device).to(dtype),
                *(torch.randn(b, m.num_kv_heads, lv, m.head_dim, device=device).to(dtype) for _ in range(2)))

    one_fn, how_one = sdpa_call(torch, *sdpa_inputs(1), m.gqa)
    n_fn, how_n = sdpa_call(torch, *sdpa_inputs(n), m.gqa)
    one_us, n_us = (timed(graphed(f) or f) for f in (one_fn, n_fn))
    state.setdefault("sdpa", set()).update({how_one, how_n})
    esize = kv.key_cache.element_size()  # 1 for an FP8 cache; SDPA's copies are in the model dtype
    blocks = len(group.used_blocks)
    kv_bytes = blocks * m.num_kv_heads * m.block_size * m.head_dim * 2 * esize
    copies_bytes = n * lv * m.num_kv_heads * m.head_dim * 2 * torch.empty(0, dtype=dtype).element_size()
    entries = int(splits_written(torch, plan).sum())  # (pair, split) partials written
    partial_bytes = 2 * entries * m.num_q_heads * (m.head_dim + 2) * 4
    floor_us = kv_bytes / (args.hbm_tbps * 1e12) * 1e6
    kernel_us = graph_us if graph_us is not None else eager_us
    fmt = lambda x: "-" if x is None else f"{x:.1f}"  # noqa: E731
    return (f"| {m.name} | {n} | {lv:,} | {chunk} | {eager_us:.1f} | {fmt(graph_us)} | {fmt(merge_us)} | "
            f"{one_block_us:.1f} | {one_us:.1f} | "
            f"{n_us:.1f} | {n_us / kernel_us:.2f}x | {floor_us:.1f} | {kv_bytes / 1e6:.2f} | "
            f"{copies_bytes / 1e6:.2f} | {partial_bytes / 1e6:.2f} | {plan_ms:.1f} |")
