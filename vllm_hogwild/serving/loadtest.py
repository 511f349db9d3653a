"""A bounded load test for an OpenAI-compatible server with the Hogwild plugin (one server or replicas).

::

    python -m vllm_hogwild.serving.loadtest --url http://127.0.0.1:8000/v1 --model NAME \\
        [--requests 300] [--concurrency 48] [--max-tokens 24] [--json out.json]

It sends a fixed, seeded mix of ``/v1/completions`` requests at a bounded
concurrency: plain greedy requests, Hogwild groups of 2 and of 4 workers, half
of each kind streamed, and one streamed request in five of each Hogwild kind
cancelled (the client closes the stream) after its first chunks. Every request
has a deadline, so a hang shows up as a ``timeout`` outcome instead of a stuck
run. It prints one row per kind: requests, completed, cancelled, errored (by
reason), and p50 / p95 latency of the completed ones.

The tests (``tests/server/test_load.py``) run it against a real server with a
small KV cache and check every outcome; ``docs/deploying.md`` has the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from collections import Counter
from dataclasses import asdict, dataclass, field

KINDS = ("plain", "hogwild-2", "hogwild-4")
WORKERS = {"plain": 1, "hogwild-2": 2, "hogwild-4": 4}
WORDS = ("apple", "river", "seven", "prime", "graph", "count", "split", "merge", "table", "light", "north", "stone")


@dataclass(frozen=True)
class Spec:
    index: int
    kind: str
    stream: bool
    cancel_after: int | None  # chunks read before the client closes the stream
    prompt: str
    max_tokens: int
    seed: int

    @property
    def n(self) -> int:
        return WORKERS[self.kind]

    def body(self) -> dict:
        """The request's arguments for ``client.completions.create``."""
        args = dict(prompt=self.prompt, max_tokens=self.max_tokens, n=self.n, stream=self.stream)
        if self.kind == "plain":
            return {**args, "temperature": 0.0}
        xargs = {"hogwild_protocol": "raw", "hogwild_layout": "contiguous"}
        return {**args, "temperature": 0.8, "seed": self.seed, "extra_body": {"vllm_xargs": xargs}}


@dataclass
class Outcome:
    spec: Spec
    status: str  # completed | cancelled | error | timeout
    latency_s: float
    texts: list[str] = field(default_factory=list)  # completed: one per choice
    reason: str = ""  # error: exception class and HTTP status
    # streamed: the chunks read. vLLM merges a stream's pending outputs while its client reads late, so a whole
    # answer can come in fewer chunks than a spec's ``cancel_after``: then it completes.
    chunks: int = 0


def make_mix(count: int, max_tokens: int = 24, seed: int = 0) -> list[Spec]:
    """``count`` requests: 40% plain, 30% groups of 2, 30% groups of 4, shuffled with ``seed``."""
    rng = random.Random(seed)
    kinds = [KINDS[0]] * (count * 4 // 10) + [KINDS[1]] * (count * 3 // 10)
    kinds += [KINDS[2]] * (count - len(kinds))
    rng.shuffle(kinds)
    specs, streamed = [], Counter()
    for i, kind in enumerate(kinds):
        stream = i % 2 == 1
        cancel = None
        if stream and kind != "plain":
            streamed[kind] += 1
            if streamed[kind] % 5 == 0:
                cancel = rng.randint(1, 4)
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 40)))
        specs.append(Spec(i, kind, stream, cancel, f"Request {i}: {words}.", max_tokens, 1000 + i))
    return specs


async def run_one(client, model: str, spec: Spec, deadline_s: float) -> Outcome:
    start = time.perf_counter()

    def done(status: str, texts=(), reason: str = "", chunks: int = 0) -> Outcome:
        return Outcome(spec, status, time.perf_counter() - start, list(texts), reason, chunks)

    async def call() -> Outcome:
        body = spec.body()
        if not spec.stream:
            resp = await client.completions.create(model=model, **body)
            texts = [""] * spec.n
            for choice in resp.choices:
                texts[choice.index] = choice.text
            return done("completed", texts)
        stream = await client.completions.create(model=model, **body)
        texts, chunks = [""] * spec.n, 0
        async for chunk in stream:
            for choice in chunk.choices:
                texts[choice.index] += choice.text
            chunks += 1
            if spec.cancel_after is not None and chunks >= spec.cancel_after:
                await stream.close()
                return done("cancelled", chunks=chunks)
        return done("completed", texts, chunks=chunks)

    try:
        return await asyncio.wait_for(call(), deadline_s)
    except asyncio.TimeoutError:
        return done("timeout", reason=f"no answer within {deadline_s:.0f} s")
    except Exception as err:  # any client-visible failure is an outcome, never a crash of the run
        status = getattr(err, "status_code", None)
        cause = err.__cause__ or err.__context__
        detail = f" ({type(cause).__name__}: {str(cause)[:120]})" if cause is not None else ""
        return done("error", reason=f"{type(err).__name__}" + (f" {status}" if status else "") + detail)


