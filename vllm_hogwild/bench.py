"""Benchmarks against stock vLLM, measured side by side in one engine.

    python -m vllm_hogwild.bench decode [--workers 2 4] [--prompt-lens 200 1500]
                                        [--max-tokens 256] [--rounds 2] [--json out.json]

``decode``: decode tokens/s of a Hogwild group of N workers vs stock ``n=N``
sampling of the same prompt, in the same engine (the stock requests take
vLLM's own code paths there). Decode time is a run's wall time minus the
wall time of the same request with ``max_tokens=1`` (prefill and first
token), so both sides pay the same prefill. Runs alternate A B A B with fresh
prompts (no prefix-cache reuse between runs); medians are reported. Also
reported per group, from the scheduler: prompt tokens computed and KV blocks
held at its end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time


def _engine(model: str | None, max_model_len: int):
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the scheduler's stats are read in-process
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    from vllm import LLM

    from vllm_hogwild.default_model import prepare

    return LLM(model=model or str(prepare()), dtype="float32", enforce_eager=True, seed=0,
               max_model_len=max_model_len, additional_config={"hogwild": {}})


def _prompt(length: int, salt: int) -> dict:
    # Distinct token ids per run: nothing is served from the prefix cache.
    return {"prompt_token_ids": [(1000 + 7919 * salt + 31 * i) % 40000 + 100 for i in range(length)]}


def _timed(llm, prompt, params) -> float:
    t = time.perf_counter()
    llm.generate([prompt], params, use_tqdm=False)
    return time.perf_counter() - t


def decode(args) -> dict:
    from vllm import SamplingParams

    llm = _engine(args.model, max(args.prompt_lens) + max(args.workers) * args.max_tokens + 16)
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    results = []
    salt = 0
    for n in args.workers:
        for p in args.prompt_lens:
            times: dict[str, list[float]] = {"stock": [], "hogwild": []}
            for _ in range(args.rounds):
                for kind in ("stock", "hogwild"):
                    extra = {"hogwild": {"layout": "contiguous"}} if kind == "hogwild" else None

                    def params(m: int):
                        return SamplingParams(n=n, temperature=1.0, seed=salt, max_tokens=m,
                                              ignore_eos=True, extra_args=extra)

                    salt += 1
                    full = _timed(llm, _prompt(p, salt), params(args.max_tokens))
                    if kind == "hogwild":
                        group = scheduler.stats.ended[-1]
                    salt += 1
                    first = _timed(llm, _prompt(p, salt), params(1))
                    times[kind].append(full - first)
            tps = {k: n * (args.max_tokens - 1) / statistics.median(v) for k, v in times.items()}
            row = {
                "workers": n, "prompt_len": p, "max_tokens": args.max_tokens,
                "stock_decode_tok_s": tps["stock"], "hogwild_decode_tok_s": tps["hogwild"],
                "ratio": tps["hogwild"] / tps["stock"],
                "prefill_tokens_per_group": group.num_prefill_tokens,
                "blocks_held_at_end": group.num_blocks_held,
                "lane_lens": group.lane_lens,
            }
            results.append(row)
            print(json.dumps(row), flush=True)
    return {"benchmark": "decode", "block_size": llm.llm_engine.vllm_config.cache_config.block_size,
            "omp_threads_bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "(vLLM default)"),
            "results": results}


def markdown(report: dict) -> str:
    lines = ["| N | prompt | new tokens | stock n=N tok/s | Hogwild tok/s | ratio | prompt tokens computed | blocks held at end |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in report["results"]:
        lines.append(f"| {r['workers']} | {r['prompt_len']} | {r['max_tokens']} | {r['stock_decode_tok_s']:.1f} | "
                     f"{r['hogwild_decode_tok_s']:.1f} | {r['ratio']:.2f} | {r['prefill_tokens_per_group']} | "
                     f"{r['blocks_held_at_end']} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("decode", help="Hogwild group vs stock n=N decode tokens/s")
    d.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    d.add_argument("--prompt-lens", type=int, nargs="+", default=[200, 1500])
    d.add_argument("--max-tokens", type=int, default=256)
    d.add_argument("--rounds", type=int, default=2)
    d.add_argument("--model", default=None)
    d.add_argument("--json", default=None)
    args = parser.parse_args()
    report = decode(args)
    print(markdown(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
