"""One Hogwild group: its workers, its protocol and what crosses to the worker processes. Pure, no vLLM import.

A group is the ``n`` requests of one vLLM parent request, one per worker. A
:class:`Group` holds the :class:`Worker` records, the
:class:`~vllm_hogwild.core.options.RequestSpec`, the paragraph tracker (layouts
with a shared history), the protocol driver (forced tokens, answers, the
finisher) and the counters the metrics report. What crosses to the worker
processes is built from it by :meth:`Group.step` and :meth:`Group.shape`. Its
life (arrival, admission, lock-step, the end) is :mod:`vllm_hogwild.core.groups.table`'s.

Sampled tokens enter a group's state in one place, :meth:`Group.accept_sampled`: its
driver reads each new token's text (paragraph ends, answers, forks). In a step, the
table hands a group's kind the step's data (:class:`StepInput`), the kind works on the
group (:meth:`Group.decode`, :meth:`Group.lock_step`) and returns what the table must
record (:class:`StepResult`): nothing calls back into the table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Mapping, Protocol, Sequence

from vllm_hogwild.core.protocol.driver import ForkJoinDriver, ProtocolDriver
from vllm_hogwild.core.options import RequestSpec
from vllm_hogwild.core.protocol.paragraphs import ParagraphTracker
from vllm_hogwild.core.replay.step_log import Replay, StepLog
from vllm_hogwild.core.stats import GroupEnd
from vllm_hogwild.core.wire import GroupFork, GroupShape, GroupStep


class EngineRequest(Protocol):
    """What the core reads of a worker's engine request (vLLM's ``Request`` has these)."""

    num_computed_tokens: int  # tokens of the lane whose K/V is written (or scheduled to be, this step)
    num_tokens: int  # prompt and output tokens
    num_output_tokens: int
    output_token_ids: Sequence[int]

    def is_finished(self) -> bool: ...


class Phase(Enum):
    """Where a group is in its life."""

    GATHERING = "gathering"  # not all of its requests have arrived
    WAITING = "waiting"  # complete; not admitted yet (no room, or fairness)
    ADMITTED = "admitted"  # its requests are in the engine's queues: they prefill, then decode in lock-step
    PREEMPTED = "preempted"  # out whole under KV pressure, every block freed; waits to be admitted again
    REPLAYING = "replaying"  # admitted again: every lane re-feeds its tokens with their views, then decodes on


@dataclass(frozen=True, slots=True)
class StepInput:
    """What a group's kind reads of the step being built, once vLLM has scheduled it (token counts advanced): the
    step's data, never the table. Kinds fill ``forced`` in."""

    scheduled: Mapping[str, int]  # tokens per request this step
    drafts: Mapping[str, Sequence[int]]  # each request's draft tokens this step
    forced: dict[str, int]  # request id -> the token the engine forces (filled in by the kinds)
    all_scheduled: bool  # vLLM scheduled every running request (none fell out of the token budget)
    speculative: bool  # the engine verifies drafts


@dataclass(slots=True)
class StepResult:
    """A group's part of the step, as its kind returns it to the table, which records it in its own indexes."""

    wire: GroupStep | None = None  # joins or drafts for the worker processes (None: only lengths)
    fork: GroupFork | None = None  # the fork state, when a fork started or joined (fork/join)
    lane_lens: list[int] | None = None  # its lanes' lengths for the wire (None: no row of it decodes)
    steady: bool = False  # steady from the next step on: the table advances it with the other steady groups
    settled: bool | None = None  # True: even from the next step on (who sits out need not be asked); False: it fell
    # out of step (ask again); None: no change


