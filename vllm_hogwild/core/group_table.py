"""Every Hogwild group's life in one engine core, from its first request to its last block. Pure, no vLLM import.

The scheduler keeps one :class:`GroupTable`. It translates vLLM's requests
into the table's inputs and applies the table's answers; what is decided about
a group is decided here:

- **arrive**: a worker's request comes in (they arrive one by one, in any
  order); the scheduler holds it out of vLLM's waiting queue;
- **admit**: complete groups, oldest first, go to vLLM's waiting queue whole,
  when they fit (the KV budget rule below) and fairness allows
  (:mod:`vllm_hogwild.core.admission`); the answer names the requests to queue
  and, when a group has waited too long, the plain requests to hold back;
- **hold**: lock-step: a worker ahead of its group's slowest live worker sits
  out a step (:meth:`holds`); with speculative decoding, workers whose next
  token the engine may place verify no drafts (:meth:`drafts_to_drop`);
- **step**: after vLLM has scheduled, the step's wire for the worker
  processes (:meth:`step`): each decoding group's lane lengths, the
  paragraphs that join the shared history, forced tokens, shapes and ended
  groups; the finisher may start here;
- **observe**: every sampled token's text goes to the group's protocol driver
  (paragraph ends, next prefixes, answers; :meth:`accept`, :meth:`must_place`,
  :meth:`after_outputs`), which may stop the group;
- **park** and **finish**: a worker that stops keeps its lane (co-workers
  still read it) until the whole group is done; then every lane is freed
  together (:meth:`finish`).

The KV budget rule (``reserve``): a group is admitted only when every worker
fits for its whole budget, ``prompt // bs`` shared full blocks plus, per lane,
the rest of ``prompt + max_tokens`` (:func:`~vllm_hogwild.core.options.blocks_for_group`);
a worker's first allocation takes that whole budget (:meth:`first_allocation`),
so it never asks for a block later and is never preempted.

The table reads a worker's engine request only through
:class:`~vllm_hogwild.core.group.Lane` (vLLM's ``Request`` has those fields);
per step it works only on the groups the step schedules, plus the groups that
may be out of lock-step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from vllm_hogwild.core.admission import Decision, Fairness, ahead_of_group, fits
from vllm_hogwild.core.group import Group, Phase, Worker, parse_request_id
from vllm_hogwild.core.options import RequestSpec, blocks_for_group
from vllm_hogwild.core.stats import GroupEnd, HogwildStats
from vllm_hogwild.core.wire import StepWire


@dataclass(frozen=True)
class Room:
    """What the engine has left for a group to be admitted."""

    free_blocks: int
    watermark_blocks: int
    num_running: int  # requests running in the engine
    max_running: int


@dataclass
class Admission:
    queue: list[Any] = field(default_factory=list)  # worker requests to put at the head of the waiting queue, in order
    hold_newer_than: float | None = None  # plain requests that arrived after this wait this step


class GroupTable:
    def __init__(self, *, block_size: int, max_plain_wait: float, encode: Callable[[str], list[int]],
                 text_for: Callable[[Any], Callable[[int], str]] | None = None, slack: int = 0,
                 speculative: bool = False, clock: Callable[[], float] = time.monotonic) -> None:
        """``encode``: text to token ids (placed text); ``text_for(request)``: that request's detokenizer
        (the text each sampled token adds), for groups that observe text; ``slack``: slots a lane may need
        past its budget (:func:`~vllm_hogwild.core.options.spec_slack`); ``speculative``: the engine verifies
        drafts (a lane may accept several tokens per step); ``clock``: seconds, for metrics."""
        self.block_size = block_size
        self.slack = slack
        self.speculative = speculative
        self.fairness = Fairness(max_plain_wait)
        self.stats = HogwildStats()
        self._encode = encode
        self._text_for = text_for
        self._clock = clock
        self.groups: dict[str, Group] = {}  # by group id, in arrival order
        self.workers: dict[str, Worker] = {}  # by request id
        self._waiting: dict[str, Group] = {}  # groups not admitted yet, in arrival order
        self._running: dict[str, Group] = {}  # admitted groups, in admission order
        self._observing: dict[str, Group] = {}  # admitted groups whose text the driver reads
        self._num_held = 0  # requests of those groups that have arrived and not finished
        self._unbudgeted: dict[str, int] = {}  # request id -> slots its first allocation takes (queued workers)
        self._promised_blocks = 0  # blocks those first allocations will take
        self._uneven: set[str] = set()  # groups that may be out of lock-step
        self._queued: set[str] = set()  # requests handed to the engine's waiting queue, not scheduled yet
        self._ended: list[str] = []  # groups whose shape the worker processes hold, ended since the last wire

    def __contains__(self, request_id: str) -> bool:
        return request_id in self.workers

    def __bool__(self) -> bool:
        return bool(self.groups)

    @property
    def num_held(self) -> int:
        """Requests held out of the engine's queues (their groups are not admitted): they wait too."""
        return self._num_held

    @property
    def num_waiting_groups(self) -> int:
        return len(self._waiting)

    @property
    def num_running_groups(self) -> int:
        return len(self._running)

    # -- arrive -----------------------------------------------------------------------------------------

    def arrive(self, request_id: str, spec: RequestSpec, request: Any, *, prompt_len: int, max_tokens: int,
               eos_token_id: int | None, arrival: float) -> Worker:
        """A worker's request arrived (``arrival``: its wall-clock arrival time, as vLLM records it)."""
        group_id, index = parse_request_id(request_id, spec.num_workers)
        group = self.groups.get(group_id)
        if group is None:
            group = Group.create(group_id, spec, max_tokens, prompt_len, arrival=arrival,
                                 arrival_time=self._clock(), encode=self._encode)
            self.groups[group_id] = group
            self._waiting[group_id] = group
        worker = Worker(group, index, request_id, request, eos_token_id)
        if group.driver.observes_text and self._text_for is not None:
            worker.text = self._text_for(request)
        group.workers[index] = worker
        self.workers[request_id] = worker
        self._num_held += 1
        if group.is_complete:
            group.phase = Phase.WAITING
        return worker

    # -- admit ------------------------------------------------------------------------------------------

    def admit(self, now: float, room: Callable[[], Room], oldest_plain: Callable[[], float | None]) -> Admission:
        """Complete groups to queue now, oldest first, while they fit and fairness allows.

        ``now``: wall-clock seconds; ``room``, ``oldest_plain`` (the arrival time of the oldest
        waiting plain request, None: none): read only when a complete group waits.
        """
        admission = Admission()
        complete = [g for g in self._waiting.values() if g.phase is Phase.WAITING]
        if not complete:
            return admission
        here, oldest = room(), oldest_plain()
        for group in complete:
            decision = self.fairness.decide(now, group.arrival, self._fits(group, here), oldest)
            if decision is Decision.WAIT:
                break  # first come, first served among groups: a later group does not overtake
            if decision is Decision.HOLD_NEWER:
                admission.hold_newer_than = group.arrival
                break
            admission.queue += self._queue(group)
        return admission

    def _fits(self, group: Group, room: Room) -> bool:
        bs = self.block_size
        return fits(blocks_for_group(group.prompt_len, group.max_tokens, group.num_workers, bs, self.slack),
                    self._promised_blocks, room.watermark_blocks, room.free_blocks,
                    room.num_running + len(self._unbudgeted), group.num_workers, room.max_running)

    def _queue(self, group: Group) -> list[Any]:
        del self._waiting[group.group_id]
        self._running[group.group_id] = group
        if group.driver.observes_text:
            self._observing[group.group_id] = group
        group.phase = Phase.ADMITTED
        group.counters.admitted_time = self._clock()
        self._uneven.add(group.group_id)
        live = [w for w in group.workers if not w.request.is_finished()]
        self._num_held -= len(live)
        budget = group.prompt_len + group.max_tokens + self.slack
        for worker in live:
            self._promise(worker.request_id, budget)
            self._queued.add(worker.request_id)
        return [w.request for w in live]

    @property
    def num_queued(self) -> int:
        """Workers handed to the engine's waiting queue that it has not scheduled yet."""
        return len(self._queued)

    @property
    def has_unbudgeted(self) -> bool:
        """Whether a queued worker's first allocation is still to come."""
        return bool(self._unbudgeted)

    def first_allocation(self, request_id: str) -> int | None:
        """Slots (tokens) the request's first allocation must cover: its whole budget; None: not a first one."""
        return self._unbudgeted.get(request_id)

    def allocated(self, request_id: str) -> None:
        """The request's first allocation succeeded."""
        self._promise(request_id, None)

    def _promise(self, request_id: str, slots: int | None) -> None:
        """Record (``slots``) or drop (None) what a queued worker's first allocation will take."""
        before = self._unbudgeted.pop(request_id, None)
        if before is not None:
            self._promised_blocks -= -(-before // self.block_size)
        if slots is not None:
            self._unbudgeted[request_id] = slots
            self._promised_blocks += -(-slots // self.block_size)

    def preempted(self, request_id: str) -> None:
        """vLLM preempted a worker alone (the budget rule is there so that it never does): counted, and its
        blocks, freed, are allocated again whole."""
        worker = self.workers[request_id]
        self.stats.num_member_preemptions += 1
        self._promise(request_id, worker.group.prompt_len + worker.group.max_tokens + self.slack)

    # -- hold -------------------------------------------------------------------------------------------

    def holds(self) -> list[Any]:
        """Requests of running workers ahead of their group's slowest live worker: they sit this step out.

        Only groups that may be out of step are looked at: workers finish their prefill in
        different steps, and a worker left out of a step (vLLM's token budget) falls behind. A
        prefilled group whose live workers are even stays even while all are scheduled.
        """
        held = []
        for group_id in list(self._uneven):
            group = self.groups[group_id]
            ahead = ahead_of_group([None if w.request.is_finished() else self._steps_of(w) for w in group.workers])
            held += [group.workers[w].request for w in ahead]
            group.in_step = group.prefilled and not ahead
            if group.in_step:
                self._uneven.discard(group_id)
        return held

    def _steps_of(self, worker: Worker) -> int:
        """Engine steps in which the worker accepted tokens (without speculative decoding: one token each)."""
        return worker.sampled_steps if self.speculative else worker.request.num_output_tokens

    def drafts_to_drop(self) -> list[Any]:
        """Speculative decoding: requests whose next token the engine may place verify no drafts (forced
        tokens apply to a request's first sampled row only)."""
        out = []
        for group in self._running.values():
            if not group.driver.places_tokens:
                continue
            for w in group.workers:
                if not w.finished and group.driver.may_place(w.index, w.request.num_output_tokens):
                    out.append(w.request)
        return out

    # -- step -------------------------------------------------------------------------------------------

    def step(self, scheduled: Mapping[str, int], drafts: Mapping[str, Sequence[int]],
             block_ids: Callable[[str], Sequence[int]], *, all_scheduled: bool, has_tokens: bool) -> StepWire:
        """The step's wire, once vLLM has scheduled (token counts already advanced).

        ``scheduled``: tokens per request this step; ``drafts``: each request's draft tokens this
        step; ``block_ids(request_id)``: its lane's blocks; ``all_scheduled``: vLLM scheduled every
        running request (none fell out of the token budget); ``has_tokens``: the step reaches the
        worker processes (a step without tokens does not). A group decoding in lock-step (every live
        worker one token more, no paragraph to join) costs one counter: O(1); any other, O(N).
        """
        shapes, steps, forced = [], [], {}
        if self._queued:
            self._queued = {r for r in self._queued if r not in scheduled}
        for group in self._running.values():
            workers = group.workers
            if not group.shape_sent:
                if not any(w.lane_request_id in scheduled for w in workers):
                    continue
                shapes.append(group.shape([block_ids(w.lane_request_id) for w in workers]))
                group.shape_sent = True
            if group.driver.places_tokens:  # a worker's first sample may be placed too: before the prefill check
                self._place_tokens(group, scheduled, forced, drafts)
            if not group.prefilled:
                self._count_prefill(group, scheduled)
                if any(w.length() < group.prompt_len for w in workers):
                    continue  # someone still prefills: every decode row reads the prompt alone
                group.prefilled = True
            log = group.log
            if (all_scheduled and not self.speculative and log.runs and len(log.runs[-1].decoding) == group.num_live
                    and not (group.tracker is not None and group.tracker.pending)):
                log.advance()  # lock-step: the same workers, one token more each; the worker processes follow
                continue
            decoding = [w.index for w in workers if not w.finished and (n := scheduled.get(w.request_id))
                        and w.request.num_computed_tokens - n >= group.prompt_len]  # a prefill chunk reads its lane
            if group.in_step and len(decoding) < group.num_live:
                group.in_step = False  # a live worker sat this step out: it is behind now
                self._uneven.add(group.group_id)
            if not decoding:
                continue  # prefill rows read their own lane: plain attention
            if self.speculative:  # co-workers read accepted tokens only: a lane's drafts are its own rows' alone
                num_drafts = [len(drafts.get(w.request_id, ())) for w in workers]
                wire = group.step([w.length() - d for w, d in zip(workers, num_drafts)], decoding, num_drafts,
                                  exact=True)
            else:
                wire = group.step([w.length() for w in workers], decoding)
            if wire is not None:
                steps.append(wire)
        ended = ()
        if self._ended and has_tokens:
            ended, self._ended = tuple(self._ended), []
        return StepWire(tuple(shapes), tuple(steps), ended, forced)

    def _place_tokens(self, group: Group, scheduled: Mapping[str, int], forced: dict[str, int],
                      drafts: Mapping[str, Sequence[int]]) -> None:
        """The token each worker that samples this step must produce, where the protocol places text.

        A worker verifying drafts this step (its queue filled after scheduling: the finisher started)
        gets its token next step: a forced token applies to a request's bonus row only. Its accepted
        run is then cut after its first token (:meth:`must_place`).
        """
        driver = group.driver
        finisher = driver.maybe_start_finisher(
            [None if w.request.is_finished() else w.request.num_output_tokens for w in group.workers])
        if finisher is not None:  # everyone else ends now: its rest joins the history the finisher reads
            self._stop(group, keep=finisher)
        for w in group.workers:
            request = w.request
            if (w.request_id in scheduled and request.num_computed_tokens >= request.num_tokens  # it samples now
                    and not drafts.get(w.request_id)):
                token = driver.forced(w.index, request.num_output_tokens)
                if token is not None:
                    forced[w.request_id] = token

    def _count_prefill(self, group: Group, scheduled: Mapping[str, int]) -> None:
        for w in group.workers:
            n = scheduled.get(w.request_id, 0)
            if n:
                before = w.request.num_computed_tokens - n  # counts were advanced by vLLM's schedule()
                group.counters.prefill_by_worker[w.index] += max(0, min(n, group.prompt_len - before))

    # -- observe ----------------------------------------------------------------------------------------

    def accept(self, request_id: str) -> Worker | None:
        """Speculative decoding: the request accepted tokens this step (one or more): its worker, with the
        step counted; None: a plain request."""
        worker = self.workers.get(request_id)
        if worker is not None:
            worker.sampled_steps += 1
        return worker

    def must_place(self, worker: Worker) -> bool:
        """After each token of an accepted run: whether the engine must place the worker's next token (a
        paragraph ended and queued its prefix, an answer, the finisher's room); the run is cut there."""
        self._observe(worker)
        return worker.group.driver.may_place(worker.index, worker.request.num_output_tokens)

    def after_outputs(self) -> None:
        """The step's outputs are in: show each driver its workers' new text; an answer stops its group.
        Groups that read no text (the raw protocol) cost nothing here."""
        for group in self._observing.values():
            for worker in group.workers:
                if not worker.finished:
                    self._observe(worker)
            if group.driver.answered:  # a worker wrote the answer: everyone samples its end next
                self._stop(group)

    def _observe(self, worker: Worker) -> None:
        """Show the driver the text of every token ``worker`` sampled since last time."""
        driver = worker.group.driver
        if not driver.observes_text:
            return
        tokens = worker.request.output_token_ids
        for i in range(driver.num_observed[worker.index], len(tokens)):
            driver.observe(worker.index, i, worker.text(tokens[i]))

    def _stop(self, group: Group, keep: int | None = None) -> None:
        live = [w.index for w in group.workers if not w.request.is_finished()]
        group.driver.stop(live, [w.eos_token_id for w in group.workers], keep=keep)

    # -- park and finish --------------------------------------------------------------------------------

    def finish(self, request_id: str, block_ids: Callable[[str], Sequence[int]]) -> list[Any] | None:
        """The request finished (stopped, or aborted). None: park it (co-workers still read its lane: keep
        its blocks); else its group ended: the parked requests whose blocks to free now, with its own."""
        worker = self.workers[request_id]
        group = worker.group
        worker.finished, worker.lane_len = True, worker.request.num_computed_tokens
        group.num_live -= 1
        self._promise(request_id, None)
        self._queued.discard(request_id)
        if group.phase is not Phase.ADMITTED:
            self._num_held -= 1  # aborted before its group was admitted
        self._observe(worker)
        if group.tracker is not None:
            group.tracker.stop(worker.index, worker.lane_len)
        arrived = [w for w in group.workers if w is not None]
        if not all(w.finished for w in arrived):
            return None
        # The group ends (all its workers finished; or it was aborted while its requests still arrived:
        # vLLM aborts a parent's requests together, and no later one comes).
        if group.is_complete:
            self._record_end(group, block_ids)
        for w in arrived:
            del self.workers[w.request_id]
        del self.groups[group.group_id]
        self._waiting.pop(group.group_id, None)
        self._running.pop(group.group_id, None)
        self._observing.pop(group.group_id, None)
        self._uneven.discard(group.group_id)
        if group.shape_sent:
            self._ended.append(group.group_id)
        return [w.request for w in arrived if w.request_id != request_id]

    def _record_end(self, group: Group, block_ids: Callable[[str], Sequence[int]]) -> None:
        lanes = [(block_ids(w.lane_request_id), w.length()) for w in group.workers]
        if group.tracker is not None:
            group.tracker.join([n for _, n in lanes])  # the last rests, for the record
        used: set[int] = set()
        for blocks, n in lanes:
            used.update(blocks[: -(-n // self.block_size)])
        c, now = group.counters, self._clock()
        self.stats.record(GroupEnd(
            group.num_workers, group.prompt_len, [n for _, n in lanes], len(used), c.num_prefill_tokens,
            c.prefill_saved(group.prompt_len), [w.request.num_output_tokens for w in group.workers],
            group.coworker_reads(),
            admission_wait_s=(c.admitted_time - group.arrival_time) if c.admitted_time else None,
            latency_s=now - group.arrival_time,
            history=[(s.lane, s.start, s.end) for s in (group.tracker.history if group.tracker else ())],
            finisher=group.driver.finisher,
        ))

    def snapshot(self, free_blocks: int) -> dict[str, Any]:
        """The metrics since the last snapshot (plain data: it crosses processes)."""
        return self.stats.snapshot(self.num_running_groups, self.num_waiting_groups, free_blocks)
