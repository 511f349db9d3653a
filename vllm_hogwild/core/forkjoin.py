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

Serving one request: :class:`ForkJoinLanes` is its lanes' state (the trunk,
the branch lanes, the order of events around a fork, which lanes sit out a
step), :func:`fork_view` what each lane reads given the fork
(:class:`ForkState`, which crosses to the worker processes), and
:func:`lane_record` what a lane ≥ 1 tells the front end when it finishes, so
that the lanes come out as one completion (``vllm_hogwild/serving/forkjoin.py``).

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

from vllm_hogwild.core.errors import HogwildOptionError
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


DEFAULT_BRANCH_LANES = 4  # a family without a branch limit (Multiverse): lanes for branches unless asked


def branch_lanes(protocol: str, max_branches: int, max_workers: int) -> int:
    """The lanes a fork/join request takes for branches: ``max_branches`` (0: the family's limit, or
    :data:`DEFAULT_BRANCH_LANES`), at most ``max_workers - 1`` (an explicit larger ask is refused)."""
    if max_workers < 2:
        raise HogwildOptionError("protocol", "fork/join needs a trunk and a branch lane: --hogwild-max-workers >= 2")
    if max_branches > max_workers - 1:
        raise HogwildOptionError("hogwild_max_branches", f"{max_branches} branch lanes; this engine allows 1 to "
                                                 f"{max_workers - 1} (--hogwild-max-workers {max_workers}, less the trunk)")
    family = FAMILIES[protocol]
    return min(max_branches or family.max_branches or DEFAULT_BRANCH_LANES, max_workers - 1)


def prompt_goal(family: Family, prompt_text: str) -> tuple[tuple[str, ...] | None, str]:
    """``(parts, open goal)`` of a prompt's tail: the parts when it ends in a complete goal (the fork starts at
    once; None: it does not), and the text of a goal it opens and leaves unclosed (else "")."""
    tail = prompt_text[-MAX_GOAL_CHARS:]
    if tail.rstrip().endswith(family.goal_end):
        return parts_of(family, tail.rstrip()), ""
    start = tail.rfind(family.goal_start)
    if start >= 0 and tail.find(family.goal_end, start) < 0:
        return None, tail[start:]
    return None, ""


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

    branch_end: str | None = None  # a regular expression that ends a branch in place of the family's tag

    def __post_init__(self) -> None:
        self._goal = WindowMatcher(compile_pattern("goal_end", re.escape(self.family.goal_end)))
        self._end = WindowMatcher(compile_pattern(
            "branch_end", re.escape(self.family.branch_end) if self.branch_end is None else self.branch_end))

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
    TRUNK = "trunk"  # lane 0 decodes; the branch lanes wait, outside the engine's queues
    BRANCHES = "branches"  # the branches decode side by side; the trunk waits at the fork
    JOINED = "joined"  # the trunk decodes on, reading every branch


@dataclass(frozen=True)
class ForkState:
    """What a lane's view needs of a fork, on both sides of the wire: sent at the fork, and again at the join."""

    fork_at: int  # p0: the trunk's tokens (prompt included) before the first branch token
    branch_lanes: tuple[int, ...]  # lanes 1..k, in the goal's order
    ends: tuple[int, ...] | None = None  # each branch's lane length once all ended (None: not joined yet)
    hogwild: bool = False  # siblings read each other as they write (``branches: hogwild``)


def fork_view(prompt_len: int, lane_lens: Sequence[int], lane: int, state: ForkState | None) -> View:
    """What ``lane`` reads, its own text last, given the fork (None: none yet); ``lane_lens``: every lane's tokens.

    - the trunk (lane 0) before the join: its own lane;
    - branch ``b``: ``[trunk 0..p0][own @p0]``; with ``hogwild`` branches,
      ``[trunk 0..p0][every other branch so far][own]``, one after another;
    - the trunk after the join: :func:`join_view` (every branch at p0, the
      continuation after the longest); with ``hogwild`` branches, the branches
      one after another and the continuation after them all;
    - a lane no branch took: its own lane.
    """
    own_lane = View((Span(lane, 0, lane_lens[lane]),))
    if state is None:
        return own_lane
    p0 = state.fork_at
    if lane == 0:
        if state.ends is None or lane_lens[0] <= p0:
            return own_lane
        branches = [Span(b, prompt_len, e) for b, e in zip(state.branch_lanes, state.ends) if e > prompt_len]
        own = Span(0, p0, lane_lens[0])
        if state.hogwild:
            return View((Span(0, 0, p0), *branches, own))
        return join_view(Span(0, 0, p0), branches, own)
    if lane not in state.branch_lanes:
        return own_lane
    own = Span(lane, prompt_len, lane_lens[lane])
    others = [Span(b, prompt_len, lane_lens[b]) for b in state.branch_lanes
              if state.hogwild and b != lane and lane_lens[b] > prompt_len]
    return View((Span(0, 0, p0), *others, own))


