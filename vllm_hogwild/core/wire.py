"""What crosses from the engine core to the worker processes each engine step: one neutral module. Pure, no vLLM import.

The scheduler (engine core) attaches one :class:`StepWire` to vLLM's
``SchedulerOutput`` as :data:`STEP_ATTR`; vLLM's executor sends that object to
every worker (every tensor-parallel rank, Ray actors included), pickled; the
model runner's adapter in each worker applies it. Neither side imports the other.

The worker processes keep no lane length of their own: every engine step, each
group with a decoding row in it gets its lanes' lengths on the wire (what
co-workers may read: accepted tokens whose K/V is written once the step's
writes land), columnar (:attr:`StepWire.length_groups`, one flat
:attr:`StepWire.lane_lens`), the scheduler's own counts; a group decoding in
lock-step costs its N lengths. Besides: a group's :class:`GroupShape` (its
lanes' requests and block tables, its layout, its prompt and section headers)
travels once, in the first step that schedules any of its workers, and again
when a preempted group resumes; a :class:`GroupStep` only for a step in which
paragraphs joined the shared history, or in which lanes feed drafts; the
tokens forced this step, the positions a resumed group re-feeds
(:class:`GroupReplay`, with the lane lengths of the past steps it re-feeds),
a fork/join group's fork at the fork and at the join (:class:`GroupFork`), and
the groups that ended. Block tables after the shape are the runner's own lists.

Two things the worker processes keep advance only from the wire, as deltas
applied in order: a group's shared history of joined paragraphs (each
:attr:`GroupStep.joined`) and a fork/join group's forks (each
:class:`GroupFork` replaces the last).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

STEP_ATTR = "hogwild_step"  # the SchedulerOutput attribute
ARGMAX = -1  # a forced "token": the row's most likely token (greedy, whatever the sampling parameters)
# Back from the runner: fed-ahead tokens' log-probabilities ride in the step's prompt-logprobs dict (log-probabilities
# of fed tokens) under this prefix and the request id; the scheduler takes them out before vLLM reads the dict.
FED_AHEAD_LOGPROBS = "hogwild-fed-ahead:"


@dataclass(frozen=True)
class GroupShape:
    """What does not change while a group decodes: sent once, and again when it resumes after a preemption."""

    group_id: str
    request_ids: tuple[str, ...]  # request id of each worker, in worker order
    layout: str
    prompt_len: int  # tokens every lane starts with
    prompt_end: int  # the prompt part of every view ends here (before the collab section headers)
    # (start, end) of the section headers in lane 0's prompt: history, others, pivot, own (None: absent)
    separators: tuple[tuple[int, int] | None, ...]
    block_ids: tuple[tuple[int, ...], ...]  # each lane's physical KV blocks from position 0, as allocated so far


@dataclass(frozen=True)
class GroupStep:
    """What the worker processes need of a group's engine step besides its lanes' lengths.

    Sent only for a step in which paragraphs joined the history, or in which lanes feed drafts
    (speculative decoding); a group's lengths travel in :attr:`StepWire.lane_lens` every step it decodes.
    """

    group_id: str
    joined: tuple[tuple[int, int, int], ...] = ()  # (lane, start, end): paragraphs that joined the history, in order
    # speculative decoding: draft tokens each lane feeds this step after its length (empty: none). Only
    # the lane's own rows read them (causally); they are not accepted yet.
    drafts: tuple[int, ...] = ()


@dataclass(frozen=True)
class ReplayStep:
    """A past step of a group, as a re-fed token's view needs it (see :mod:`vllm_hogwild.core.replay.step_log`)."""

    lane_lens: tuple[int, ...]  # what each lane's co-workers read then
    num_history: int  # paragraphs in the shared history after that step's joins
    paragraph_starts: tuple[int, ...]  # where each lane's part outside the history started then


