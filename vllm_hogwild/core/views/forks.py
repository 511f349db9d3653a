"""What each lane of a fork/join request reads, given its forks so far. Pure, no torch and no vLLM.

:class:`ForkState` (every fork so far) crosses to the worker processes when a
fork starts and when one joins; :func:`fork_view` turns it and the lanes'
lengths into one lane's :class:`~vllm_hogwild.core.views.spans.View`. The protocol
that decides forks and joins is :mod:`vllm_hogwild.core.forkjoin.families`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from vllm_hogwild.core.views.spans import Span, View


@dataclass(frozen=True)
class ForkNode:
    """One fork of a request, as views need it."""

    parent: int  # the lane that wrote the goal
    at: int  # that lane's length with the goal's last token: its branches are read from its view position there
    lanes: tuple[int, ...]  # the branch lanes, in the goal's order
    ends: tuple[int, ...] | None = None  # each branch lane's length once all stopped (None: not joined yet)


@dataclass(frozen=True)
class ForkState:
    """Every fork of a request so far, on both sides of the wire: sent when a fork starts and when one joins."""

    forks: tuple[ForkNode, ...] = ()  # in the order they started
    hogwild: bool = False  # siblings read each other as they write (``branches: hogwild``)


def fork_view(prompt_len: int, lane_lens: Sequence[int], lane: int, state: ForkState | None) -> View:
    """What ``lane`` reads, its own text last, given the forks so far; ``lane_lens``: every lane's tokens.

    Every lane holds the prompt; a branch's own text follows it in its lane
    (from ``prompt_len``). A lane's *content* is its own text with each joined
    fork it made laid in at the fork's point: every branch's content there
    (isolated: all at that one view position, the text after the join after
    the longest; ``hogwild``: one after another, the text after them all).
    What a lane reads:

    - the trunk (lane 0): its content;
    - a branch: its parent's content up to the fork, then (``hogwild``) every
      sibling's content so far, then its own content, from the parent's
      fork point on; a nested branch so through every fork above it;
    - a lane no fork took: its own lane.

    O(forks + lanes).
    """
    own_lane = View((Span(lane, 0, lane_lens[lane]),))
    if state is None or not state.forks:
        return own_lane
    made: dict[int, list[ForkNode]] = {}
    branch_of: dict[int, ForkNode] = {}
    for f in state.forks:
        made.setdefault(f.parent, []).append(f)
        branch_of.update((b, f) for b in f.lanes)
    chain, b = [], lane
    while b in branch_of:  # the forks above the reader, from its own up to the trunk's
        chain.append((branch_of[b], b))
        b = branch_of[b].parent
    if b != 0:
        return own_lane
    layout = _Layout(prompt_len, made, state.hogwild)
    at, cur, start = 0, 0, 0
    for f, b in reversed(chain):
        at = layout.lay(cur, start, f.at, at)
        if state.hogwild:
            for sibling in f.lanes:
                if sibling != b and lane_lens[sibling] > prompt_len:
                    at = layout.lay(sibling, prompt_len, lane_lens[sibling], at)
        cur, start = b, prompt_len
    layout.lay(cur, start, max(lane_lens[cur], start), at)
    return layout.view()


class _Layout:
    """Spans with their view positions, laid one after another (see :func:`fork_view`)."""

    def __init__(self, prompt_len: int, made: dict[int, list[ForkNode]], hogwild: bool) -> None:
        self.prompt_len, self.made, self.hogwild = prompt_len, made, hogwild
        self.spans: list[Span] = []
        self.starts: list[int] = []

    def lay(self, lane: int, start: int, end: int, at: int) -> int:
        """Lane ``lane``'s content from ``start`` to ``end`` laid from view position ``at``; the position after it.
        A fork it made at ``end`` or later is not in it (its branches are read by the text after the join)."""
        for f in self.made.get(lane, ()):
            if f.at >= end or f.ends is None:
                break
            if f.at <= start:
                continue
            at = self._put(Span(lane, start, f.at), at)
            start, base = f.at, at
            for b, e in zip(f.lanes, f.ends):
                if e > self.prompt_len:
                    after = self.lay(b, self.prompt_len, e, at if self.hogwild else base)
                    at = after if self.hogwild else max(at, after)
        return self._put(Span(lane, start, end), at)

    def _put(self, span: Span, at: int) -> int:
        if not span.num_tokens:
            return at
        if self.spans and (last := self.spans[-1]).lane == span.lane and last.end == span.start \
                and self.starts[-1] + last.num_tokens == at:
            self.spans[-1] = Span(span.lane, last.start, span.end)  # it continues the last span: one span
        else:
            self.spans.append(span)
            self.starts.append(at)
        return at + span.num_tokens

    def view(self) -> View:
        if len(self.spans) == 1 and self.spans[0].start == 0 and self.starts[0] == 0:
            return View(tuple(self.spans))  # its own lane from position 0: plain attention
        return View(tuple(self.spans), tuple(self.starts))
