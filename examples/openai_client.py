"""Hogwild through the stock `openai` client: one request with n=N runs N workers.

    vllm serve <model> --plugin hogwild --hogwild-max-workers 4
    .venv/bin/python examples/openai_client.py [--workers 2] [--route completions|chat|errors|all]

A Hogwild group is an ordinary OpenAI request with `n=N` plus the Hogwild fields in
`vllm_xargs` (sent through `extra_body`); choice i is worker i. This script shows:

  completions  /v1/completions, non-streaming: each worker's text and the group's usage
  chat         /v1/chat/completions, streaming: deltas as they arrive, then time to first
               token and tokens/s per worker, measured here on the client
  errors       a bad Hogwild field (unknown layout) -> HTTP 400 naming the field

vLLM refuses n>1 with temperature=0; for greedy workers pass --top-k 1 instead.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass, field
from typing import Any

import openai
from openai import OpenAI


def hogwild_body(layout: str, top_k: int | None) -> dict[str, Any]:
    """The `extra_body` of a Hogwild request: flat `hogwild_*` keys under vllm_xargs."""
    body: dict[str, Any] = {"vllm_xargs": {"hogwild_layout": layout, "hogwild_protocol": "raw"}}
    if top_k is not None:
        body["top_k"] = top_k  # a vLLM sampling extension, also sent through extra_body
    return body


def run_completions(client: OpenAI, args: argparse.Namespace) -> None:
    """(a) Non-streaming /v1/completions: one response, one choice per worker."""
    print(f"== /v1/completions, {args.workers} workers, layout={args.layout} ==")
    response = client.completions.create(
        model=args.model, prompt=args.prompt, n=args.workers, max_tokens=args.max_tokens,
        temperature=args.temperature, extra_body=hogwild_body(args.layout, args.top_k))
    for choice in sorted(response.choices, key=lambda c: c.index):
        print(f"--- worker {choice.index} (finish_reason={choice.finish_reason}) ---")
        print(choice.text.strip() or "<empty>")
    # Usage is for the whole group: completion_tokens sums every worker's tokens.
    usage = response.usage
    if usage is not None:
        print(f"usage: prompt={usage.prompt_tokens} completion={usage.completion_tokens} "
              f"total={usage.total_tokens}")
    print()


@dataclass
class WorkerStats:
    """What the client saw of one worker (one choice index) in the stream."""
    tokens: int = 0                   # tokens received for this worker (see count_tokens)
    first_token_s: float | None = None  # seconds from sending the request to its first content
    last_token_s: float = 0.0         # seconds from sending the request to its last token
    finish_reason: str | None = None
    text: list[str] = field(default_factory=list)


def count_tokens(choice: Any) -> int:
    """Tokens carried by one stream choice.

    We ask vLLM for `return_token_ids`, so each choice chunk lists the exact token ids it
    carries (the final EOS included, although its text is empty); those are what we count.
    Without them (another server) we fall back to counting chunks with non-empty content,
    which is one per token here but misses EOS and tokens whose text is still incomplete.
    """
    token_ids = getattr(choice, "token_ids", None)
    if token_ids is not None:
        return len(token_ids)
    return 1 if choice.delta.content else 0


def run_chat_stream(client: OpenAI, args: argparse.Namespace) -> None:
    """(b) Streaming /v1/chat/completions: deltas of all workers arrive interleaved."""
    print(f"== /v1/chat/completions (stream), {args.workers} workers, layout={args.layout} ==")
    extra_body = hogwild_body(args.layout, args.top_k) | {"return_token_ids": True}
    stats = {i: WorkerStats() for i in range(args.workers)}
    usage = None
    start = time.perf_counter()
    stream = client.chat.completions.create(
        model=args.model, messages=[{"role": "user", "content": args.prompt}], n=args.workers,
        max_tokens=args.max_tokens, temperature=args.temperature, stream=True,
        stream_options={"include_usage": True},  # a last chunk with the group's usage
        extra_body=extra_body)
    for chunk in stream:
        now = time.perf_counter() - start
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:  # each chunk carries one worker's delta, by index
            worker = stats.setdefault(choice.index, WorkerStats())
            content = choice.delta.content or ""
            n_tokens = count_tokens(choice)
            worker.tokens += n_tokens
            if n_tokens:
                worker.last_token_s = now
            if content:
                if worker.first_token_s is None:
                    worker.first_token_s = now
                worker.text.append(content)
                print(f"[w{choice.index}] {content!r}")
            if choice.finish_reason is not None:
                worker.finish_reason = choice.finish_reason

    print()
    for index, worker in sorted(stats.items()):
        print(f"--- worker {index} (finish_reason={worker.finish_reason}) ---")
        print("".join(worker.text).strip() or "<empty>")
    print()
    print_timing(stats)
    if usage is not None:
        counted = sum(w.tokens for w in stats.values())
        print(f"usage: prompt={usage.prompt_tokens} completion={usage.completion_tokens} "
              f"total={usage.total_tokens} (counted per worker: {counted})")
    print()


def print_timing(stats: dict[int, WorkerStats]) -> None:
    """Client-side time to first token and throughput, overall and per worker.

    tok/s is a worker's tokens over the time from sending the request to its last token
    (so it includes the prefill); decode tok/s leaves the first token out:
    (tokens - 1) / (last - first).
    """
    firsts = [w.first_token_s for w in stats.values() if w.first_token_s is not None]
    if firsts:
        print(f"time to first token (any worker): {min(firsts) * 1000:.0f} ms")
    print(f"{'worker':>6} {'tokens':>6} {'TTFT ms':>8} {'last ms':>8} {'tok/s':>7} {'decode tok/s':>12}")
    for index, w in sorted(stats.items()):
        ttft = f"{w.first_token_s * 1000:.0f}" if w.first_token_s is not None else "-"
        rate = f"{w.tokens / w.last_token_s:.1f}" if w.last_token_s > 0 else "-"
        span = w.last_token_s - (w.first_token_s or 0.0)
        decode = f"{(w.tokens - 1) / span:.1f}" if w.tokens > 1 and span > 0 else "-"
        print(f"{index:>6} {w.tokens:>6} {ttft:>8} {w.last_token_s * 1000:>8.0f} {rate:>7} {decode:>12}")


def run_error(client: OpenAI, args: argparse.Namespace) -> bool:
    """(c) A bad Hogwild field is refused up front with HTTP 400 naming it."""
    print("== error path: hogwild_layout='diagonal' ==")
    try:
        client.completions.create(
            model=args.model, prompt=args.prompt, n=args.workers, max_tokens=args.max_tokens,
            temperature=args.temperature, extra_body=hogwild_body("diagonal", args.top_k))
    except openai.BadRequestError as error:
        # error.body is the server's {"message", "type", "param", "code"} object.
        body = error.body if isinstance(error.body, dict) else {}
        print(f"HTTP {error.status_code}: {body.get('message', error.message)}")
        print()
        return True
    print("unexpected: the server accepted an unknown layout (is the hogwild plugin loaded?)\n")
    return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "EMPTY"))
    parser.add_argument("--model", default=None, help="default: the first model the server lists")
    parser.add_argument("--workers", type=int, default=2, help="n: the number of Hogwild workers")
    parser.add_argument("--layout", default="contiguous", choices=["contiguous", "isolated"])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.7, help="must be > 0 for n > 1")
    parser.add_argument("--top-k", type=int, default=None, help="1 for greedy workers")
    parser.add_argument("--prompt", default="List some fruits and some vegetables.")
    parser.add_argument("--route", default="all", choices=["completions", "chat", "errors", "all"])
    args = parser.parse_args()

    client = OpenAI(base_url=args.base_url, api_key=args.api_key)
    if args.model is None:
        args.model = client.models.list().data[0].id
    print(f"server {args.base_url}, model {args.model}\n")

    ok = True
    if args.route in ("completions", "all"):
        run_completions(client, args)
    if args.route in ("chat", "all"):
        run_chat_stream(client, args)
    if args.route in ("errors", "all"):
        ok = run_error(client, args)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
