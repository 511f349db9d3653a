"""When a complete Hogwild group may start, beside plain requests. Pure, no vLLM import.

Arrival order with a bounded overtake (``max_plain_wait`` seconds, on
vLLM's request arrival times):

- a group may go ahead of an older waiting plain request only while that
  request has waited less than the bound;
- a complete group that has waited longer than the bound without fitting
  holds back the plain requests that arrived after it, so that the room
  running requests free goes to the group, not to newer requests.

Groups among themselves are first come, first served: a later group never
overtakes an earlier complete one.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Decision(Enum):
    ADMIT = "admit"  # queue the group's members now
    WAIT = "wait"  # not now; plain requests go on as usual
    HOLD_NEWER = "hold_newer"  # not now; plain requests that arrived after the group wait too


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
        return Decision.HOLD_NEWER if now - group_arrival >= self.max_plain_wait else Decision.WAIT
