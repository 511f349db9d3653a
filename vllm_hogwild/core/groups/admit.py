"""Admission of the group table's groups: the part of :class:`~vllm_hogwild.core.groups.table.GroupTable` that
decides when a complete (or preempted) group goes to the engine's queue, and what its lanes' first allocations
take (:class:`Admitter`, the table's ``admitter``). Pure, no vLLM import.

A group goes whole or not at all, oldest first, when it fits (its lanes' first blocks, as the
table's KV rule counts them: :func:`~vllm_hogwild.core.groups.policy.fits`) and fairness towards
plain requests allows (:class:`~vllm_hogwild.core.groups.policy.Fairness`). A fork/join request's
lanes that no fork took yet (``Group.spare``) stay in the table: with ``on-demand`` they take no
KV until a fork takes them (then they ask for it like any request, and the room-making pass
counts them with their group: :meth:`Admitter.forked_lanes`); with ``reserve`` their budgets are
kept aside. The admitter owns the indexes of all this (the waiting groups, the requests set aside, the
promised first allocations, the lanes a fork took); the table owns the running groups: it records the
groups each admission returns, and asks the admitter to forget a group that ends
(:meth:`Admitter.forget`).

The KV rule (``kv``): ``on-demand`` (the default) admits a group when every
lane's prompt and first token fit, as vLLM admits a request, and its lanes
then take blocks as they grow; a preempted group is admitted again when all
its lanes fit as they were; a fork/join request's lanes that no fork took yet
take nothing until one does. ``reserve`` admits a group only when every lane
fits for its whole budget, ``prompt // bs`` shared full blocks plus, per lane,
the rest of ``prompt + max_tokens``
(:func:`~vllm_hogwild.core.options.blocks_for_group`), and a lane's first
allocation takes that whole budget (:meth:`Admitter.first_allocation`): no group is
ever preempted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Container, Sequence

from vllm_hogwild.core.groups.policy import Decision, Fairness, Promises, fits
from vllm_hogwild.core.groups.group import Group, Phase, Worker
from vllm_hogwild.core.options import blocks_for_group


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
    defer_newer_than: float | None = None  # plain requests that arrived after this wait this step
    groups: list[Group] = field(default_factory=list)  # the groups admitted now, in order (the table runs them)


class Admitter:
    """The table's admission part: the groups that wait, the requests set aside (out of the engine's queues), the first
    allocations promised to queued requests, and the spare lanes a fork took."""

    def __init__(self, *, block_size: int, slack: int, on_demand: bool, max_plain_wait: float,
                 clock: Callable[[], float]) -> None:
        self.block_size, self.slack, self.on_demand, self._clock = block_size, slack, on_demand, clock
        self.fairness = Fairness(max_plain_wait)
        self.waiting: dict[str, Group] = {}  # groups not admitted (or preempted), oldest first
        self.num_aside = 0  # requests of waiting groups that have arrived and not finished
        # requests handed to the engine's waiting queue, not scheduled yet -> slots their first allocation takes
        # (with `reserve` the whole budget, which that allocation reserves: :meth:`first_allocation`)
        self.promises = Promises(block_size)
        self._with_spares: dict[str, Group] = {}  # admitted groups that keep lanes out of the queues (fork/join)
        self._released: list[Worker] = []  # spare lanes a fork took, for the engine's queue at the next admission
        self._forked: dict[str, Worker] = {}  # lanes a fork took, handed to the engine's queue (:meth:`forked_lanes`)

    def arrived(self, group: Group, new: bool) -> None:
        """A worker's request of ``group`` arrived (``new``: the group's first): set aside until the group is admitted."""
        if new:
            self.waiting[group.group_id] = group
        self.num_aside += 1

    def release(self, workers: Sequence[Worker]) -> None:
        """Spare lanes a fork took go to the engine's queue at the next admission."""
        self._released += workers

    def promise(self, request_id: str, slots: int | None) -> None:
        """The slots (tokens) the request's first allocation takes (None: none promised any more)."""
        self.promises.set(request_id, slots)

    def admit(self, now: float, room: Callable[[], Room], oldest_plain: Callable[[], float | None]) -> Admission:
        """Complete (or preempted) groups to queue now, oldest first, while they fit and fairness allows.

        ``now``: wall-clock seconds; ``room``, ``oldest_plain`` (the arrival time of the oldest
        waiting plain request, None: none): read only when such a group waits.
        """
        admission = Admission()
        if self._released:
            for worker in self._released:
                self.num_aside -= 1
                self.promises.set(worker.request_id, self._first_slots(worker.group))
                if self.on_demand:  # (the room-making pass, which reads them, runs with on-demand only)
                    self._forked[worker.request_id] = worker
                admission.queue.append(worker.request)
            self._released = []
        ready = [g for g in self.waiting.values() if g.phase in (Phase.WAITING, Phase.PREEMPTED)]
        if not ready:
            return admission
        here, oldest = room(), oldest_plain()
        for group in ready:
            decision = self.fairness.decide(now, group.arrival, self._fits(group, here), oldest)
            if decision is Decision.WAIT:
                break  # first come, first served among groups: a later group does not overtake
            if decision is Decision.DEFER_NEWER:
                admission.defer_newer_than = group.arrival
                break
            self._admit(group, admission)
        return admission

    def _fits(self, group: Group, room: Room) -> bool:
        bs, n = self.block_size, group.num_workers
        # on-demand: a lane no fork took yet takes no KV (its first allocation comes when a fork takes it)
        lanes = [i for i in range(n) if not (self.on_demand and i in group.spare)]
        if group.phase is Phase.PREEMPTED:  # every lane as it was (at least its prompt), and its next token
            p, targets = group.prompt_len, group.replay.targets
            need = p // bs + sum(-(-(max(targets[i], p) + 1 + self.slack) // bs) - p // bs for i in lanes)
        else:
            need = blocks_for_group(group.prompt_len, 1 if self.on_demand else group.max_tokens, len(lanes), bs,
                                    self.slack)
        spare_lanes, spare_blocks = self.spare()
        return fits(need, self.promises.num_blocks + spare_blocks, room.watermark_blocks, room.free_blocks,
                    room.num_running + len(self.promises) + spare_lanes, n, room.max_running)

    def spare(self) -> tuple[int, int]:
        """Spare lanes (no fork took them yet), and the blocks kept aside for them: each keeps a sequence slot
        (``max_num_seqs``); with ``reserve`` its whole budget too, so that a fork never waits for KV. With
        ``on-demand`` no block: a fork's lanes ask for theirs like any request, and under pressure the
        room-making pass preempts for them (:meth:`forked_lanes`). O(admitted groups that keep lanes)."""
        lanes = blocks = 0
        for group in self._with_spares.values():
            if group.spare:
                lanes += len(group.spare)
                if not self.on_demand:
                    blocks += len(group.spare) * -(-self._first_slots(group) // self.block_size)
        return lanes, blocks

    def forked_lanes(self, running: Container[str]) -> list[tuple[str, int, int]]:
        """Lanes a fork took that the engine's queue holds, not scheduled yet: (request id, the slots (tokens)
        their first allocations take, the group's prompt length). The room-making pass counts them with their
        groups' needs, as it counts running requests': a fork that waits for KV is its group waiting
        (``running``: the ids of the running groups). O(such lanes)."""
        out = []
        for request_id, worker in list(self._forked.items()):
            slots = self.promises.get(request_id)
            if slots is None or worker.group.group_id not in running or worker.finished:
                del self._forked[request_id]
            else:
                out.append((request_id, slots, worker.group.prompt_len))
        return out

    def _admit(self, group: Group, admission: Admission) -> None:
        del self.waiting[group.group_id]
        admission.groups.append(group)
        resumed = group.phase is Phase.PREEMPTED
        group.phase = Phase.REPLAYING if resumed else Phase.ADMITTED
        group.counters.admitted_time = group.counters.admitted_time or self._clock()
        group.shape_sent = False  # the worker processes get it (again) with its first scheduled step
        spare = group.spare
        live = [w for w in group.workers if not w.request.is_finished() and w.index not in spare]
        self.num_aside -= len(live)
        if spare:
            self._with_spares[group.group_id] = group
        first = self._first_slots(group)
        for worker in live:
            slots = (max(group.replay.targets[worker.index], group.prompt_len) + 1 + self.slack if resumed
                     else first)
            self.promises.set(worker.request_id, slots)
        admission.queue += [w.request for w in live]
        if resumed:  # finished lanes re-feed through requests of their own (made by the scheduler)
            admission.replays += [(w, w.request.all_token_ids[: w.lane_len + 1])
                                  for w in group.workers if w.finished]

    def _first_slots(self, group: Group) -> int:
        """The slots a lane's first allocation takes: its prompt and first token, or its whole budget."""
        return group.prompt_len + (1 if self.on_demand else group.max_tokens) + self.slack

    @property
    def num_queued(self) -> int:
        """Requests handed to the engine's waiting queue that it has not scheduled yet."""
        return len(self.promises)

    @property
    def has_reservations(self) -> bool:
        """``reserve``: whether a queued worker's first allocation (its whole budget) is still to come."""
        return bool(self.promises) and not self.on_demand

    def first_allocation(self, request_id: str) -> int | None:
        """``reserve``: the slots (tokens) the request's first allocation must cover, its whole budget; None:
        not a first allocation."""
        if self.on_demand:
            return None
        return self.promises.get(request_id)

    def allocated(self, request_id: str) -> None:
        """The request's first allocation succeeded."""
        self.promises.set(request_id, None)

    def preempted_alone(self, worker: Worker) -> None:
        """vLLM preempted one worker: with ``reserve`` its blocks, freed, are allocated again whole."""
        if not self.on_demand:
            self.promises.set(worker.request_id, worker.group.prompt_len + worker.group.max_tokens + self.slack)

    # -- a lane stops, a group is preempted or ends -------------------------------------------------------

    def lane_finished(self, worker: Worker, phase: Phase) -> None:
        """``worker``'s request finished (or was aborted) while its group was in ``phase``: nothing promised to it
        any more; a request set aside here (its group not admitted, or a spare lane) is aside no more."""
        group = worker.group
        if self.promises:
            self.promises.set(worker.request_id, None)
        if phase is not Phase.ADMITTED and phase is not Phase.REPLAYING:
            self.num_aside -= 1  # aborted while its group waited
        elif (group.spare or self._released) and (
                worker.index in group.spare or any(w is worker for w in self._released)):  # a spare lane
            group.spare.discard(worker.index)  # not handed to the engine's queue yet (aborted)
            self._released = [w for w in self._released if w is not worker]
            self.num_aside -= 1

    def preempted(self, group: Group) -> set[int]:
        """A running group is preempted: its lanes' promises are dropped, and the lanes a fork took that were not
        queued yet stay aside (their indices are returned: queued on resumption). Then :meth:`wait_again`."""
        self._with_spares.pop(group.group_id, None)
        pending = {w.index for w in self._released if w.group is group}
        if pending:  # fork/join lanes a fork took, not queued yet: aside already, queued on resumption
            self._released = [w for w in self._released if w.group is not group]
        for w in group.workers:
            self.promises.set(w.lane_request_id, None)
        return pending

    def wait_again(self, group: Group, num_aside: int) -> None:
        """The preempted group waits again, oldest first, its ``num_aside`` live requests set aside here."""
        self.num_aside += num_aside
        self.waiting[group.group_id] = group
        self.waiting = dict(sorted(self.waiting.items(), key=lambda item: item[1].arrival))  # oldest first

    def forget(self, group: Group, workers: Sequence[Worker], orphans: Sequence[str]) -> None:
        """The group ended: it leaves every index of admission (``workers``: its workers; ``orphans``: its replay
        requests still in the engine's queues, promised nothing any more)."""
        self.waiting.pop(group.group_id, None)
        self._with_spares.pop(group.group_id, None)
        for w in workers:
            self._forked.pop(w.request_id, None)
        for request_id in orphans:
            self.promises.set(request_id, None)
