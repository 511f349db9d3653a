"""One Hogwild group as the scheduler keeps it. Pure, no vLLM import.

A group is the ``n`` children of one vLLM parent request. The scheduler keeps a
:class:`Group` per Hogwild request: who its members are and which have finished,
its :class:`~vllm_hogwild.core.options.RequestSpec`, the step tracker (layouts
with a shared history), the protocol driver (placed tokens, answers, the
finisher), and the counters the metrics report. What crosses to the workers is
built from it by :meth:`Group.step` and :meth:`Group.shape`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from vllm_hogwild.core.driver import ProtocolDriver
from vllm_hogwild.core.options import STEP_LAYOUTS, RequestSpec
from vllm_hogwild.core.steps import STEP_END, StepTracker
from vllm_hogwild.core.wire import GroupShape, GroupStep


@dataclass
class GroupCounters:
    """What the metrics report about a group."""

    num_workers: int
    prefill_by_worker: list[int] = field(default_factory=list)  # prompt tokens each member computed
    coworker_reads: list[int] = field(default_factory=list)  # co-worker tokens each member attended, summed
    admitted_time: float = 0.0  # monotonic seconds when the group was queued (0: not yet)

    def __post_init__(self) -> None:
        self.prefill_by_worker = self.prefill_by_worker or [0] * self.num_workers
        self.coworker_reads = self.coworker_reads or [0] * self.num_workers

    @property
    def num_prefill_tokens(self) -> int:
        return sum(self.prefill_by_worker)

    def prefill_saved(self, prompt_len: int) -> int:
        """Prompt tokens not computed: the prompt is computed once for the group, not once per worker."""
        extra = sum(self.prefill_by_worker) - max(self.prefill_by_worker, default=0)
        return max(0, (self.num_workers - 1) * prompt_len - extra)


@dataclass
class Group:
    group_id: str
    spec: RequestSpec
    max_tokens: int  # per worker
    prompt_len: int
    arrival: float  # the request's arrival time (wall clock, as vLLM records it): fairness
    arrival_time: float  # monotonic seconds in the scheduler's process: metrics
    tracker: StepTracker | None
    driver: ProtocolDriver
    member_ids: list[str | None] = field(default_factory=list)
    finished: set[int] = field(default_factory=set)
    shape_sent: bool = False  # the workers have this group's shape
    prefilled: bool = False  # every member has computed the whole prompt
    in_step: bool = False  # prefilled, and every live member has fed as many tokens as the others
    counters: GroupCounters | None = None
    _history_by_lane: list[int] = field(default_factory=list)  # generated tokens of each lane in the history
    # steps in which each member accepted tokens (one or more): lock-step counts these, not tokens
    sampled_steps: list[int] = field(default_factory=list)

    @classmethod
    def create(cls, group_id: str, spec: RequestSpec, max_tokens: int, prompt_len: int, arrival: float,
               arrival_time: float, encode: Callable[[str], list[int]]) -> "Group":
        n, options = spec.num_workers, spec.options
        tracker = (StepTracker(n, prompt_len, options.step_end or STEP_END)
                   if options.layout in STEP_LAYOUTS else None)
        driver = ProtocolDriver(options, n, max_tokens, prompt_len, tracker, encode)
        return cls(group_id, spec, max_tokens, prompt_len, arrival, arrival_time, tracker, driver,
                   member_ids=[None] * n, counters=GroupCounters(n), _history_by_lane=[0] * n,
                   sampled_steps=[0] * n)

    @property
    def num_workers(self) -> int:
        return self.spec.num_workers

    @property
    def is_complete(self) -> bool:
        return all(m is not None for m in self.member_ids)

    @property
    def is_done(self) -> bool:
        return len(self.finished) == self.num_workers

    def index_of(self, request_id: str) -> int:
        return self.member_ids.index(request_id)

    def shape(self, block_ids: Sequence[Sequence[int]]) -> GroupShape:
        """What the workers keep for the group's whole life (``block_ids``: each lane's blocks, whole budget)."""
        tail = self.spec.prompt_tail
        return GroupShape(self.group_id, tuple(self.member_ids), self.spec.options.layout, self.prompt_len,
                          self.prompt_len if tail is None else tail.prompt_end,
                          (None,) * 4 if tail is None else tail.separators(),
                          tuple(tuple(b) for b in block_ids))

    def step(self, lane_lens: Sequence[int], decoding: Sequence[int], drafts: Sequence[int] = ()) -> GroupStep:
        """This step's wire for the group: lanes' lengths, decoding members, and the steps that join now.

        ``lane_lens``: each lane's accepted tokens (what co-workers may read); ``drafts``: the draft
        tokens each lane feeds after them this step (speculative decoding; empty: none).
        Also counts what each decoding member reads from co-workers. O(N + joined).
        """
        joined = self.tracker.join(lane_lens) if self.tracker is not None else []
        for span in joined:
            self._history_by_lane[span.lane] += span.num_tokens
        self._count_reads(lane_lens, decoding)
        return GroupStep(self.group_id, tuple(lane_lens), tuple(decoding),
                         tuple((s.lane, s.start, s.end) for s in joined), tuple(drafts) if any(drafts) else ())

    def _count_reads(self, lane_lens: Sequence[int], decoding: Sequence[int]) -> None:
        """Co-worker tokens in each decoding member's view (the prompt is nobody's)."""
        layout, p = self.spec.options.layout, self.prompt_len
        if layout == "isolated":
            return
        if layout == "contiguous":
            total = sum(n - p for n in lane_lens)
            for w in decoding:
                self.counters.coworker_reads[w] += total - (lane_lens[w] - p)
            return
        history = sum(self._history_by_lane)
        starts = self.tracker.step_starts
        unfinished = [max(0, n - s) for n, s in zip(lane_lens, starts)] if layout == "combined" else [0] * len(starts)
        live = sum(unfinished)
        for w in decoding:
            if lane_lens[w] > starts[w]:  # otherwise the worker reads its own lane alone
                self.counters.coworker_reads[w] += history - self._history_by_lane[w] + live - unfinished[w]


def parse_member(request_id: str, num_workers: int) -> tuple[str, int]:
    """``(group id, worker index)`` of a child request id.

    vLLM's ``n > 1`` fan-out names child ``i`` of parent ``P`` ``f"{i}_{P}"``;
    with ``n == 1`` there is no fan-out and the request is its own group.
    """
    if num_workers == 1:
        return request_id, 0
    index, sep, parent = request_id.partition("_")
    if not sep or not index.isdigit() or not 0 <= int(index) < num_workers:
        raise ValueError(f"request id {request_id!r} is not a child of an n={num_workers} request")
    return parent, int(index)
