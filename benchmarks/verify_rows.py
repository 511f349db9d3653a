"""Micro-benchmark: a speculative verify step's Hogwild rows, on the compiled CPU op against the PyTorch item plan.

Usage::

    .venv/bin/python benchmarks/verify_rows.py [--tokens 5] [--rounds 15] [--json out.json]

One attention layer of SmolLM2-like shapes (those of ``benchmarks/segment_attention.py``)
over a synthetic Hogwild group in the ``contiguous`` layout: the prompt is half of the
view length L, the other half split evenly among the N workers. Every worker verifies
``--tokens`` query tokens (its last token and its drafts: 1 + ``num_speculative_tokens``),
one multi-token row each. Per (N, L):

- **buckets**: the PyTorch path (the item plan; before 2026-12-06 the block buckets), which ran every step with a multi-token row
  on the CPU before verify rows went to the compiled op;
- **compiled**: the compiled op, each verify row split into one row per token
  (:func:`vllm_hogwild.attention.segment_attention.single_token_rows`);
- **decode**: the compiled op on one decode row per worker, the step without drafts.

``plan`` is paid once per step (all layers), the others once per layer. The two verify
paths' outputs are compared first (relative error <= 1e-4). Medians of alternating rounds.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from segment_attention import (BLOCK_SIZE, DTYPE, HEAD_DIM, NUM_KV_HEADS, NUM_Q_HEADS,  # noqa: E402
                               alternate, median_time, rel_err, rope_spec)

from vllm_hogwild.attention import segment_attention as sa  # noqa: E402
from vllm_hogwild.core.views.spans import contiguous_views  # noqa: E402
from tools.synthetic import SyntheticGroup  # noqa: E402


def bench_one(n: int, length: int, tokens: int, rounds: int, sample_ms: float, seed: int = 0) -> dict:
    prompt = length // 2
    rest = length - prompt
    gen_lens = [rest // n + (1 if i < rest % n else 0) for i in range(n)]
    group = SyntheticGroup.build(prompt, gen_lens, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, "cpu_k_transposed", DTYPE,
                                 seed=seed)
    views = contiguous_views(prompt, group.lane_lens)
    verify_rows, decode_rows = group.rows(views, [tokens] * n), group.rows(views, [1] * n)
    query = torch.randn(n * tokens, NUM_Q_HEADS, HEAD_DIM, generator=torch.Generator().manual_seed(seed + 1))
    spec, scale = rope_spec(), 1.0 / math.sqrt(HEAD_DIM)

    def make(rows, mode):
        return lambda: sa.plan(rows, BLOCK_SIZE, spec, mode, num_tokens=query.shape[0])

    plans = {"buckets": make(verify_rows, sa.PlanMode.TORCH), "compiled": make(verify_rows, sa.PlanMode.CPU_OP),
             "decode": make(decode_rows, sa.PlanMode.CPU_OP)}
    plan_ms = {k: median_time(f, reps=max(3, rounds)) * 1e3 for k, f in plans.items()}
    built = {k: f() for k, f in plans.items()}
    layer = {k: (lambda p=p: sa.run(p, query, group.kv, scale=scale)) for k, p in built.items()}
    err = rel_err(layer["compiled"](), layer["buckets"]().to(torch.float64))
    if not err <= 1e-4:
        raise AssertionError(f"N={n} L={length}: compiled vs buckets relative error {err:.2e}")
    buckets_s, compiled_s, ratio = alternate(layer["buckets"], layer["compiled"], rounds, sample_ms)
    ratio = 1.0 / ratio  # alternate gives compiled / buckets, per round
    decode_s = median_time(layer["decode"], reps=max(3, rounds))
    return {"workers": n, "view_len": length, "query_tokens": tokens, "rel_err": err,
            "plan_ms": plan_ms, "buckets_ms_per_layer": buckets_s * 1e3, "compiled_ms_per_layer": compiled_s * 1e3,
            "decode_ms_per_layer": decode_s * 1e3, "buckets_over_compiled": ratio}


def markdown(results: list[dict], facts: dict) -> str:
    lines = [f"torch {facts['torch']}, threads = {facts['threads']} ({facts['machine']}), float32, "
             f"{facts['tokens']} query tokens per verify row, median of {facts['rounds']} alternating rounds.", "",
             "| N | view length | buckets ms/layer | compiled ms/layer | buckets / compiled | decode ms/layer | "
             "plan ms/step: buckets, compiled, decode |", "|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['workers']} | {r['view_len']} | {r['buckets_ms_per_layer']:.3f} | "
              f"{r['compiled_ms_per_layer']:.3f} | {r['buckets_over_compiled']:.2f}x | {r['decode_ms_per_layer']:.3f} | "
              f"{r['plan_ms']['buckets']:.2f}, {r['plan_ms']['compiled']:.2f}, {r['plan_ms']['decode']:.2f} |"
              for r in results]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=5, help="query tokens per verify row (1 + speculative tokens)")
    ap.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--sample-ms", type=float, default=20.0)
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    if sa.CPU_OP_MAX_ROW_TOKENS < args.tokens:
        ap.error(f"--tokens: the compiled op takes rows of up to {sa.CPU_OP_MAX_ROW_TOKENS} tokens")
    facts = {"torch": torch.__version__, "threads": torch.get_num_threads(), "machine": platform.machine(),
             "cpu_count": os.cpu_count(), "tokens": args.tokens, "rounds": args.rounds}
    results = [bench_one(n, length, args.tokens, args.rounds, args.sample_ms)
               for n in args.workers for length in args.lengths]
    print(markdown(results, facts))
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": facts, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