@dataclass
class Worker:
    """One of a group's N sequences and the engine requests that carry it."""

    group: "Group"
    index: int
    request_id: str
    request: Any  # the client's engine request (read through :class:`EngineRequest` only)
    eos_token_id: int | None = None
    text: Callable[[int], str] | None = None  # the text each sampled token adds (groups that observe text)
    hidden: Callable[[int], str] | None = None  # fork/join: a token's text the client's text leaves out ("": none)
    sampled_steps: int = 0  # speculative decoding: steps in which it accepted tokens (lock-step counts these)
    finished: bool = False
    lane_len: int = 0  # once finished: its lane's tokens (its last sampled token is never fed)
    lane_request: Any = None  # who holds its lane's blocks now: ``request``, or a replay request once it resumed

    def __post_init__(self) -> None:
        self.lane_request = self.lane_request or self.request

    @property
    def lane_request_id(self) -> str:
        return self.lane_request.request_id

    def length(self) -> int:
        """Its lane's tokens whose K/V is written (or scheduled to be, this step)."""
        return self.lane_len if self.finished else self.request.num_computed_tokens


@dataclass
class GroupCounters:
    """What the metrics report about a group."""

    num_workers: int
    prefill_by_worker: list[int] = field(default_factory=list)  # prompt tokens each worker computed
    admitted_time: float = 0.0  # monotonic seconds when the group was admitted (0: not yet)
    num_preemptions: int = 0
    num_replayed_tokens: int = 0  # tokens re-fed on resumption (the prompt's cached blocks excluded)

    def __post_init__(self) -> None:
        self.prefill_by_worker = self.prefill_by_worker or [0] * self.num_workers

    @property
    def num_prefill_tokens(self) -> int:
        return sum(self.prefill_by_worker)

    def prefill_saved(self, prompt_len: int) -> int:
        """Prompt tokens not computed: the prompt is computed once for the group, not once per worker."""
        extra = sum(self.prefill_by_worker) - max(self.prefill_by_worker, default=0)
        return max(0, (self.num_workers - 1) * prompt_len - extra)


