"""A group's views on the worker-process side, kept from step to step from the wire. Pure, no vLLM import.

Each worker process keeps one :class:`GroupViews` per group that decodes: the
shape it was sent (layout, prompt, section headers, each lane's request id),
each lane's block table (grown by the wire's ``new_blocks`` as lanes take KV
on demand, replaced when a preempted group resumes), the shared history of
finished paragraphs and where each lane's unfinished part starts, both grown
from the ``joined`` spans of every :class:`~vllm_hogwild.core.wire.GroupStep`.
Given a step, it returns the segments of each decoding worker whose view is
not its own lane alone; given a replay (:class:`~vllm_hogwild.core.wire.GroupReplay`),
the segments of every re-fed token, each with the view of the step it was
first produced under. Every tensor-parallel rank applies the same wire, so
every rank holds the same views.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm_hogwild.core.views import Segment, Separators, Span, build_views, segments_of
from vllm_hogwild.core.wire import GroupReplay, GroupShape, GroupStep, StepWire

SEPARATOR_NAMES = ("history", "others", "pivot", "own")  # the order of GroupShape.separators


@dataclass
class GroupViews:
    shape: GroupShape
    history: list[Span] = field(default_factory=list)  # finished paragraphs, in the order they joined
    paragraph_starts: list[int] = field(default_factory=list)  # where each lane's part outside the history starts

    def __post_init__(self) -> None:
        self.paragraph_starts = self.paragraph_starts or [self.shape.prompt_len] * len(self.shape.request_ids)
        self.separators = Separators(**{
            name: None if r is None else Span(0, *r) for name, r in zip(SEPARATOR_NAMES, self.shape.separators)})
        self.reshape(self.shape)

    def reshape(self, shape: GroupShape) -> None:
        """A new shape: the group's lanes now live in these requests and blocks (it resumed); history stays."""
        self.shape = shape
        self.block_ids = list(shape.block_ids)

    def extend(self, lane: int, block_ids: tuple[int, ...]) -> None:
        self.block_ids[lane] = self.block_ids[lane] + block_ids

    def apply(self, step: GroupStep) -> dict[int, tuple[Segment, ...]]:
        """Join what the step joined, then the segments of each decoding worker that reads more than its lane."""
        for lane, start, end in step.joined:
            if start != self.paragraph_starts[lane]:
                raise ValueError(f"group {step.group_id}: lane {lane} joins [{start}, {end}) but its unfinished "
                                 f"part starts at {self.paragraph_starts[lane]}")
            self.history.append(Span(lane, start, end))
            self.paragraph_starts[lane] = end
        if any(step.drafts):  # each reader's own span runs on over its drafts; nobody else sees them
            views = [self._views([n + (d if lane == w else 0) for lane, (n, d) in
                                  enumerate(zip(step.lane_lens, step.drafts))], [w])[0] for w in step.decoding]
        else:
            views = self._views(step.lane_lens, step.decoding)
        out = {}
        for w, view in zip(step.decoding, views):
            segments = segments_of(view, self.block_ids)
            if segments is not None:
                out[w] = segments
        return out

    def replay(self, replay: GroupReplay) -> dict[int, tuple[tuple[Segment, ...], ...]]:
        """Each re-fed token's segments, by lane, in position order; a lane whose tokens all read their own
        lane alone (prompt tokens, the isolated layout) is left out: plain attention."""
        out = {}
        for lane, runs in replay.lanes:
            tokens, plain = [], True
            for start, end, index in runs:
                for p in range(start, end):
                    segments = None
                    if index >= 0:
                        step = replay.steps[index]
                        lens = list(step.lane_lens)
                        lens[lane] = p + 1  # its own tokens up to itself: causal within the row
                        view = self._views(lens, [lane], self.history[:step.num_history], step.paragraph_starts)[0]
                        segments = segments_of(view, self.block_ids)
                    plain &= segments is None
                    tokens.append(segments or (Segment(self.block_ids[lane], 0, p + 1, 0),))
            if not plain:
                out[lane] = tuple(tokens)
        return out

    def _views(self, lane_lens, readers, history=None, paragraph_starts=None):
        shape = self.shape
        return build_views(shape.layout, shape.prompt_len, lane_lens, readers=readers,
                           history=self.history if history is None else history,
                           paragraph_starts=self.paragraph_starts if paragraph_starts is None else paragraph_starts,
                           separators=self.separators, prompt_end=shape.prompt_end)


@dataclass(frozen=True)
class StepSegments:
    """One step's Hogwild rows in a worker process, by request id."""

    rows: dict[str, tuple[Segment, ...]] = field(default_factory=dict)  # a row that reads one view
    replays: dict[str, tuple[tuple[Segment, ...], ...]] = field(default_factory=dict)  # per re-fed token

    def __bool__(self) -> bool:
        return bool(self.rows or self.replays)

    def request_ids(self) -> set[str]:
        return set(self.rows) | set(self.replays)


@dataclass
class ViewRegistry:
    """Every group this worker process knows, updated by each step's wire."""

    groups: dict[str, GroupViews] = field(default_factory=dict)

    def apply(self, wire: StepWire | None) -> StepSegments:
        """The step's segments by request id (only rows that read more than their own lane)."""
        if not wire:
            return StepSegments()
        for shape in wire.shapes:
            known = self.groups.get(shape.group_id)
            if known is None:
                self.groups[shape.group_id] = GroupViews(shape)
            else:
                known.reshape(shape)
        for group_id, lane, block_ids in wire.new_blocks:
            self.groups[group_id].extend(lane, block_ids)
        rows, replays = {}, {}
        for step in wire.steps:
            group = self.groups[step.group_id]
            for w, segments in group.apply(step).items():
                rows[group.shape.request_ids[w]] = segments
        for replay in wire.replays:
            group = self.groups[replay.group_id]
            for w, tokens in group.replay(replay).items():
                replays[group.shape.request_ids[w]] = tokens
        for group_id in wire.ended:
            self.groups.pop(group_id, None)
        return StepSegments(rows, replays)
