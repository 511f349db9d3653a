"""A stand-in for vLLM's scheduler around a GroupTable, for pure tests (no vLLM).

vLLM itself cannot run in a unit test; the engine tests run the real one. This
keeps only what the table sees of it: requests that queue, prefill (in chunks),
decode one token per step (forced text fed ahead: more), sample (or take the token the wire forces), stop at
their end-of-sequence token or budget, and are aborted. Tokens are characters
(``ord``), the end of sequence is token 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from vllm_hogwild.core.groups.admit import Room
from vllm_hogwild.core.groups.table import GroupTable
from vllm_hogwild.core.views.registry import BatchRow
from vllm_hogwild.core.options import RequestOptions, RequestSpec, parse_request
from vllm_hogwild.core.wire import ARGMAX, StepWire

EOS = 0
GREEDY = ord("$")  # what a forced ARGMAX token samples here


def encode(text: str) -> list[int]:
    return [ord(c) for c in text]


def decode(ids) -> str:
    return "".join(chr(i) for i in ids if i != EOS)


@dataclass(eq=False)
class FakeRequest:
    request_id: str
    num_prompt_tokens: int
    max_tokens: int
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    status: str = "aside"  # aside (set aside by the table), waiting, running, finished
    spec_token_ids: list[int] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + len(self.output_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    def is_finished(self) -> bool:
        return self.status == "finished"


class FakeEngine:
    def __init__(self, *, prompt_len: int = 10, block_size: int = 4, num_blocks: int = 10_000,
                 chunk: int = 1 << 20, max_plain_wait: float = 0.5, kv: str = "on-demand") -> None:
        self.table = GroupTable(block_size=block_size, max_plain_wait=max_plain_wait, encode=encode,
                                text_for=lambda request: lambda token: decode([token]), clock=lambda: self.now, kv=kv)
        self.prompt_len, self.block_size, self.num_blocks, self.chunk = prompt_len, block_size, num_blocks, chunk
        self.now = 0.0
        self.requests: dict[str, FakeRequest] = {}
        self.waiting: list[FakeRequest] = []
        self.running: list[FakeRequest] = []
        self.parked: set[str] = set()
        self.freed: list[str] = []  # request ids whose blocks were freed, in order
        self.wires: list[StepWire] = []
        self.rows: list[BatchRow] = []  # the last step's batch, as a worker process sees it
        self.skip: set[str] = set()  # requests vLLM's token budget leaves out of the next step
        self.awaiting: set[str] = set()  # requests sitting out the next step awaiting their last output (async)
        self.tables: dict[str, list[int]] = {}  # each request's block list, grown in place as vLLM's is
        self.num_steps = 0

    def add(self, request_id: str, options: dict | RequestOptions, num_workers: int, max_tokens: int) -> FakeRequest:
        opts = options if isinstance(options, RequestOptions) else parse_request(
            {f"hogwild_{k}": v for k, v in options.items()})
        request = FakeRequest(request_id, self.prompt_len, max_tokens)
        self.requests[request_id] = request
        self.table.arrive(request_id, RequestSpec(opts, num_workers), request, prompt_len=self.prompt_len,
                          max_tokens=max_tokens, eos_token_id=EOS, arrival=self.now)
        return request

    def add_group(self, group_id: str, num_workers: int, max_tokens: int, order=None, **options) -> list[FakeRequest]:
        order = range(num_workers) if order is None else order
        out = {w: self.add(f"{w}_{group_id}" if num_workers > 1 else group_id, options, num_workers, max_tokens)
               for w in order}
        return [out[w] for w in sorted(out)]

    def used_blocks(self) -> int:
        bs = self.block_size
        return sum(-(-r.num_tokens // bs) for r in self.requests.values()
                   if r.status == "running" or r.request_id in self.parked)

    def step(self, sample: Callable[[FakeRequest, int], int]) -> StepWire:
        """One engine step: admit, sit out, schedule everything not sitting out, sample, stop, observe.

        ``sample(request, step)``: the token a request samples when nothing is forced.
        """
        table = self.table
        for request, tokens in table.feed_ahead(lambda r: r.status == "running"):  # before the room is made
            request.output_token_ids.extend(tokens)
        admission = table.admit(self.now, lambda: Room(self.num_blocks - self.used_blocks(), 0, len(self.running),
                                                       1024), lambda: None)
        for request in admission.queue:
            request.status = "waiting"
        self.waiting = admission.queue + self.waiting
        sitting_out = {r.request_id for r in table.who_sits_out() if r.status == "running"}
        if self.awaiting:  # vLLM's async scheduling: these wait for their last output, sitting out the step
            table.wait_for_outputs(sorted(self.awaiting))
            sitting_out |= {r for r in self.awaiting if self.requests[r].status == "running"}
        self.running += self.waiting
        for request in self.waiting:
            request.status = "running"
        self.waiting = []
        scheduled, self.rows = {}, []
        for request in self.running:
            if request.request_id in sitting_out or request.request_id in self.skip:
                continue
            n = min(request.num_tokens - request.num_computed_tokens, self.chunk)
            if n:
                self.rows.append(BatchRow(request.request_id, request.num_computed_tokens, n))
                request.num_computed_tokens += n
                scheduled[request.request_id] = n
                self._grow(request)
        for request, count, _ in table.fed_ahead(scheduled):  # forced tokens not fed go back
            del request.output_token_ids[-count:]
        wire = table.step(scheduled, {}, self.block_ids, has_tokens=bool(scheduled),
                          all_scheduled=len(scheduled) == len(self.running) - len(sitting_out))
        for request_id in scheduled:
            request = self.requests[request_id]
            if request.num_computed_tokens < request.num_tokens:
                continue  # a prefill chunk: no sample
            forced = wire.forced.get(request_id)
            token = sample(request, self.num_steps) if forced is None else (GREEDY if forced == ARGMAX else forced)
            table.accept(request_id)
            request.output_token_ids.append(token)
            if token == EOS or request.num_output_tokens >= request.max_tokens:
                self.stop(request)
        table.take_sampled()
        self.wires.append(wire)
        self.num_steps += 1
        self.now += 0.01
        return wire

    def stop(self, request: FakeRequest) -> None:
        request.status = "finished"
        if request in self.running:
            self.running.remove(request)
        parked = self.table.finish(request.request_id, self.block_ids)
        if parked is None:
            self.parked.add(request.request_id)
            return
        for other in parked:
            if other.request_id in self.parked:
                self.parked.discard(other.request_id)
                self.freed.append(other.request_id)
        self.freed.append(request.request_id)

    def abort(self, group_id: str) -> None:
        for request in list(self.requests.values()):
            if request.request_id.endswith(group_id) and not request.is_finished():
                self.waiting = [r for r in self.waiting if r is not request]
                self.stop(request)

    def _grow(self, request: FakeRequest) -> None:
        table = self.tables.setdefault(request.request_id, [])
        base = 1000 * (list(self.requests).index(request.request_id) + 1)
        while len(table) * self.block_size < request.num_computed_tokens + 1:
            table.append(base + len(table))

    def block_ids(self, request_id: str) -> list[int]:
        """The request's blocks, one list per request that grows in place (vLLM's runner keeps such a list)."""
        return self.tables.setdefault(request_id, [])

    def run(self, samples: dict[str, str], steps: int) -> dict[str, str]:
        """Step ``steps`` times; request ``r`` samples ``samples[r][k % len]`` at engine step ``k``. Returns texts."""
        def sample(request: FakeRequest, k: int) -> int:
            script = samples[request.request_id]
            return ord(script[k % len(script)])

        for _ in range(steps):
            if not self.table:
                break
            self.step(sample)
        return {rid: decode(r.output_token_ids) for rid, r in self.requests.items()}
