"""What the scheduler reports about Hogwild groups, as plain data. Pure, no vLLM import.

The engine core keeps a :class:`HogwildStats`; each step's :meth:`HogwildStats.snapshot`
(plain types only) travels to the front end over the plugin's own stats channel
(:mod:`vllm_hogwild.core.stats_channel`), where :mod:`vllm_hogwild.serving.metrics`
turns it into Prometheus series.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, ClassVar


@dataclass
class GroupEnd:
    num_workers: int
    prompt_len: int
    lane_lens: list[int]
    num_blocks_held: int  # distinct blocks holding the group's tokens at its end
    num_prefill_tokens: int  # prompt tokens computed for the group (prefix-cache hits excluded)
    num_prefill_saved: int  # prompt tokens computed once for the group instead of once per worker
    output_lens: list[int]  # tokens each worker generated
    coworker_reads: list[int] | None  # co-worker tokens each worker attended, summed over its steps (see settle)
    admission_wait_s: float | None  # first worker's arrival to the group's admission (None: never admitted)
    latency_s: float  # first worker's arrival to the group's end
    history: list[tuple[int, int, int]] = field(default_factory=list)  # (lane, start, end) of steps, as joined
    finisher: int | None = None  # the worker the finisher ran on
    num_preemptions: int = 0  # times the group was preempted whole
    num_replayed_tokens: int = 0  # tokens re-fed on its resumptions
    group_id: str = ""  # the parent request's id
    _reads: ClassVar[Callable[[], list[int]] | None] = None  # per record, once set: computes its co-worker reads

    def settle_with(self, reads: Callable[[], list[int]]) -> None:
        """``coworker_reads`` computed when first read (:class:`HogwildStats` settles a record before it hands
        it out, in a metrics snapshot or to a reader of ``ended``), not in the engine step the group ends in."""
        self._reads = reads

    def settle(self) -> None:
        if self._reads is not None:
            self.coworker_reads, self._reads = self._reads(), None


@dataclass
class HogwildStats:
    num_member_preemptions: int = 0  # a worker preempted alone (by design never)
    num_group_preemptions: int = 0  # groups preempted whole under KV pressure
    num_replayed_tokens: int = 0  # tokens re-fed by resumed groups
    _ended: deque = field(default_factory=lambda: deque(maxlen=1024))  # GroupEnd, newest last
    _unreported: list = field(default_factory=list)  # GroupEnd not yet in a snapshot
    _unsettled: list = field(default_factory=list)  # GroupEnd whose co-worker reads are still to compute

    def record(self, end: GroupEnd) -> None:
        self._ended.append(end)
        self._unreported.append(end)
        del self._unreported[:-1024]
        self._unsettled.append(end)
        # The newest records, in order: those past the last 1,024 left ``ended`` and the unreported ones, and
        # nobody can read them any more (no metrics, no reader): their co-worker reads are never counted.
        del self._unsettled[:-1024]

    @property
    def ended(self) -> deque:
        """The last 1,024 groups' records, newest last."""
        self._settle()
        return self._ended

    def _settle(self) -> None:
        for end in self._unsettled:
            end.settle()
        self._unsettled = []

    def snapshot(self, groups_running: int, groups_waiting: int, free_blocks: int) -> dict[str, Any]:
        """What the front end's metrics need since the last snapshot (plain types: it crosses processes)."""
        self._settle()
        ended, self._unreported = self._unreported, []
        return {
            "groups_running": groups_running,
            "groups_waiting": groups_waiting,
            "kv_free_blocks": free_blocks,
            "member_preemptions": self.num_member_preemptions,
            "group_preemptions": self.num_group_preemptions,
            "replayed_tokens": self.num_replayed_tokens,
            "ended": [asdict(e) for e in ended],
        }
