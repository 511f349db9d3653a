"""Micro-benchmark: Hogwild segment attention vs materialize-the-view + SDPA (one layer, CPU).

Usage::

    .venv/bin/python benchmarks/segment_attention.py [--quick] [--json out.json] [--markdown]
        [--kv-layout cpu_k_transposed|cpu|plain] [--rounds R] [--threads T]

One attention layer of SmolLM2-like shapes (9 query heads, 3 KV heads, head_dim 64,
fp32, block size 32, default RoPE with theta 1e5) over a synthetic Hogwild group
(:class:`tools.synthetic.SyntheticGroup`: random K/V in a paged cache, the
prompt's full blocks shared by every lane, shuffled physical block ids). For N
workers and a view length L, the prompt is L // 2 tokens and the other half is
split evenly among the workers' generated text; ``contiguous`` layout, so every
worker's view is ``[prompt][co-workers' text][own text]`` = L tokens, and each
worker decodes one query token (the last token of its lane).

The two sides, measured in the same run:

- **segment**: :func:`vllm_hogwild.attention.segment_attention.plan` once per step (timed
  separately: it is paid once per step for all layers), then
  :func:`~vllm_hogwild.attention.segment_attention.run` per layer (timed: the per-layer cost).
- **materialize**: what the original Hogwild reference implementation does, per
  worker: token-granular gather of its view's K and V out of the paged cache into
  contiguous ``[L, Hkv, D]`` tensors (one ``index_select`` per tensor on the
  cache's own layout, see :class:`TokenGather`), re-rotation of every key from
  its stored position to its view position (:func:`vllm_hogwild.core.views.rope.rotate`
  with cos/sin of the per-token position difference), rotation of the query to
  its view position, and
  ``torch.nn.functional.scaled_dot_product_attention(..., enable_gqa=True)``.
  The gather indices and the cos/sin tables depend only on the step's views, so
  like ``plan`` they are built once per step outside the timed per-layer work
  (their cost is not reported); the timed work is the whole per-layer work for
  all N workers.

Before timing, both sides' outputs are compared (relative error = max |a - b| /
max |b| must be <= 1e-4 in fp32), so the benchmark compares like with like.

Timing: each side is warmed up, its inner repetition count is calibrated so that
one sample lasts ~``--sample-ms``, then the sides alternate A B A B ... for
``--rounds`` rounds (fair when another process shares the 2 cores) and the median
sample of each side is reported. ``speed ratio`` = materialize time / segment time,
taken as the median of the per-round ratios (each round's two samples ran back to
back, so a burst of load from another process hits both; > 1: segment attention is
faster). The 1-minute load average before and after the run goes into the machine
facts: on a 2-core machine a busy neighbour makes torch's 2 intra-op threads wait
for each other, which slows the many small ops of segment attention more than the
few large ops of SDPA; ``--threads 1`` is the robust choice on a shared machine.

Memory method: peak *extra* bytes of one per-layer call, measured with
``torch.profiler.profile(activities=[CPU], profile_memory=True)``: the profiler
records every CPU allocation and free (its ``[memory]`` events, read from the
exported trace) during the call; the peak is the maximum running sum of their
byte counts (allocations minus frees, in event order), i.e. the most memory the
call held above what existed before it, including its output. Frees of tensors
that existed before the call only lower the running sum. This is exact for
tensor allocations (no RSS noise); it does not count allocator slack.
``memory ratio`` = materialize peak / segment peak (> 1: segment attention uses
less).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from vllm_hogwild.attention import segment_attention as sa  # noqa: E402
from vllm_hogwild.attention.kv_layout import PagedKV, PlainPagedKV  # noqa: E402
from vllm_hogwild.core.views.rope import RopeSpec, rotate  # noqa: E402
from tools.synthetic import KV_LAYOUTS, SyntheticGroup  # noqa: E402
from vllm_hogwild.core.views.spans import View, contiguous_views  # noqa: E402

NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 9, 3, 64, 32
ROPE_THETA = 1e5
DTYPE = torch.float32
TOLERANCE = 1e-4

FULL = {"workers": (2, 4), "lengths": (1024, 2048, 4096, 8192), "rounds": 15, "sample_ms": 30.0}
QUICK = {"workers": (2,), "lengths": (1024,), "rounds": 3, "sample_ms": 10.0}


def rope_spec() -> RopeSpec:
    return RopeSpec.from_hf_config(
        {"model_type": "llama", "rope_theta": ROPE_THETA, "head_dim": HEAD_DIM,
         "hidden_size": HEAD_DIM * NUM_Q_HEADS, "num_attention_heads": NUM_Q_HEADS}
    )


# --------------------------------------------------------------------------- materialize side


@dataclass
class _WorkerView:
    k_index: torch.Tensor  # gather indices of the view's keys (see TokenGather)
    v_index: torch.Tensor  # ... and of its values
    k_cos: torch.Tensor  # [L, rotary_dim / 2]: stored -> view position of every key
    k_sin: torch.Tensor
    q_cos: torch.Tensor  # [1, rotary_dim / 2]: stored -> view position of the query
    q_sin: torch.Tensor


class TokenGather:
    """Token-granular reads of a view's K and V ``[L, Hkv, D]`` out of a paged cache, on its own layout.

    Each read is one ``index_select`` on a flat view of the cache with indices
    built once per step: rows of ``Hkv * D`` (``plain``: a token's heads are
    adjacent), rows of ``D`` (``cpu`` K and V: one row per token and head), or
    single elements (``cpu_k_transposed`` K, whose token dimension is innermost).
    Measured on this machine this is 1.5x (elements) to 6x (rows) faster than
    torch advanced indexing of the block/offset views, so the alternative gets
    its best plain-PyTorch shot.
    """

    def __init__(self, kv: PagedKV):
        self.kv = kv
        if isinstance(kv, PlainPagedKV):
            nb, bs, heads, d = kv.key_cache.shape
            self.k_src = kv.key_cache.reshape(nb * bs, heads * d)  # a view when contiguous
            self.v_src = kv.value_cache.reshape(nb * bs, heads * d)
            self.heads, self.d, self.bs = heads, d, bs
            return
        nb, heads, bs, two_d = kv.cache.shape
        self.heads, self.d, self.bs = heads, two_d // 2, bs
        self.v_src = kv.cache.view(-1, self.d)  # rows of D
        self.k_src = kv.cache.view(-1) if kv.k_transposed else self.v_src

    def indices(self, blocks: torch.Tensor, offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-step: indices of the tokens at ``blocks [L]``, ``offsets [L]``."""
        heads, d, bs = self.heads, self.d, self.bs
        if isinstance(self.kv, PlainPagedKV):
            rows = blocks * bs + offsets
            return rows, rows
        h = torch.arange(heads)
        head_base = (blocks[:, None] * heads + h[None, :]) * 2  # [L, H]: (block, head) pair, K half
        v_rows = ((head_base + 1) * bs + offsets[:, None]).reshape(-1)
        if not self.kv.k_transposed:
            return (head_base * bs + offsets[:, None]).reshape(-1), v_rows
        dd = torch.arange(d)
        k_elems = head_base[..., None] * (bs * d) + dd[None, None, :] * bs + offsets[:, None, None]
        return k_elems.reshape(-1), v_rows

    def __call__(self, k_index: torch.Tensor, v_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (-1, self.heads, self.d)
        return self.k_src.index_select(0, k_index).view(shape), self.v_src.index_select(0, v_index).view(shape)


def materialize_prepare(group: SyntheticGroup, views: list[View], spec: RopeSpec,
                        gather: TokenGather) -> list[_WorkerView]:
    """Per-step tables of the materialize side (not timed per layer, like ``plan``)."""
    out = []
    for view in views:
        stored = torch.cat([torch.arange(s.start, s.end) for s in view.spans])
        tables = [torch.tensor(group.block_tables[s.lane]) for s in view.spans]
        blocks = torch.cat([t[torch.arange(s.start, s.end) // BLOCK_SIZE] for t, s in zip(tables, view.spans)])
        k_index, v_index = gather.indices(blocks, stored % BLOCK_SIZE)
        k_cos, k_sin = spec.cos_sin(torch.arange(view.num_tokens) - stored)
        q_stored = view.own.end - 1  # one decode token: the last of its lane
        q_view = view.num_tokens - 1
        q_cos, q_sin = spec.cos_sin(torch.tensor([q_view - q_stored]))
        out.append(_WorkerView(k_index, v_index, k_cos, k_sin, q_cos, q_sin))
    return out


def _materialize_one(w: int, wv: _WorkerView, query: torch.Tensor, gather: TokenGather,
                     spec: RopeSpec, scale: float) -> torch.Tensor:
    k, v = gather(wv.k_index, wv.v_index)  # [L, Hkv, D] each, contiguous copies
    k = rotate(k, wv.k_cos, wv.k_sin, spec)  # every key to its view position
    q = rotate(query[w : w + 1], wv.q_cos, wv.q_sin, spec)  # [1, Hq, D] to its view position
    o = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
        scale=scale, enable_gqa=True,
    )  # [1, Hq, 1, D]
    return o[0].transpose(0, 1)  # [1, Hq, D]


def materialize_layer(prep: list[_WorkerView], query: torch.Tensor, gather: TokenGather,
                      spec: RopeSpec, scale: float) -> torch.Tensor:
    """The per-layer work for all N workers (one decode query each)."""
    return torch.cat([_materialize_one(w, wv, query, gather, spec, scale) for w, wv in enumerate(prep)])


# --------------------------------------------------------------------------- measurement


@contextlib.contextmanager
def _quiet_stderr():
    """The profiler's native code logs start/stop lines on fd 2; keep the report clean."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def peak_extra_bytes(fn) -> int:
    """Peak of (bytes allocated - bytes freed) during one call of ``fn``, from the profiler's memory events."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    with _quiet_stderr():
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            result = fn()
            del result
        fd, path = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        try:
            prof.export_chrome_trace(path)
            with open(path) as f:
                events = json.load(f)["traceEvents"]
        finally:
            os.unlink(path)
    mem = [e for e in events if e.get("name") == "[memory]"]
    mem.sort(key=lambda e: (float(e["ts"]), e["args"].get("Ev Idx", 0)))
    running = peak = 0
    for e in mem:
        running += int(e["args"]["Bytes"])
        peak = max(peak, running)
    return peak


def _calibrate(fn, sample_s: float) -> int:
    one = max(median_time(fn, reps=5), 1e-6)  # a median: one stalled call must not set the count
    return max(1, math.ceil(sample_s / one))


def _sample(fn, reps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def alternate(fa, fb, rounds: int, sample_ms: float) -> tuple[float, float, float]:
    """Warm both up, then A B A B ... ``rounds`` times.

    Returns the median seconds per call of each and the median of the per-round
    ratios b / a (each round's two samples ran back to back, under the same load).
    """
    for _ in range(3):
        fa(), fb()
    ra, rb = _calibrate(fa, sample_ms / 1e3), _calibrate(fb, sample_ms / 1e3)
    sa_, sb_ = [], []
    for _ in range(rounds):
        sa_.append(_sample(fa, ra))
        sb_.append(_sample(fb, rb))
    ratio = statistics.median(b / a for a, b in zip(sa_, sb_))
    return statistics.median(sa_), statistics.median(sb_), ratio


def median_time(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.double() - ref.double()).abs().max() / ref.double().abs().max()).item()


# --------------------------------------------------------------------------- one configuration


PATHS = ("torch", "compiled")


def bench_one(n: int, length: int, kv_layout: str, rounds: int, sample_ms: float, seed: int = 0,
              path: str = "torch") -> dict:
    prompt = length // 2
    rest = length - prompt
    gen_lens = [rest // n + (1 if i < rest % n else 0) for i in range(n)]
    group = SyntheticGroup.build(prompt, gen_lens, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, kv_layout, DTYPE, seed=seed)
    views = contiguous_views(prompt, group.lane_lens)
    assert all(v.num_tokens == length for v in views), [v.num_tokens for v in views]
    rows = group.rows(views, [1] * n)
    query = torch.randn(n, NUM_Q_HEADS, HEAD_DIM, generator=torch.Generator().manual_seed(seed + 1)).to(DTYPE)
    spec = rope_spec()
    scale = 1.0 / math.sqrt(HEAD_DIM)

    def make_plan():
        mode = sa.PlanMode.CPU_OP if path == "compiled" else sa.PlanMode.TORCH
        return sa.plan(rows, BLOCK_SIZE, spec, mode, num_tokens=n)

    plan_s = median_time(make_plan, reps=max(3, rounds))
    p = make_plan()
    gather = TokenGather(group.kv)
    prep = materialize_prepare(group, views, spec, gather)

    def segment():
        return sa.run(p, query, group.kv, scale=scale)

    def materialize():
        return materialize_layer(prep, query, gather, spec, scale)

    err = rel_err(segment(), materialize())
    if not err <= TOLERANCE:
        raise AssertionError(f"N={n} L={length}: segment vs materialize relative error {err:.2e} > {TOLERANCE:.0e}")

    seg_s, mat_s, ratio = alternate(segment, materialize, rounds, sample_ms)
    seg_peak, mat_peak = peak_extra_bytes(segment), peak_extra_bytes(materialize)
    return {
        "workers": n,
        "view_len": length,
        "prompt_len": prompt,
        "gen_lens": gen_lens,
        "segment_path": path,
        "rel_err": err,
        "plan_ms_per_step": plan_s * 1e3,
        "segment_ms_per_layer": seg_s * 1e3,
        "materialize_ms_per_layer": mat_s * 1e3,
        "speed_ratio": ratio,
        "segment_peak_mib": seg_peak / 2**20,
        "materialize_peak_mib": mat_peak / 2**20,
        "memory_ratio": mat_peak / seg_peak if seg_peak else float("nan"),
    }


# --------------------------------------------------------------------------- report


def machine_facts(kv_layout: str, rounds: int, path: str) -> dict:
    return {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "kv_layout": kv_layout,
        "segment_path": path,
        "dtype": str(DTYPE).replace("torch.", ""),
        "shapes": f"{NUM_Q_HEADS} q heads, {NUM_KV_HEADS} kv heads, head_dim {HEAD_DIM}, block_size {BLOCK_SIZE}",
        "rounds": rounds,
        "loadavg_1min_before": round(os.getloadavg()[0], 2),
    }


HEADER = ["N", "view length", "segment ms/layer", "materialize+SDPA ms/layer", "speed ratio",
          "segment peak MiB", "materialize peak MiB", "memory ratio", "plan ms/step"]


def _cells(r: dict) -> list[str]:
    return [
        str(r["workers"]), str(r["view_len"]),
        f"{r['segment_ms_per_layer']:.3f}", f"{r['materialize_ms_per_layer']:.3f}",
        f"{r['speed_ratio']:.2f}x",
        f"{r['segment_peak_mib']:.2f}", f"{r['materialize_peak_mib']:.2f}",
        f"{r['memory_ratio']:.2f}x", f"{r['plan_ms_per_step']:.2f}",
    ]


def markdown(results: list[dict], facts: dict) -> str:
    lines = [
        f"torch {facts['torch']}, threads = {facts['threads']} (cpu_count {facts['cpu_count']}, "
        f"{facts['machine']}), {facts['dtype']}, {facts['shapes']}, KV layout `{facts['kv_layout']}`, "
        f"segment path `{facts['segment_path']}`, "
        f"median of {facts['rounds']} alternating rounds; 1-min load average "
        f"{facts['loadavg_1min_before']} before, {facts.get('loadavg_1min_after', '?')} after "
        f"({facts.get('wall_s', '?')} s).",
        "",
        "| " + " | ".join(HEADER) + " |",
        "|" + "|".join("---:" for _ in HEADER) + "|",
    ]
    lines += ["| " + " | ".join(_cells(r)) + " |" for r in results]
    return "\n".join(lines)


def plain_table(results: list[dict]) -> str:
    rows = [HEADER] + [_cells(r) for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke test: N=2, L=1024, few rounds")
    ap.add_argument("--json", metavar="PATH", help="write machine facts and results as JSON")
    ap.add_argument("--markdown", action="store_true", help="print a markdown table")
    ap.add_argument("--kv-layout", default="cpu_k_transposed", choices=KV_LAYOUTS)
    ap.add_argument("--rounds", type=int, help="alternating A/B rounds (default 15, quick 3)")
    ap.add_argument("--sample-ms", type=float, help="target length of one timing sample")
    ap.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--isa", default=None, help="the compiled op's vector path (avx512, avx2, generic; "
                                                "default: the widest it has)")
    ap.add_argument("--path", default="torch", choices=PATHS,
                    help="segment attention path: torch (the item plan in PyTorch), "
                         "compiled (the CPU op; CPU cache layouts only)")
    args = ap.parse_args(argv)

    cfg = QUICK if args.quick else FULL
    rounds = args.rounds or cfg["rounds"]
    sample_ms = args.sample_ms or cfg["sample_ms"]
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.path == "compiled" and args.kv_layout == "plain":
        ap.error("--path compiled reads vLLM's CPU cache layouts only")
    facts = machine_facts(args.kv_layout, rounds, args.path)
    if args.path == "compiled":
        from vllm_hogwild.attention import cpu_ops

        facts["segment_path"] = f"compiled ({cpu_ops.use(args.isa)})"
    print(f"# segment attention micro-benchmark: torch {facts['torch']}, threads {facts['threads']}, "
          f"{facts['dtype']}, {facts['shapes']}, KV layout {facts['kv_layout']}", flush=True)

    results = []
    t0 = time.perf_counter()
    for n in cfg["workers"]:
        for length in cfg["lengths"]:
            r = bench_one(n, length, args.kv_layout, rounds, sample_ms, path=args.path)
            results.append(r)
            print(f"N={n} L={length}: segment {r['segment_ms_per_layer']:.3f} ms, materialize "
                  f"{r['materialize_ms_per_layer']:.3f} ms, ratio {r['speed_ratio']:.2f}x, "
                  f"rel err {r['rel_err']:.1e}", flush=True)
    facts["wall_s"] = round(time.perf_counter() - t0, 1)
    facts["loadavg_1min_after"] = round(os.getloadavg()[0], 2)

    print()
    print(plain_table(results))
    if args.markdown:
        print()
        print(markdown(results, facts))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": facts, "results": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
