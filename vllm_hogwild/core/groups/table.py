"""Every Hogwild group's life in one engine core, from its first request to its last block. Pure, no vLLM import.

The scheduler keeps one :class:`GroupTable`. It translates vLLM's requests
into the table's inputs and applies the table's answers; what is decided about
a group is decided here:

- **arrive**: a worker's request comes in (they arrive one by one, in any
  order); the scheduler sets it aside, out of vLLM's waiting queue;
- **admit**: complete groups, oldest first, go to vLLM's waiting queue whole,
  when they fit (the KV rule: :mod:`vllm_hogwild.core.groups.admit`) and fairness allows
  (:class:`~vllm_hogwild.core.groups.admit.Admitter`, on the rules of
  :mod:`vllm_hogwild.core.groups.policy`); a preempted group comes back the same
  way, its finished lanes with replay requests of their own;
- **sit out**, **step**, **take sampled**: what differs between kinds of group (lock-step
  Hogwild groups, fork/join requests) each kind decides through one interface,
  :class:`~vllm_hogwild.core.groups.kind.GroupKind`: which workers sit a step
  out (:meth:`who_sits_out`), its part of the step's wire for the worker processes
  (:meth:`step`), what sampled tokens change (:meth:`take_sampled`: where they
  enter the groups, their text read by each group's driver, which may stop it);
  with speculative decoding, what the table says of drafts and accepted runs
  (:mod:`vllm_hogwild.core.groups.drafts`);
- **preempt** and **replay**: a whole group out under KV pressure, and back by
  exact replay (:class:`~vllm_hogwild.core.groups.preempt.Replayer`);
- **park** and **finish**: a worker that stops keeps its lane (co-workers
  still read it) until the whole group is done; then every lane is freed
  together (:meth:`finish`), and the group leaves every index in one place
  (:meth:`_end`).

The table composes its parts, each owning its own indexes: ``admitter`` and ``replayer``
(the drafts part keeps none); it owns the groups, workers, running groups and the step being
built. A step goes one way, table -> kind -> group: a kind gets the step's data
(:class:`~vllm_hogwild.core.groups.group.StepInput`) and returns a
:class:`~vllm_hogwild.core.groups.group.StepResult`, which the table records.

The table reads a worker's engine request only through
:class:`~vllm_hogwild.core.groups.group.EngineRequest` (vLLM's ``Request`` has those fields);
per step it works on the groups that changed and sends each decoding group's lane
lengths: a group decoding in lock-step costs one counter and its N lengths.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping, Sequence

from vllm_hogwild.core.groups import drafts as drafts_part
from vllm_hogwild.core.groups.group import Group, Phase, StepInput, Worker, parse_request_id
from vllm_hogwild.core.groups.admit import Admission, Admitter, Room
from vllm_hogwild.core.groups.all_kinds import new_group
from vllm_hogwild.core.groups.preempt import Preemption, Replayer
from vllm_hogwild.core.forkjoin.lane_channel import LaneRecord
from vllm_hogwild.core.options import KV_MODES, RequestSpec
from vllm_hogwild.core.stats import HogwildStats
from vllm_hogwild.core.wire import LaneLengths, StepWire
from vllm_hogwild.core.replay.steady import SteadyGroups


class GroupTable:
    def __init__(self, *, block_size: int, max_plain_wait: float, encode: Callable[[str], list[int]],
                 text_for: Callable[[Any], Callable[[int], str]] | None = None,
                 hidden_for: Callable[[Any], Callable[[int], str] | None] | None = None, slack: int = 0,
                 speculative: bool = False, kv: str = "on-demand", max_positions: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``encode``: text to token ids (fed_ahead text); ``text_for(request)``: that request's detokenizer
        (the text each sampled token adds), for groups that observe text; ``hidden_for(request)``: a token's
        text that request's text leaves out (special tokens it skips; None: none), which fork/join protocols
        read (a model's tags may be special tokens); ``slack``: slots a lane may need
        past its budget (:func:`~vllm_hogwild.core.options.spec_slack`); ``speculative``: the engine verifies
        drafts (a lane may accept several tokens per step); ``kv``: one of :data:`KV_MODES`;
        ``max_positions``: the context window (a fork/join request's views stay below it); ``clock``:
        seconds, for metrics."""
        if kv not in KV_MODES:
            raise ValueError(f"kv: one of {KV_MODES}")
        self.block_size = block_size
        self.slack = slack
        self.speculative = speculative
        self.on_demand = kv == "on-demand"
        self.max_positions = max_positions
        self.stats = HogwildStats()
        self._encode = encode
        self._text_for = text_for
        self._hidden_for = hidden_for
        self._clock = clock
        # The parts, each owning its own indexes (a group that ends leaves them all in one place: :meth:`_end`).
        self.admitter = Admitter(block_size=block_size, slack=slack, on_demand=self.on_demand,
                                 max_plain_wait=max_plain_wait, clock=clock)
        self.replayer = Replayer()
        # what the sit-out decisions compare: engine steps in which a worker accepted tokens (without drafts: one token each)
        self._steps_of = (lambda w: w.sampled_steps) if speculative else (lambda w: w.request.num_output_tokens)
        self.groups: dict[str, Group] = {}  # by group id, in arrival order
        self.workers: dict[str, Worker] = {}  # by request id
        self._running: dict[str, Group] = {}  # admitted groups, in admission order
        self._observing: dict[str, Group] = {}  # admitted groups whose text the driver reads
        self._unsettled: set[str] = set()  # admitted groups whose kind may have workers sit out (:meth:`who_sits_out`)
        self._ended: list[str] = []  # groups whose shape the worker processes hold, ended since the last wire
        self._sitting_out: set[str] = set()  # groups with a worker sitting out the step being scheduled
        self._steady = SteadyGroups()  # groups in steady lock-step, advanced together (:meth:`Group.lock_step`)
        self._num_recording = 0  # groups whose kind sends lane records (:meth:`lane_record`)
        self.feeding_ahead = True  # forced text after its first token is fed in one step (off: a control)
        self._placing: dict[str, tuple[Worker, int, list[int]]] = {}  # taken for the step being scheduled
        self._fed: dict[str, tuple[int, tuple[int, ...]]] = {}  # fed in it: request id -> (first index, tokens)

    def __contains__(self, request_id: str) -> bool:
        """A worker's request, or a replay request: a lane of some group."""
        return request_id in self.workers or request_id in self.replayer.replays

    def __bool__(self) -> bool:
        return bool(self.groups)

    @property
    def replays(self) -> dict[str, Worker]:  # replay request id -> the worker whose lane it re-feeds
        return self.replayer.replays

    @property
    def num_aside(self) -> int:  # requests set aside, out of the engine's queues (their groups are not admitted)
        return self.admitter.num_aside

    @property
    def num_waiting_groups(self) -> int:
        return len(self.admitter.waiting)

    @property
    def num_running_groups(self) -> int:
        return len(self._running)

    @property
    def running_groups(self) -> list[Group]:
        return list(self._running.values())

    # -- arrive -----------------------------------------------------------------------------------------

    def arrive(self, request_id: str, spec: RequestSpec, request: Any, *, prompt_len: int, max_tokens: int,
               eos_token_id: int | None, arrival: float) -> Worker:
        """A worker's request arrived (``arrival``: its wall-clock arrival time, as vLLM records it)."""
        group_id, index = parse_request_id(request_id, spec.num_workers)
        group = self.groups.get(group_id)
        new = group is None
        if new:
            group = new_group(group_id, spec, max_tokens, prompt_len, arrival=arrival,
                              arrival_time=self._clock(), encode=self._encode, max_positions=self.max_positions)
            self.groups[group_id] = group
            self._num_recording += group.kind.records
        worker = Worker(group, index, request_id, request, eos_token_id)
        if group.driver.observes_text and self._text_for is not None:
            worker.text = self._text_for(request)
        if group.driver.reads_hidden and self._hidden_for is not None:
            worker.hidden = self._hidden_for(request)
        group.workers[index] = worker
        self.workers[request_id] = worker
        self.admitter.arrived(group, new)
        if group.is_complete:
            group.phase = Phase.WAITING
        return worker

    # -- admit (the admitter's) ------------------------------------------------------------------------

    def admit(self, now: float, room: Callable[[], Room], oldest_plain: Callable[[], float | None]) -> Admission:
        """Complete (or preempted) groups to queue now (:meth:`Admitter.admit
        <vllm_hogwild.core.groups.admit.Admitter.admit>`); the table runs those admitted."""
        admission = self.admitter.admit(now, room, oldest_plain)
        for group in admission.groups:
            group_id = group.group_id
            self._running[group_id] = group
            if group.driver.observes_text:
                self._observing[group_id] = group
            if group.phase is Phase.REPLAYING:
                self.replayer.resumed(group)
            self._unsettled.add(group_id)
        return admission

    def forked_lanes(self) -> list[tuple[str, int, int]]:
        """Lanes a fork took, queued, not scheduled yet (:meth:`Admitter.forked_lanes
        <vllm_hogwild.core.groups.admit.Admitter.forked_lanes>`)."""
        return self.admitter.forked_lanes(self._running)

    @property
    def num_queued(self) -> int:  # (these four: the admitter's, which says what they are)
        return self.admitter.num_queued

    @property
    def has_reservations(self) -> bool:
        return self.admitter.has_reservations

    def first_allocation(self, request_id: str) -> int | None:
        return self.admitter.first_allocation(request_id)

    def allocated(self, request_id: str) -> None:
        self.admitter.allocated(request_id)

    def preempted_alone(self, request_id: str) -> None:
        """vLLM preempted one worker (the table's rules are there so that it never does): counted."""
        worker = self.workers[request_id]
        self.stats.num_lone_preemptions += 1
        self.admitter.preempted_alone(worker)

    # -- preempt and replay (the replayer's) ---------------------------------------------------------------

    def preempt(self, group_id: str) -> Preemption:
        """Take a running group out whole: it waits again, oldest first, and re-feeds its lanes on resumption.
        Call it before the scheduler frees anything: each lane's length is read here, once."""
        group = self._running.pop(group_id)
        self._steady.drop(group_id)  # (its log catches up: the replay reads it)
        self._observing.pop(group_id, None)
        self._unsettled.discard(group_id)
        pending = self.admitter.preempted(group)
        preemption = self.replayer.preempt(group, pending)
        group.phase, group.in_step, group.shape_sent = Phase.PREEMPTED, False, False
        self.admitter.wait_again(group, len(preemption.requests))
        group.counters.num_preemptions += 1
        self.stats.num_group_preemptions += 1
        return preemption

    def replay_request(self, worker: Worker, request: Any) -> None:
        """The scheduler made ``request`` to re-feed ``worker``'s (finished) lane; it holds the lane now."""
        self.replayer.replay_request(worker, request)
        self.admitter.promise(request.request_id, worker.lane_len + 1 + self.slack)

    @property
    def replaying(self) -> list[Group]:
        return list(self.replayer.replaying.values())

    def replay_ends(self, budget: int, max_chunk: int = 0) -> dict[str, int]:
        """Where each replaying lane's tokens stop this step (:meth:`Replayer.replay_ends
        <vllm_hogwild.core.groups.preempt.Replayer.replay_ends>`)."""
        return self.replayer.replay_ends(budget, max_chunk)

    def settle(self) -> tuple[list[tuple[Any, int]], list[Any]]:
        """Before a step: :meth:`Replayer.settle <vllm_hogwild.core.groups.preempt.Replayer.settle>`."""
        rollbacks, finished, done = self.replayer.settle()
        for group in done:
            self._unsettled.add(group.group_id)
        return rollbacks, finished

    def replay_parked(self, request_id: str) -> bool:
        """A replay request finished; True: its group goes on and keeps the lane in its blocks (park it)."""
        return self.replayer.replay_parked(request_id, self.groups)

    def prefix_hit_cap(self, request_id: str, block_size: int) -> int | None:
        """A replaying lane's most prefix-cache hit tokens (:meth:`Replayer.prefix_hit_cap
        <vllm_hogwild.core.groups.preempt.Replayer.prefix_hit_cap>`); None: no cap."""
        return self.replayer.prefix_hit_cap(self.workers.get(request_id) or self.replayer.replays.get(request_id),
                                            block_size)

    def take_orphans(self) -> list[Any]:
        """Replay requests of groups that ended (aborted while replaying): the scheduler aborts them."""
        return self.replayer.take_orphans()

    # -- drafts (speculative decoding) ------------------------------------------------------------------

    def drafts_to_drop(self) -> list[Any]:
        """Requests that verify no drafts (:func:`~vllm_hogwild.core.groups.drafts.drafts_to_drop`)."""
        return drafts_part.drafts_to_drop(self._running.values())

    def accept(self, request_id: str) -> Worker | None:
        """Speculative decoding: the request accepted tokens this step (one or more): its worker, with the
        step counted; None: a plain request."""
        worker = self.workers.get(request_id)
        if worker is not None:
            worker.sampled_steps += 1
        return worker

    def accept_run(self, worker: Worker, tokens: list[int], accept) -> tuple[int, bool]:
        """An accepted run, token by token, each entering its group's state, up to where it is cut
        (:func:`~vllm_hogwild.core.groups.drafts.accept_run`): ``(accepted, stopped)``."""
        return drafts_part.accept_run(worker, tokens, accept)

    # -- sit out -------------------------------------------------------------------------------------------

    def who_sits_out(self) -> list[Any]:
        """Requests of running workers that sit this step out, as each group's kind decides
        (:meth:`~vllm_hogwild.core.groups.kind.GroupKind.who_sits_out`).

        Only unsettled groups are asked: a Hogwild group whose live workers are even stays even while
        all are scheduled (a worker left out of a step by vLLM's token budget unsettles it again).
        """
        sitting_out = []
        for group_id in list(self._unsettled):
            group = self.groups[group_id]
            if group.phase is not Phase.ADMITTED:
                continue  # replaying lanes keep step through their chunk ends
            waits, settled = group.kind.who_sits_out(group, self._steps_of)
            if waits:
                self._sit_out(group_id)
            sitting_out += [group.workers[w].request for w in waits]
            if settled:
                self._unsettled.discard(group_id)
        return sitting_out

    def wait_for_outputs(self, request_ids: Sequence[str]) -> None:
        """These workers sit this step out: their last output is not in yet (async scheduling)."""
        for request_id in request_ids:
            worker = self.workers.get(request_id)
            if worker is not None:
                self._sit_out(worker.group.group_id)

    def _sit_out(self, group_id: str) -> None:
        """A worker of the group sits this step out: the group is not in lock-step in it."""
        self._steady.drop(group_id)
        self._sitting_out.add(group_id)

    # -- feed ahead -------------------------------------------------------------------------------------

    def feed_ahead(self, runs: Callable[[Any], bool]) -> list[tuple[Any, list[int]]]:
        """Before vLLM schedules: the forced tokens each lane feeds whole in the coming step, ``(request,
        tokens)`` for the scheduler to append to the request (its kind decides: :meth:`~vllm_hogwild.core.
        groups.kind.GroupKind.feed_ahead`); ``runs(request)``: vLLM runs it. Once vLLM has scheduled,
        :meth:`fed_ahead` says what was fed. O(groups whose kind forces ahead)."""
        if not self.feeding_ahead or not self._observing:
            return []
        out = []
        for group in self._observing.values():
            if group.kind.feeds_ahead and group.phase is Phase.ADMITTED:
                for worker, first, tokens in group.kind.feed_ahead(group, runs, self.max_positions):
                    self._placing[worker.request_id] = (worker, first, tokens)
                    out.append((worker.request, tokens))
        return out

    def fed_ahead(self, scheduled: Mapping[str, int]) -> list[tuple[Any, int, bool]]:
        """vLLM has scheduled (``scheduled``: tokens per request): of each lane's forced tokens, those it feeds
        this step stay (they go on the wire); the rest go back to the lane's queue. Returns ``(request, how
        many of its last tokens to take back, whether it samples in this step all the same)``."""
        back = []
        for request_id, (worker, first, tokens) in self._placing.items():
            n = scheduled.get(request_id, 0)
            fed = max(0, n - 1)  # its unfed token first, then the forced ones
            if fed < len(tokens):
                worker.group.driver.give_back(worker.index, tokens[fed:], first + fed)
                back.append((worker.request, len(tokens) - fed, n > 0))
            if fed:
                self._fed[request_id] = (first, tuple(tokens[:fed]))
        self._placing.clear()
        return back

    # -- step -------------------------------------------------------------------------------------------

    def step(self, scheduled: Mapping[str, int], drafts: Mapping[str, Sequence[int]],
             block_ids: Callable[[str], Sequence[int]], *, all_scheduled: bool, has_tokens: bool) -> StepWire:
        """The step's wire, once vLLM has scheduled (token counts already advanced).

        ``scheduled``: tokens per request this step; ``drafts``: each request's draft tokens this
        step; ``block_ids(request_id)``: its lane's blocks; ``all_scheduled``: vLLM scheduled every
        running request (none fell out of the token budget); ``has_tokens``: the step reaches the
        worker processes (a step without tokens does not). Each group that decodes sends its lanes'
        lengths (the worker processes keep none): O(N); in lock-step, one counter in its log besides.
        """
        shapes, steps, replays, forced, forks = [], [], [], {}, []
        lengths = LaneLengths()  # the step being built: the groups that decode and their lanes' lengths
        promises = self.admitter.promises
        if promises:
            promises.drop_scheduled(scheduled)
        steady = self._steady
        if steady and (not all_scheduled or self.speculative):
            steady.clear()  # a step that may break lock-step: every group's kind decides again
        if steady:  # the same workers, one token more each: every steady group's lengths in one operation
            lengths.add_block(*steady.advance())
        # Every other running group (none when all are steady); one that becomes steady below is from the next step on.
        others = self._running.items() if len(steady) < len(self._running) else ()
        step = StepInput(scheduled, drafts, forced, all_scheduled, self.speculative)
        sitting_out, unsettled = self._sitting_out, self._unsettled
        for group_id, group in others:
            if group_id in steady:
                continue  # advanced above
            if not group.shape_sent:
                lane_ids = group.request_ids
                if not any(r in scheduled for r in lane_ids):
                    continue
                shapes.append(group.shape([block_ids(r) for r in lane_ids], lane_ids))
                group.shape_sent = True
            if group.phase is Phase.REPLAYING:  # its lanes re-feed: the replayer's part of the wire
                replay, replayed = self.replayer.step(group, scheduled)
                if replay is not None:
                    replays.append(replay)
                    self.stats.num_replayed_tokens += replayed
                continue
            # The group's kind decides its part from the step's data and returns it; the table records it here.
            out = group.kind.step(group, step, group_id in sitting_out)
            if out.settled is not None:
                if out.settled:
                    unsettled.discard(group_id)
                else:
                    unsettled.add(group_id)
            if out.lane_lens is not None:
                lengths.add(group_id, out.lane_lens)
            if out.steady:
                steady.add(group_id, group.log)
            if out.wire is not None:
                steps.append(out.wire)
            if out.fork is not None:
                forks.append(out.fork)
        self._sitting_out.clear()
        ended = ()
        if self._ended and has_tokens:
            ended, self._ended = tuple(self._ended), []
        fed_ahead, self._fed = self._fed, {}
        return StepWire(tuple(shapes), tuple(steps), *lengths.columns(), ended, forced, tuple(replays), tuple(forks),
                        fed_ahead)

    # -- take sampled -----------------------------------------------------------------------------------

    def take_sampled(self) -> None:
        """Where the step's sampled tokens enter the groups' state, once vLLM's outputs are in (its requests have
        them): each observing group's driver reads its workers' new tokens (:meth:`Group.accept_sampled
        <vllm_hogwild.core.groups.group.Group.accept_sampled>`); an answer stops its group; then its kind
        (:meth:`~vllm_hogwild.core.groups.kind.GroupKind.after_outputs`), whose lanes a fork took go to the
        engine's queue at the next admission. Groups that read no text (the raw protocol) cost nothing here."""
        for group in self._observing.values():
            for worker in group.workers:
                if not worker.finished:
                    group.accept_sampled(worker)
            if group.driver.answered:  # a worker wrote the answer: everyone samples its end next
                group.stop()
            released = group.kind.after_outputs(group)
            if released:
                self.admitter.release(released)

    # -- park and finish --------------------------------------------------------------------------------

    def finish(self, request_id: str, block_ids: Callable[[str], Sequence[int]]) -> list[Any] | None:
        """A worker's request finished (stopped, or aborted). None: park it (co-workers still read its lane:
        keep its blocks); else its group ended: the parked requests whose blocks to free now, with its own."""
        worker = self.workers[request_id]
        group = worker.group
        worker.finished, worker.lane_len = True, worker.request.num_computed_tokens
        if group.replay is not None:  # stopped (aborted) while preempted or replaying: its lane as it was
            worker.lane_len = group.replay.targets[worker.index]
        group.num_live -= 1
        self._steady.drop(group.group_id)  # its lanes no longer all grow (its log catches up)
        phase = group.phase
        self.admitter.lane_finished(worker, phase)
        if group.driver.observes_text:
            group.accept_sampled(worker)
        if group.tracker is not None:
            group.tracker.stop(worker.index, worker.lane_len)
        released = group.kind.finished(group, worker)
        if released:
            self.admitter.release(released)
        if group.num_live > 0 and phase is not Phase.GATHERING:
            return None  # a complete group with a live worker (``num_live`` counts them down: O(1) here)
        arrived = [w for w in group.workers if w is not None]
        if not all(w.finished for w in arrived):
            return None
        # The group ends (all its workers finished; or it was aborted while its requests still arrived:
        # vLLM aborts a parent's requests together, and no later one comes).
        if group.is_complete:
            self._record_end(group, block_ids)
        return self._end(group, arrived, request_id)

    def _end(self, group: Group, arrived: list[Worker], request_id: str) -> list[Any]:
        """The one place a group leaves the table (``arrived``: its workers; ``request_id``: the last to finish):
        every index drops it, each part its own in one call, and its workers let go of it. Returns the parked
        requests whose blocks to free now."""
        group_id, parked = group.group_id, []
        for w in arrived:
            if w.lane_request is not w.request:  # a replay request holds the lane
                if w.lane_request.is_finished():
                    parked.append(w.lane_request)  # parked: its blocks go now (else aborted next step: an orphan)
            elif w.request_id != request_id:
                parked.append(w.request)  # (a preempted group's hold no block: freeing them frees nothing)
        orphans = self.replayer.forget(group, arrived)
        self.admitter.forget(group, arrived, orphans)
        for w in arrived:
            del self.workers[w.request_id]
        del self.groups[group_id]
        self._num_recording -= group.kind.records
        self._running.pop(group_id, None)
        self._observing.pop(group_id, None)
        self._unsettled.discard(group_id)
        self._steady.drop(group_id)  # (dropped already when its last worker finished: a no-op)
        self._sitting_out.discard(group_id)
        if group.shape_sent or group.log.num_steps:
            self._ended.append(group_id)
        # The table is done with the group: break its cycle with its workers (each names its group), so that
        # they and the engine requests they hold are freed now, by reference counting, not left to the garbage
        # collector's rare full pass (at 256 groups of 4 a run, they were all of the process's cyclic garbage).
        for w in arrived:
            w.group = None
        return parked

    @property
    def records_lanes(self) -> bool:
        """Whether a group of a kind that sends lane records is in the table (else :meth:`lane_record` is
        None for every request: a caller with many requests may skip asking)."""
        return self._num_recording > 0

    def lane_record(self, request_id: str, finished: bool = False) -> LaneRecord | None:
        """What the front end must learn of a worker with its outputs, as its kind says
        (:meth:`~vllm_hogwild.core.groups.kind.GroupKind.record`; ``finished``: with its last one), for the
        plugin's own output field (:mod:`vllm_hogwild.core.forkjoin.lane_channel`). None: nothing (not a worker, or a
        kind with nothing to say)."""
        worker = self.workers.get(request_id)
        return None if worker is None else worker.group.kind.record(worker, finished)

    def _record_end(self, group: Group, block_ids: Callable[[str], Sequence[int]]) -> None:
        self.stats.record(group.end_record([block_ids(w.lane_request_id) for w in group.workers], self.block_size,
                                           self._clock()))

    def snapshot(self, free_blocks: int) -> dict[str, Any]:
        """The metrics since the last snapshot (plain data: it crosses processes)."""
        return self.stats.snapshot(self.num_running_groups, self.num_waiting_groups, free_blocks)
