"""Fairness under load: plain requests' latency against Hogwild groups', through a running server, over rounds.

    python -c "from pathlib import Path; from vllm_hogwild.models.tiny import build_tiny_llama; \\
               build_tiny_llama(Path('/tmp/tiny-llama'))"
    vllm serve /tmp/tiny-llama --plugin hogwild --hogwild-max-workers 4 --block-size 32 \\
        --num-gpu-blocks-override 72 --max-num-seqs 64 --hogwild-client-patterns off \\
        --served-model-name tiny --dtype float32 --max-model-len 2048 --enforce-eager \\
        [--hogwild-max-plain-wait S]
    .venv/bin/python benchmarks/load_fairness.py --url http://127.0.0.1:8000/v1 --model tiny [--rounds 5]

The server above is the load test's (``tests/server/test_load.py``: a KV cache of 72 blocks of 32 tokens,
which the load saturates). Each round sends the load test's seeded mix
(``vllm_hogwild.serving.loadtest``: 300 requests, 40% plain, 30% groups of 2, 30% groups of 4, 24 tokens
per sequence, at concurrency 48) with a seed of its own, and reports the plain class's p50 and p95
latency, the lowest of the group classes', and the ratios; then the median ratios over the rounds, against
the documented target: plain p95 at most 1.25x the lowest group p95 (``docs/deploying.md``, fairness).
The test checks the behaviour only, on medians, with a bound that holds on a loaded machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

from vllm_hogwild.serving.loadtest import KINDS, fairness, make_mix, run_load, summarize

TARGET = 1.25  # plain p95 / lowest group p95


def lowest_group(rows: list[dict], key: str) -> float:
    """The lowest ``key`` of the group classes that completed requests (``nan`` when none did)."""
    values = [r[key] for r in rows if r["kind"] in KINDS[1:] and r[key] > 0]
    return min(values) if values else float("nan")


def round_row(index: int, seed: int, rows: list[dict], wall_s: float) -> dict:
    """One round's figures from its ``summarize`` rows."""
    plain = next(r for r in rows if r["kind"] == KINDS[0])
    return {"round": index, "seed": seed, "wall_s": wall_s, "errored": rows[-1]["errored"],
            "plain_p50_s": plain["p50_s"], "group_p50_s": lowest_group(rows, "p50_s"),
            "plain_p95_s": plain["p95_s"], "group_p95_s": lowest_group(rows, "p95_s"),
            "p50_ratio": fairness(rows, "p50_s"), "p95_ratio": fairness(rows, "p95_s")}


def report(rounds: list[dict], target: float = TARGET) -> dict:
    p95 = statistics.median(r["p95_ratio"] for r in rounds)
    return {"benchmark": "load_fairness", "target_p95_ratio": target, "rounds": rounds,
            "median_p50_ratio": statistics.median(r["p50_ratio"] for r in rounds), "median_p95_ratio": p95,
            "meets_target": p95 <= target}


def markdown(rep: dict) -> str:
    lines = ["| round | seed | plain p50 s | group p50 s | plain p95 s | group p95 s | p50 ratio | p95 ratio "
             "| errored |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rep["rounds"]:
        lines.append(f"| {r['round']} | {r['seed']} | {r['plain_p50_s']:.2f} | {r['group_p50_s']:.2f} | "
                     f"{r['plain_p95_s']:.2f} | {r['group_p95_s']:.2f} | {r['p50_ratio']:.2f} | "
                     f"{r['p95_ratio']:.2f} | {r['errored']} |")
    met = "met" if rep["meets_target"] else "not met"
    lines.append(f"\nmedian over {len(rep['rounds'])} rounds: plain p50 / group p50 {rep['median_p50_ratio']:.2f}, "
                 f"plain p95 / group p95 {rep['median_p95_ratio']:.2f} (target at most "
                 f"{rep['target_p95_ratio']:.2f}: {met})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmarks/load_fairness.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True, help="the server's OpenAI base URL, e.g. http://127.0.0.1:8000/v1")
    ap.add_argument("--model", required=True, help="the served model name")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--concurrency", type=int, default=48)
    ap.add_argument("--max-tokens", type=int, default=24, help="per worker")
    ap.add_argument("--deadline", type=float, default=240.0, help="seconds before a request counts as hung")
    ap.add_argument("--seed", type=int, default=0, help="the first round's mix; round k uses seed + k")
    ap.add_argument("--json", help="write the report here")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.requests < 1 or args.concurrency < 1:
        ap.error("--rounds, --requests and --concurrency must be at least 1")
    rounds = []
    for k in range(args.rounds):
        seed = args.seed + k
        start = time.perf_counter()
        outcomes = asyncio.run(run_load(args.url, args.model, make_mix(args.requests, args.max_tokens, seed),
                                        args.concurrency, args.deadline))
        rounds.append(round_row(k, seed, summarize(outcomes), time.perf_counter() - start))
        print(json.dumps(rounds[-1]), flush=True)
    rep = report(rounds)
    print(markdown(rep))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rep, f, indent=1)
    return 1 if any(r["errored"] for r in rounds) else 0


if __name__ == "__main__":
    raise SystemExit(main())