@dataclass(frozen=True)
class GroupReplay:
    """The positions each lane of a resumed group re-feeds this step, and the past steps they were fed at."""

    group_id: str
    steps: tuple[ReplayStep, ...]
    # (lane, runs): each run (start, end, index into ``steps``, or -1: prompt positions, plain prefill)
    lanes: tuple[tuple[int, tuple[tuple[int, int, int], ...]], ...]


@dataclass(frozen=True)
class GroupFork:
    """A fork/join group's forks as its lanes' views need them: sent when a fork starts and when one joins."""

    group_id: str
    state: Any  # core.views.forks.ForkState: every fork so far (parent, point, branch lanes, ends once joined)


def lengths_array(values: Sequence[int] = ()) -> array:
    """A flat array of lane lengths, as :attr:`StepWire.lane_lens` holds them."""
    return array("i", values)


@dataclass
class LaneLengths:
    """The step's lane lengths as the scheduler gathers them: :class:`StepWire`'s two columns. The steady groups'
    come first, as one block (:meth:`add_block`); then group after group (plain lists while it gathers: the
    cheapest to grow; one array on the wire)."""

    groups: list[str] = field(default_factory=list)
    lens: list[int] = field(default_factory=list)
    block: array = field(default_factory=lengths_array)  # the lengths of the groups added by add_block

    def add_block(self, group_ids: Sequence[str], lens: Any) -> None:
        """Many groups' lengths at once, before any :meth:`add` (``lens``: a C-contiguous int32 buffer)."""
        self.groups += group_ids
        self.block.frombytes(memoryview(lens).cast("B"))

    def add(self, group_id: str, lens: list[int]) -> None:
        self.groups.append(group_id)
        self.lens += lens

    def columns(self) -> tuple[tuple[str, ...], array]:
        """:attr:`StepWire.length_groups` and :attr:`StepWire.lane_lens`, once: the block is extended in place."""
        flat = self.block
        flat.extend(self.lens)
        return tuple(self.groups), flat


@dataclass(frozen=True)
class StepWire:
    shapes: tuple[GroupShape, ...] = ()
    steps: tuple[GroupStep, ...] = ()  # groups with joins or drafts this step
    # Every group with a decoding row this step, and its lanes' lengths: ``lane_lens`` holds them group after
    # group, in this order, each group's lanes in lane order (its shape says how many).
    length_groups: tuple[str, ...] = ()
    lane_lens: array = field(default_factory=lengths_array)
    ended: tuple[str, ...] = ()
    forced: Mapping[str, int] = field(default_factory=dict)  # request id -> the token it must sample (or ARGMAX)
    replays: tuple[GroupReplay, ...] = ()
    forks: tuple[GroupFork, ...] = ()
    # request id -> (index of the first among its output tokens, tokens): forced text the engine appended to the
    # request for this step to feed (fork/join headers after their first token); the runner has not seen them
    fed_ahead: Mapping[str, tuple[int, tuple[int, ...]]] = field(default_factory=dict)
    # request id -> (tokens computed, tokens, tokens dropped): lengths the scheduler set since the last step,
    # past what vLLM's own rejections did: an accepted run cut where the engine must force the next token (its
    # last tokens dropped, as rejected drafts are), a resumed group's lanes rolled back to re-feed (nothing
    # dropped). A runner that keeps each request's lengths itself (Model Runner V2) rewinds them.
    rewound: Mapping[str, tuple[int, int, int]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.shapes or self.length_groups or self.steps or self.ended or self.forced or self.replays
                    or self.forks or self.fed_ahead or self.rewound)

    def lengths(self, num_lanes: Callable[[str], int]) -> Iterator[tuple[str, array]]:
        """``(group id, its lanes' lengths)`` for each group in :attr:`length_groups`; ``num_lanes(group_id)``:
        the group's lane count (its shape's)."""
        at = 0
        for group_id in self.length_groups:
            n = num_lanes(group_id)
            yield group_id, self.lane_lens[at: at + n]
            at += n
        if at != len(self.lane_lens):
            raise ValueError(f"the wire's {len(self.lane_lens)} lane lengths do not match its groups' {at} lanes")
