"""What crosses from the engine core to the worker processes each engine step: one neutral module. Pure, no vLLM import.

The scheduler (engine core) attaches one :class:`StepWire` to vLLM's
``SchedulerOutput`` as :data:`STEP_ATTR`; vLLM's executor sends that object to
every worker (every tensor-parallel rank, Ray actors included), pickled; the
runner hook in each worker applies it. Neither side imports the other.

The wire carries only what the worker processes cannot read from vLLM's own
``SchedulerOutput``: a group's :class:`GroupShape` (its lanes' requests and
block tables, its layout, its prompt and section headers) travels once, in the
first step that schedules any of its workers, and again when a preempted group
resumes; a :class:`GroupStep` only for a step in which paragraphs joined the
shared history, or with speculative decoding. A group decoding in lock-step
costs nothing on the wire: each worker process follows its lanes' lengths and
blocks from the batch itself. Also: the tokens forced this step, the positions
a resumed group re-feeds (:class:`GroupReplay`), a fork/join group's fork at
the fork and at the join (:class:`GroupFork`), and the groups that ended.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

STEP_ATTR = "hogwild_step"  # the SchedulerOutput attribute
ARGMAX = -1  # a forced "token": the row's most likely token (greedy, whatever the sampling parameters)


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
    """What the worker processes cannot know of a group's engine step from vLLM's own counts.

    Sent only for a step in which paragraphs joined the history, or with speculative decoding
    (how many drafts each lane accepted is the scheduler's). Otherwise the worker processes
    follow each lane from the batch: a scheduled lane's length is its computed tokens plus its
    scheduled ones, less its drafts; a lane that is not scheduled keeps its length.
    """

    group_id: str
    # tokens of each lane that co-workers may read this step: its accepted tokens whose K/V is written
    # once this step's writes land (never this step's drafts)
    lane_lens: tuple[int, ...]
    joined: tuple[tuple[int, int, int], ...] = ()  # (lane, start, end): paragraphs that joined the history, in order
    # speculative decoding: draft tokens each lane feeds this step after ``lane_lens`` (empty: none). Only
    # the lane's own rows read them (causally); they are not accepted yet.
    drafts: tuple[int, ...] = ()


@dataclass(frozen=True)
class ReplayStep:
    """A past step of a group, as a re-fed token's view needs it (see :mod:`vllm_hogwild.core.replay`)."""

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
    state: Any  # core.fork_views.ForkState: every fork so far (parent, point, branch lanes, ends once joined)


@dataclass(frozen=True)
class StepWire:
    shapes: tuple[GroupShape, ...] = ()
    steps: tuple[GroupStep, ...] = ()
    ended: tuple[str, ...] = ()
    forced: Mapping[str, int] = field(default_factory=dict)  # request id -> the token it must sample (or ARGMAX)
    replays: tuple[GroupReplay, ...] = ()
    forks: tuple[GroupFork, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.shapes or self.steps or self.ended or self.forced or self.replays or self.forks)
