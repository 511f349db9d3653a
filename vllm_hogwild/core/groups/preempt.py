"""Preemption and replay of the group table's groups: the half of :class:`~vllm_hogwild.core.groups.table.GroupTable`
that takes a group out whole under KV pressure and brings it back. Pure, no vLLM import.

Under KV pressure a whole group is the unit (:meth:`PreemptAndReplay.preempt`: never a lone
worker, co-workers read its blocks); resumed, every lane re-feeds its tokens with the views
they were produced under (:meth:`~PreemptAndReplay.replay_ends`, :meth:`~PreemptAndReplay.settle`,
:mod:`vllm_hogwild.core.replay.step_log`). A mixin of the table: it reads and changes the table's own
indexes, which :meth:`GroupTable.__init__ <vllm_hogwild.core.groups.table.GroupTable>` declares.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm_hogwild.core.groups.group import Group, Phase, Worker
from vllm_hogwild.core.replay.step_log import Replay


@dataclass
class Preemption:
    """What the scheduler frees when a group is preempted, by where each request stands in vLLM."""

    group_id: str
    requests: list[Any]  # the live workers' requests (running, or queued in vLLM's waiting queue)
    parked: list[Any]  # finished lanes' requests holding blocks (workers' own, or replay requests parked)
    replays: list[Any]  # replay requests still in vLLM's queues (they are dropped; new ones come on resumption)


class PreemptAndReplay:
    def replay_request(self, worker: Worker, request: Any) -> None:
        """The scheduler made ``request`` to re-feed ``worker``'s (finished) lane; it holds the lane now."""
        worker.lane_request = request
        self.replays[request.request_id] = worker
        self.promises.set(request.request_id, worker.lane_len + 1 + self.slack)

    # -- preempt and replay -----------------------------------------------------------------------------

    def preempt(self, group_id: str) -> Preemption:
        """Take a running group out whole: it waits again, oldest first, and re-feeds its lanes on resumption.

        Call it before the scheduler frees anything: each lane's length is read here, once (a group
        preempted again while it replays keeps what it had to re-feed).
        """
        group = self._running.pop(group_id)
        self._steady.drop(group_id)  # (its log catches up: the replay reads it)
        self._observing.pop(group_id, None)
        self._replaying.pop(group_id, None)
        self._with_spares.pop(group_id, None)
        self._unsettled.discard(group_id)
        if group.replay is None:
            group.replay = Replay(group.log, [w.length() for w in group.workers])
        preemption = Preemption(group_id, [], [], [])
        pending = {w.index for w in self._released if w.group is group}
        if pending:  # fork/join lanes a fork took, not queued yet: held already, queued on resumption
            self._released = [w for w in self._released if w.group is not group]
        for w in group.workers:
            self.promises.set(w.lane_request_id, None)
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
                self._unsettled.add(group.group_id)
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
