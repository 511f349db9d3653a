"""A group's views on the worker side, kept from step to step from the wire. Pure, no vLLM import.

Each worker process keeps one :class:`GroupViews` per group that decodes: the
shape it was sent once (block tables, layout, prompt, section headers), the
shared history of finished steps and where each lane's unfinished part starts,
both grown from the ``joined`` spans of every :class:`~vllm_hogwild.core.wire.GroupStep`.
Given a step, it returns the segments of each decoding member whose view is
not its own lane alone. Every tensor-parallel rank applies the same wire, so
every rank holds the same views.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm_hogwild.core.views import Segment, Separators, Span, build_views, segments_of
from vllm_hogwild.core.wire import GroupShape, GroupStep, StepWire

SEPARATOR_NAMES = ("history", "others", "pivot", "own")  # the order of GroupShape.separators


@dataclass
class GroupViews:
    shape: GroupShape
    history: list[Span] = field(default_factory=list)  # finished steps, in the order they joined
    step_starts: list[int] = field(default_factory=list)  # where each lane's part outside the history starts

    def __post_init__(self) -> None:
        self.step_starts = self.step_starts or [self.shape.prompt_len] * len(self.shape.member_ids)
        self.separators = Separators(**{
            name: None if r is None else Span(0, *r) for name, r in zip(SEPARATOR_NAMES, self.shape.separators)})

    def apply(self, step: GroupStep) -> dict[int, tuple[Segment, ...]]:
        """Join what the step joined, then the segments of each decoding member that reads more than its lane."""
        for lane, start, end in step.joined:
            if start != self.step_starts[lane]:
                raise ValueError(f"group {step.group_id}: lane {lane} joins [{start}, {end}) but its unfinished "
                                 f"part starts at {self.step_starts[lane]}")
            self.history.append(Span(lane, start, end))
            self.step_starts[lane] = end
        shape = self.shape
        if any(step.drafts):  # each reader's own span runs on over its drafts; nobody else sees them
            views = [self._views([n + (d if lane == w else 0) for lane, (n, d) in
                                  enumerate(zip(step.lane_lens, step.drafts))], [w])[0] for w in step.decoding]
        else:
            views = self._views(step.lane_lens, step.decoding)
        out = {}
        for w, view in zip(step.decoding, views):
            segments = segments_of(view, shape.block_ids)
            if segments is not None:
                out[w] = segments
        return out

    def _views(self, lane_lens, readers):
        shape = self.shape
        return build_views(shape.layout, shape.prompt_len, lane_lens, readers=readers, history=self.history,
                           step_starts=self.step_starts, separators=self.separators, prompt_end=shape.prompt_end)


@dataclass
class ViewRegistry:
    """Every group this worker process knows, updated by each step's wire."""

    groups: dict[str, GroupViews] = field(default_factory=dict)

    def apply(self, wire: StepWire | None) -> dict[str, tuple[Segment, ...]]:
        """The step's segments by request id (only rows that read more than their own lane)."""
        if not wire:
            return {}
        for shape in wire.shapes:
            self.groups[shape.group_id] = GroupViews(shape)
        out = {}
        for step in wire.steps:
            group = self.groups[step.group_id]
            for w, segments in group.apply(step).items():
                out[group.shape.member_ids[w]] = segments
        for group_id in wire.ended:
            self.groups.pop(group_id, None)
        return out
