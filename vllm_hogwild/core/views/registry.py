"""A group's views on the worker-process side: a function of its shape and the step's wire. Pure, no vLLM import.

Each worker process keeps one :class:`GroupViews` per group: the shape it was
sent (layout, prompt, section headers, the request that holds each lane) and
each lane's block table (the runner's own list, which grows in place). It
keeps no lane length: the scheduler sends every decoding group's lane lengths
each step (:attr:`~vllm_hogwild.core.wire.StepWire.lane_lens`), and a resumed
group's re-fed positions come with the lengths of the past steps they were fed
at (:class:`~vllm_hogwild.core.wire.ReplayStep`). Two things advance, only from
the wire, as deltas applied in order: the shared history of finished paragraphs
with where each lane's unfinished part starts
(:attr:`~vllm_hogwild.core.wire.GroupStep.joined`), and a fork/join group's
forks (:class:`~vllm_hogwild.core.wire.GroupFork`). From the batch
(:class:`BatchRow`) it reads only which lanes decode this step (a prefill chunk
reads its own lane) and each one's drafts. It returns the segments of each
decoding worker whose view is not its own lane alone, and, for a resumed group
(:class:`~vllm_hogwild.core.wire.GroupReplay`), the segments of every re-fed
token, each with the view of the last step that fed its position (the step its
K/V in the cache came from: a rejected draft's position is fed again later).
Every tensor-parallel rank applies the same wire to the same batch, so every
rank holds the same views.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, NamedTuple, Sequence

from vllm_hogwild.core.views.forks import ForkState, fork_view
from vllm_hogwild.core.options import FORKJOIN_LAYOUT
from vllm_hogwild.core.views.spans import Segment, SegmentColumns, Separators, Span, check_lanes, build_views, segments_of
from vllm_hogwild.core.wire import GroupReplay, GroupShape, GroupStep, ReplayStep, StepWire

SEPARATOR_NAMES = ("history", "others", "pivot", "own")  # the order of GroupShape.separators

BlockTable = Callable[[str], "Sequence[int] | None"]  # request id -> the engine's live block list (None: unknown)


class BatchRow(NamedTuple):
    """One scheduled request of the step's batch, as its group's views need it (a tuple: the runner makes one per
    Hogwild row every step, 1,024 a step at 256 groups of 4, and a frozen dataclass cost 2.5 times as much)."""

    request_id: str
    num_computed: int  # tokens computed before this step
    num_scheduled: int  # tokens fed this step (its last sampled token and any drafts, or a prefill chunk)
    num_drafts: int = 0


@dataclass
class _LaneState:
    blocks: tuple[int, ...]  # its block table, from position 0
    live: Sequence[int] | None = None  # the engine's own block list for it (grows in place), once known


@dataclass
class LaneSlots:
    """Slots of the worker's lane table (:class:`~vllm_hogwild.attention.lane_table.LaneTable`): the lowest free
    small integer for each lane, given back when its group ends, and a new generation each time one is given
    out (so a reused slot is known to hold another lane's table)."""

    free: list[int] = field(default_factory=list)  # a heap
    num_slots: int = 0  # slots ever made: [0, num_slots)
    next_gen: int = 0

    def take(self) -> tuple[int, int]:
        slot = heapq.heappop(self.free) if self.free else self.num_slots
        self.num_slots = max(self.num_slots, slot + 1)
        return slot, self.new_generation()

    def new_generation(self) -> int:
        self.next_gen += 1
        return self.next_gen

    def give_back(self, slot: int) -> None:
        if slot >= 0:
            heapq.heappush(self.free, slot)


def max_segments(shape: GroupShape, history: int = 0, forks: int = 0) -> int:
    """At most how many segments a row of a group of this shape reads with ``history`` finished paragraphs, or
    (fork/join) forks of ``forks`` branches in all: a fork lays each branch in, and the text around it."""
    lanes = len(shape.request_ids)
    if shape.layout in ("contiguous", "isolated"):
        return lanes + 1
    if shape.layout == FORKJOIN_LAYOUT:
        return 2 * (lanes + forks) + 2
    return history + 3 * lanes + len(SEPARATOR_NAMES) + 2


@dataclass
class GroupViews:
    shape: GroupShape
    history: list[Span] = field(default_factory=list)  # finished paragraphs, in the order they joined
    paragraph_starts: list[int] = field(default_factory=list)  # where each lane's part outside the history starts
    fork: ForkState | None = None  # fork/join: the forks so far (each one's branch ends once joined)

    def __post_init__(self) -> None:
        self.paragraph_starts = self.paragraph_starts or [self.shape.prompt_len] * len(self.shape.request_ids)
        self.separators = Separators(**{
            name: None if r is None else Span(0, *r) for name, r in zip(SEPARATOR_NAMES, self.shape.separators)})
        self.lanes = [_LaneState(tuple(b)) for b in self.shape.block_ids]
        self.lane_slots: list[tuple[int, int]] = [(-1, 0)] * len(self.lanes)  # (slot, generation); -1: none
        self.slots: LaneSlots | None = None  # the registry's, once it gives the lanes slots

    def reshape(self, shape: GroupShape) -> None:
        """The group resumed: its lanes live in these requests and blocks now; its history and forks stay.
        (Its lane slots stay; the registry gives them new generations: their tables are new.)"""
        self.shape = shape
        for lane, blocks in zip(self.lanes, shape.block_ids):
            lane.blocks, lane.live = tuple(blocks), None

    @property
    def prompt_len(self) -> int:
        return self.shape.prompt_len

    def block_ids(self, block_table: BlockTable) -> list[tuple[int, ...]]:
        """Each lane's blocks now: the engine's own list where it knows the lane (it grows as the lane does, and
        is a new list once a preempted request resumes); a finished lane's last one."""
        out = []
        for i, (lane, request_id) in enumerate(zip(self.lanes, self.shape.request_ids)):
            live = block_table(request_id)
            if live is not None and (live is not lane.live or len(live) != len(lane.blocks)):
                if lane.live is not None and live is not lane.live and self.slots is not None:
                    self.lane_slots[i] = (self.lane_slots[i][0], self.slots.new_generation())  # another table
                lane.live, lane.blocks = live, tuple(live)
            out.append(lane.blocks)
        return out

    def decode(self, rows: Sequence[tuple[int, BatchRow]], lane_lens: Sequence[int] | None, step: GroupStep | None,
               block_table: BlockTable, columns: SegmentColumns | None = None) -> dict[int, tuple[Segment, ...] | int]:
        """A step of the group: its scheduled ``(lane, row)`` pairs, its lanes' lengths the scheduler sent
        (None: none; then no row may decode) and its step (None: none sent); the segments of each decoding
        worker that reads more than its lane. With ``columns``, a ``contiguous`` group's rows without drafts
        (the common case) are added there as columns and given as their row's index instead."""
        if step is not None:
            for lane, start, end in step.joined:
                if start != self.paragraph_starts[lane]:
                    raise ValueError(f"group {step.group_id}: lane {lane} joins [{start}, {end}) but its unfinished "
                                     f"part starts at {self.paragraph_starts[lane]}")
                self.history.append(Span(lane, start, end))
                self.paragraph_starts[lane] = end
        decoding = [(w, row) for w, row in rows if row.num_computed >= self.prompt_len]  # a prefill chunk reads its lane
        if not decoding:
            return {}
        if lane_lens is None or len(lane_lens) != len(self.lanes):
            raise ValueError(f"group {self.shape.group_id}: lanes {[w for w, _ in decoding]} decode but the wire "
                             f"has {'no' if lane_lens is None else len(lane_lens)} lane lengths for its "
                             f"{len(self.lanes)} lanes")
        # A lane's tokens past its length this step: drafts, or forced text fed ahead (the scheduler counts both
        # on the step's wire; the batch knows only drafts).
        ahead = step.drafts if step is not None and step.drafts else None
        drafts = [ahead[w] if ahead else row.num_drafts for w, row in decoding]
        if not any(drafts) and self.shape.layout == "contiguous":  # the common case: built directly, as columns
            check_lanes(self.prompt_len, lane_lens)
            flat = columns if columns is not None else SegmentColumns()
            base = flat.add_tables(self.block_ids(block_table), self.lane_slots)
            out: dict[int, tuple[Segment, ...] | int] = {}
            for w, _ in decoding:
                if flat.add_contiguous(w, self.prompt_len, lane_lens, base):
                    out[w] = len(flat) - 1 if columns is not None else flat.segments(len(flat) - 1)
            return out
        lens = list(lane_lens)
        if any(drafts):  # each reader's own span runs on over its drafts
            views = [self._views([n + (d if lane == w else 0) for lane, n in enumerate(lens)], [w])[0]
                     for (w, _), d in zip(decoding, drafts)]
        else:
            views = self._views(lens, [w for w, _ in decoding])
        tables = self.block_ids(block_table)
        out = {}
        for (w, _), view in zip(decoding, views):
            segments = segments_of(view, tables, self.lane_slots)
            if segments is not None:
                out[w] = segments
        return out

    def max_segments(self) -> int:
        """At most how many segments one of this group's rows reads this step (a bound, for sizing a plan before
        its views exist): the layout's parts for every lane, the history so far and a paragraph a lane joining it."""
        forks = sum(len(f.lanes) + 1 for f in self.fork.forks) if self.fork is not None else 0
        return max_segments(self.shape, len(self.history), forks)

    def replay(self, replay: GroupReplay, block_table: BlockTable) -> dict[int, tuple[tuple[Segment, ...], ...]]:
        """Each re-fed token's segments, by lane, in position order; a lane whose tokens all read their own
        lane alone (prompt tokens, the isolated layout) is left out: plain attention."""
        tables = self.block_ids(block_table)
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
                        view = self._views(lens, [lane], step)[0]
                        segments = segments_of(view, tables, self.lane_slots)
                    plain &= segments is None
                    tokens.append(segments or (Segment(tables[lane], 0, p + 1, 0, *self.lane_slots[lane]),))
            if not plain:
                out[lane] = tuple(tokens)
        return out

    def _views(self, lane_lens, readers, past: ReplayStep | None = None):
        """The readers' views now, or (``past``) as they were at a past step: its history and paragraph starts
        (a fork/join request's forks now give its views of then: see :mod:`vllm_hogwild.core.replay.step_log`)."""
        shape = self.shape
        if shape.layout == FORKJOIN_LAYOUT:
            return [fork_view(shape.prompt_len, lane_lens, w, self.fork) for w in readers]
        return build_views(shape.layout, shape.prompt_len, lane_lens, readers=readers,
                           history=self.history if past is None else self.history[:past.num_history],
                           paragraph_starts=self.paragraph_starts if past is None else past.paragraph_starts,
                           separators=self.separators, prompt_end=shape.prompt_end)


@dataclass(frozen=True)
class StepSegments:
    """One step's Hogwild rows in a worker process, by request id: each row's segments as objects
    (``general``) or as a row of ``columns`` (``flat``: a contiguous group's decoding rows, most of a step's),
    and each re-fed token's."""

    general: dict[str, tuple[Segment, ...]] = field(default_factory=dict)  # a row that reads one view
    flat: dict[str, int] = field(default_factory=dict)  # a row that reads one view: its row of ``columns``
    columns: SegmentColumns = field(default_factory=SegmentColumns)
    replays: dict[str, tuple[tuple[Segment, ...], ...]] = field(default_factory=dict)  # per re-fed token

    def __bool__(self) -> bool:
        return bool(self.general or self.flat or self.replays)

    @property
    def rows(self) -> dict[str, tuple[Segment, ...]]:
        """Every row that reads one view, as segments (made here: for tests and checks, not the step's path)."""
        return {**self.general, **{r: self.columns.segments(k) for r, k in self.flat.items()}}

    def request_ids(self) -> set[str]:
        return set(self.general) | set(self.flat) | set(self.replays)


@dataclass
class ViewRegistry:
    """Every group this worker process knows, kept from step to step."""

    groups: dict[str, GroupViews] = field(default_factory=dict)
    lanes: dict[str, tuple[GroupViews, int]] = field(default_factory=dict)  # request id -> its group and lane
    plain_replay: bool = False  # a control for the tests: re-fed tokens read their own lane only (wrong)
    slots: LaneSlots = field(default_factory=LaneSlots)

    def max_pairs(self, scheduled: Mapping[str, int], wire: StepWire | None) -> tuple[int, int]:
        """Before a step's views exist: at most how many Hogwild rows (one a query token) and plan pairs (two a
        segment at most) the step's ``scheduled`` requests (request id -> tokens fed) make, the groups its
        ``wire`` sends the shape of included; other requests are plain."""
        new = {rid: shape for shape in (wire.shapes if wire else ()) for rid in shape.request_ids}
        rows = pairs = 0
        for request_id, tokens in scheduled.items():
            entry = self.lanes.get(request_id)
            if entry is not None:
                bound = entry[0].max_segments()
            elif request_id in new:
                bound = max_segments(new[request_id])
            else:
                continue
            rows += tokens
            pairs += 2 * tokens * bound
        return rows, pairs

    def apply(self, wire: StepWire | None, batch: Callable[[Mapping[str, object]], Iterable[BatchRow]] = lambda _: (),
              block_table: BlockTable = lambda request_id: None) -> StepSegments:
        """The step's segments by request id (only rows that read more than their own lane).

        ``batch(lanes)``: the step's scheduled requests among ``lanes`` (request ids, once this step's
        shapes are known); ``block_table``: the engine's own block list of a request it knows.
        """
        if wire:
            for shape in wire.shapes:
                group = self.groups.get(shape.group_id)
                if group is None:
                    group = self.groups[shape.group_id] = GroupViews(shape)
                else:
                    for request_id in group.shape.request_ids:
                        self.lanes.pop(request_id, None)
                    group.reshape(shape)
                    for slot, _ in group.lane_slots:
                        self.slots.give_back(slot)
                group.lane_slots, group.slots = [self.slots.take() for _ in group.lanes], self.slots
                for lane, request_id in enumerate(shape.request_ids):
                    self.lanes[request_id] = (group, lane)
        rows: dict[str, list[tuple[int, BatchRow]]] = {}
        for row in batch(self.lanes):
            entry = self.lanes.get(row.request_id)
            if entry is not None:
                rows.setdefault(entry[0].shape.group_id, []).append((entry[1], row))
        if not rows and not wire:
            return StepSegments()
        for fork in wire.forks if wire else ():
            if fork.group_id in self.groups:
                self.groups[fork.group_id].fork = fork.state
        steps = {s.group_id: s for s in wire.steps} if wire else {}
        lengths = dict(wire.lengths(lambda g: len(self.groups[g].lanes))) if wire and wire.length_groups else {}
        replaying = {r.group_id for r in wire.replays} if wire else set()
        out = StepSegments()
        for group_id, lane_rows in rows.items():
            if group_id in replaying:
                continue
            group = self.groups[group_id]
            ids = group.shape.request_ids
            decoded = group.decode(lane_rows, lengths.get(group_id), steps.get(group_id), block_table, out.columns)
            for w, segs in decoded.items():
                if isinstance(segs, int):
                    out.flat[ids[w]] = segs
                else:
                    out.general[ids[w]] = segs
        for replay in wire.replays if wire else ():
            group = self.groups[replay.group_id]
            for w, tokens in group.replay(replay, block_table).items():
                if not self.plain_replay:
                    out.replays[group.shape.request_ids[w]] = tokens
        for group_id in wire.ended if wire else ():
            group = self.groups.pop(group_id, None)
            if group is not None:
                for request_id in group.shape.request_ids:
                    self.lanes.pop(request_id, None)
                for slot, _ in group.lane_slots:
                    self.slots.give_back(slot)
        return out
