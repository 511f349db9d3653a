"""A Hogwild group's lanes and the segments each member reads in one step. Pure, no vLLM import.

The scheduler keeps one :class:`Group` per Hogwild request (the ``n`` children
of one vLLM parent request) and asks it, every step, for the segments of each
member that decodes in that step.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Sequence

from vllm_hogwild.core.options import STEP_LAYOUTS, RequestOptions
from vllm_hogwild.core.patterns import WindowMatcher
from vllm_hogwild.core.protocol import answer_regex
from vllm_hogwild.attention.segment_attention import Segment
from vllm_hogwild.core.steps import STEP_END, StepTracker
from vllm_hogwild.core.views import Separators, Span, View, build_views


@dataclass(frozen=True)
class Lane:
    block_ids: tuple[int, ...]  # physical blocks from stored position 0
    num_tokens: int  # tokens whose K/V is in the cache once this step's writes land


@dataclass
class Group:
    group_id: str
    num_workers: int
    options: RequestOptions
    max_tokens: int
    member_ids: list[str | None] = field(default_factory=list)
    prompt_len: int = 0
    finished: set[int] = field(default_factory=set)
    block_size: int = 16
    num_prefill_tokens: int = 0  # prompt tokens computed for the whole group
    # For metrics (monotonic seconds in the scheduler's process; 0: not yet).
    arrival_time: float = 0.0  # first member reached the scheduler
    arrival: float = 0.0  # the request's arrival time (wall clock, vLLM's Request.arrival_time): fairness
    admitted_time: float = 0.0  # the whole group was queued for its first step
    prefill_by_worker: list[int] = field(default_factory=list)  # prompt tokens each member computed
    coworker_reads: list[int] = field(default_factory=list)  # co-worker tokens each member attended, summed over steps
    prompt_end: int | None = None  # the prompt part of every view (collab: the section headers follow it)
    separators: Separators = Separators()  # section headers, stored at the prompt's tail (collab)

    def __post_init__(self) -> None:
        if not self.member_ids:
            self.member_ids = [None] * self.num_workers
        self.prefill_by_worker = self.prefill_by_worker or [0] * self.num_workers
        self.coworker_reads = self.coworker_reads or [0] * self.num_workers
        # Layouts with a shared history: the steps of every lane, and how many of
        # each worker's sampled tokens the tracker has seen.
        self.steps = (
            StepTracker(self.num_workers, self.prompt_len, self.options.step_end or STEP_END)
            if self.options.layout in STEP_LAYOUTS else None
        )
        self.num_observed = [0] * self.num_workers
        # Whether each lane's text has matched answer_pattern, searched over a bounded window.
        self.answer_matchers = (
            [WindowMatcher(answer_regex(self.options.answer_pattern)) for _ in range(self.num_workers)]
            if self.options.answer_pattern is not None else None
        )
        self.answered = False
        self.num_steps = [1] * self.num_workers  # the step each worker writes (named protocol)
        self.checked_at = [0] * self.num_workers  # group tokens at each worker's last redundancy check
        self.placed = [set() for _ in range(self.num_workers)]  # output indices the engine placed
        self.placing = [deque() for _ in range(self.num_workers)]  # tokens the engine still places, per lane
        self.finisher: int | None = None  # the worker the finisher runs on, once started

    @property
    def num_prefill_saved(self) -> int:
        """Prompt tokens the group did not compute: the prompt is computed once, not once per worker."""
        extra = sum(self.prefill_by_worker) - max(self.prefill_by_worker, default=0)
        return max(0, (self.num_workers - 1) * self.prompt_len - extra)

    @property
    def observes_text(self) -> bool:
        """Whether the scheduler must decode this group's sampled tokens (steps or answers)."""
        return self.steps is not None or self.options.answer_pattern is not None

    @property
    def is_complete(self) -> bool:
        return all(m is not None for m in self.member_ids)

    @property
    def is_done(self) -> bool:
        return len(self.finished) == self.num_workers

    def index_of(self, request_id: str) -> int:
        return self.member_ids.index(request_id)


def member_views(group: Group, lanes: Sequence[Lane]) -> list[View]:
    """Every member's view given all lanes (worker order).

    For the layouts with a shared history, finished steps whose last token has
    been fed join the history first (``group.steps.join``).
    """
    lens = [lane.num_tokens for lane in lanes]
    if group.steps is None:
        return build_views(group.options.layout, group.prompt_len, lens)
    group.steps.join(lens)
    return build_views(group.options.layout, group.prompt_len, lens,
                       history=group.steps.history, step_starts=group.steps.step_starts,
                       separators=group.separators, prompt_end=group.prompt_end)


def segments_of(view: View, lanes: Sequence[Lane]) -> tuple[Segment, ...] | None:
    """The view as attention segments; ``None`` when it is the reader's own lane alone.

    A view that is exactly ``[own lane from position 0]`` (one worker, the
    ``isolated`` layout, a worker reading nobody yet) is plain causal
    attention: it runs through vLLM's own kernel, bit for bit like a plain
    request.
    """
    if len(view.spans) == 1 and view.own.start == 0:
        return None
    return tuple(
        Segment(lanes[s.lane].block_ids, s.start, s.end, delta)
        for s, delta in zip(view.spans, view.deltas())
    )


def coworker_tokens(view: View, reader: int, prompt_len: int) -> int:
    """Tokens of ``view`` generated by workers other than ``reader`` (the prompt is nobody's)."""
    return sum(max(0, s.end - max(s.start, prompt_len)) for s in view.spans if s.lane != reader)


def step_segments(
    group: Group, lanes: Sequence[Lane], decoding: Sequence[int]
) -> dict[int, tuple[Segment, ...]]:
    """Segments of the members in ``decoding`` (worker indices) whose view is not plain.

    Also adds what each of them reads from co-workers to ``group.coworker_reads``.
    """
    views = member_views(group, lanes)
    out = {}
    for w in decoding:
        group.coworker_reads[w] += coworker_tokens(views[w], w, group.prompt_len)
        segs = segments_of(views[w], lanes)
        if segs is not None:
            out[w] = segs
    return out


def prompt_separators(tail: dict) -> tuple[int, Separators]:
    """``(prompt_end, separators)`` from the prompt tail the front end recorded (collab).

    The headers are read from lane 0's copy of the prompt: every lane holds the
    same prompt, and lane 0's blocks live as long as the group.
    """
    spans = {name: Span(0, *tail[name]) for name in ("history", "others", "pivot", "own")}
    return tail["prompt_end"], Separators(**spans)


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
