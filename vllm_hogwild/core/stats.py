"""What the scheduler reports about Hogwild groups, as plain data. Pure, no vLLM import.

The engine core keeps a :class:`HogwildStats`; each step's :meth:`HogwildStats.snapshot`
(plain types only) travels to the front end over the plugin's own stats channel
(:mod:`vllm_hogwild.core.stats_channel`), where :mod:`vllm_hogwild.serving.metrics`
turns it into Prometheus series.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any, Callable


@dataclass
class GroupEnd:
    num_workers: int
    prompt_len: int
    lane_lens: list[int]
    num_blocks_owned: int  # distinct blocks holding the group's tokens at its end
    num_prefill_tokens: int  # prompt tokens computed for the group (prefix-cache hits excluded)
    num_prefill_saved: int  # prompt tokens computed once for the group instead of once per worker
    output_lens: list[int]  # tokens each worker generated
    coworker_reads: list[int]  # co-worker tokens each worker attended, summed over its steps
    admission_wait_s: float | None  # first worker's arrival to the group's admission (None: never admitted)
    latency_s: float  # first worker's arrival to the group's end
    history: list[tuple[int, int, int]] = field(default_factory=list)  # (lane, start, end) of steps, as joined
    finisher: int | None = None  # the worker the finisher ran on
    num_preemptions: int = 0  # times the group was preempted whole
    num_replayed_tokens: int = 0  # tokens re-fed on its resumptions
    group_id: str = ""  # the parent request's id


@dataclass
class HogwildStats:
    num_lone_preemptions: int = 0  # a worker preempted alone (by design never)
    num_group_preemptions: int = 0  # groups preempted whole under KV pressure
    num_replayed_tokens: int = 0  # tokens re-fed by resumed groups
    _ended: deque = field(default_factory=lambda: deque(maxlen=1024))  # GroupEnd, newest last
    _unreported: list = field(default_factory=list)  # GroupEnd not yet in a snapshot
    _pending: list = field(default_factory=list)  # records still to build (each a call), newest last

    def record(self, build: Callable[[], GroupEnd]) -> None:
        """A group ended; ``build()`` makes its record, called when the record is first read (a metrics snapshot,
        or a reader of :attr:`ended`), not in the engine step the group ended in (where hundreds of groups may end
        together). ``build`` holds only what the group left behind, which nothing changes any more."""
        self._pending.append(build)
        # Only the newest 1,024 records can ever be read (``ended`` and the unreported ones are the newest):
        # older ones are never built.
        del self._pending[:-1024]

    @property
    def ended(self) -> deque:
        """The last 1,024 groups' records, newest last."""
        self._settle()
        return self._ended

    def _settle(self) -> None:
        if self._pending:
            built, self._pending = [build() for build in self._pending], []
            self._ended.extend(built)
            self._unreported += built
            del self._unreported[:-1024]

    def snapshot(self, groups_running: int, groups_waiting: int, free_blocks: int) -> dict[str, Any]:
        """What the front end's metrics need since the last snapshot (plain types: it crosses processes)."""
        self._settle()
        ended, self._unreported = self._unreported, []
        return {
            "groups_running": groups_running,
            "groups_waiting": groups_waiting,
            "kv_free_blocks": free_blocks,
            "member_preemptions": self.num_lone_preemptions,
            "group_preemptions": self.num_group_preemptions,
            "replayed_tokens": self.num_replayed_tokens,
            "ended": [asdict(e) for e in ended],
        }
