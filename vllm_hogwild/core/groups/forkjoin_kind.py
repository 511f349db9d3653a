"""Fork/join requests as a kind of group: a trunk and branch lanes that forks take. Pure, no vLLM import.

The request's lanes are its workers: lane 0 the trunk, lanes 1..B a pool of spare lanes kept
out of the engine's queues until a fork takes them (``Group.spare``). The
protocol (:class:`~vllm_hogwild.core.forkjoin.families.ForkJoinLanes`, driven by
:class:`~vllm_hogwild.core.protocol.driver.ForkJoinDriver`) decides forks and joins from
the text. This kind's part of the group's life
(:class:`~vllm_hogwild.core.groups.kind.GroupKind`):

- **sit out**: the protocol's: a lane whose next token must wait for others (a
  join reads every branch to its end) sits the step out; never settled;
- **feed ahead**: a header's tokens after its first are fed in one step
  (:meth:`ForkJoinKind.feed_ahead`), as drafts are: co-workers read them
  from the next step on;
- **step**: the engine forces branch and join headers; when a fork starts or
  joins, the worker processes get the new fork state
  (:class:`~vllm_hogwild.core.wire.GroupFork`); every step that decodes is logged;
- **after outputs**: lanes the protocol is done with end next (a branch at its
  budget's last token, lanes no fork can take); the lanes a fork took are returned
  to the table, for the queue;
- **finished**: the trunk's end ends the request; a branch's end lets its join go on;
- **record**: a lane ≥ 1's part in the document (its branch, its fork point),
  for the front end, which assembles one completion from every lane.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from vllm_hogwild.core.protocol.driver import ForkJoinDriver
from vllm_hogwild.core.groups.group import Group, GroupCounters, StepInput, StepResult
from vllm_hogwild.core.replay.step_log import StepLog
from vllm_hogwild.core.wire import GroupFork

if TYPE_CHECKING:
    from vllm_hogwild.core.groups.group import Worker
    from vllm_hogwild.core.forkjoin.lane_channel import LaneRecord
    from vllm_hogwild.core.options import RequestOptions, RequestSpec


class ForkJoinKind:
    name = "fork/join"
    records = True  # each lane's part (trunk, branch) goes to the front end
    feeds_ahead = True  # a header's tokens after its first are fed in one step

    def takes(self, options: "RequestOptions") -> bool:
        return options.forks

    def new_group(self, group_id: str, spec: "RequestSpec", max_tokens: int, prompt_len: int, arrival: float,
                  arrival_time: float, encode: Callable[[str], list[int]],
                  max_positions: int | None = None) -> Group:
        n = spec.num_workers
        driver = ForkJoinDriver(spec.options, n, max_tokens, prompt_len, encode, spec.fork_now, spec.open_goal,
                                max_positions)
        return Group(group_id, spec, max_tokens, prompt_len, arrival, arrival_time, None, driver,
                     StepLog(n, prompt_len), self, workers=[None] * n, num_live=n, counters=GroupCounters(n),
                     spare=set(driver.lanes.pool))

    def who_sits_out(self, group: Group, steps_of: Callable[["Worker"], int]) -> tuple[list[int], bool]:
        ws = group.workers
        sitting_out = group.driver.lanes.who_sits_out([w.request.num_computed_tokens for w in ws],
                                       [w.request.num_output_tokens for w in ws],
                                       [not w.request.is_finished() for w in ws])
        return [i for i in sitting_out if i not in group.spare], False

    def feed_ahead(self, group: Group, runs: Callable[[Any], bool],
                    max_positions: int | None) -> list[tuple["Worker", int, list[int]]]:
        """The forced text each lane feeds whole in the coming step: ``(worker, index of its first output token,
        the tokens)`` each, taken from the lane's queue. A header's first token is sampled (forced) in the step
        that feeds the token before it, as any forced token; the rest of the header is taken here, by a lane
        that runs (``runs(request)``: vLLM's running state), does not sit out, and whose only unfed token is that
        forced one, up to its budget and the context window, never its end of sequence (vLLM must sample
        that, to stop the lane). O(lanes)."""
        driver, out, sitting_out = group.driver, [], None
        for w in group.workers:
            queue = driver.queues[w.index]
            if not queue or w.finished or w.index in group.spare:
                continue
            request = w.request
            n, num_tokens = request.num_output_tokens, request.num_tokens
            if (not n or n - 1 not in driver.forced_at[w.index] or request.num_computed_tokens != num_tokens - 1
                    or not runs(request)):
                continue
            limit = group.max_tokens - n - 2  # the lane still samples after them, and a branch ends at max - 1
            if max_positions is not None:
                limit = min(limit, max_positions - num_tokens - 1)
            if w.eos_token_id in queue:
                limit = min(limit, queue.index(w.eos_token_id))
            if limit <= 0:
                continue
            if sitting_out is None:
                sitting_out = set(self.who_sits_out(group, None)[0])
            if w.index not in sitting_out:
                out.append((w, n, driver.take(w.index, n, limit)))
        return out

    def step(self, group: Group, step: StepInput, sits_out: bool) -> StepResult:
        if group.driver.forces_tokens:
            group.force_tokens(step.scheduled, step.forced, step.drafts)
        lanes, fork = group.driver.lanes, None
        if lanes.version != group.fork_sent:  # a fork started or joined: the worker processes' views change
            fork = GroupFork(group.group_id, lanes.state)
            group.fork_sent = lanes.version
        group.count_prefill(step.scheduled)
        # (the decoding lanes change as forks start and join: every step is logged, none is lock-step)
        out = group.decode(step, fed_ahead=True)
        out.fork = fork
        return out

    def after_outputs(self, group: Group) -> list["Worker"]:
        driver, released = group.driver, []
        for w in group.workers[1:]:  # a branch at its budget's last token ends with its end of sequence: the
            # token before is fed (the join reads it), as after a branch end the model wrote
            if not w.finished and w.index not in group.spare and w.request.num_output_tokens == group.max_tokens - 1:
                driver.lanes.end_at_budget(w.index)
        driver.end_lanes([w.eos_token_id for w in group.workers])
        for lane in driver.lanes.take_released():
            if lane in group.spare:
                group.spare.discard(lane)
                released.append(group.workers[lane])
        return released

    def finished(self, group: Group, worker: "Worker") -> list["Worker"]:
        if worker.index == 0:
            group.driver.lanes.trunk_finished()
            return self.after_outputs(group)
        group.driver.lanes.stopped(worker.index, worker.lane_len)
        return []

    def record(self, worker: "Worker", finished: bool) -> "LaneRecord | None":
        lanes = worker.group.driver.lanes
        if worker.index == 0:
            return lanes.trunk_record() if finished else None
        if not finished:
            return lanes.record(worker.index)
        tokens = worker.request.output_token_ids
        eos = bool(tokens) and worker.eos_token_id is not None and tokens[-1] == worker.eos_token_id
        return lanes.record(worker.index, len(tokens), eos)


FORK_JOIN = ForkJoinKind()
