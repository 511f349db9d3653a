"""Every Hogwild group's life in one engine core, from its first request to its last block. Pure, no vLLM import.

The scheduler keeps one :class:`GroupTable`. It translates vLLM's requests
into the table's inputs and applies the table's answers; what is decided about
a group is decided here:

- **arrive**: a worker's request comes in (they arrive one by one, in any
  order); the scheduler holds it out of vLLM's waiting queue;
- **admit**: complete groups, oldest first, go to vLLM's waiting queue whole,
  when they fit (the KV rule below) and fairness allows
  (:mod:`vllm_hogwild.core.groups.admit`, on the rules of
  :mod:`vllm_hogwild.core.groups.policy`); a preempted group comes back the same
  way, its finished lanes with replay requests of their own;
- **hold**, **step**, **observe**: what differs between kinds of group (lock-step
  Hogwild groups, fork/join requests) each kind decides through one interface,
  :class:`~vllm_hogwild.core.groups.kind.GroupKind`: which workers sit a step
  out (:meth:`holds`), its part of the step's wire for the worker processes
  (:meth:`step`), what sampled tokens change (:meth:`after_outputs`; every
  token's text goes to the group's protocol driver first, which may stop it);
  with speculative decoding, what the table says of drafts and accepted runs
  (:mod:`vllm_hogwild.core.groups.drafts`);
- **preempt** and **replay**: a whole group out under KV pressure, and back by
  exact replay (:mod:`vllm_hogwild.core.groups.preempt`);
- **park** and **finish**: a worker that stops keeps its lane (co-workers
  still read it) until the whole group is done; then every lane is freed
  together (:meth:`finish`).

The KV rule (``kv``): ``on-demand`` (the default) admits a group when every
lane's prompt and first token fit, as vLLM admits a request, and its lanes
then take blocks as they grow; a preempted group is admitted again when all
its lanes fit as they were; a fork/join request's lanes that no fork took yet
take nothing until one does. ``reserve`` admits a group only when every lane
fits for its whole budget, ``prompt // bs`` shared full blocks plus, per lane,
the rest of ``prompt + max_tokens``
(:func:`~vllm_hogwild.core.options.blocks_for_group`), and a lane's first
allocation takes that whole budget (:meth:`first_allocation`): no group is
ever preempted.

The table reads a worker's engine request only through
:class:`~vllm_hogwild.core.groups.group.EngineRequest` (vLLM's ``Request`` has those fields);
per step it works on the groups that changed and sends each decoding group's lane
lengths: a group decoding in lock-step costs one counter and its N lengths.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping, Sequence

from vllm_hogwild.core.groups.policy import Fairness, Promises
from vllm_hogwild.core.groups.group import Group, Phase, Worker, parse_request_id
from vllm_hogwild.core.groups.admit import Admit
from vllm_hogwild.core.groups.all_kinds import new_group
from vllm_hogwild.core.groups.drafts import Drafts
from vllm_hogwild.core.groups.preempt import PreemptAndReplay
from vllm_hogwild.core.forkjoin.lane_channel import LaneRecord
from vllm_hogwild.core.options import KV_MODES, RequestSpec
from vllm_hogwild.core.stats import HogwildStats
from vllm_hogwild.core.wire import GroupStep, LaneLengths, StepWire
from vllm_hogwild.core.replay.steady import SteadyGroups


class GroupTable(Admit, PreemptAndReplay, Drafts):
    def __init__(self, *, block_size: int, max_plain_wait: float, encode: Callable[[str], list[int]],
                 text_for: Callable[[Any], Callable[[int], str]] | None = None,
                 hidden_for: Callable[[Any], Callable[[int], str] | None] | None = None, slack: int = 0,
                 speculative: bool = False, kv: str = "on-demand", max_positions: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``encode``: text to token ids (placed text); ``text_for(request)``: that request's detokenizer
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
        self.fairness = Fairness(max_plain_wait)
        self.stats = HogwildStats()
        self._encode = encode
        self._text_for = text_for
        self._hidden_for = hidden_for
        self._clock = clock
        self.groups: dict[str, Group] = {}  # by group id, in arrival order
        self.workers: dict[str, Worker] = {}  # by request id
        self.replays: dict[str, Worker] = {}  # replay request id -> the (finished) worker whose lane it re-feeds
        self._waiting: dict[str, Group] = {}  # groups not admitted (or preempted), oldest first
        self._running: dict[str, Group] = {}  # admitted groups, in admission order
        self._observing: dict[str, Group] = {}  # admitted groups whose text the driver reads
        self._replaying: dict[str, Group] = {}  # admitted again after a preemption, re-feeding their lanes
        self._num_held = 0  # requests of waiting groups that have arrived and not finished
        # requests handed to the engine's waiting queue, not scheduled yet -> slots their first allocation takes
        # (with `reserve` the whole budget, which that allocation reserves: :meth:`first_allocation`)
        self.promises = Promises(block_size)
        self._with_spares: dict[str, Group] = {}  # admitted groups that keep lanes out of the queues (fork/join)
        self._released: list[Worker] = []  # spare lanes a fork took, for the engine's queue at the next admission
        self._forked: dict[str, Worker] = {}  # lanes a fork took, handed to the engine's queue (:meth:`forked_lanes`)
        self._unsettled: set[str] = set()  # admitted groups whose kind may hold workers back (:meth:`holds`)
        self._ended: list[str] = []  # groups whose shape the worker processes hold, ended since the last wire
        self._orphans: list[Any] = []  # replay requests of groups that ended: the scheduler aborts them
        self._lengths = LaneLengths()  # the step being built: the groups that decode and their lanes' lengths
        self._sitting_out: set[str] = set()  # groups with a worker held out of the step being scheduled
        self._steady = SteadyGroups()  # groups in steady lock-step, advanced together (:meth:`lock_step`)
        self._num_recording = 0  # groups whose kind sends lane records (:meth:`lane_record`)
        self.feeds_placed_ahead = True  # placed text after its first token is fed in one step (off: a control)
        self._placing: dict[str, tuple[Worker, int, list[int]]] = {}  # taken for the step being scheduled
        self._placed: dict[str, tuple[int, tuple[int, ...]]] = {}  # fed in it: request id -> (first index, tokens)

    def __contains__(self, request_id: str) -> bool:
        """A worker's request, or a replay request: a lane of some group."""
        return request_id in self.workers or request_id in self.replays

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

    @property
    def running_groups(self) -> list[Group]:
        return list(self._running.values())

    # -- arrive -----------------------------------------------------------------------------------------

    def arrive(self, request_id: str, spec: RequestSpec, request: Any, *, prompt_len: int, max_tokens: int,
               eos_token_id: int | None, arrival: float) -> Worker:
        """A worker's request arrived (``arrival``: its wall-clock arrival time, as vLLM records it)."""
        group_id, index = parse_request_id(request_id, spec.num_workers)
        group = self.groups.get(group_id)
        if group is None:
            group = new_group(group_id, spec, max_tokens, prompt_len, arrival=arrival,
                              arrival_time=self._clock(), encode=self._encode, max_positions=self.max_positions)
            self.groups[group_id] = group
            self._waiting[group_id] = group
            self._num_recording += group.kind.records
        worker = Worker(group, index, request_id, request, eos_token_id)
        if group.driver.observes_text and self._text_for is not None:
            worker.text = self._text_for(request)
        if group.driver.reads_hidden and self._hidden_for is not None:
            worker.hidden = self._hidden_for(request)
        group.workers[index] = worker
        self.workers[request_id] = worker
        self._num_held += 1
        if group.is_complete:
            group.phase = Phase.WAITING
        return worker

    # -- hold -------------------------------------------------------------------------------------------

    def holds(self) -> list[Any]:
        """Requests of running workers that sit this step out, as each group's kind decides
        (:meth:`~vllm_hogwild.core.groups.kind.GroupKind.holds`).

        Only unsettled groups are asked: a Hogwild group whose live workers are even stays even while
        all are scheduled (a worker left out of a step by vLLM's token budget unsettles it again).
        """
        held = []
        for group_id in list(self._unsettled):
            group = self.groups[group_id]
            if group.phase is not Phase.ADMITTED:
                continue  # replaying lanes keep step through their chunk ends
            waits, settled = group.kind.holds(group, self._steps_of)
            if waits:
                self._sit_out(group_id)
            held += [group.workers[w].request for w in waits]
            if settled:
                self._unsettled.discard(group_id)
        return held

    def wait_for_outputs(self, request_ids: Sequence[str]) -> None:
        """The engine holds these workers out of this step: their last output is not in yet (async scheduling)."""
        for request_id in request_ids:
            worker = self.workers.get(request_id)
            if worker is not None:
                self._sit_out(worker.group.group_id)

    def keep_in_step(self, group: Group) -> None:
        """The group's live workers are even from the next step on (its kind knows it without asking
        :meth:`holds`): it is in step, and settled, until it falls out of step."""
        group.in_step = True
        self._unsettled.discard(group.group_id)

    def _sit_out(self, group_id: str) -> None:
        """A worker of the group sits this step out: the group is not in lock-step in it."""
        self._steady.drop(group_id)
        self._sitting_out.add(group_id)

    def sits_out(self, group: Group) -> bool:
        """Whether a worker of ``group`` sits this step out (the table's holds, or waiting for its outputs)."""
        return group.group_id in self._sitting_out

    def _steps_of(self, worker: Worker) -> int:
        """Engine steps in which the worker accepted tokens (without speculative decoding: one token each)."""
        return worker.sampled_steps if self.speculative else worker.request.num_output_tokens

    # -- place ahead ------------------------------------------------------------------------------------

    def place_ahead(self, runs: Callable[[Any], bool]) -> list[tuple[Any, list[int]]]:
        """Before vLLM schedules: the placed tokens each lane feeds whole in the coming step, ``(request,
        tokens)`` for the scheduler to append to the request (its kind decides: :meth:`~vllm_hogwild.core.
        groups.kind.GroupKind.place_ahead`); ``runs(request)``: vLLM runs it. Once vLLM has scheduled,
        :meth:`placed_fed` says what was fed. O(groups whose kind places ahead)."""
        if not self.feeds_placed_ahead or not self._observing:
            return []
        out = []
        for group in self._observing.values():
            if group.kind.places_ahead and group.phase is Phase.ADMITTED:
                for worker, first, tokens in group.kind.place_ahead(group, runs, self.max_positions):
                    self._placing[worker.request_id] = (worker, first, tokens)
                    out.append((worker.request, tokens))
        return out

    def placed_fed(self, scheduled: Mapping[str, int]) -> list[tuple[Any, int, bool]]:
        """vLLM has scheduled (``scheduled``: tokens per request): of each lane's placed tokens, those it feeds
        this step stay (they go on the wire); the rest go back to the lane's queue. Returns ``(request, how
        many of its last tokens to take back, whether it samples in this step all the same)``."""
        back = []
        for request_id, (worker, first, tokens) in self._placing.items():
            n = scheduled.get(request_id, 0)
            fed = max(0, n - 1)  # its unfed token first, then the placed ones
            if fed < len(tokens):
                worker.group.driver.give_back(worker.index, tokens[fed:], first + fed)
                back.append((worker.request, len(tokens) - fed, n > 0))
            if fed:
                self._placed[request_id] = (first, tuple(tokens[:fed]))
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
        lengths = self._lengths = LaneLengths()
        if self.promises:
            self.promises.drop_scheduled(scheduled)
        steady = self._steady
        if steady and (not all_scheduled or self.speculative):
            steady.clear()  # a step that may break lock-step: every group's kind decides again
        if steady:  # the same workers, one token more each: every steady group's lengths in one operation
            lengths.add_block(*steady.advance())
        # Every other running group (none when all are steady); one that becomes steady below is from the next step on.
        others = self._running.items() if len(steady) < len(self._running) else ()
        for group_id, group in others:
            if group_id in steady:
                continue  # advanced above
            workers = group.workers
            if not group.shape_sent:
                lane_ids = group.request_ids
                if not any(r in scheduled for r in lane_ids):
                    continue
                shapes.append(group.shape([block_ids(r) for r in lane_ids], lane_ids))
                group.shape_sent = True
            if group.phase is Phase.REPLAYING:
                lanes = [(w.index, (r := w.lane_request).num_computed_tokens - n, r.num_computed_tokens)
                         for w in workers if (n := scheduled.get(w.lane_request_id))]
                if lanes:
                    # What vLLM's budget cut short in one lane makes the same steps' tokens of the others
                    # wrong: they are rolled back after the step (settle), and read their own lane meanwhile.
                    valid = group.replay.valid([w.lane_request.num_computed_tokens for w in workers])
                    replays.append(group.replay.wire(group.group_id, lanes, valid))
                    replayed = sum(b - max(a, group.prompt_len) for _, a, b in lanes if b > group.prompt_len)
                    group.counters.num_replayed_tokens += replayed
                    self.stats.num_replayed_tokens += replayed
                continue
            wire, fork = group.kind.step(self, group, scheduled, drafts, forced, all_scheduled)
            if wire is not None:
                steps.append(wire)
            if fork is not None:
                forks.append(fork)
        self._sitting_out.clear()
        ended = ()
        if self._ended and has_tokens:
            ended, self._ended = tuple(self._ended), []
        placed, self._placed = self._placed, {}
        return StepWire(tuple(shapes), tuple(steps), *lengths.columns(), ended, forced, tuple(replays), tuple(forks),
                        placed)

    def decode_step(self, group: Group, scheduled: Mapping[str, int],
                    drafts: Mapping[str, Sequence[int]], fed_ahead: bool = False) -> GroupStep | None:
        """Log the step of a group whose workers decode in it, send its lengths; its joins and drafts, if any.
        ``fed_ahead``: a lane's tokens beyond its first this step count as drafts (placed text fed ahead:
        :meth:`place_ahead`): co-workers read them from the next step on, and the step is a run of its own."""
        workers = group.workers
        decoding = [w.index for w in workers if not w.finished and (n := scheduled.get(w.request_id))
                    and w.request.num_computed_tokens - n >= group.prompt_len]  # a prefill chunk reads its lane
        if group.in_step and len(decoding) < group.num_live:
            group.in_step = False  # a live worker sat this step out: it is behind now
            self._unsettled.add(group.group_id)
        if not decoding:
            return None  # prefill rows read their own lane: plain attention
        if fed_ahead:  # a lane's tokens past its first: its drafts, or placed text fed ahead (see lane_lens)
            num_drafts = [0] * len(workers)
            for i in decoding:
                num_drafts[i] = scheduled[workers[i].request_id] - 1
            if not self.speculative and not any(num_drafts):
                num_drafts = None
        else:
            num_drafts = [len(drafts.get(w.request_id, ())) for w in workers] if self.speculative else None
        self._lengths.add(group.group_id, lens := group.lane_lens(num_drafts))
        return group.step(lens, decoding, num_drafts or (), exact=num_drafts is not None)

    def lock_step(self, group: Group, steady: bool = False) -> None:
        """A group in lock-step (the same workers, one token more each): a counter in its log, its lengths sent.

        ``steady``: its kind needs nothing else of it while it stays so (no text placed or read). From the next
        step on, while vLLM schedules every running request and verifies no drafts, :meth:`step` advances it
        with the other steady groups without asking its kind, all their lanes' lengths in one array operation
        (:class:`~vllm_hogwild.core.replay.steady.SteadyGroups`: at hundreds of groups, a call per group cost most of
        the step), its log caught up when it leaves. It leaves when a worker of it finishes or is
        held back, when it is preempted, and at any other step (its kind decides again then)."""
        group.log.advance()
        self._lengths.add(group.group_id, group.lane_lens())
        if steady:
            self._steady.add(group.group_id, group.log)

    def keep_steady(self, group: Group) -> None:
        """The group, whose log's last run is this step's (every live worker decoding in it), is steady from the
        next step on (as after :meth:`lock_step` with ``steady``): a group that starts decoding in lock-step is
        advanced with the others from its second decoding step, not its third."""
        self._steady.add(group.group_id, group.log)

    # -- observe ----------------------------------------------------------------------------------------

    def after_outputs(self) -> None:
        """The step's outputs are in: show each driver its workers' new text; an answer stops its group.
        Groups that read no text (the raw protocol) cost nothing here."""
        for group in self._observing.values():
            for worker in group.workers:
                if not worker.finished:
                    self._observe(worker)
            if group.driver.answered:  # a worker wrote the answer: everyone samples its end next
                group.stop()
            group.kind.after_outputs(self, group)

    def release(self, worker: Worker) -> None:
        """A spare lane a fork took goes to the engine's queue at the next admission."""
        self._released.append(worker)

    def _observe(self, worker: Worker) -> None:
        """Show the driver the text of every token ``worker`` sampled since last time."""
        driver = worker.group.driver
        if not driver.observes_text:
            return
        tokens = worker.request.output_token_ids
        for i in range(driver.num_observed[worker.index], len(tokens)):
            token = tokens[i]
            driver.observe(worker.index, i, worker.text(token), worker.hidden(token) if worker.hidden else "")

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
        if self.promises:
            self.promises.set(request_id, None)
        phase = group.phase
        if phase is not Phase.ADMITTED and phase is not Phase.REPLAYING:
            self._num_held -= 1  # aborted while its group waited
        elif (group.spare or self._released) and (
                worker.index in group.spare or any(w is worker for w in self._released)):  # a spare lane
            group.spare.discard(worker.index)  # not handed to the engine's queue yet (aborted)
            self._released = [w for w in self._released if w is not worker]
            self._num_held -= 1
        if group.driver.observes_text:
            self._observe(worker)
        if group.tracker is not None:
            group.tracker.stop(worker.index, worker.lane_len)
        group.kind.finished(self, group, worker)
        if group.num_live > 0 and phase is not Phase.GATHERING:
            return None  # a complete group with a live worker (``num_live`` counts them down: O(1) here)
        arrived = [w for w in group.workers if w is not None]
        if not all(w.finished for w in arrived):
            return None
        # The group ends (all its workers finished; or it was aborted while its requests still arrived:
        # vLLM aborts a parent's requests together, and no later one comes).
        if group.is_complete:
            self._record_end(group, block_ids)
        parked = []
        for w in arrived:
            del self.workers[w.request_id]
            self._forked.pop(w.request_id, None)
            if w.lane_request is not w.request:  # a replay request holds the lane
                if w.lane_request.is_finished():
                    parked.append(w.lane_request)  # parked: its blocks go now
                    del self.replays[w.lane_request_id]
                else:
                    self._orphans.append(w.lane_request)  # still in vLLM's queues: aborted next step
                    self.promises.set(w.lane_request_id, None)
            elif w.request_id != request_id:
                parked.append(w.request)  # (a preempted group's hold no block: freeing them frees nothing)
        del self.groups[group.group_id]
        self._num_recording -= group.kind.records
        self._waiting.pop(group.group_id, None)
        self._running.pop(group.group_id, None)
        self._observing.pop(group.group_id, None)
        self._replaying.pop(group.group_id, None)
        self._with_spares.pop(group.group_id, None)
        self._unsettled.discard(group.group_id)
        if group.shape_sent or group.log.num_steps:
            self._ended.append(group.group_id)
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