@dataclass
class Group:
    group_id: str
    spec: RequestSpec
    max_tokens: int  # per worker
    prompt_len: int
    arrival: float  # the request's arrival time (wall clock, as vLLM records it): fairness
    arrival_time: float  # monotonic seconds in the scheduler's process: metrics
    tracker: ParagraphTracker | None
    driver: ProtocolDriver | ForkJoinDriver
    log: StepLog
    kind: Any  # its GroupKind (core/groups/kind.py): what this kind of group decides for itself
    workers: list[Worker | None] = field(default_factory=list)
    phase: Phase = Phase.GATHERING
    shape_sent: bool = False  # the worker processes have this group's shape
    prefilled: bool = False  # every worker has computed the whole prompt
    in_step: bool = False  # prefilled, and every live worker has fed as many tokens as the others
    num_live: int = 0  # workers that have not stopped
    counters: GroupCounters | None = None
    replay: Replay | None = None  # preempted or replaying: what each lane re-feeds
    spare: set[int] = field(default_factory=set)  # lanes no fork has taken: out of the engine's queues until one does
    fork_sent: int = 0  # fork/join: the version of the fork state the worker processes hold

    @property
    def num_workers(self) -> int:
        return self.spec.num_workers

    @property
    def request_ids(self) -> list[str]:
        """The request that holds each lane now, in worker order (complete groups)."""
        return [w.lane_request_id for w in self.workers]

    @property
    def is_complete(self) -> bool:
        return all(w is not None for w in self.workers)

    @property
    def is_done(self) -> bool:
        return all(w is not None and w.finished for w in self.workers)

    @property
    def live(self) -> list[int]:
        """Workers that have not stopped."""
        return [w.index for w in self.workers if not w.finished]

    def shape(self, block_ids: Sequence[Sequence[int]], request_ids: Sequence[str] | None = None) -> GroupShape:
        """What the worker processes keep of the group (``block_ids``: each lane's blocks now; ``request_ids``:
        :attr:`request_ids`, where the caller has it)."""
        tail = self.spec.prompt_tail
        return GroupShape(self.group_id, tuple(request_ids or self.request_ids), self.spec.options.layout,
                          self.prompt_len,
                          self.prompt_len if tail is None else tail.prompt_end,
                          (None,) * 4 if tail is None else tail.separators(),
                          tuple(tuple(b) for b in block_ids))

    def lane_lens(self, num_drafts: Sequence[int] | None = None) -> list[int]:
        """Each lane's tokens co-workers may read this step, once vLLM has scheduled it: its tokens whose K/V
        is written once the step's writes land, at least the prompt; with speculative decoding
        (``num_drafts``: each lane's draft tokens this step) its accepted ones, never its drafts. O(N)."""
        if num_drafts is not None:
            return [w.length() - d for w, d in zip(self.workers, num_drafts)]
        p = self.prompt_len  # (Worker.length() inlined: every decoding group's lanes, every step)
        return [n if (n := w.lane_len if w.finished else w.request.num_computed_tokens) > p else p
                for w in self.workers]

    def step(self, lane_lens: Sequence[int], decoding: Sequence[int], drafts: Sequence[int] = (),
             exact: bool = False) -> GroupStep | None:
        """Log this engine step; the wire's :class:`GroupStep` when it has something besides the lanes'
        lengths, which the wire carries apart (None: nothing joined, no drafts).

        ``lane_lens``: each lane's accepted tokens (what co-workers may read, :meth:`lane_lens`);
        ``drafts``: the draft tokens each lane feeds after them (speculative decoding); ``exact``: a
        speculative step (lanes grew by the drafts they accepted: a run of its own in the log).
        O(N + joined).
        """
        self.log.record(lane_lens, decoding, exact=exact)
        joined = self.tracker.join(lane_lens) if self.tracker is not None and self.tracker.pending else []
        if joined:
            self.log.join(len(self.tracker.history), self.tracker.paragraph_starts)
        if not joined and not any(drafts):
            return None
        return GroupStep(self.group_id, tuple((s.lane, s.start, s.end) for s in joined),
                         tuple(drafts) if any(drafts) else ())

    def accept_sampled(self, worker: Worker) -> None:
        """Where sampled tokens enter the group's state: its driver reads the text of every token ``worker``
        sampled since last time (groups that read no text: nothing). The table calls it after each step's
        outputs (:meth:`~vllm_hogwild.core.groups.table.GroupTable.take_sampled`), for a worker that finishes,
        and token by token in a speculative accepted run (:func:`~vllm_hogwild.core.groups.drafts.must_force`)."""
        driver = self.driver
        if not driver.observes_text:
            return
        tokens = worker.request.output_token_ids
        for i in range(driver.num_observed[worker.index], len(tokens)):
            token = tokens[i]
            driver.observe(worker.index, i, worker.text(token), worker.hidden(token) if worker.hidden else "")

    def lock_step(self) -> list[int]:
        """A step in lock-step (the same workers, one token more each): a counter in its log; its lanes' lengths
        for the wire."""
        self.log.advance()
        return self.lane_lens()

    def decode(self, step: StepInput, fed_ahead: bool = False) -> StepResult:
        """A step in which its workers decode: logged, its lanes' lengths for the wire, its joins and drafts, if any.
        ``fed_ahead``: a lane's tokens beyond its first this step count as drafts (forced text fed ahead:
        :meth:`~vllm_hogwild.core.groups.table.GroupTable.feed_ahead`): co-workers read them from the next step
        on, and the step is a run of its own."""
        workers, scheduled, out = self.workers, step.scheduled, StepResult()
        decoding = [w.index for w in workers if not w.finished and (n := scheduled.get(w.request_id))
                    and w.request.num_computed_tokens - n >= self.prompt_len]  # a prefill chunk reads its lane
        if self.in_step and len(decoding) < self.num_live:
            self.in_step = False  # a live worker sat this step out: it is behind now
            out.settled = False
        if not decoding:
            return out  # prefill rows read their own lane: plain attention
        if fed_ahead:  # a lane's tokens past its first: its drafts, or forced text fed ahead (see lane_lens)
            num_drafts = [0] * len(workers)
            for i in decoding:
                num_drafts[i] = scheduled[workers[i].request_id] - 1
            if not step.speculative and not any(num_drafts):
                num_drafts = None
        else:
            num_drafts = [len(step.drafts.get(w.request_id, ())) for w in workers] if step.speculative else None
        out.lane_lens = lens = self.lane_lens(num_drafts)
        out.wire = self.step(lens, decoding, num_drafts or (), exact=num_drafts is not None)
        return out

    def stop(self, keep: int | None = None) -> None:
        """Every live worker samples its end next (``keep``: but this one, the finisher)."""
        live = [w.index for w in self.workers if not w.request.is_finished()]
        self.driver.stop(live, [w.eos_token_id for w in self.workers], keep=keep)

    def force_tokens(self, scheduled: Mapping[str, int], forced: dict[str, int],
                     drafts: Mapping[str, Sequence[int]]) -> None:
        """The token each worker that samples this step must produce, where the protocol forces text (into
        ``forced``: request id -> token). ``scheduled``: tokens per request this step; ``drafts``: each
        request's draft tokens.

        A worker verifying drafts this step (its queue filled after scheduling: the finisher started)
        gets its token next step: a forced token applies to a request's bonus row only. Its accepted
        run is then cut after its first token (:func:`~vllm_hogwild.core.groups.drafts.must_force`).
        """
        driver = self.driver
        finisher = driver.maybe_start_finisher(
            [None if w.request.is_finished() else w.request.num_output_tokens for w in self.workers])
        if finisher is not None:  # everyone else ends now: its rest joins the history the finisher reads
            self.stop(keep=finisher)
        for w in self.workers:
            request = w.request
            if (w.request_id in scheduled and request.num_computed_tokens >= request.num_tokens  # it samples now
                    and not drafts.get(w.request_id)):
                token = driver.forced(w.index, request.num_output_tokens)
                if token is not None:
                    forced[w.request_id] = token

    def count_prefill(self, scheduled: Mapping[str, int]) -> tuple[bool, bool]:
        """Count the prompt tokens each worker computed this step (``scheduled``: tokens per request). Returns
        whether every worker has the whole prompt now, and whether each of them was scheduled and samples its
        first token in this step (all of them together). One pass: at admission hundreds of groups prefill in
        one step."""
        p, by_worker = self.prompt_len, self.counters.prefill_by_worker
        prefilled = together = True
        for w in self.workers:
            n = scheduled.get(w.request_id, 0)
            if w.finished:
                prefilled &= w.lane_len >= p
                together = False
                continue
            request = w.request
            computed = request.num_computed_tokens
            if n:
                before = computed - n  # counts were advanced by vLLM's schedule()
                by_worker[w.index] += max(0, min(n, p - before))
            prefilled &= computed >= p
            together &= bool(n) and computed >= request.num_tokens and not request.num_output_tokens
        return prefilled, together

    def end_record(self, block_ids: Sequence[Sequence[int]], block_size: int, now: float) -> Callable[[], GroupEnd]:
        """What the metrics keep of the group once it ended (``block_ids``: each lane's blocks; ``now``:
        monotonic seconds), as a call that builds its record (:meth:`HogwildStats.record
        <vllm_hogwild.core.stats.HogwildStats.record>`). What the engine frees after this step (the lanes'
        blocks and requests) is read now; the rest is what the group leaves behind, which nothing changes any
        more (its counters, log, paragraphs), held without the group, its workers or their requests."""
        lanes = [w.length() for w in self.workers]
        used: set[int] = set()
        for blocks, n in zip(block_ids, lanes):
            used.update(blocks[: -(-n // block_size)])
        outputs = [w.request.num_output_tokens for w in self.workers]
        counters, tracker, log, layout = self.counters, self.tracker, self.log, self.spec.options.layout
        n, p, arrival, finisher, group_id = self.num_workers, self.prompt_len, self.arrival_time, \
            self.driver.finisher, self.group_id

        def build() -> GroupEnd:
            if tracker is not None:
                tracker.join(lanes)  # the last rests, for the record
            history = tracker.history if tracker is not None else []
            return GroupEnd(
                n, p, lanes, len(used), counters.num_prefill_tokens, counters.prefill_saved(p), outputs,
                coworker_reads(log, history, n, p, layout),
                admission_wait_s=(counters.admitted_time - arrival) if counters.admitted_time else None,
                latency_s=now - arrival, history=[(s.lane, s.start, s.end) for s in history],
                finisher=finisher, num_preemptions=counters.num_preemptions,
                num_replayed_tokens=counters.num_replayed_tokens, group_id=group_id)

        return build

    def coworker_reads(self) -> list[int]:
        """Co-worker tokens each worker attended over its life, summed over its steps (the prompt is nobody's).

        From the step log, in closed form over its runs: O(runs + joins), not O(steps)."""
        history = self.tracker.history if self.tracker is not None else []
        return coworker_reads(self.log, history, self.num_workers, self.prompt_len, self.spec.options.layout)


def coworker_reads(log: StepLog, history: Sequence[Any], num_workers: int, prompt_len: int,
                   layout: str) -> list[int]:
    """:meth:`Group.coworker_reads` from what a group leaves behind: its step log, its history's spans (each
    with ``lane`` and ``num_tokens``), its size, prompt and layout. Isolated and fork/join: not counted (0)."""
    reads = [0] * num_workers
    if layout not in ("contiguous", "combined", "interleaved"):
        return reads
    joins = log.joins
    for run in log.runs:
        # Pieces of the run between joins: the history is constant inside one.
        cuts = [run.first] + [j for j, _, _ in joins if run.first < j < run.first + run.length] + [
            run.first + run.length]
        for a, b in zip(cuts, cuts[1:]):
            _add_reads(reads, run, a, b, history, prompt_len, layout, joins)
    return reads


def _add_reads(reads: list[int], run: Any, a: int, b: int, history: Sequence[Any], p: int, layout: str,
               joins: Sequence[tuple[int, int, tuple[int, ...]]]) -> None:
    base, decoding, m = run.lens_at(a), run.decoding, b - a
    num_growing = len(decoding)
    if layout == "contiguous":
        total = sum(base) - p * len(base)  # every lane's tokens past the prompt
        for w in decoding:
            reads[w] += m * (total - (base[w] - p)) + (num_growing - 1) * m * (m - 1) // 2
        return
    num_history, starts = 0, (p,) * len(base)  # after the joins up to step ``a``
    for j, n, s in joins:
        if j > a:
            break
        num_history, starts = n, s
    by_lane = [0] * len(base)
    for span in history[:num_history]:
        by_lane[span.lane] += span.num_tokens
    total = sum(by_lane)
    for w in decoding:
        k0 = max(0, starts[w] - base[w] + 1)  # from then on the worker reads more than its own lane
        count = max(0, m - k0)
        if not count:
            continue
        reads[w] += count * (total - by_lane[w])
        if layout == "combined":
            ks = (m * (m - 1) - k0 * (k0 - 1)) // 2  # sum of k over [k0, m)
            reads[w] += count * sum(base[o] - starts[o] for o in range(len(base)) if o != w)
            reads[w] += ks * (num_growing - 1)


def parse_request_id(request_id: str, num_workers: int) -> tuple[str, int]:
    """``(group id, worker index)`` of a worker's request id.

    vLLM's ``n > 1`` fan-out names the request of worker ``i`` of parent ``P``
    ``f"{i}_{P}"``; with ``n == 1`` there is no fan-out and the request is its own group.
    """
    if num_workers == 1:
        return request_id, 0
    index, sep, parent = request_id.partition("_")
    if not sep or not index.isdigit() or not 0 <= int(index) < num_workers:
        raise ValueError(f"request id {request_id!r} is not a worker of an n={num_workers} request")
    return parent, int(index)