@dataclass
class BranchLane:
    lane: int
    number: str  # the goal's part number
    header: str  # placed at its start
    wrote_end: bool = False  # its text reached the branch end: it feeds that token and stops
    end: int | None = None  # its lane's length once it stopped


@dataclass
class ForkJoinLanes:
    """The lanes of one fork/join request: lane 0 is the trunk, lanes 1.. take the branches of its fork.

    Every lane holds the prompt's ``prompt_len`` tokens (the prompt's full
    blocks are shared through the prefix cache); a branch's own tokens follow
    them in its lane, read at p0. The engine's order of events around a fork:

    1. the trunk samples the token that completes the goal (or the prompt ends
       in a complete goal: :meth:`fork_now`); ``fork_at`` is then the trunk's
       length with that token;
    2. the branch lanes (and the spare ones) go to the engine's queue: each
       prefills the prompt's last block and samples its first token, placed
       (a branch: its header's first token; a spare lane: its end of sequence);
    3. the trunk then feeds the goal's last token and samples the join header's
       first token (placed), and waits;
    4. the branches decode side by side (:meth:`waiting` holds the others);
       a branch that writes its end feeds that token and stops
       (:meth:`lanes_to_stop`); one whose budget runs out stops too;
    5. once every branch has stopped (:meth:`stopped`), the trunk feeds the
       join header and goes on, reading every branch.

    Step 3 follows step 2 so that the front end sees every branch lane's
    first token before the trunk's first token after the fork. One fork per
    request: a goal inside a branch, or after the join, is text (nesting is not
    built). Feed every lane's new text with :meth:`observe`.
    """

    family: Family
    num_lanes: int
    prompt_len: int
    max_tokens: int  # each lane's budget of generated tokens
    hogwild: bool = False
    branch_end: str | None = None  # a request's own branch end (a regular expression), else the family's tag
    stage: Stage = Stage.TRUNK
    fork_at: int | None = None
    trunk_text: str = ""  # the trunk's text: an unclosed goal of the prompt, then what it wrote
    trunk_chars: int = 0  # characters the trunk wrote (its output text's length)
    trunk_text_at_fork: int | None = None  # trunk_chars at the fork
    branches: list[BranchLane] = field(default_factory=list)
    unforked: str | None = None  # why a goal the trunk wrote did not fork, if one did not
    _release: list[int] = field(default_factory=list)  # lanes to hand to the engine's queue now
    _stop: list[int] = field(default_factory=list)  # lanes whose next token is their end of sequence
    _trunk: Watch | None = field(default=None, repr=False)
    _watches: dict[int, Watch] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.num_lanes < 2:
            raise ValueError("a fork/join request needs a trunk and at least one branch lane")
        self._trunk = Watch(self.family, in_branch=False)

    @property
    def state(self) -> ForkState | None:
        if self.fork_at is None:
            return None
        ends = tuple(b.end for b in self.branches) if self.stage is Stage.JOINED else None
        return ForkState(self.fork_at, tuple(b.lane for b in self.branches), ends, self.hogwild)

    def fork_now(self, numbers: Sequence[str]) -> dict[int, str]:
        """The prompt ends in a complete goal of these parts (decided in the front end): fork before any token."""
        fork = Fork(tuple(numbers), tuple(self.family.header(n) for n in numbers))
        return self._fork(fork, self.prompt_len)

    def observe(self, lane: int, piece: str, lane_len: int) -> dict[int, str]:
        """Lane ``lane`` sampled a token adding ``piece`` and holds ``lane_len`` tokens with it; the text to place
        next, per lane (a placed token's text is fed here too)."""
        if lane == 0:
            self.trunk_text += piece
            self.trunk_chars += len(piece)
            if len(self.trunk_text) > 2 * MAX_GOAL_CHARS:
                self.trunk_text = self.trunk_text[-MAX_GOAL_CHARS:]  # parts_of reads no further back
            if self.stage is Stage.TRUNK and self._trunk.feed(piece) == "fork":
                return self._decide(lane_len)
            return {}
        branch = self._branch(lane)
        if branch is None or self.stage is not Stage.BRANCHES:
            return {}  # a spare lane's end of sequence, or a stopped branch's last sample
        if not branch.wrote_end and self._watches[lane].feed(piece) == "end":
            branch.wrote_end = True
            self._stop.append(lane)
        return {}

    def _decide(self, lane_len: int) -> dict[int, str]:
        try:
            fork = decide(self.family, self.trunk_text, depth=0,
                          budget_left=self.max_tokens - (lane_len - self.prompt_len), max_branches=self.num_lanes - 1)
        except ForkTooWide as err:
            self.unforked = str(err).replace("--hogwild-max-workers", "the request's branch lanes")
            return {}
        if fork is None:
            return {}
        return self._fork(fork, lane_len)

    def _fork(self, fork: Fork, fork_at: int) -> dict[int, str]:
        if fork.num_branches > self.num_lanes - 1:
            raise ForkTooWide(fork.num_branches, self.num_lanes - 1)
        self.stage, self.fork_at = Stage.BRANCHES, fork_at
        self.trunk_text_at_fork = self.trunk_chars
        self.branches = [BranchLane(i + 1, n, h) for i, (n, h) in enumerate(zip(fork.numbers, fork.headers))]
        self._watches = {b.lane: Watch(self.family, in_branch=True, branch_end=self.branch_end)
                         for b in self.branches}
        self._release = list(range(1, self.num_lanes))
        self._stop += list(range(len(self.branches) + 1, self.num_lanes))  # spare lanes end at once
        return {0: self.family.join_header, **{b.lane: b.header for b in self.branches}}

    def _branch(self, lane: int) -> BranchLane | None:
        return self.branches[lane - 1] if 1 <= lane <= len(self.branches) else None

    def trunk_finished(self) -> None:
        """The trunk stopped: the lanes no fork took are released, each to end at once."""
        if self.stage is Stage.TRUNK:
            self._release = list(range(1, self.num_lanes))
            self._stop += list(range(1, self.num_lanes))

    def end_at_budget(self, lane: int) -> None:
        """Branch ``lane`` has one token of budget left: it ends there (its end of sequence), so that the token
        before it is fed and the join reads it; an unfed last token would be in the document, not in the view."""
        branch = self._branch(lane)
        if branch is not None and self.stage is Stage.BRANCHES and not branch.wrote_end:
            branch.wrote_end = True
            self._stop.append(lane)

    def take_released(self) -> list[int]:
        out, self._release = self._release, []
        return out

    def lanes_to_stop(self) -> list[int]:
        """Lanes whose next sampled token must be their end of sequence (each is returned once)."""
        out, self._stop = self._stop, []
        return out

    def stopped(self, lane: int, lane_len: int) -> bool:
        """Lane ``lane`` finished with ``lane_len`` tokens of K/V; True when that joins the branches."""
        branch = self._branch(lane)
        if branch is None or self.stage is not Stage.BRANCHES or branch.end is not None:
            return False
        branch.end = lane_len
        if all(b.end is not None for b in self.branches):
            self.stage = Stage.JOINED
            return True
        return False

    def waiting(self, computed: Sequence[int], sampled: Sequence[int], live: Sequence[bool]) -> set[int]:
        """The lanes in the engine's queues that sit out the next step. ``computed``: each lane's tokens with
        K/V; ``sampled``: its sampled tokens; ``live``: it has not stopped."""
        if self.stage is Stage.TRUNK:
            return set(range(1, self.num_lanes))
        if self.stage is Stage.JOINED:
            return set()
        lanes = range(1, self.num_lanes)
        hold = {0} if computed[0] >= self.fork_at else set()  # the trunk waits at the fork
        if self.fork_at > self.prompt_len and any(live[b] and sampled[b] == 0 for b in lanes):
            hold.add(0)  # step 3 after step 2: the trunk feeds the goal's last token once every lane sampled
        running = [b for b in lanes if live[b] and sampled[b] > 0]
        if computed[0] < self.fork_at:
            return hold | set(running)  # the branches read the trunk up to p0: it is fed first
        slowest = min((sampled[b] for b in running), default=0)  # lock-step: siblings read each other by step
        return hold | {b for b in running if sampled[b] > slowest}

    def record(self, lane: int, num_output: int, ends_with_eos: bool) -> dict:
        """What the front end needs of a lane ≥ 1 to assemble the document (see :func:`lane_record`):
        its part (None: no branch took it), the fork point (tokens and characters of the trunk's output),
        and ``keep``: how many of its ``num_output`` tokens are the branch's (an end of sequence is not)."""
        branch = self._branch(lane)
        keep = 0 if branch is None else num_output - (1 if ends_with_eos else 0)
        out = {"lane": lane, "branch": None if branch is None else branch.number, "keep": keep}
        if self.fork_at is not None:
            out.update(fork_tokens=self.fork_at - self.prompt_len, fork_chars=self.trunk_text_at_fork)
        if self.unforked:
            out["unforked"] = self.unforked
        return out

    def sequential_tokens(self, lane_lens: Sequence[int]) -> int:
        """Decode steps the request took one after another: the trunk's tokens plus its longest branch's."""
        longest = max(((b.end or lane_lens[b.lane]) - self.prompt_len for b in self.branches), default=0)
        return lane_lens[0] - self.prompt_len + longest


RECORD_PREFIX = "hogwild-fork:"  # a lane ≥ 1's stop_reason: how it took part (the front end reads and drops it)


def lane_record(record: dict) -> str:
    import json

    return RECORD_PREFIX + json.dumps(record, separators=(",", ":"))


def read_record(stop_reason) -> dict | None:
    import json

    if not isinstance(stop_reason, str) or not stop_reason.startswith(RECORD_PREFIX):
        return None
    return json.loads(stop_reason[len(RECORD_PREFIX):])
