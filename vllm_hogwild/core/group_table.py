"""Every Hogwild group's life in one engine core, from its first request to its last block. Pure, no vLLM import.

The scheduler keeps one :class:`GroupTable`. It translates vLLM's requests
into the table's inputs and applies the table's answers; what is decided about
a group is decided here:

- **arrive**: a worker's request comes in (they arrive one by one, in any
  order); the scheduler holds it out of vLLM's waiting queue;
- **admit**: complete groups, oldest first, go to vLLM's waiting queue whole,
  when they fit (the KV rule below) and fairness allows
  (:mod:`vllm_hogwild.core.admission`); a preempted group comes back the same
  way, its finished lanes with replay requests of their own;
- **hold**: lock-step: a worker ahead of its group's slowest live worker sits
  out a step (:meth:`holds`); with speculative decoding, workers whose next
  token the engine may place verify no drafts (:meth:`drafts_to_drop`);
- **step**: after vLLM has scheduled, the step's wire for the worker
  processes (:meth:`step`); each group's step goes into its log; the finisher
  may start here;
- **observe**: every sampled token's text goes to the group's protocol driver
  (paragraph ends, next prefixes, answers), which may stop the group;
- **preempt** and **replay**: under KV pressure a whole group is the unit
  (:meth:`preempt`: never a lone worker, co-workers read its blocks); resumed,
  every lane re-feeds its tokens with the views they were produced under
  (:meth:`replay_ends`, :meth:`settle`, :mod:`vllm_hogwild.core.replay`);
- **park** and **finish**: a worker that stops keeps its lane (co-workers
  still read it) until the whole group is done; then every lane is freed
  together (:meth:`finish`).

The KV rule (``kv``): ``on-demand`` (the default) admits a group when every
lane's prompt and first token fit, as vLLM admits a request, and its lanes
then take blocks as they grow; a preempted group is admitted again when all
its lanes fit as they were. ``reserve`` admits a group only when every lane
fits for its whole budget, ``prompt // bs`` shared full blocks plus, per lane,
the rest of ``prompt + max_tokens``
(:func:`~vllm_hogwild.core.options.blocks_for_group`), and a lane's first
allocation takes that whole budget (:meth:`first_allocation`): no group is
ever preempted.

The table reads a worker's engine request only through
:class:`~vllm_hogwild.core.group.Lane` (vLLM's ``Request`` has those fields);
per step it works on the groups that changed: a group decoding in lock-step
costs one counter.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from vllm_hogwild.core.admission import Decision, Fairness, ahead_of_group, fits
from vllm_hogwild.core.group import Group, Phase, Worker, parse_request_id
from vllm_hogwild.core.options import KV_MODES, RequestSpec, blocks_for_group
from vllm_hogwild.core.replay import Replay
from vllm_hogwild.core.stats import GroupEnd, HogwildStats
from vllm_hogwild.core.wire import GroupFork, StepWire


@dataclass(frozen=True)
class Room:
    """What the engine has left for a group to be admitted."""

    free_blocks: int
    watermark_blocks: int
    num_running: int  # requests running in the engine
    max_running: int


@dataclass
class Admission:
    queue: list[Any] = field(default_factory=list)  # requests to put at the head of the waiting queue, in order
    # finished lanes of resumed groups: (worker, its lane's tokens) for each replay request to make first
    replays: list[tuple[Worker, list[int]]] = field(default_factory=list)
    hold_newer_than: float | None = None  # plain requests that arrived after this wait this step


@dataclass
class Preemption:
    """What the scheduler frees when a group is preempted, by where each request stands in vLLM."""

    group_id: str
    requests: list[Any]  # the live workers' requests (running, or queued in vLLM's waiting queue)
    parked: list[Any]  # finished lanes' requests holding blocks (workers' own, or replay requests parked)
    replays: list[Any]  # replay requests still in vLLM's queues (they are dropped; new ones come on resumption)


class GroupTable:
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
        self._promised: dict[str, int] = {}
        self._promised_blocks = 0  # blocks those first allocations take
        self._forking: dict[str, Group] = {}  # admitted fork/join groups (their holds are the protocol's)
        self._released: list[Worker] = []  # fork/join lanes to hand to the engine's queue at the next admission
        self._uneven: set[str] = set()  # groups that may be out of lock-step
        self._ended: list[str] = []  # groups whose shape the worker processes hold, ended since the last wire
        self._orphans: list[Any] = []  # replay requests of groups that ended: the scheduler aborts them

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
            group = Group.create(group_id, spec, max_tokens, prompt_len, arrival=arrival,
                                 arrival_time=self._clock(), encode=self._encode, max_positions=self.max_positions)
            self.groups[group_id] = group
            self._waiting[group_id] = group
        worker = Worker(group, index, request_id, request, eos_token_id)
        if group.driver.observes_text and self._text_for is not None:
            worker.text = self._text_for(request)
        if group.driver.forks and self._hidden_for is not None:
            worker.hidden = self._hidden_for(request)
        group.workers[index] = worker
        self.workers[request_id] = worker
        self._num_held += 1
        if group.is_complete:
            group.phase = Phase.WAITING
        return worker

    # -- admit ------------------------------------------------------------------------------------------

    def admit(self, now: float, room: Callable[[], Room], oldest_plain: Callable[[], float | None]) -> Admission:
        """Complete (or preempted) groups to queue now, oldest first, while they fit and fairness allows.

        ``now``: wall-clock seconds; ``room``, ``oldest_plain`` (the arrival time of the oldest
        waiting plain request, None: none): read only when such a group waits.
        """
        admission = Admission()
        if self._released:
            for worker in self._released:
                self._num_held -= 1
                self._promise(worker.request_id, self._first_slots(worker.group))
                admission.queue.append(worker.request)
            self._released = []
        ready = [g for g in self._waiting.values() if g.phase in (Phase.WAITING, Phase.PREEMPTED)]
        if not ready:
            return admission
        here, oldest = room(), oldest_plain()
        for group in ready:
            decision = self.fairness.decide(now, group.arrival, self._fits(group, here), oldest)
            if decision is Decision.WAIT:
                break  # first come, first served among groups: a later group does not overtake
            if decision is Decision.HOLD_NEWER:
                admission.hold_newer_than = group.arrival
                break
            self._admit(group, admission)
        return admission

    def _fits(self, group: Group, room: Room) -> bool:
        bs, n = self.block_size, group.num_workers
        if group.phase is Phase.PREEMPTED:  # every lane as it was (at least its prompt), and its next token
            p = group.prompt_len
            need = p // bs + sum(-(-(max(k, p) + 1 + self.slack) // bs) - p // bs for k in group.replay.targets)
        else:
            need = blocks_for_group(group.prompt_len, 1 if self.on_demand else group.max_tokens, n, bs, self.slack)
        kept_lanes, kept_blocks = self._kept()
        return fits(need, self._promised_blocks + kept_blocks, room.watermark_blocks, room.free_blocks,
                    room.num_running + len(self._promised) + kept_lanes, n, room.max_running)

    def _kept(self) -> tuple[int, int]:
        """Fork/join lanes kept back until a fork takes them, and the blocks their first allocations will take: no
        later admission may take those (a sequence that forks waits for them). O(admitted fork/join groups)."""
        lanes = blocks = 0
        for group in self._forking.values():
            if group.kept:
                lanes += len(group.kept)
                blocks += len(group.kept) * -(-self._first_slots(group) // self.block_size)
        return lanes, blocks

    def _admit(self, group: Group, admission: Admission) -> None:
        del self._waiting[group.group_id]
        self._running[group.group_id] = group
        if group.driver.observes_text:
            self._observing[group.group_id] = group
        resumed = group.phase is Phase.PREEMPTED
        group.phase = Phase.REPLAYING if resumed else Phase.ADMITTED
        if resumed:
            self._replaying[group.group_id] = group
        group.counters.admitted_time = group.counters.admitted_time or self._clock()
        group.shape_sent = False  # the worker processes get it (again) with its first scheduled step
        self._uneven.add(group.group_id)
        live = [w for w in group.workers if not w.request.is_finished() and w.index not in group.kept]
        self._num_held -= len(live)
        if group.driver.forks:
            self._forking[group.group_id] = group
            self._uneven.discard(group.group_id)
        for worker in live:
            slots = (max(group.replay.targets[worker.index], group.prompt_len) + 1 + self.slack if resumed
                     else self._first_slots(group))
            self._promise(worker.request_id, slots)
        admission.queue += [w.request for w in live]
        if resumed:  # finished lanes re-feed through requests of their own (made by the scheduler)
            admission.replays += [(w, w.request.all_token_ids[: w.lane_len + 1])
                                  for w in group.workers if w.finished]

    def replay_request(self, worker: Worker, request: Any) -> None:
        """The scheduler made ``request`` to re-feed ``worker``'s (finished) lane; it holds the lane now."""
        worker.lane_request = request
        self.replays[request.request_id] = worker
        self._promise(request.request_id, worker.lane_len + 1 + self.slack)

    def _first_slots(self, group: Group) -> int:
        """The slots a lane's first allocation takes: its prompt and first token, or its whole budget."""
        return group.prompt_len + (1 if self.on_demand else group.max_tokens) + self.slack

    def _promise(self, request_id: str, slots: int | None) -> None:
        """Record (``slots``) or drop (None) what a queued request's first allocation takes."""
        before = self._promised.pop(request_id, None)
        if before is not None:
            self._promised_blocks -= -(-before // self.block_size)
        if slots is not None:
            self._promised[request_id] = slots
            self._promised_blocks += -(-slots // self.block_size)

    @property
    def num_queued(self) -> int:
        """Requests handed to the engine's waiting queue that it has not scheduled yet."""
        return len(self._promised)

    @property
    def has_reservations(self) -> bool:
        """``reserve``: whether a queued worker's first allocation (its whole budget) is still to come."""
        return bool(self._promised) and not self.on_demand

    def first_allocation(self, request_id: str) -> int | None:
        """``reserve``: the slots (tokens) the request's first allocation must cover, its whole budget; None:
        not a first allocation."""
        if self.on_demand:
            return None
        return self._promised.get(request_id)

    def allocated(self, request_id: str) -> None:
        """The request's first allocation succeeded."""
        self._promise(request_id, None)

    def preempted_alone(self, request_id: str) -> None:
        """vLLM preempted one worker (the table's rules are there so that it never does): counted, and with
        ``reserve`` its blocks, freed, are allocated again whole."""
        worker = self.workers[request_id]
        self.stats.num_member_preemptions += 1
        if not self.on_demand:
            self._promise(request_id, worker.group.prompt_len + worker.group.max_tokens + self.slack)

    # -- hold -------------------------------------------------------------------------------------------

    def holds(self) -> list[Any]:
        """Requests of running workers ahead of their group's slowest live worker: they sit this step out.

        Only groups that may be out of step are looked at: workers finish their prefill in
        different steps, and a worker left out of a step (vLLM's token budget) falls behind. A
        prefilled group whose live workers are even stays even while all are scheduled.
        """
        held = []
        for group in self._forking.values():
            if group.phase is not Phase.ADMITTED:
                continue  # replaying lanes keep step through their chunk ends
            ws = group.workers
            waiting = group.driver.lanes.waiting([w.request.num_computed_tokens for w in ws],
                                                 [w.request.num_output_tokens for w in ws],
                                                 [not w.request.is_finished() for w in ws])
            held += [ws[i].request for i in waiting if i not in group.kept]
        for group_id in list(self._uneven):
            group = self.groups[group_id]
            if group.phase is not Phase.ADMITTED:
                continue  # replaying lanes keep step through their chunk ends
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

    # -- preempt and replay -----------------------------------------------------------------------------

    def preempt(self, group_id: str) -> Preemption:
        """Take a running group out whole: it waits again, oldest first, and re-feeds its lanes on resumption.

        Call it before the scheduler frees anything: each lane's length is read here, once (a group
        preempted again while it replays keeps what it had to re-feed).
        """
        group = self._running.pop(group_id)
        self._observing.pop(group_id, None)
        self._replaying.pop(group_id, None)
        self._forking.pop(group_id, None)
        self._uneven.discard(group_id)
        if group.replay is None:
            group.replay = Replay(group.log, [w.length() for w in group.workers])
        preemption = Preemption(group_id, [], [], [])
        pending = {w.index for w in self._released if w.group is group}
        if pending:  # fork/join lanes a fork took, not queued yet: held already, queued on resumption
            self._released = [w for w in self._released if w.group is not group]
        for w in group.workers:
            self._promise(w.lane_request_id, None)
            if not w.finished:
                if w.index not in group.kept and w.index not in pending:  # (kept lanes wait in the table already)
                    preemption.requests.append(w.request)
                continue
            if w.lane_request is not w.request:  # a replay request: dropped whatever it holds
                del self.replays[w.lane_request_id]
                (preemption.parked if w.lane_request.is_finished() else preemption.replays).append(w.lane_request)
                w.lane_request = w.request
            else:
                preemption.parked.append(w.request)
        group.phase, group.in_step, group.shape_sent = Phase.PREEMPTED, False, False
        self._num_held += len(preemption.requests)
        self._waiting[group_id] = group
        self._waiting = dict(sorted(self._waiting.items(), key=lambda item: item[1].arrival))  # oldest first
        group.counters.num_preemptions += 1
        self.stats.num_group_preemptions += 1
        return preemption

    @property
    def replaying(self) -> list[Group]:
        return list(self._replaying.values())

    def replay_ends(self, budget: int, max_chunk: int = 0) -> dict[str, int]:
        """Where each replaying lane's tokens this step stop (request id -> position): every lane of a group
        through the same past steps, the groups sharing ``budget`` tokens."""
        groups = self.replaying
        out = {}
        for group in groups:
            lanes = [w.lane_request for w in group.workers]
            ends = group.replay.chunk_ends([r.num_computed_tokens for r in lanes], max(1, budget // len(groups)),
                                           max_chunk)
            out.update((r.request_id, end) for r, end in zip(lanes, ends))
        return out

    def settle(self) -> tuple[list[tuple[Any, int]], list[Any]]:
        """Before a step: replaying lanes whose last chunk outran a co-worker's go back to a consistent frontier
        (``(request, num_computed_tokens)`` pairs), and groups done replaying decode again: their replay
        requests are finished (they park, their blocks stay the lanes')."""
        rollbacks, finished = [], []
        for group in self.replaying:
            lanes = [w.lane_request for w in group.workers]
            computed = [r.num_computed_tokens for r in lanes]
            valid = group.replay.valid(computed)
            rollbacks += [(r, v) for r, c, v in zip(lanes, computed, valid) if v < c]
            if group.replay.done(valid):
                group.phase, group.replay = Phase.ADMITTED, None
                del self._replaying[group.group_id]
                if not group.driver.forks:  # (a fork/join group's holds are its protocol's)
                    self._uneven.add(group.group_id)
                finished += [w.lane_request for w in group.workers if w.finished]
        return rollbacks, finished

    def replay_parked(self, request_id: str) -> bool:
        """A replay request finished; True: its group goes on and keeps the lane in its blocks (park it)."""
        worker = self.replays.get(request_id)
        if worker is None:
            return False
        if worker.group.group_id not in self.groups:
            del self.replays[request_id]
            return False
        return True

    def prefix_hit_cap(self, request_id: str, block_size: int) -> int | None:
        """A replaying lane's most prefix-cache hit tokens: its group's prompt, and at most one token short of the
        lane's end (it re-feeds at least one token), rounded down to whole blocks (its blocks past the prompt
        hold K/V of Hogwild views: they are re-fed with them). None: no cap (not a lane of a replaying group)."""
        worker = self.workers.get(request_id) or self.replays.get(request_id)
        if worker is None or worker.group.phase is not Phase.REPLAYING:
            return None
        group = worker.group
        cap = min(group.prompt_len, group.replay.targets[worker.index] - 1)
        return max(0, cap) // block_size * block_size

    def take_orphans(self) -> list[Any]:
        """Replay requests of groups that ended (aborted while replaying): the scheduler aborts them."""
        orphans, self._orphans = self._orphans, []
        return orphans

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
        shapes, steps, replays, forced, forks = [], [], [], {}, []
        if self._promised:
            for request_id in [r for r in self._promised if r in scheduled]:
                self._promise(request_id, None)
        for group in self._running.values():
            workers = group.workers
            if not group.shape_sent:
                if not any(w.lane_request_id in scheduled for w in workers):
                    continue
                shapes.append(group.shape([block_ids(w.lane_request_id) for w in workers]))
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
            if group.driver.places_tokens:  # a worker's first sample may be placed too: before the prefill check
                self._place_tokens(group, scheduled, forced, drafts)
            if group.driver.forks:
                lanes = group.driver.lanes
                if lanes.version != group.fork_sent:  # a fork started or joined: the worker processes' views change
                    forks.append(GroupFork(group.group_id, lanes.state))
                    group.fork_sent = lanes.version
                self._count_prefill(group, scheduled)
            elif not group.prefilled:
                self._count_prefill(group, scheduled)
                if any(w.length() < group.prompt_len for w in workers):
                    continue  # someone still prefills: every decode row reads the prompt alone
                group.prefilled = True
            log = group.log
            if (all_scheduled and not self.speculative and log.runs and len(log.runs[-1].decoding) == group.num_live
                    and not (group.tracker is not None and group.tracker.pending) and not group.driver.forks):
                log.advance()  # lock-step: the same workers, one token more each; the worker processes follow
                # (a fork/join group's decoding lanes change as forks start and join: each step is recorded)
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
                wire = group.step([max(w.length(), group.prompt_len) for w in workers], decoding)
            if wire is not None:
                steps.append(wire)
        ended = ()
        if self._ended and has_tokens:
            ended, self._ended = tuple(self._ended), []
        return StepWire(tuple(shapes), tuple(steps), ended, forced, tuple(replays), tuple(forks))

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

    def accept_run(self, worker: Worker, tokens: list[int], accept) -> tuple[int, bool]:
        """Speculative decoding: ``accept(token) -> stopped`` for each token of an accepted run, up to the first
        that stops the worker or after which the engine must place the next token. ``(kept, stopped)``."""
        kept, stopped = 0, False
        for token in tokens:
            stopped = accept(token)
            kept += 1
            if stopped or self.must_place(worker):
                break
        return kept, stopped

    def after_outputs(self) -> None:
        """The step's outputs are in: show each driver its workers' new text; an answer stops its group.
        Groups that read no text (the raw protocol) cost nothing here."""
        for group in self._observing.values():
            for worker in group.workers:
                if not worker.finished:
                    self._observe(worker)
            if group.driver.answered:  # a worker wrote the answer: everyone samples its end next
                self._stop(group)
            if group.driver.forks:
                self._fork_steps(group)

    def _fork_steps(self, group: Group) -> None:
        """A fork/join group: lanes the protocol is done with end next; lanes the fork takes go to the queue."""
        driver = group.driver
        for w in group.workers[1:]:  # a branch at its budget's last token ends with its end of sequence: the
            # token before is fed (the join reads it), as after a branch end the model wrote
            if not w.finished and w.index not in group.kept and w.request.num_output_tokens == group.max_tokens - 1:
                driver.lanes.end_at_budget(w.index)
        driver.end_lanes([w.eos_token_id for w in group.workers])
        for lane in driver.lanes.take_released():
            if lane in group.kept:
                group.kept.discard(lane)
                self._released.append(group.workers[lane])

    def _observe(self, worker: Worker) -> None:
        """Show the driver the text of every token ``worker`` sampled since last time."""
        driver = worker.group.driver
        if not driver.observes_text:
            return
        tokens = worker.request.output_token_ids
        for i in range(driver.num_observed[worker.index], len(tokens)):
            token = tokens[i]
            driver.observe(worker.index, i, worker.text(token), worker.hidden(token) if worker.hidden else "")

    def _stop(self, group: Group, keep: int | None = None) -> None:
        live = [w.index for w in group.workers if not w.request.is_finished()]
        group.driver.stop(live, [w.eos_token_id for w in group.workers], keep=keep)

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
        self._promise(request_id, None)
        if group.phase not in (Phase.ADMITTED, Phase.REPLAYING):
            self._num_held -= 1  # aborted while its group waited
        elif worker.index in group.kept or any(w is worker for w in self._released):  # a fork/join lane
            group.kept.discard(worker.index)  # not handed to the engine's queue yet (aborted)
            self._released = [w for w in self._released if w is not worker]
            self._num_held -= 1
        self._observe(worker)
        if group.tracker is not None:
            group.tracker.stop(worker.index, worker.lane_len)
        if group.driver.forks:
            if worker.index == 0:
                group.driver.lanes.trunk_finished()
                self._fork_steps(group)
            else:
                group.driver.lanes.stopped(worker.index, worker.lane_len)
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
            if w.lane_request is not w.request:  # a replay request holds the lane
                if w.lane_request.is_finished():
                    parked.append(w.lane_request)  # parked: its blocks go now
                    del self.replays[w.lane_request_id]
                else:
                    self._orphans.append(w.lane_request)  # still in vLLM's queues: aborted next step
                    self._promise(w.lane_request_id, None)
            elif w.request_id != request_id:
                parked.append(w.request)  # (a preempted group's hold no block: freeing them frees nothing)
        del self.groups[group.group_id]
        self._waiting.pop(group.group_id, None)
        self._running.pop(group.group_id, None)
        self._observing.pop(group.group_id, None)
        self._replaying.pop(group.group_id, None)
        self._forking.pop(group.group_id, None)
        self._uneven.discard(group.group_id)
        if group.shape_sent or group.log.num_steps:
            self._ended.append(group.group_id)
        return parked

    def fork_record(self, request_id: str, finished: bool = False) -> str | None:
        """A fork/join lane ≥ 1: how it takes part, for the front end (its ``stop_reason``, carried by each of
        its outputs from the first on; ``finished``: with how many of its tokens are its branch's). None: not
        such a lane."""
        from vllm_hogwild.core.forkjoin import lane_record

        worker = self.workers.get(request_id)
        if worker is None or not worker.group.driver.forks or worker.index == 0:
            return None
        lanes = worker.group.driver.lanes
        if not finished:
            return lane_record(lanes.record(worker.index))
        tokens = worker.request.output_token_ids
        eos = bool(tokens) and worker.eos_token_id is not None and tokens[-1] == worker.eos_token_id
        return lane_record(lanes.record(worker.index, len(tokens), eos))

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
            finisher=group.driver.finisher, num_preemptions=c.num_preemptions,
            num_replayed_tokens=c.num_replayed_tokens, group_id=group.group_id,
        ))

    def snapshot(self, free_blocks: int) -> dict[str, Any]:
        """The metrics since the last snapshot (plain data: it crosses processes)."""
        return self.stats.snapshot(self.num_running_groups, self.num_waiting_groups, free_blocks)
