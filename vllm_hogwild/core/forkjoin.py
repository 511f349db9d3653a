"""Fork/join protocols of parallel-reasoning models (Multiverse, NPR): when to fork, what to place, when to join.

Pure, no torch and no vLLM. These models write a plan of k parallel parts,
then the engine decodes k *branches* of the request at once and joins them:

- **fork**: the text ends with the family's goal end (``</Goal>``,
  ``</guideline>``); the goal since its start tag lists the parts, one numbered
  entry each (``<Outline>\\n1: ...``, ``<plan> 1: ...``). Branch i starts with
  the placed header of its part's number (``\\n<Path>\\n1:``) and ends when it
  writes the family's branch end (``</Path>``);
- **join**: when every branch has ended, the continuation reads the prefix and
  every branch and starts with the placed join header (``<Conclusion>\\n``).

A family is one row of :data:`FAMILIES` (a new family is a few lines). The
rules each family's own engine applies are there too: how deep forks may nest,
how many parts make a fork (others: the request goes on without forking), and
how much budget a fork needs left.

Detection is bounded per token: the goal end is matched with RE2 over a
window of the latest text (:class:`~vllm_hogwild.core.patterns.WindowMatcher`)
and the goal's entries are counted over at most :data:`MAX_GOAL_CHARS`
characters before it; the patterns are the family's own, never a client's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Sequence

from vllm_hogwild.core.patterns import WindowMatcher, compile_pattern
from vllm_hogwild.core.views import Span, View, join_view

MAX_GOAL_CHARS = 16_384  # a goal longer than this (start tag to end tag) counts the entries of its tail only


@dataclass(frozen=True)
class Family:
    """One fork/join protocol, as its model was trained on it."""

    name: str
    goal_start: str  # the tag that opens a plan of parallel parts
    goal_end: str  # the tag that closes it: the fork point
    entry: str  # RE2 pattern of one part's entry in the goal, its number as group 1
    branch_header: str  # placed at the start of each branch; ``{n}``: the part's number
    branch_end: str  # the branch is done once its text contains this
    join_header: str  # placed at the start of the continuation after the join
    max_depth: int  # forks open at once along one branch, the outermost included
    max_branches: int | None  # more parts than this: no fork (the request goes on); None: no such rule
    min_budget_left: int  # tokens of budget a fork needs left, else no fork

    def header(self, number: str) -> str:
        return self.branch_header.format(n=number)


FAMILIES: dict[str, Family] = {f.name: f for f in (
    # Multiverse (arXiv:2506.09991): entries "1:" or "1.2:", nesting 5 deep, no fork within 30 tokens of the end.
    Family("multiverse", goal_start="<Goal>", goal_end="</Goal>", entry=r"<Outline>\s*(\d+(?:\.\d+)*):",
           branch_header="\n<Path>\n{n}:", branch_end="</Path>", join_header="<Conclusion>\n",
           max_depth=5, max_branches=None, min_budget_left=30),
    # NPR (arXiv:2512.07461): no nesting; 1-5 plans fork, 0 or more go on; a fork needs 1,024 tokens left.
    Family("npr", goal_start="<guideline>", goal_end="</guideline>", entry=r"<plan>\s*(\d+):",
           branch_header="\n<step>\n{n}:", branch_end="</step>", join_header="<takeaway>\n",
           max_depth=1, max_branches=5, min_budget_left=1024),
)}


@dataclass(frozen=True)
class Fork:
    """A fork decided: one branch per part, in the goal's order; ``headers[i]`` is placed at branch i's start."""

    numbers: tuple[str, ...]
    headers: tuple[str, ...]

    @property
    def num_branches(self) -> int:
        return len(self.numbers)


def parts_of(family: Family, text: str) -> tuple[str, ...]:
    """The part numbers of the last goal in ``text`` (which ends with the goal end), in order; () if none.

    Looks at most :data:`MAX_GOAL_CHARS` characters back for the goal's start tag.
    """
    window = text[-MAX_GOAL_CHARS:]
    start = window.rfind(family.goal_start)
    goal = window[start + len(family.goal_start):] if start >= 0 else window
    pattern = compile_pattern("entry", family.entry, min_groups=1)
    return tuple(m.group(1) for m in pattern.finditer(goal))


def decide(family: Family, text: str, *, depth: int, budget_left: int, max_branches: int) -> Fork | None:
    """Whether a sequence whose text has just reached the goal end forks, and into what.

    ``depth``: forks already open around this sequence (0 at the top);
    ``budget_left``: tokens it may still generate; ``max_branches``: the
    engine's cap (``--hogwild-max-workers``). No fork (``None``) when the
    family's rules say so: nested too deep, too little budget, no part, or more
    parts than the family forks. More parts than the engine's cap: refused by
    the caller (:class:`ForkTooWide`), never silently cut.
    """
    if depth >= family.max_depth or budget_left < family.min_budget_left:
        return None
    numbers = parts_of(family, text)
    if not numbers or (family.max_branches is not None and len(numbers) > family.max_branches):
        return None
    if len(numbers) > max_branches:
        raise ForkTooWide(len(numbers), max_branches)
    return Fork(numbers, tuple(family.header(n) for n in numbers))


class ForkTooWide(ValueError):
    def __init__(self, num_parts: int, cap: int) -> None:
        super().__init__(f"a goal of {num_parts} parts: more branches than --hogwild-max-workers ({cap})")
        self.num_parts, self.cap = num_parts, cap


@dataclass
class Watch:
    """One sequence's text fed piece by piece: whether it reached the goal end, and whether it ended its branch.

    Bounded work and memory per piece (RE2 over a window). The goal end is
    matched on the text since the last fork (a branch's header never re-triggers
    it). The text itself is the caller's (:func:`parts_of` reads it at a fork).
    """

    family: Family
    in_branch: bool  # a branch watches for its end, the top sequence does not
    _goal: WindowMatcher = field(init=False, repr=False)
    _end: WindowMatcher = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._goal = WindowMatcher(compile_pattern("goal_end", re.escape(self.family.goal_end)))
        self._end = WindowMatcher(compile_pattern("branch_end", re.escape(self.family.branch_end)))

    def feed(self, piece: str) -> str | None:
        """``"fork"`` when the text reached a goal end with this piece, ``"end"`` when a branch wrote its end
        (whichever comes first in the piece is not distinguished: the end wins), else None."""
        if self.in_branch and self._end.feed(piece):
            return "end"
        if self._goal.feed(piece):
            self._goal = WindowMatcher(self._goal.pattern)  # the next goal is matched afresh
            return "fork"
        return None


# -- one request's lanes through one fork and its join ------------------------------------------------

class Stage(Enum):
    TRUNK = "trunk"  # lane 0 decodes; the branch lanes wait
    BRANCHES = "branches"  # the branches decode side by side; the trunk waits at the fork
    JOINED = "joined"  # the trunk decodes on, reading every branch


@dataclass
class BranchLane:
    lane: int
    number: str  # the goal's part number
    header: str  # placed at its start
    text: str = ""  # what the lane wrote (the placed header first)
    end: int | None = None  # its lane length once it wrote the branch end


@dataclass
class ForkJoinLanes:
    """The lanes of one fork/join request: lane 0 is the trunk, lanes 1.. take the branches of its fork.

    Every lane stores the prompt's ``prompt_len`` tokens (forked lanes share its
    blocks); a branch's own tokens follow them in its lane. The trunk waits at the
    fork and, once every branch has ended, continues in its own lane after the
    fork point, read at the position after the longest branch (:func:`join_view`).
    One fork per request here: a goal end inside a branch, or after the join,
    does not fork again (nesting is not built).

    Feed each lane's new text with :meth:`observe` (sampled or placed: a placed
    header is the lane's text too); :meth:`waiting` are the
    lanes that sit out the next step, :meth:`view` what a lane reads, and
    :meth:`document` the flat text the model was trained on.
    """

    family: Family
    num_lanes: int
    prompt_len: int
    max_tokens: int  # each lane's budget of generated tokens
    stage: Stage = Stage.TRUNK
    fork_at: int | None = None  # the trunk's lane length at the fork (p0)
    trunk_text: str = ""
    trunk_text_at_fork: int | None = None
    branches: list[BranchLane] = field(default_factory=list)
    _trunk: Watch | None = field(default=None, repr=False)
    _watches: dict[int, Watch] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.num_lanes < 2:
            raise ValueError("a fork/join request needs a trunk and at least one branch lane")
        self._trunk = Watch(self.family, in_branch=False)

    def observe(self, lane: int, piece: str, lane_len: int) -> dict[int, str]:
        """Lane ``lane`` wrote ``piece`` and is now ``lane_len`` tokens long; the text to place, per lane."""
        if lane == 0:
            self.trunk_text += piece
            if self.stage is Stage.TRUNK and self._trunk.feed(piece) == "fork":
                return self._fork(lane_len)
            return {}
        branch = next((b for b in self.branches if b.lane == lane), None)
        if branch is None or self.stage is not Stage.BRANCHES or branch.end is not None:
            raise ValueError(f"lane {lane} writes nothing in stage {self.stage.value}")
        branch.text += piece
        if self._watches[lane].feed(piece) == "end":
            branch.end = lane_len
            if all(b.end is not None for b in self.branches):
                self.stage = Stage.JOINED
                return {0: self.family.join_header}
        return {}

    def _fork(self, lane_len: int) -> dict[int, str]:
        fork = decide(self.family, self.trunk_text, depth=0, budget_left=self.max_tokens - (lane_len - self.prompt_len),
                      max_branches=self.num_lanes - 1)
        if fork is None:
            return {}
        self.stage, self.fork_at, self.trunk_text_at_fork = Stage.BRANCHES, lane_len, len(self.trunk_text)
        self.branches = [BranchLane(i + 1, n, h) for i, (n, h) in enumerate(zip(fork.numbers, fork.headers))]
        self._watches = {b.lane: Watch(self.family, in_branch=True) for b in self.branches}
        return {b.lane: b.header for b in self.branches}

    def waiting(self) -> set[int]:
        """The lanes that sit out the next step."""
        if self.stage is Stage.BRANCHES:
            return {0} | {b.lane for b in self.branches if b.end is not None} | set(range(len(self.branches) + 1,
                                                                                          self.num_lanes))
        return set(range(1, self.num_lanes))

    def view(self, lane: int, lane_lens: Sequence[int]) -> View:
        """What ``lane`` reads, its own text last; ``lane_lens``: every lane's length."""
        if lane == 0:
            if self.stage is not Stage.JOINED:
                return View((Span(0, 0, lane_lens[0]),))
            branches = [Span(b.lane, self.prompt_len, b.end) for b in self.branches]
            return join_view(Span(0, 0, self.fork_at), branches, Span(0, self.fork_at, lane_lens[0]))
        if not any(b.lane == lane for b in self.branches):
            return View((Span(lane, 0, lane_lens[lane]),))  # a lane this request did not use
        own = Span(lane, self.prompt_len, lane_lens[lane])
        return View((Span(0, 0, self.fork_at), own)) if own.num_tokens else View((Span(0, 0, self.fork_at),))

    def document(self) -> str:
        """The flat text: the trunk up to the fork, every branch in order (headers included), the trunk on."""
        if self.trunk_text_at_fork is None:
            return self.trunk_text
        cut = self.trunk_text_at_fork
        return self.trunk_text[:cut] + "".join(b.text for b in self.branches) + self.trunk_text[cut:]

    def sequential_tokens(self, lane_lens: Sequence[int]) -> int:
        """Decode steps the request took one after another: the trunk's tokens plus its longest branch's."""
        longest = max((b.end or lane_lens[b.lane]) - self.prompt_len for b in self.branches) if self.branches else 0
        return lane_lens[0] - self.prompt_len + longest
