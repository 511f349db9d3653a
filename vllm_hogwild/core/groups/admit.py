"""Admission of the group table's groups: the part of :class:`~vllm_hogwild.core.groups.table.GroupTable` that
decides when a complete (or preempted) group goes to the engine's queue, and what its lanes' first allocations
take. Pure, no vLLM import.

A group goes whole or not at all, oldest first, when it fits (its lanes' first blocks, as the
table's KV rule counts them: :func:`~vllm_hogwild.core.groups.policy.fits`) and fairness towards
plain requests allows (:class:`~vllm_hogwild.core.groups.policy.Fairness`). A fork/join request's
lanes that no fork took yet (``Group.spare``) stay in the table: with ``on-demand`` they take no
KV until a fork takes them (then they ask for it like any request, and the room-making pass
counts them with their group: :meth:`Admit.forked_lanes`); with ``reserve`` their budgets are
kept aside. A mixin of the table: it reads and changes the table's own indexes, which
:meth:`GroupTable.__init__ <vllm_hogwild.core.groups.table.GroupTable>` declares.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from vllm_hogwild.core.groups.policy import Decision, fits
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
    hold_newer_than: float | None = None  # plain requests that arrived after this wait this step


class Admit:
    def admit(self, now: float, room: Callable[[], Room], oldest_plain: Callable[[], float | None]) -> Admission:
        """Complete (or preempted) groups to queue now, oldest first, while they fit and fairness allows.

        ``now``: wall-clock seconds; ``room``, ``oldest_plain`` (the arrival time of the oldest
        waiting plain request, None: none): read only when such a group waits.
        """
        admission = Admission()
        if self._released:
            for worker in self._released:
                self._num_held -= 1
                self.promises.set(worker.request_id, self._first_slots(worker.group))
                if self.on_demand:  # (the room-making pass, which reads them, runs with on-demand only)
                    self._forked[worker.request_id] = worker
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
        # on-demand: a lane no fork took yet takes no KV (its first allocation comes when a fork takes it)
        lanes = [i for i in range(n) if not (self.on_demand and i in group.spare)]
        if group.phase is Phase.PREEMPTED:  # every lane as it was (at least its prompt), and its next token
            p, targets = group.prompt_len, group.replay.targets
            need = p // bs + sum(-(-(max(targets[i], p) + 1 + self.slack) // bs) - p // bs for i in lanes)
        else:
            need = blocks_for_group(group.prompt_len, 1 if self.on_demand else group.max_tokens, len(lanes), bs,
                                    self.slack)
        spare_lanes, spare_blocks = self._spare()
        return fits(need, self.promises.num_blocks + spare_blocks, room.watermark_blocks, room.free_blocks,
                    room.num_running + len(self.promises) + spare_lanes, n, room.max_running)

    def _spare(self) -> tuple[int, int]:
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

    def forked_lanes(self) -> list[tuple[str, int, int]]:
        """Lanes a fork took that the engine's queue holds, not scheduled yet: (request id, the slots (tokens)
        their first allocations take, the group's prompt length). The room-making pass counts them with their
        groups' needs, as it counts running requests': a fork that waits for KV is its group waiting.
        O(such lanes)."""
        out = []
        for request_id, worker in list(self._forked.items()):
            slots = self.promises.get(request_id)
            if slots is None or worker.group.group_id not in self._running or worker.finished:
                del self._forked[request_id]
            else:
                out.append((request_id, slots, worker.group.prompt_len))
        return out

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
        self._unsettled.add(group.group_id)
        spare = group.spare
        live = [w for w in group.workers if not w.request.is_finished() and w.index not in spare]
        self._num_held -= len(live)
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

    def preempted_alone(self, request_id: str) -> None:
        """vLLM preempted one worker (the table's rules are there so that it never does): counted, and with
        ``reserve`` its blocks, freed, are allocated again whole."""
        worker = self.workers[request_id]
        self.stats.num_member_preemptions += 1
        if not self.on_demand:
            self.promises.set(request_id, worker.group.prompt_len + worker.group.max_tokens + self.slack)
