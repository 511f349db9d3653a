"""When a complete Hogwild group may start, beside plain requests; lock-step; preemption order. Pure, no vLLM import.

A group is admitted whole or not at all: only when a slot and KV blocks are
free for every worker (:func:`fits`). What "blocks for a worker" means is the
engine's ``kv`` option: with ``on-demand`` (the default) its prompt and first
token, and it takes the rest as it grows; with ``reserve`` its whole budget.
The workers then start together and decode in lock-step
(:func:`ahead_of_group`). Under KV pressure whole units are preempted, in the
order of vLLM's policy (:func:`preemption_order`).

Arrival order with a bounded overtake (``max_plain_wait`` seconds, on
vLLM's request arrival times):

- a group may go ahead of an older waiting plain request only while that
  request has waited less than the bound;
- a complete group that has waited longer than the bound without fitting
  defers the plain requests that arrived after it, so that the room
  running requests free goes to the group, not to newer requests.

Groups among themselves are first come, first served: a later group never
overtakes an earlier complete one.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Sequence


class Decision(Enum):
    ADMIT = "admit"  # queue the group's workers now
    WAIT = "wait"  # not now; plain requests go on as usual
    DEFER_NEWER = "defer_newer"  # not now; plain requests that arrived after the group wait too


@dataclass(frozen=True)
class Fairness:
    max_plain_wait: float  # seconds

    def decide(self, now: float, group_arrival: float, fits: bool, oldest_plain_arrival: float | None) -> Decision:
        """What to do with the oldest complete group this step.

        ``oldest_plain_arrival``: arrival time of the oldest waiting plain
        request, or ``None`` when none waits.
        """
        if (oldest_plain_arrival is not None and oldest_plain_arrival < group_arrival
                and now - oldest_plain_arrival >= self.max_plain_wait):
            return Decision.WAIT  # that request goes first
        if fits:
            return Decision.ADMIT
        return Decision.DEFER_NEWER if now - group_arrival >= self.max_plain_wait else Decision.WAIT


def fits(need_blocks: int, promised_blocks: int, watermark_blocks: int, free_blocks: int,
         num_active: int, num_workers: int, max_active: int) -> bool:
    """Whether a whole group fits now: a slot for every worker, and ``need_blocks`` free for them all.

    ``need_blocks``: the blocks the group's workers take at admission (under ``kv=reserve`` every worker's
    whole budget, under ``kv=on-demand`` its prompt and first token; for a preempted group, every lane as it
was and its next token). ``promised_blocks``: blocks of workers
    already queued that have not allocated yet.
    """
    return (num_active + num_workers <= max_active
            and need_blocks + promised_blocks + watermark_blocks <= free_blocks)


def ahead_of_group(num_outputs: Sequence[int | None]) -> list[int]:
    """Lock-step: the live workers (``None``: stopped) that have more output tokens than the slowest live one.

    They sit out a step, so that every worker feeds its k-th token in the same step (a worker that
    finished its prefill waits for a sibling still prefilling).
    """
    live = [n for n in num_outputs if n is not None]
    if not live:
        return []
    slowest = min(live)
    return [w for w, n in enumerate(num_outputs) if n is not None and n > slowest]


@dataclass(frozen=True)
class Unit:
    """What vLLM's preemption policy ranks: a plain request, or a whole Hogwild group (never a lone worker)."""

    key: str  # the request id, or the group id
    is_group: bool
    arrival: float  # wall-clock arrival time (a group: its first request's)
    priority: int  # vLLM's request priority (lower is more urgent)
    need: int  # blocks its requests ask for this step
    owned: int  # blocks it owns


def preemption_order(units: Sequence[Unit], by_priority: bool) -> list[Unit]:
    """vLLM's order for victims, with a group as one unit: first come, first served preempts the newest first;
    the priority policy the least urgent (highest priority value), newest first among equals. Units that hold
    no block are left out (preempting them frees nothing)."""
    key = (lambda u: (u.priority, u.arrival)) if by_priority else (lambda u: u.arrival)
    return sorted((u for u in units if u.owned), key=key, reverse=True)


class Promises:
    """Requests handed to the engine's waiting queue, not scheduled yet, and the slots (tokens) their first
    allocations take (with ``kv: reserve`` the whole budget, which that allocation reserves); kept with the
    blocks those take, so that an admission check is O(1)."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._slots: dict[str, int] = {}
        self.num_blocks = 0

    def __len__(self) -> int:
        return len(self._slots)

    def get(self, request_id: str) -> int | None:
        return self._slots.get(request_id)

    def set(self, request_id: str, slots: int | None) -> None:
        """Record (``slots``) or drop (None) what a queued request's first allocation takes."""
        before = self._slots.pop(request_id, None)
        if before is not None:
            self.num_blocks -= -(-before // self.block_size)
        if slots is not None:
            self._slots[request_id] = slots
            self.num_blocks += -(-slots // self.block_size)

    def drop_scheduled(self, scheduled) -> None:
        """vLLM scheduled these requests (a mapping or set of request ids): their first allocations are made."""
        slots, bs = self._slots, self.block_size
        for request_id in [r for r in slots if r in scheduled]:
            self.num_blocks -= -(-slots.pop(request_id) // bs)

