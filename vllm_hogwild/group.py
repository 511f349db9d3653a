"""A Hogwild group's lanes and the segments each member reads in one step. Pure, no vLLM import.

The scheduler keeps one :class:`Group` per Hogwild request (the ``n`` children
of one vLLM parent request) and asks it, every step, for the segments of each
member that decodes in that step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from vllm_hogwild.options import RequestOptions
from vllm_hogwild.segment_attention import Segment
from vllm_hogwild.views import View, build_views


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

    def __post_init__(self) -> None:
        if not self.member_ids:
            self.member_ids = [None] * self.num_workers

    @property
    def is_complete(self) -> bool:
        return all(m is not None for m in self.member_ids)

    @property
    def is_done(self) -> bool:
        return len(self.finished) == self.num_workers

    def index_of(self, request_id: str) -> int:
        return self.member_ids.index(request_id)


def member_views(group: Group, lanes: Sequence[Lane]) -> list[View]:
    """Every member's view given all lanes (worker order)."""
    return build_views(group.options.layout, group.prompt_len, [lane.num_tokens for lane in lanes])


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


def step_segments(group: Group, lanes: Sequence[Lane], decoding: Sequence[int]) -> dict[int, tuple[Segment, ...]]:
    """Segments of the members in ``decoding`` (worker indices) whose view is not plain."""
    views = member_views(group, lanes)
    out = {}
    for w in decoding:
        segs = segments_of(views[w], lanes)
        if segs is not None:
            out[w] = segs
    return out


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