async def run_load(base_url: str, model: str, specs: list[Spec], concurrency: int,
                   deadline_s: float = 180.0) -> list[Outcome]:
    """Every spec once, at most ``concurrency`` in flight; outcomes in spec order."""
    import httpx
    import openai

    # Every request on a connection of its own: reusing a kept-alive connection that the server is
    # closing at that moment fails the request with a ReadError that says nothing about the server.
    # Dropping idle connections after 2 s, before uvicorn's 5 s keep-alive timeout, still let one
    # ReadError through in 300 requests on a loaded 2-core machine, with nothing in the server's log.
    # A loopback connect costs well under a millisecond. No retries: every failure is counted.
    http = httpx.AsyncClient(limits=httpx.Limits(max_connections=2 * concurrency, max_keepalive_connections=0),
                             timeout=deadline_s)
    client = openai.AsyncOpenAI(base_url=base_url, api_key="EMPTY", max_retries=0, timeout=deadline_s,
                                http_client=http)
    gate = asyncio.Semaphore(concurrency)

    async def gated(spec: Spec) -> Outcome:
        async with gate:
            return await run_one(client, model, spec, deadline_s)

    try:
        return list(await asyncio.gather(*(gated(s) for s in specs)))
    finally:
        await client.close()


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q) - 1]


def summarize(outcomes: list[Outcome]) -> list[dict]:
    """One row per kind, then the whole."""
    rows = []
    for kind in (*KINDS, "all"):
        mine = [o for o in outcomes if kind in ("all", o.spec.kind)]
        lat = [o.latency_s for o in mine if o.status == "completed"]
        errors = Counter(o.reason for o in mine if o.status in ("error", "timeout"))
        rows.append({
            "kind": kind,
            "requests": len(mine),
            "streamed": sum(o.spec.stream for o in mine),
            "completed": sum(o.status == "completed" for o in mine),
            "cancelled": sum(o.status == "cancelled" for o in mine),
            "errored": sum(errors.values()),
            "errors": dict(errors),
            "p50_s": percentile(lat, 50),
            "p95_s": percentile(lat, 95),
        })
    return rows


def fairness(rows: list[dict], key: str = "p95_s") -> float:
    """Plain requests' p95 latency (``key``: another column, ``"p50_s"``) over the lowest of the group classes'
    (same tokens per sequence).

    1.0: plain requests fare like groups; the documented target for the p95 is at most 1.25.
    """
    by_kind = {r["kind"]: r[key] for r in rows}
    groups = [by_kind[k] for k in KINDS[1:] if by_kind.get(k, 0) > 0]
    return by_kind["plain"] / min(groups) if groups and by_kind.get("plain", 0) > 0 else 0.0


def markdown(rows: list[dict]) -> str:
    lines = ["| kind | requests | streamed | completed | cancelled (by the client) | errored (reason) | p50 s | p95 s |",
             "|---|---:|---:|---:|---:|---|---:|---:|"]
    for r in rows:
        errs = ", ".join(f"{k}: {v}" for k, v in r["errors"].items()) or "0"
        lines.append(f"| {r['kind']} | {r['requests']} | {r['streamed']} | {r['completed']} | {r['cancelled']} | "
                     f"{errs} | {r['p50_s']:.2f} | {r['p95_s']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m vllm_hogwild.serving.loadtest", description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True, help="the server's OpenAI base URL, e.g. http://127.0.0.1:8000/v1")
    ap.add_argument("--model", required=True, help="the served model name")
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--concurrency", type=int, default=48)
    ap.add_argument("--max-tokens", type=int, default=24, help="per worker")
    ap.add_argument("--deadline", type=float, default=180.0, help="seconds before a request counts as hung")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the rows and every outcome here")
    args = ap.parse_args(argv)
    if args.requests < 1 or args.concurrency < 1:
        ap.error("--requests and --concurrency must be at least 1")
    specs = make_mix(args.requests, args.max_tokens, args.seed)
    start = time.perf_counter()
    outcomes = asyncio.run(run_load(args.url, args.model, specs, args.concurrency, args.deadline))
    wall = time.perf_counter() - start
    rows = summarize(outcomes)
    print(markdown(rows))
    print(f"\n{len(specs)} requests at concurrency {args.concurrency} in {wall:.1f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"wall_s": wall, "rows": rows,
                       "outcomes": [{**asdict(o), "spec": asdict(o.spec)} for o in outcomes]}, f, indent=1)
    bad = rows[-1]["errored"]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
