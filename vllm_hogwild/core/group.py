"""One Hogwild group: its workers, its protocol and what crosses to the worker processes. Pure, no vLLM import.

A group is the ``n`` requests of one vLLM parent request, one per worker. A
:class:`Group` holds the :class:`Worker` records, the
:class:`~vllm_hogwild.core.options.RequestSpec`, the paragraph tracker (layouts
with a shared history), the protocol driver (placed tokens, answers, the
finisher) and the counters the metrics report. What crosses to the worker
processes is built from it by :meth:`Group.step` and :meth:`Group.shape`. Its
life (arrival, admission, lock-step, the end) is :mod:`vllm_hogwild.core.group_table`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Protocol, Sequence

from vllm_hogwild.core.driver import ProtocolDriver
from vllm_hogwild.core.options import HISTORY_LAYOUTS, RequestSpec
from vllm_hogwild.core.paragraphs import PARAGRAPH_END, ParagraphTracker
from vllm_hogwild.core.wire import GroupShape, GroupStep


class Lane(Protocol):
    """What the core reads of a worker's engine request (vLLM's ``Request`` has these)."""

    num_computed_tokens: int  # tokens of the lane whose K/V is written (or scheduled to be, this step)
    num_tokens: int  # prompt and output tokens
    num_output_tokens: int
    output_token_ids: Sequence[int]

    def is_finished(self) -> bool: ...


class Phase(Enum):
    """Where a group is in its life."""

    GATHERING = "gathering"  # not all of its requests have arrived
    WAITING = "waiting"  # complete; not admitted yet (no room, or fairness)
    ADMITTED = "admitted"  # its requests are in the engine's queues: they prefill, then decode in lock-step


@dataclass
class Worker:
    """One of a group's N sequences and the engine request that carries its lane."""

    group: "Group"
    index: int
    request_id: str
    request: Any  # the engine's request object, read through :class:`Lane` only
    eos_token_id: int | None = None
    text: Callable[[int], str] | None = None  # the text each sampled token adds (groups that observe text)
    sampled_steps: int = 0  # engine steps in which it accepted tokens (one or more): lock-step counts these
    finished: bool = False

    @property
    def lane(self) -> Lane:
        return self.request


@dataclass
class GroupCounters:
    """What the metrics report about a group."""

    num_workers: int
    prefill_by_worker: list[int] = field(default_factory=list)  # prompt tokens each worker computed
    coworker_reads: list[int] = field(default_factory=list)  # co-worker tokens each worker attended, summed
    admitted_time: float = 0.0  # monotonic seconds when the group was admitted (0: not yet)

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
    tracker: ParagraphTracker | None
    driver: ProtocolDriver
    workers: list[Worker | None] = field(default_factory=list)
    phase: Phase = Phase.GATHERING
    shape_sent: bool = False  # the worker processes have this group's shape
    prefilled: bool = False  # every worker has computed the whole prompt
    in_step: bool = False  # prefilled, and every live worker has fed as many tokens as the others
    counters: GroupCounters | None = None
    _history_by_lane: list[int] = field(default_factory=list)  # generated tokens of each lane in the history

    @classmethod
    def create(cls, group_id: str, spec: RequestSpec, max_tokens: int, prompt_len: int, arrival: float,
               arrival_time: float, encode: Callable[[str], list[int]]) -> "Group":
        n, options = spec.num_workers, spec.options
        tracker = (ParagraphTracker(n, prompt_len, options.step_end or PARAGRAPH_END)
                   if options.layout in HISTORY_LAYOUTS else None)
        driver = ProtocolDriver(options, n, max_tokens, prompt_len, tracker, encode)
        return cls(group_id, spec, max_tokens, prompt_len, arrival, arrival_time, tracker, driver,
                   workers=[None] * n, counters=GroupCounters(n), _history_by_lane=[0] * n)

    @property
    def num_workers(self) -> int:
        return self.spec.num_workers

    @property
    def request_ids(self) -> list[str]:
        """Each worker's request id, in worker order (complete groups)."""
        return [w.request_id for w in self.workers]

    @property
    def is_complete(self) -> bool:
        return all(w is not None for w in self.workers)

    @property
    def is_done(self) -> bool:
        return all(w is not None and w.finished for w in self.workers)

    @property
    def live(self) -> list[int]:
        """Workers that have not stopped."""
        return [w.index for w in self.workers if not w.finished]

    def shape(self, block_ids: Sequence[Sequence[int]]) -> GroupShape:
        """What the worker processes keep for the group's whole life (``block_ids``: each lane's blocks)."""
        tail = self.spec.prompt_tail
        return GroupShape(self.group_id, tuple(self.request_ids), self.spec.options.layout, self.prompt_len,
                          self.prompt_len if tail is None else tail.prompt_end,
                          (None,) * 4 if tail is None else tail.separators(),
                          tuple(tuple(b) for b in block_ids))

    def step(self, lane_lens: Sequence[int], decoding: Sequence[int], drafts: Sequence[int] = ()) -> GroupStep:
        """This engine step's wire for the group: lanes' lengths, decoding workers, paragraphs that join now.

        ``lane_lens``: each lane's accepted tokens (what co-workers may read); ``drafts``: the draft
        tokens each lane feeds after them this step (speculative decoding; empty: none).
        Also counts what each decoding worker reads from co-workers. O(N + joined).
        """
        joined = self.tracker.join(lane_lens) if self.tracker is not None else []
        for span in joined:
            self._history_by_lane[span.lane] += span.num_tokens
        self._count_reads(lane_lens, decoding)
        return GroupStep(self.group_id, tuple(lane_lens), tuple(decoding),
                         tuple((s.lane, s.start, s.end) for s in joined), tuple(drafts) if any(drafts) else ())

    def _count_reads(self, lane_lens: Sequence[int], decoding: Sequence[int]) -> None:
        """Co-worker tokens in each decoding worker's view (the prompt is nobody's)."""
        layout, p = self.spec.options.layout, self.prompt_len
        if layout == "isolated":
            return
        if layout == "contiguous":
            total = sum(n - p for n in lane_lens)
            for w in decoding:
                self.counters.coworker_reads[w] += total - (lane_lens[w] - p)
            return
        history = sum(self._history_by_lane)
        starts = self.tracker.paragraph_starts
        unfinished = [max(0, n - s) for n, s in zip(lane_lens, starts)] if layout == "combined" else [0] * len(starts)
        live = sum(unfinished)
        for w in decoding:
            if lane_lens[w] > starts[w]:  # otherwise the worker reads its own lane alone
                self.counters.coworker_reads[w] += history - self._history_by_lane[w] + live - unfinished[w]


def parse_request_id(request_id: str, num_workers: int) -> tuple[str, int]:
    """``(group id, worker index)`` of a worker's request id.

    vLLM's ``n > 1`` fan-out names the request of worker ``i`` of parent ``P``
    ``f"{i}_{P}"``; with ``n == 1`` there is no fan-out and the request is its own group.
    """
    if num_workers == 1:
        return request_id, 0
    index, sep, parent = request_id.partition("_")
    if not sep or not index.isdigit() or not 0 <= int(index) < num_workers:
        raise ValueError(f"request id {request_id!r} is not a worker of an n={num_workers} request")
    return parent, int(index)
