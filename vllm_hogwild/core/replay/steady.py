"""Groups in steady lock-step, advanced together: one array operation per engine step for all of them. Pure, no vLLM import.

A group is steady while the same workers decode, one token more each per engine step, vLLM schedules every
running request, and its kind needs nothing else of it (no text forced or read; see
:meth:`~vllm_hogwild.core.groups.group.Group.lock_step`). Each engine step then adds one step to its
log's last run, and its lanes' lengths follow from that run alone: the run's lengths, plus the steps so
far for the lanes that decode in it (:meth:`~vllm_hogwild.core.replay.step_log.StepLog.advance`).

:class:`SteadyGroups` keeps those lengths for every steady group as two flat columns (an offset and a 0/1
growth per lane), so an engine step's lengths of all of them are ``offsets + growth * tick``: one array
operation at hundreds of groups, where a call per group cost most of the table's step. A steady group's
log is not touched while it stays steady; it catches up (its last run's length, its step count) when the
group leaves, or when :meth:`SteadyGroups.sync` is called. Anything that reads a running group's log reads
it after the group left, or after a sync.
"""

from __future__ import annotations

from itertools import chain

import numpy as np

from vllm_hogwild.core.replay.step_log import StepLog

_NONE = np.zeros(0, np.int64)


class SteadyGroups:
    """The steady groups, by id, with their logs, in the order they became steady."""

    def __init__(self) -> None:
        self._logs: dict[str, StepLog] = {}
        self._since: dict[str, int] = {}  # the tick at which each group's log was last caught up
        # per group: its lanes' offsets, growth (plain lists: many groups become steady in one step, and the
        # flat columns are built from all of them at once). 64-bit columns: the tick grows for the engine's life
        # (at 1,000 steps a second, 32 bits would wrap within a month); a length itself fits the wire's 32 bits.
        self._columns: dict[str, tuple[list[int], list[int]]] = {}
        self._tick = 0  # engine steps advanced so far
        self._ids: tuple[str, ...] | None = ()  # None: the flat columns are rebuilt at the next advance
        self._offsets, self._growth = _NONE, _NONE

    def __contains__(self, group_id: str) -> bool:
        return group_id in self._logs

    def __len__(self) -> int:
        return len(self._logs)

    def add(self, group_id: str, log: StepLog) -> None:
        """The group is steady from the next engine step on; ``log``'s last run is the one it goes on with."""
        run = log.runs[-1]
        decoding, shift = run.decoding, run.length - 1 - self._tick
        growth = [1 if w in decoding else 0 for w in range(len(run.lens))]
        # StepLog.advance at tick t > now returns lens + (run.length + t - 1 - now) for the decoding lanes.
        offsets = [n + shift if g else n for n, g in zip(run.lens, growth)]
        self._logs[group_id], self._since[group_id] = log, self._tick
        self._columns[group_id] = (offsets, growth)
        self._ids = None

    def drop(self, group_id: str) -> None:
        """The group leaves (a worker finished or sat out, it was preempted, ...): its log catches up."""
        log = self._logs.pop(group_id, None)
        if log is not None:
            self._catch_up(log, self._since.pop(group_id))
            del self._columns[group_id]
            self._ids = None

    def clear(self) -> None:
        """Every group leaves (a step that may break lock-step: each kind decides again)."""
        for group_id in list(self._logs):
            self.drop(group_id)

    def sync(self) -> None:
        """Every steady log caught up to now; the groups stay steady (their columns do not change)."""
        for group_id, log in self._logs.items():
            self._catch_up(log, self._since[group_id])
            self._since[group_id] = self._tick

    def advance(self) -> tuple[tuple[str, ...], np.ndarray]:
        """One engine step: the steady groups' ids and every one of their lanes' lengths after it, group after
        group in the ids' order, each group's lanes in lane order (int32)."""
        self._tick += 1
        if self._ids is None:
            self._ids = tuple(self._columns)
            columns = self._columns.values()
            self._offsets = np.fromiter(chain.from_iterable(o for o, _ in columns), np.int64)
            self._growth = np.fromiter(chain.from_iterable(g for _, g in columns), np.int64)
        return self._ids, (self._offsets + self._growth * self._tick).astype(np.int32)

    def _catch_up(self, log: StepLog, since: int) -> None:
        steps = self._tick - since
        log.runs[-1].length += steps
        log.num_steps += steps
