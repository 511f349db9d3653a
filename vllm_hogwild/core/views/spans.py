"""Views: what each Hogwild worker reads, as ordered spans of lanes.

Pure bookkeeping, no torch and no vLLM.

- A *lane* is one physical token sequence (one worker request in vLLM). A
  token's *stored position* is its index in its lane; its key sits in the KV
  cache already rotated at that position.
- A *span* is a contiguous range ``[start, end)`` of stored positions of one lane.
- A *view* is an ordered list of spans. View positions are assigned by
  concatenation. The reading worker's own current text is always the LAST span,
  so its next token continues its own text.

The RoPE identity: ``<R(a) q, R(b) k>`` depends only on ``a - b``. A span stored
at ``s..`` but positioned at view position ``v..`` is attended exactly by rotating
the query (stored at ``p``, positioned at ``view_pos(p)``) by

    delta = (view_pos(p) - p) - (v - s)

instead of re-rotating the span's keys. Within a view the query always lies in
the last span, so ``view_pos(p) - p`` is that span's own offset and ``delta`` is
one integer per span.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Sequence

LAYOUTS = ("contiguous", "isolated", "combined", "interleaved")


@dataclass(frozen=True)
class Span:
    """Stored positions ``[start, end)`` of lane ``lane``."""

    lane: int
    start: int
    end: int

    def __post_init__(self) -> None:
        if self.lane < 0 or self.start < 0 or self.end < self.start:
            raise ValueError(f"bad span {self}")

    @property
    def num_tokens(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Separators:
    """Token runs positioned between the parts of a ``combined`` view.

    Each is a span whose K/V exists once somewhere in the group (the engine
    stores them at the tail of the common prompt, after ``prompt_end``, see
    :func:`combined_views`); ``None`` leaves that separator out.
    """

    history: Span | None = None  # before the shared history ("### Past steps": finished paragraphs)
    others: Span | None = None  # before co-workers' unfinished paragraphs
    pivot: Span | None = None  # after each co-worker's unfinished paragraph ("<...>")
    own: Span | None = None  # before the reader's own unfinished paragraph


@dataclass(frozen=True)
class Segment:
    """A span as attention reads it: stored positions ``[start, end)`` of a lane whose block table is ``block_ids``.

    ``block_ids`` covers the lane from position 0 (at least up to ``end``);
    ``delta`` is the query rotation for this segment (see the module's docstring).
    ``slot``/``gen``: the lane's slot in the worker's lane table and the generation of that slot
    (:class:`SegmentColumns`; -1: none, as for rows built by hand); not part of a segment's value.
    """

    block_ids: tuple[int, ...]
    start: int
    end: int
    delta: int
    slot: int = field(default=-1, compare=False)
    gen: int = field(default=0, compare=False)


@dataclass(frozen=True)
class View:
    """An ordered list of spans; the last one is the reader's own text.

    ``starts``: the view position of each span's first token. ``None`` (every
    Hogwild layout) positions the spans one after another. A fork/join view gives
    them: the branches of a join all start where the prefix ends, and the
    continuation after the longest (:func:`~vllm_hogwild.core.views.forks.fork_view`). Spans are read in
    ``spans`` order either way; the own span is last and starts at or after
    every other span's end.
    """

    spans: tuple[Span, ...]
    starts: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if not self.spans:
            raise ValueError("a view needs at least its own span")
        if self.starts is not None:
            if len(self.starts) != len(self.spans) or min(self.starts) < 0:
                raise ValueError("one view start >= 0 per span")
            own_start = self.starts[-1]
            if any(v + s.num_tokens > own_start for v, s in zip(self.starts[:-1], self.spans[:-1])):
                raise ValueError("the own span starts after every other span ends")

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.spans)

    @property
    def own(self) -> Span:
        return self.spans[-1]

    def view_starts(self) -> list[int]:
        """View position of the first token of every span."""
        if self.starts is not None:
            return list(self.starts)
        starts, pos = [], 0
        for span in self.spans:
            starts.append(pos)
            pos += span.num_tokens
        return starts

    def deltas(self) -> list[int]:
        """Per-span query rotation ``(v_own - s_own) - (v_i - s_i)``."""
        starts = self.view_starts()
        own_offset = starts[-1] - self.own.start
        return [own_offset - (v - s.start) for v, s in zip(starts, self.spans)]

    def view_pos(self, lane: int, stored_pos: int) -> int:
        """View position of one stored token; ``KeyError`` if not in the view."""
        for v, span in zip(self.view_starts(), self.spans):
            if span.lane == lane and span.start <= stored_pos < span.end:
                return v + stored_pos - span.start
        raise KeyError((lane, stored_pos))

    def tokens(self) -> list[tuple[int, int]]:
        """Every ``(lane, stored_pos)`` of the view, in view order."""
        return [(s.lane, p) for s in self.spans for p in range(s.start, s.end)]


def normalize(spans: Sequence[Span]) -> tuple[Span, ...]:
    """Drop empty spans and merge a span into its predecessor when it continues it.

    Merging keeps the view's token order unchanged; it turns
    ``[prompt of lane w][own text of lane w]`` into one span with delta 0, so a
    worker that reads nobody else attends exactly like a plain request.
    """
    out: list[Span] = []
    for span in spans:
        if span.num_tokens == 0:
            continue
        if out and out[-1].lane == span.lane and out[-1].end == span.start:
            out[-1] = Span(span.lane, out[-1].start, span.end)
        else:
            out.append(span)
    return tuple(out)


def _own_view(parts: list[Span], own: Span) -> View:
    spans = normalize([*parts, own])
    if not spans or spans[-1].lane != own.lane or spans[-1].end != own.end:
        raise ValueError("a view must end with the reader's own text")
    return View(spans)


def contiguous_views(prompt_len: int, lane_lens: Sequence[int]) -> list[View]:
    """``[prompt][co-worker 1] ... [co-worker N-1][own]`` for every worker.

    Every lane starts with the same ``prompt_len`` prompt tokens; each worker
    reads the prompt from its own lane (whose full blocks are shared with the
    other lanes through prefix caching), so with no co-worker text the view is
    exactly its own lane.
    """
    check_lanes(prompt_len, lane_lens)
    return [_contiguous_view(w, prompt_len, lane_lens) for w in range(len(lane_lens))]


def _contiguous_view(w: int, prompt_len: int, lane_lens: Sequence[int]) -> View:
    others = [Span(o, prompt_len, n) for o, n in enumerate(lane_lens) if o != w]
    return _own_view([Span(w, 0, prompt_len), *others], Span(w, prompt_len, lane_lens[w]))


def isolated_views(prompt_len: int, lane_lens: Sequence[int]) -> list[View]:
    """``[prompt][own]``: N independent sequences (a testing aid)."""
    check_lanes(prompt_len, lane_lens)
    return [View((Span(w, 0, n),)) for w, n in enumerate(lane_lens)]


def combined_views(
    prompt_len: int,
    lane_lens: Sequence[int],
    history: Sequence[Span],
    paragraph_starts: Sequence[int],
    separators: Separators = Separators(),
    prompt_end: int | None = None,
) -> list[View]:
    """``[prompt][history][others' unfinished paragraphs + pivot][own unfinished paragraph]``.

    ``history`` lists finished paragraphs (spans of any lane) in the order they
    finished; ``paragraph_starts[w]`` is where worker ``w``'s unfinished paragraph
    starts in its lane (so ``[paragraph_starts[w], lane_lens[w])`` is unfinished). A
    paragraph's tokens move into ``history`` when it finishes: a change of views only.

    ``prompt_end`` (default ``prompt_len``): the prompt part of every view is
    ``[0, prompt_end)``; the stored prompt's tail after it holds the separators,
    which appear only where the view positions it.
    """
    return build_views("combined", prompt_len, lane_lens, history=history, paragraph_starts=paragraph_starts,
                       separators=separators, prompt_end=prompt_end)


def interleaved_views(
    prompt_len: int,
    lane_lens: Sequence[int],
    history: Sequence[Span],
    paragraph_starts: Sequence[int],
    separators: Separators = Separators(),
    prompt_end: int | None = None,
) -> list[View]:
    """``[prompt][history][own unfinished paragraph]``: ``combined`` without the others' live work.

    An ablation: co-workers are seen only through finished paragraphs.
    """
    return build_views("interleaved", prompt_len, lane_lens, history=history, paragraph_starts=paragraph_starts,
                       separators=separators, prompt_end=prompt_end)


def _history_view(
    w: int,
    prompt_len: int,
    lane_lens: Sequence[int],
    history: Sequence[Span],
    paragraph_starts: Sequence[int],
    separators: Separators,
    live_others: bool,
    prompt_end: int,
) -> View:
    own_len = lane_lens[w]
    if own_len == paragraph_starts[w]:
        # Nothing of its own outside the history: a worker that has fed no token yet (or has
        # stopped) reads its own lane as a plain sequence; it writes nothing after it.
        return View((Span(w, 0, own_len),))
    parts = [Span(w, 0, prompt_end)]
    if history:
        parts += _present(separators.history) + list(history)
    others = [
        Span(o, paragraph_starts[o], n)
        for o, n in enumerate(lane_lens)
        if live_others and o != w and n > paragraph_starts[o]
    ]
    if others:
        parts += _present(separators.others)
        for span in others:
            parts += [span, *_present(separators.pivot)]
    parts += _present(separators.own)
    return _own_view(parts, Span(w, paragraph_starts[w], own_len))


def build_views(layout: str, prompt_len: int, lane_lens: Sequence[int], readers: Sequence[int] | None = None,
                history: Sequence[Span] = (), paragraph_starts: Sequence[int] | None = None,
                separators: Separators = Separators(), prompt_end: int | None = None) -> list[View]:
    """The views of ``readers`` (default: every worker, in worker order) for one of :data:`LAYOUTS`.

    ``history``, ``paragraph_starts``, ``separators`` and ``prompt_end``: the layouts
    with a shared history (``combined``, ``interleaved``); see :func:`combined_views`.
    """
    check_lanes(prompt_len, lane_lens)
    readers = range(len(lane_lens)) if readers is None else readers
    if layout == "contiguous":
        return [_contiguous_view(w, prompt_len, lane_lens) for w in readers]
    if layout == "isolated":
        return [View((Span(w, 0, lane_lens[w]),)) for w in readers]
    if layout in ("combined", "interleaved"):
        if paragraph_starts is None or len(paragraph_starts) != len(lane_lens):
            raise ValueError("one paragraph start per lane")
        prompt_end = prompt_len if prompt_end is None else prompt_end
        if not 0 <= prompt_end <= prompt_len:
            raise ValueError("the prompt part of a view ends within the prompt")
        return [_history_view(w, prompt_len, lane_lens, history, paragraph_starts, separators,
                              layout == "combined", prompt_end) for w in readers]
    raise ValueError(f"layout: unknown layout {layout!r}; expected one of {LAYOUTS}")


def segments_of(view: View, block_ids: Sequence[tuple[int, ...]],
                lanes: Sequence[tuple[int, int]] | None = None) -> tuple[Segment, ...] | None:
    """The view as attention segments over the lanes' block tables; ``None`` when it is its own lane alone.

    A view that is exactly ``[own lane from position 0]`` (one worker, the
    ``isolated`` layout, a worker reading nobody yet) is plain causal
    attention: it runs through vLLM's own kernel, bit for bit like a plain
    request. ``lanes``: each lane's (slot, generation) in the lane table.
    """
    if len(view.spans) == 1 and view.own.start == 0 and view.view_starts()[0] == 0:
        return None
    if lanes is None:
        return tuple(Segment(block_ids[s.lane], s.start, s.end, d) for s, d in zip(view.spans, view.deltas()))
    return tuple(Segment(block_ids[s.lane], s.start, s.end, d, *lanes[s.lane])
                 for s, d in zip(view.spans, view.deltas()))


def contiguous_segments(w: int, prompt_len: int, lane_lens: Sequence[int],
                        block_ids: Sequence[tuple[int, ...]]) -> tuple[Segment, ...] | None:
    """``segments_of`` the ``contiguous`` view of reader ``w``, through :meth:`SegmentColumns.add_contiguous` (a
    test compares the two over random lanes)."""
    columns = SegmentColumns()
    base = columns.add_tables(block_ids)
    return columns.segments(0) if columns.add_contiguous(w, prompt_len, lane_lens, base) else None


class SegmentColumns:
    """Many rows' segments as flat integer columns: no Python object per row or per segment.

    Row ``r``'s segments are ``[row_ptr[r], row_ptr[r + 1])``; segment ``s`` reads positions
    ``[start[s], end[s])`` of the lane whose block table is ``tables[table[s]]``, its query rotated by
    ``delta[s]`` (what a :class:`Segment` holds). A step's decoding rows are thousands at scale, and each
    object made per row lives until the step's attention has run: as columns they cost the garbage
    collector nothing (``array`` objects are not tracked by it) and are planned without a loop per segment.
    ``slots[t]``/``gens[t]``: table ``t``'s lane slot and its generation in the worker's lane table
    (:class:`~vllm_hogwild.attention.lane_table.LaneTable`; -1: none), so a plan uploads what changed.
    """

    __slots__ = ("tables", "slots", "gens", "row_ptr", "table", "start", "end", "delta")

    def __init__(self) -> None:
        self.tables: list[Sequence[int]] = []
        self.slots, self.gens = array("q"), array("q")
        self.row_ptr = array("q", [0])
        self.table, self.start, self.end, self.delta = array("q"), array("q"), array("q"), array("q")

    def __len__(self) -> int:
        return len(self.row_ptr) - 1

    def add_tables(self, tables: Sequence[Sequence[int]], lanes: Sequence[tuple[int, int]] | None = None) -> int:
        """Block tables the next rows index (``lanes``: each one's slot and generation); the index of the first."""
        base = len(self.tables)
        self.tables.extend(tables)
        if lanes is None:
            self.slots.extend([-1] * len(tables))
            self.gens.extend([0] * len(tables))
        else:
            for slot, gen in lanes:
                self.slots.append(slot)
                self.gens.append(gen)
        return base

    def _segment(self, table: int, start: int, end: int, delta: int) -> None:
        self.table.append(table)
        self.start.append(start)
        self.end.append(end)
        self.delta.append(delta)

    def extend(self, other: "SegmentColumns") -> None:
        """``other``'s rows after these."""
        base, at = len(self.tables), len(self.start)
        self.tables.extend(other.tables)
        self.slots.extend(other.slots)
        self.gens.extend(other.gens)
        self.table.extend(k + base for k in other.table)
        self.start.extend(other.start)
        self.end.extend(other.end)
        self.delta.extend(other.delta)
        self.row_ptr.extend(p + at for p in other.row_ptr[1:])

    def add_row(self, segments: Sequence[Segment]) -> None:
        """One row given as segments (each block table added again: for the few rows of the general path)."""
        for seg in segments:
            self._segment(len(self.tables), seg.start, seg.end, seg.delta)
            self.tables.append(seg.block_ids)
            self.slots.append(seg.slot)
            self.gens.append(seg.gen)
        self.row_ptr.append(len(self.start))

    def add_contiguous(self, w: int, prompt_len: int, lane_lens: Sequence[int], base: int) -> bool:
        """Reader ``w``'s ``contiguous`` view as one row, lane ``o``'s blocks at ``tables[base + o]``; False (no
        row added) when the view is its own lane alone: plain attention.

        ``[prompt][co-workers with text, in lane order][own]``: the prompt is read from the reader's lane,
        co-worker ``o``'s text ``[prompt_len, n_o)`` is positioned after the text of the co-workers before it, and
        the own text comes last, so the query's offset is all co-workers' text.
        """
        own_end = lane_lens[w]
        if own_end <= prompt_len:  # no own text: plain if nobody has any, else not a view (raises)
            _contiguous_view(w, prompt_len, lane_lens)
            return False
        offset = -(own_end - prompt_len)  # co-workers' text: all text less the reader's own
        for n in lane_lens:
            if n > prompt_len:
                offset += n - prompt_len
        if offset == 0:
            return False  # [prompt][own]: the own lane from 0
        if prompt_len:
            self._segment(base + w, 0, prompt_len, offset)
        at = prompt_len  # the view position of the next co-worker's text
        for o, n in enumerate(lane_lens):
            if o != w and n > prompt_len:
                self._segment(base + o, prompt_len, n, offset - at + prompt_len)
                at += n - prompt_len
        self._segment(base + w, prompt_len, own_end, 0)
        self.row_ptr.append(len(self.start))
        return True

    def segments(self, r: int) -> tuple[Segment, ...]:
        """Row ``r`` as :class:`Segment` objects (tests, and paths that plan from objects)."""
        return tuple(Segment(tuple(self.tables[self.table[s]]), self.start[s], self.end[s], self.delta[s],
                             self.slots[self.table[s]], self.gens[self.table[s]])
                     for s in range(self.row_ptr[r], self.row_ptr[r + 1]))


def _present(span: Span | None) -> list[Span]:
    return [] if span is None else [span]


def check_lanes(prompt_len: int, lane_lens: Sequence[int]) -> None:
    if prompt_len < 0 or not lane_lens:
        raise ValueError("need a prompt length >= 0 and at least one lane")
    if any(n < prompt_len for n in lane_lens):
        raise ValueError("every lane starts with the whole prompt")
