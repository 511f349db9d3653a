"""Time to first token and decode tokens/s per worker through a running server, Hogwild vs stock.

    vllm serve MODEL --plugin hogwild --hogwild-max-workers 4
    .venv/bin/python benchmarks/serve_latency.py --base-url http://127.0.0.1:8000/v1 --workers 2 4

For each n it streams the same chat request as a plain request (n=1), as stock
vLLM parallel sampling (n=N, no Hogwild options) and as a Hogwild group
(n=N, contiguous, raw), all on the one server in the same run, and prints the
median over --rounds of:

- TTFT first / last: from sending the request to the first token of the first
  (last) worker to start;
- decode tok/s per worker: (tokens - 1) / (last token - first token), mean over
  workers; total: summed over workers;
- Hogwild / stock: the ratio of total decode tokens/s, same n.

Tokens are counted exactly from the ``token_ids`` vLLM returns with each chunk.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass

from openai import OpenAI


@dataclass
class Run:
    ttft_first: float
    ttft_last: float
    decode_per_worker: list[float]

    @property
    def total(self) -> float:
        return sum(self.decode_per_worker)


def stream_once(client: OpenAI, model: str, prompt: str, n: int, hogwild: bool, max_tokens: int) -> Run:
    extra: dict = {"ignore_eos": True, "return_token_ids": True}
    if hogwild:
        extra["vllm_xargs"] = {"hogwild_layout": "contiguous", "hogwild_protocol": "raw"}
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    tokens: dict[int, int] = {}
    start = time.perf_counter()
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], n=n, max_tokens=max_tokens,
        temperature=0.7, seed=1, stream=True, extra_body=extra)
    for chunk in stream:
        now = time.perf_counter() - start
        for choice in chunk.choices:
            k = len(getattr(choice, "token_ids", None) or [])
            if k:
                first.setdefault(choice.index, now)
                last[choice.index] = now
                tokens[choice.index] = tokens.get(choice.index, 0) + k
    decode = [(tokens[i] - 1) / (last[i] - first[i]) for i in sorted(tokens) if last[i] > first[i]]
    return Run(min(first.values()), max(first.values()), decode)


def median_run(runs: list[Run]) -> Run:
    med = statistics.median
    n = len(runs[0].decode_per_worker)
    return Run(med(r.ttft_first for r in runs), med(r.ttft_last for r in runs),
               [med(r.decode_per_worker[i] for r in runs) for i in range(n)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--model", default=None, help="default: the first model the server lists")
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompt", default="Plan a picnic for a group of friends: what should each bring?")
    args = parser.parse_args()

    client = OpenAI(base_url=args.base_url, api_key="unused", max_retries=0)
    model = args.model or client.models.list().data[0].id
    print(f"model {model}, max_tokens {args.max_tokens} per worker, median of {args.rounds} rounds\n")
    print(f"| request | n | TTFT first (ms) | TTFT last (ms) | decode tok/s per worker | total tok/s | Hogwild / stock |")
    print("|---|---|---|---|---|---|---|")
    cases = [("plain", 1, False)] + [(mode, n, mode == "hogwild") for n in args.workers for mode in ("stock", "hogwild")]
    totals: dict[int, float] = {}
    for label, n, hogwild in cases:
        stream_once(client, model, args.prompt, n, hogwild, 4)  # warm this shape
        run = median_run([stream_once(client, model, args.prompt, n, hogwild, args.max_tokens)
                          for _ in range(args.rounds)])
        ratio = ""
        if label == "stock":
            totals[n] = run.total
        elif label == "hogwild":
            ratio = f"{run.total / totals[n]:.2f}"
        per = statistics.mean(run.decode_per_worker)
        print(f"| {label} | {n} | {run.ttft_first * 1000:.0f} | {run.ttft_last * 1000:.0f} | {per:.1f} "
              f"| {run.total:.1f} | {ratio} |", flush=True)


if __name__ == "__main__":
    main()
