"""Preemption and replay of the group table's groups: the part of :class:`~vllm_hogwild.core.groups.table.GroupTable`
that takes a group out whole under KV pressure and brings it back (:class:`Replayer`, the table's ``replayer``). Pure,
no vLLM import.

Under KV pressure a whole group is the unit (:meth:`GroupTable.preempt
<vllm_hogwild.core.groups.table.GroupTable.preempt>`: never a lone worker, co-workers read its blocks); resumed,
every lane re-feeds its tokens with the views they were produced under (:meth:`Replayer.replay_ends`,
:meth:`Replayer.settle`, :mod:`vllm_hogwild.core.replay.step_log`). The replayer owns the indexes of all this:
the replay requests and the lanes they re-feed, the groups replaying, and the replay requests of groups that
ended (orphans, for the scheduler to abort).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from vllm_hogwild.core.groups.group import Group, Phase, Worker
from vllm_hogwild.core.replay.step_log import Replay
from vllm_hogwild.core.wire import GroupReplay


@dataclass
class Preemption:
    """What the scheduler frees when a group is preempted, by where each request stands in vLLM."""

    group_id: str
    requests: list[Any]  # the live workers' requests (running, or queued in vLLM's waiting queue)
    parked: list[Any]  # finished lanes' requests holding blocks (workers' own, or replay requests parked)
    replays: list[Any]  # replay requests still in vLLM's queues (they are dropped; new ones come on resumption)


class Replayer:
    """The table's preemption and replay part."""

    def __init__(self) -> None:
        self.replays: dict[str, Worker] = {}  # replay request id -> the (finished) worker whose lane it re-feeds
        self.replaying: dict[str, Group] = {}  # admitted again after a preemption, re-feeding their lanes
        self._orphans: list[Any] = []  # replay requests of groups that ended: the scheduler aborts them

    def replay_request(self, worker: Worker, request: Any) -> None:
        """The scheduler made ``request`` to re-feed ``worker``'s (finished) lane; it holds the lane now."""
        worker.lane_request = request
        self.replays[request.request_id] = worker

    def resumed(self, group: Group) -> None:
        """A preempted group was admitted again: it replays."""
        self.replaying[group.group_id] = group

    # -- preempt and replay -----------------------------------------------------------------------------

    def preempt(self, group: Group, pending: set[int]) -> Preemption:
        """Take a running group out whole (the table has taken it out of the running indexes, its log caught up):
        what it had to re-feed, read here once (a group preempted again while it replays keeps what it had), and
        its requests by where they stand (``pending``: lanes a fork took, aside already)."""
        self.replaying.pop(group.group_id, None)
        if group.replay is None:
            group.replay = Replay(group.log, [w.length() for w in group.workers])
        preemption = Preemption(group.group_id, [], [], [])
        for w in group.workers:
            if not w.finished:
                if w.index not in group.spare and w.index not in pending:  # (spare lanes wait in the table already)
                    preemption.requests.append(w.request)
                continue
            if w.lane_request is not w.request:  # a replay request: dropped whatever it holds
                del self.replays[w.lane_request_id]
                (preemption.parked if w.lane_request.is_finished() else preemption.replays).append(w.lane_request)
                w.lane_request = w.request
            else:
                preemption.parked.append(w.request)
        return preemption

    def step(self, group: Group, scheduled: Mapping[str, int]) -> tuple[GroupReplay | None, int]:
        """A replaying group's part of the step's wire (``scheduled``: tokens per request), and the tokens it
        re-feeds past its prompt (counted in its counters too); None, 0: none of its lanes is scheduled."""
        lanes = [(w.index, (r := w.lane_request).num_computed_tokens - n, r.num_computed_tokens)
                 for w in group.workers if (n := scheduled.get(w.lane_request_id))]
        if not lanes:
            return None, 0
        # What vLLM's budget cut short in one lane makes the same steps' tokens of the others
        # wrong: they are rolled back after the step (settle), and read their own lane meanwhile.
        valid = group.replay.valid([w.lane_request.num_computed_tokens for w in group.workers])
        replay = group.replay.wire(group.group_id, lanes, valid)
        replayed = sum(b - max(a, group.prompt_len) for _, a, b in lanes if b > group.prompt_len)
        group.counters.num_replayed_tokens += replayed
        return replay, replayed

    def replay_ends(self, budget: int, max_chunk: int = 0) -> dict[str, int]:
        """Where each replaying lane's tokens this step stop (request id -> position): every lane of a group
        through the same past steps, the groups sharing ``budget`` tokens."""
        groups = list(self.replaying.values())
        out = {}
        for group in groups:
            lanes = [w.lane_request for w in group.workers]
            ends = group.replay.chunk_ends([r.num_computed_tokens for r in lanes], max(1, budget // len(groups)),
                                           max_chunk)
            out.update((r.request_id, end) for r, end in zip(lanes, ends))
        return out

    def settle(self) -> tuple[list[tuple[Any, int]], list[Any], list[Group]]:
        """Before a step: replaying lanes whose last chunk outran a co-worker's go back to a consistent frontier
        (``(request, num_computed_tokens)`` pairs), and groups done replaying decode again: their replay
        requests are finished (they park, their blocks stay the lanes'); those groups, last."""
        rollbacks, finished, done = [], [], []
        for group in list(self.replaying.values()):
            lanes = [w.lane_request for w in group.workers]
            computed = [r.num_computed_tokens for r in lanes]
            valid = group.replay.valid(computed)
            rollbacks += [(r, v) for r, c, v in zip(lanes, computed, valid) if v < c]
            if group.replay.done(valid):
                group.phase, group.replay = Phase.ADMITTED, None
                del self.replaying[group.group_id]
                done.append(group)
                finished += [w.lane_request for w in group.workers if w.finished]
        return rollbacks, finished, done

    def replay_parked(self, request_id: str, groups: Mapping[str, Group]) -> bool:
        """A replay request finished; True: its group (in ``groups``) goes on and keeps the lane in its blocks."""
        worker = self.replays.get(request_id)
        if worker is None:
            return False
        if worker.group is None or worker.group.group_id not in groups:  # an orphan: its group ended
            del self.replays[request_id]
            return False
        return True

    @staticmethod
    def prefix_hit_cap(worker: Worker | None, block_size: int) -> int | None:
        """A replaying lane's most prefix-cache hit tokens (``worker``: the lane's): its group's prompt, and at most
        one token short of the lane's end (it re-feeds at least one token), rounded down to whole blocks (its
        blocks past the prompt hold K/V of Hogwild views: they are re-fed with them). None: no cap (not a lane of
        a replaying group)."""
        if worker is None or worker.group is None or worker.group.phase is not Phase.REPLAYING:
            return None
        group = worker.group
        cap = min(group.prompt_len, group.replay.targets[worker.index] - 1)
        return max(0, cap) // block_size * block_size

    def take_orphans(self) -> list[Any]:
        """Replay requests of groups that ended (aborted while replaying): the scheduler aborts them."""
        orphans, self._orphans = self._orphans, []
        return orphans

    def forget(self, group: Group, workers: Sequence[Worker]) -> list[str]:
        """The group ended (``workers``: its workers): it leaves every index of replay. A replay request that
        finished leaves with it (its blocks are freed with the group's); one still in the engine's queues is an
        orphan, aborted next step. Returns the orphans' request ids."""
        self.replaying.pop(group.group_id, None)
        orphans = []
        for w in workers:
            if w.lane_request is not w.request:  # a replay request holds the lane
                if w.lane_request.is_finished():
                    del self.replays[w.lane_request_id]
                else:
                    self._orphans.append(w.lane_request)
                    orphans.append(w.lane_request_id)
        return orphans
