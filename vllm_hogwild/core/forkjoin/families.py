"""Fork/join protocols of parallel-reasoning models (Multiverse, NPR): when to fork, what to force, when to join.

Pure, no torch and no vLLM. These models write a plan of k parallel parts,
then the engine decodes k *branches* of the request at once and joins them:

- **fork**: the text ends with the family's goal end (``</Goal>``,
  ``</guideline>``); the goal since its start tag lists the parts, one numbered
  entry each (``<Outline>\\n1: ...``, ``<plan> 1: ...``). Branch i starts with
  the forced header of its part's number (``\\n<Path>\\n1:``) and ends when it
  writes the family's branch end (``</Path>``);
- **join**: when every branch has ended, the continuation reads the prefix and
  every branch and starts with the forced join header (``<Conclusion>\\n``).

A family is one row of :data:`FAMILIES` (a new family is a few lines). The
rules each family's own engine applies are there too: how deep forks may nest,
how many parts make a fork (others: the request goes on without forking), and
how much budget a fork needs left.

A branch may fork again (nested), and any sequence again after a join: a
request's forks make a tree. Serving one request: :class:`ForkJoinLanes` is
its lanes' state (the trunk and every branch, each fork, the pool of lanes
forks take, the order of events around a fork, which lanes sit out a step),
:func:`~vllm_hogwild.core.views.forks.fork_view` what each lane reads given the forks
(:class:`~vllm_hogwild.core.views.forks.ForkState`, which crosses to the worker processes), and
:meth:`ForkJoinLanes.record` what a lane ≥ 1 tells the front end
(:mod:`vllm_hogwild.core.forkjoin.lane_channel`), so that the lanes come out as one
completion (``vllm_hogwild/serving/assembly.py``).

Detection is bounded per token: the goal end is matched with RE2 over a
window of the latest text (:class:`~vllm_hogwild.core.patterns.WindowMatcher`)
and the goal's entries are counted over at most :data:`MAX_GOAL_CHARS`
characters before it; the patterns are the family's own, never a client's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Sequence

from vllm_hogwild.core.errors import HogwildOptionError
from vllm_hogwild.core.views.forks import ForkNode, ForkState
from vllm_hogwild.core.forkjoin.lane_channel import LaneRecord, new_record
from vllm_hogwild.core.patterns import WindowMatcher, compile_pattern

MAX_GOAL_CHARS = 16_384  # a goal longer than this (start tag to end tag) counts the entries of its tail only


@dataclass(frozen=True)
class Family:
    """One fork/join protocol, as its model was trained on it."""

    name: str
    goal_start: str  # the tag that opens a plan of parallel parts
    goal_end: str  # the tag that closes it: the fork point
    entry: str  # RE2 pattern of one part's entry in the goal, its number as group 1
    branch_header: str  # forced at the start of each branch; ``{n}``: the part's number
    branch_end: str  # the branch is done once its text contains this
    join_header: str  # forced at the start of the continuation after the join
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
    """A fork decided: one branch per part, in the goal's order; ``headers[i]`` is forced at branch i's start."""

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


@dataclass(frozen=True)
class NoFork:
    """A goal that does not fork, and why (the family's rule, in words a client can act on)."""

    reason: str


def decide(family: Family, text: str, *, depth: int, budget_left: int, max_branches: int) -> Fork | NoFork:
    """Whether a sequence whose text has just reached the goal end forks, and into what.

    ``depth``: forks already open around this sequence (0 at the top);
    ``budget_left``: tokens it may still generate; ``max_branches``: the
    branch lanes free for it. More parts than those lanes raises
    :class:`ForkTooWide` (checked first, so that a prompt goal of more parts
    than its lanes is refused alike in every family); otherwise no fork
    (:class:`NoFork`, with its reason) when the family's rules say so: no part,
    more parts than the family forks, nested too deep, too little budget.
    """
    numbers = parts_of(family, text)
    if not numbers:
        return NoFork(f"a goal with no part: {family.name} branches on entries like {family.entry!r}")
    if len(numbers) > max_branches:
        raise ForkTooWide(len(numbers), max_branches)
    if family.max_branches is not None and len(numbers) > family.max_branches:
        return NoFork(f"a goal of {len(numbers)} parts: {family.name} forks into at most {family.max_branches} "
                      "(a goal of more goes on as one sequence)")
    if depth >= family.max_depth:
        return NoFork(f"nested {depth} deep: {family.name} forks at most {family.max_depth} deep")
    if budget_left < family.min_budget_left:
        return NoFork(f"{budget_left} tokens of budget left: {family.name} forks with at least "
                      f"{family.min_budget_left} left")
    return Fork(numbers, tuple(family.header(n) for n in numbers))


MAX_UNFORKED = 32  # goals that did not fork a request reports (each is a goal the model wrote): the first ones

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


# -- one request's lanes through its forks and joins ------------------------------------------------

@dataclass
class Strand:
    """One sequence the protocol follows: the trunk (lane 0), or a branch of some fork."""

    lane: int
    depth: int  # forks open around it: 0 for the trunk
    watch: Watch
    number: str | None = None  # its part of the goal (None: the trunk)
    parent: int | None = None  # the lane whose fork it is a branch of
    text: str = ""  # its latest text (at most 2 x MAX_GOAL_CHARS): a goal's parts are read from it
    chars: int = 0  # characters it wrote (its output text's length)
    written: int = 0  # tokens it wrote (its lane's tokens past the prompt)
    wrote_end: bool = False  # a branch whose text reached its end: it feeds that token and stops
    end: int | None = None  # a branch's lane length once it stopped
    waits_at: "OpenFork | None" = None  # the fork of its own that it waits at


@dataclass
class OpenFork:
    parent: int
    at: int
    lanes: list[int]
    parent_chars: int  # characters the parent had written at the fork
    joined: bool = False


@dataclass
class ForkJoinLanes:
    """The lanes of one fork/join request: lane 0 is the trunk; lanes 1.. are a pool every fork takes from.

    Every lane holds the prompt's ``prompt_len`` tokens (the prompt's full
    blocks are shared through the prefix cache); a branch's own tokens follow
    them in its lane. A fork takes as many lanes as its goal has parts, the
    lowest the pool has left; a sequence that writes a goal forks (a branch
    too, nested, as deep as the family allows; the trunk again after a join)
    when the family's rules allow it, the pool has the lanes, and the text
    could not reach past the context window (``max_positions``). Lanes no fork
    takes wait outside the engine's queues until the trunk finishes, then end
    at once. The engine's order of events around a fork that sequence S writes:

    1. S samples the token that completes the goal (or the prompt ends in a
       complete goal: :meth:`fork_now`); the fork's ``at`` is then S's length
       with that token;
    2. the branch lanes go to the engine's queue: each prefills the prompt's
       last block and samples its first token, forced (its header's first);
    3. S then feeds the goal's last token and samples the join header's first
       token (forced), and waits;
    4. the branches decode (``hogwild`` branches in lock-step, as they read
       each other); a branch that writes its end feeds that token and stops
       (:meth:`lanes_to_stop`), as does one whose budget runs out;
    5. once every branch of the fork has stopped (:meth:`stopped`), S feeds
       the join header and goes on, reading every branch.

    Step 3 follows step 2 so that the front end sees every branch lane's
    first token (and with it the fork, in its record) before S's first token
    after the fork. ``hogwild`` branches do not nest: a goal inside one is
    text. Feed every lane's new text with :meth:`observe`.
    """

    family: Family
    num_lanes: int
    prompt_len: int
    max_tokens: int  # each lane's budget of generated tokens
    hogwild: bool = False
    branch_end: str | None = None  # a request's own branch end (a regular expression), else the family's tag
    trunk_text: str = ""  # an unclosed goal of the prompt: the trunk's text starts with it
    max_positions: int | None = None  # view positions must stay below this (the context window; None: no limit)
    strands: dict[int, Strand] = field(default_factory=dict)  # the trunk and every branch, by lane
    forks: list[OpenFork] = field(default_factory=list)  # every fork, in the order they started
    pool: list[int] = field(default_factory=list)  # lanes no fork took yet, lowest first
    unforked: list[tuple[str | None, int, str]] = field(default_factory=list)  # goals that did not fork (at most
    # MAX_UNFORKED): (the branch's part, None for the trunk; the tokens it had written; why), in the order written
    version: int = 0  # counts changes of :attr:`state`
    retired: bool = False  # the lanes no fork took went back: no fork could take them any more
    _fork_of: dict[int, OpenFork] = field(default_factory=dict, repr=False)  # branch lane -> its fork
    _release: list[int] = field(default_factory=list)  # lanes to hand to the engine's queue now
    _stop: list[int] = field(default_factory=list)  # lanes whose next token is their end of sequence
    _state: tuple[int, ForkState | None] = (0, None)

    def __post_init__(self) -> None:
        if self.num_lanes < 2:
            raise ValueError("a fork/join request needs a trunk and at least one branch lane")
        self.strands[0] = Strand(0, 0, Watch(self.family, in_branch=False), text=self.trunk_text)
        self.pool = list(range(1, self.num_lanes))

    @property
    def state(self) -> ForkState | None:
        """The forks as views need them (None: no fork yet); a new object only when :attr:`version` moved."""
        if not self.forks:
            return None
        if self._state[0] != self.version or self._state[1] is None:
            nodes = tuple(ForkNode(f.parent, f.at, tuple(f.lanes),
                                   tuple(self.strands[b].end for b in f.lanes) if f.joined else None)
                          for f in self.forks)
            self._state = (self.version, ForkState(nodes, self.hogwild))
        return self._state[1]

    def fork_now(self, numbers: Sequence[str]) -> dict[int, str]:
        """The prompt ends in a complete goal of these parts (decided in the front end): fork before any token."""
        fork = Fork(tuple(numbers), tuple(self.family.header(n) for n in numbers))
        if fork.num_branches > len(self.pool):
            raise ForkTooWide(fork.num_branches, len(self.pool))
        return self._fork(self.strands[0], fork, self.prompt_len)

    def observe(self, lane: int, piece: str, lane_len: int, hidden: str = "") -> dict[int, str]:
        """Lane ``lane`` sampled a token adding ``piece`` to its text and holds ``lane_len`` tokens with it; the
        text to force next, per lane (a forced token's text is fed here too). ``hidden``: the token's text when
        the client's text leaves it out (a special token, as a model's tags may be: ``</Goal>`` in
        Multiverse's tokenizer); the protocol reads it, the fork points count the client's characters."""
        strand = self.strands.get(lane)
        if strand is None or strand.end is not None:
            return {}  # a spare lane's end of sequence, or a stopped branch's last sample
        piece, visible = piece + hidden, len(piece)
        strand.text += piece
        strand.chars += visible
        strand.written = lane_len - self.prompt_len
        if len(strand.text) > 2 * MAX_GOAL_CHARS:
            strand.text = strand.text[-MAX_GOAL_CHARS:]  # parts_of reads no further back
        if strand.wrote_end:
            return {}
        said = strand.watch.feed(piece)
        forced = {}
        if said == "end":
            strand.wrote_end = True
            self._stop.append(lane)
        elif said == "fork" and strand.waits_at is None and not (self.hogwild and strand.depth):
            forced = self._decide(strand, lane_len)
        if self.pool and not forced:
            self._retire_pool()
        return forced

    def _may_fork(self, strand: Strand) -> bool:
        """Whether a goal ``strand`` writes from now on could still fork, by the family's rules."""
        return (strand.end is None and not strand.wrote_end and strand.depth < self.family.max_depth
                and not (self.hogwild and strand.depth)
                and self.max_tokens - strand.written >= self.family.min_budget_left)

    def _retire_pool(self) -> None:
        """The lanes no fork took go back as soon as no fork can take them: no sequence that may still write a
        goal may fork by the family's rules (nested as deep as it forks, less budget left than it forks with,
        or ended). O(sequences)."""
        if not any(self._may_fork(strand) for strand in self.strands.values()):
            self.retired = True
            self.trunk_finished()

    def _decide(self, strand: Strand, lane_len: int) -> dict[int, str]:
        written = lane_len - self.prompt_len
        try:  # (lanes given back because no fork could take them: the family's rule is the reason)
            fork = decide(self.family, strand.text, depth=strand.depth, budget_left=self.max_tokens - written,
                          max_branches=self.num_lanes - 1 if self.retired else len(self.pool))
        except ForkTooWide as err:
            fork = NoFork(f"a goal of {err.num_parts} parts: more branches than the request's free branch lanes "
                          f"({err.cap}; hogwild_max_branches)")
        if isinstance(fork, Fork) and fork.num_branches > len(self.pool):  # (only after the lanes went back)
            fork = NoFork(f"a goal of {fork.num_branches} parts: the request's branch lanes went back")
        if isinstance(fork, Fork) and self.max_positions is not None and self._reach(
                strand.lane, fork.num_branches) > self.max_positions:
            fork = NoFork(f"a fork of {fork.num_branches} branches could force text past the context window "
                          f"({self.max_positions} positions)")
        if isinstance(fork, NoFork):
            self.no_fork(strand.number, written, fork.reason)
            return {}
        return self._fork(strand, fork, lane_len)

    def no_fork(self, branch: str | None, at: int, reason: str) -> None:
        """A goal that did not fork: ``branch`` (None: the trunk) had written ``at`` tokens with it."""
        if len(self.unforked) < MAX_UNFORKED:
            self.unforked.append((branch, at, reason))

    def _reach(self, lane: int, num_branches: int) -> int:
        """The furthest view position the request could reach with a fork of ``num_branches`` more at ``lane``:
        every lane writes its whole budget, and a fork adds its longest branch (``hogwild``: all of them)."""
        def reach(strand: int) -> int:
            widths = [[reach(b) for b in f.lanes] for f in self.forks if f.parent == strand]
            if strand == lane:
                widths.append([self.max_tokens] * num_branches)
            return self.max_tokens + sum(sum(w) if self.hogwild else max(w) for w in widths)

        return self.prompt_len + reach(0)

    def _fork(self, strand: Strand, fork: Fork, at: int) -> dict[int, str]:
        lanes, self.pool = self.pool[:fork.num_branches], self.pool[fork.num_branches:]
        opened = OpenFork(strand.lane, at, lanes, strand.chars)
        self.forks.append(opened)
        for lane, number in zip(lanes, fork.numbers):
            self.strands[lane] = Strand(lane, strand.depth + 1,
                                        Watch(self.family, in_branch=True, branch_end=self.branch_end),
                                        number=number, parent=strand.lane)
            self._fork_of[lane] = opened
        strand.waits_at = opened
        self._release += lanes
        self.version += 1
        return {strand.lane: self.family.join_header, **dict(zip(lanes, fork.headers))}

    def trunk_finished(self) -> None:
        """The trunk stopped: the lanes no fork took are released, each to end at once."""
        spare, self.pool = self.pool, []
        self._release += spare
        self._stop += spare

    def end_at_budget(self, lane: int) -> None:
        """Branch ``lane`` has one token of budget left: it ends there (its end of sequence), so that the token
        before it is fed and the join reads it; an unfed last token would be in the document, not in the view."""
        strand = self._open_branch(lane)
        if strand is not None:
            strand.wrote_end = True
            self._stop.append(lane)

    def ends_next(self, lane: int, num_output_tokens: int) -> bool:
        """Whether ``lane``'s next token must be its end of sequence: it wrote its end (or no fork took it and
        it goes back), or, a branch, it has one token of budget left (:meth:`end_at_budget`). With speculative
        decoding an accepted run is cut there, so that the end comes exactly where it comes without."""
        return lane in self._stop or (num_output_tokens == self.max_tokens - 1
                                      and self._open_branch(lane) is not None)

    def _open_branch(self, lane: int) -> Strand | None:
        """Lane ``lane``'s strand if it is a branch still writing (not stopped, its end not written)."""
        strand = self.strands.get(lane)
        if strand is None or strand.parent is None or strand.end is not None or strand.wrote_end:
            return None
        return strand

    def take_released(self) -> list[int]:
        out, self._release = self._release, []
        return out

    def lanes_to_stop(self) -> list[int]:
        """Lanes whose next sampled token must be their end of sequence (each is returned once)."""
        out, self._stop = self._stop, []
        return out

    def stopped(self, lane: int, lane_len: int) -> bool:
        """Lane ``lane`` finished with ``lane_len`` tokens of K/V; True when that joins its fork."""
        strand = self.strands.get(lane)
        if strand is None or strand.parent is None or strand.end is not None:
            return False
        strand.end = lane_len
        fork = self._fork_of[lane]
        if self.pool:
            self._retire_pool()
        if any(self.strands[b].end is None for b in fork.lanes):
            return False
        fork.joined = True
        self.strands[fork.parent].waits_at = None
        self.version += 1
        return True

    def who_sits_out(self, computed: Sequence[int], sampled: Sequence[int], live: Sequence[bool]) -> set[int]:
        """The lanes that sit out the next step (lanes no fork took among them). ``computed``: each lane's tokens
        with K/V; ``sampled``: its sampled tokens; ``live``: it has not stopped. O(lanes)."""
        sitting_out = set(self.pool)
        for fork in self.forks:
            if fork.joined:
                continue
            parent, lanes = fork.parent, fork.lanes
            if computed[parent] >= fork.at:
                sitting_out.add(parent)  # it waits at the fork
            elif fork.at > self.prompt_len and any(live[b] and sampled[b] == 0 for b in lanes):
                sitting_out.add(parent)  # step 3 after step 2: it feeds the goal's last token once every branch sampled
            running = [b for b in lanes if live[b] and sampled[b] > 0]
            if computed[parent] < fork.at:
                sitting_out.update(running)  # the branches read the parent up to the fork: it is fed first
            elif self.hogwild and running:  # lock-step: hogwild siblings read each other by step, so a sibling
                slowest = min(sampled[b] for b in lanes if live[b])  # still to sample its first token keeps all back
                sitting_out.update(b for b in running if sampled[b] > slowest)
        return sitting_out

    def record(self, lane: int, num_output: int | None = None, ends_with_eos: bool = False) -> LaneRecord:
        """What the front end needs of a lane ≥ 1 to assemble the document (a
        :class:`~vllm_hogwild.core.forkjoin.lane_channel.LaneRecord`), from its first output on: its part (None: no fork
        took it), its fork (the parent lane, the fork's lanes, the fork point in the parent's output tokens and
        characters); once it finished (``num_output``: its output tokens), ``keep``: how many are the branch's
        (an end of sequence is not)."""
        strand = self.strands.get(lane)
        fields: dict = {}
        if strand is not None:
            fork = self._fork_of[lane]
            fields.update(branch=strand.number, parent=fork.parent, lanes=tuple(fork.lanes),
                          fork_tokens=fork.at - self.prompt_len, fork_chars=fork.parent_chars)
        if num_output is not None:
            fields["keep"] = 0 if strand is None else num_output - (1 if ends_with_eos else 0)
        if self.unforked:
            fields["unforked"] = tuple(self.unforked)
        return new_record(lane, **fields)

    def trunk_record(self) -> LaneRecord | None:
        """With the trunk's last output: the goals that did not fork, if any (one written after every branch lane
        had finished would reach the front end with no other record)."""
        return new_record(0, unforked=tuple(self.unforked)) if self.unforked else None
