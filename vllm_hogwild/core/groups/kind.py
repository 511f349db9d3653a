"""What differs between kinds of group, behind one interface. Pure, no vLLM import.

The group table (:mod:`vllm_hogwild.core.groups.table`) runs every group's life
the same way: arrival, admission, KV promises, preemption and replay, parking
and the end. What a kind of group decides for itself, it decides through a
:class:`GroupKind`, which the table calls and never branches around:

- :meth:`~GroupKind.who_sits_out`: which of its workers sit this engine step out;
- :meth:`~GroupKind.feed_ahead`: forced text its lanes feed whole in the coming step;
- :meth:`~GroupKind.step`: its part of the step's wire, once vLLM has scheduled;
- :meth:`~GroupKind.after_outputs`: what the step's sampled tokens change;
- :meth:`~GroupKind.finished`: a worker's request ended;
- :meth:`~GroupKind.record`: what the front end must learn of a worker (None: nothing).

A kind also says which requests it takes (:meth:`~GroupKind.takes`) and builds
their groups (:meth:`~GroupKind.new_group`). Two kinds exist: Hogwild groups
(:mod:`vllm_hogwild.core.groups.hogwild_kind`: N workers in lock-step, the raw and
collab protocols) and fork/join requests (:mod:`vllm_hogwild.core.groups.forkjoin_kind`:
a trunk and branch lanes that forks take); :mod:`vllm_hogwild.core.groups.all_kinds`
lists them and picks one for a request. A third kind is a new module with a
class of these methods, and a line in that list.

A kind never sees the table, and nothing in a step calls back into it: the table
calls the kind with the data it needs (the group, the step's
:class:`~vllm_hogwild.core.groups.group.StepInput`), the kind works on the group,
and returns what the table must record (a
:class:`~vllm_hogwild.core.groups.group.StepResult`; the lanes a fork took, from
:meth:`~GroupKind.after_outputs` and :meth:`~GroupKind.finished`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol

if TYPE_CHECKING:
    from vllm_hogwild.core.groups.group import Group, StepInput, StepResult, Worker
    from vllm_hogwild.core.forkjoin.lane_channel import LaneRecord
    from vllm_hogwild.core.options import RequestOptions, RequestSpec


class GroupKind(Protocol):
    records: bool  # whether :meth:`record` may return a record (the table asks only kinds that do)
    feeds_ahead: bool  # whether :meth:`feed_ahead` may return anything (the table asks only kinds that do)

    def takes(self, options: "RequestOptions") -> bool:
        """Whether requests with these options are groups of this kind."""

    def new_group(self, group_id: str, spec: "RequestSpec", max_tokens: int, prompt_len: int, arrival: float,
                  arrival_time: float, encode: Callable[[str], list[int]],
                  max_positions: int | None = None) -> "Group":
        """A group of this kind, no worker arrived yet (``arrival``: wall clock, fairness; ``arrival_time``:
        monotonic, metrics; ``encode``: text to token ids, for forced text; ``max_positions``: the context
        window)."""

    def who_sits_out(self, group: "Group", steps_of: Callable[["Worker"], int]) -> tuple[list[int], bool]:
        """The workers (indices) that sit this engine step out, and whether the group is settled: in step with
        itself, so that the table need not ask again until it falls out of step. ``steps_of(worker)``: the
        engine steps in which it accepted tokens."""

    def feed_ahead(self, group: "Group", runs: Callable[[Any], bool],
                    max_positions: int | None) -> list[tuple["Worker", int, list[int]]]:
        """Before vLLM schedules: forced tokens each lane feeds together in the coming step, beyond its one unfed
        token, as ``(worker, index of the first one among its output tokens, tokens)``; taken from the group's
        driver (the table gives back what vLLM did not feed). ``runs(request)``: vLLM runs it."""

    def step(self, group: "Group", step: "StepInput", sits_out: bool) -> "StepResult":
        """The group's part of the step (vLLM has scheduled; token counts are advanced): its lanes' lengths,
        its :class:`~vllm_hogwild.core.wire.GroupStep` and :class:`~vllm_hogwild.core.wire.GroupFork` (None:
        the worker processes need none), and whether it is steady or settled, for the table to record. Tokens
        the engine forces go into ``step.forced`` (request id -> token). ``sits_out``: a worker of the group
        sits this step out."""

    def after_outputs(self, group: "Group") -> list["Worker"]:
        """The step's sampled tokens are in, and the group's driver has read them
        (:meth:`~vllm_hogwild.core.groups.group.Group.accept_sampled`). Returns the spare lanes a fork took
        (they go to the engine's queue at the next admission)."""

    def finished(self, group: "Group", worker: "Worker") -> list["Worker"]:
        """``worker``'s request ended (its lane's length is final). Returns the spare lanes a fork took, as
        :meth:`after_outputs` does."""

    def record(self, worker: "Worker", finished: bool) -> "LaneRecord | None":
        """What the front end must learn of ``worker`` with its outputs (``finished``: with its last one), sent
        on the plugin's own field (:mod:`vllm_hogwild.core.forkjoin.lane_channel`); None: nothing beyond vLLM's own
        output."""
