"""Hogwild groups: N workers in lock-step over one shared cache (the raw and collab protocols). Pure, no vLLM.

This kind's part of a group's life (:class:`~vllm_hogwild.core.groups.kind.GroupKind`):

- **sit out**: a worker ahead of the group's slowest live worker sits a step out
  (workers finish their prefill in different steps, and vLLM's token budget may
  leave one out of a step); a prefilled group whose live workers are even is
  settled, and stays so while all are scheduled (a group whose workers all
  sample their first token in one step is settled then, and one never
  scheduled has nothing to sit out);
- **step**: the engine forces the protocol's text (prefixes, answers, the
  finisher); nothing decodes until every worker has the prompt (a worker that
  has it sits out until then); a group in lock-step (the same workers,
  one token more each, no paragraph to join) costs one counter in its log
  (:meth:`~vllm_hogwild.core.groups.group.Group.lock_step`), and one that
  reads and forces no text (the raw protocol) is steady: the table advances it
  with the others, without asking this kind, until it falls out of step (from
  its second decoding step when every live worker decodes in its first); any other step
  is logged (:meth:`~vllm_hogwild.core.groups.group.Group.decode`); either way the
  lanes' lengths go to the worker processes, which keep none. The kind returns
  all of it to the table (:class:`~vllm_hogwild.core.groups.group.StepResult`)
  and never calls the table;
- **after outputs**, **finished**: nothing beyond what every group does;
- **record**: none, vLLM's outputs carry all a worker's client needs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from vllm_hogwild.core.groups.policy import ahead_of_group
from vllm_hogwild.core.protocol.driver import ProtocolDriver
from vllm_hogwild.core.groups.group import Group, GroupCounters, StepInput, StepResult
from vllm_hogwild.core.options import HISTORY_LAYOUTS
from vllm_hogwild.core.protocol.paragraphs import PARAGRAPH_END, ParagraphTracker
from vllm_hogwild.core.replay.step_log import StepLog

if TYPE_CHECKING:
    from vllm_hogwild.core.groups.group import Worker
    from vllm_hogwild.core.forkjoin.lane_channel import LaneRecord
    from vllm_hogwild.core.options import RequestOptions, RequestSpec


class HogwildKind:
    name = "hogwild"
    records = False  # vLLM's outputs carry all a worker's client needs
    feeds_ahead = False  # paragraph prefixes are forced one token a step: the lock-step views read them so

    def takes(self, options: "RequestOptions") -> bool:
        return not options.forks

    def new_group(self, group_id: str, spec: "RequestSpec", max_tokens: int, prompt_len: int, arrival: float,
                  arrival_time: float, encode: Callable[[str], list[int]],
                  max_positions: int | None = None) -> Group:
        n, options = spec.num_workers, spec.options
        tracker = (ParagraphTracker(n, prompt_len, options.step_end or PARAGRAPH_END)
                   if options.layout in HISTORY_LAYOUTS else None)
        driver = ProtocolDriver(options, n, max_tokens, prompt_len, tracker, encode)
        return Group(group_id, spec, max_tokens, prompt_len, arrival, arrival_time, tracker, driver,
                     StepLog(n, prompt_len), self, workers=[None] * n, num_live=n, counters=GroupCounters(n))

    def who_sits_out(self, group: Group, steps_of: Callable[["Worker"], int]) -> tuple[list[int], bool]:
        if not group.shape_sent and not group.counters.num_preemptions:
            return [], False  # no worker of it was ever scheduled: none has sampled, none is ahead
        ahead = ahead_of_group([None if w.request.is_finished() else steps_of(w) for w in group.workers])
        group.in_step = group.prefilled and not ahead
        return ahead, group.in_step

    def feed_ahead(self, group: Group, runs, max_positions):
        return []

    def step(self, group: Group, step: StepInput, sits_out: bool) -> StepResult:
        if group.driver.forces_tokens:  # a worker's first sample may be forced too: before the prefill check
            group.force_tokens(step.scheduled, step.forced, step.drafts)
        if not group.prefilled:
            prefilled, sample_together = group.count_prefill(step.scheduled)
            if not prefilled:
                return StepResult()  # someone still prefills: no row decodes (a worker with the prompt sits out)
            group.prefilled = True
            if sample_together and not step.speculative:
                # Every row prefills (none decodes) and each worker samples its first token now, together: the
                # group is even from the next step on, without asking :meth:`who_sits_out`.
                group.in_step = True
                return StepResult(settled=True)
        # A group that reads no text and forces none is steady while in lock-step: the table advances it with
        # the others until it falls out of step.
        steady = not (group.driver.forces_tokens or group.driver.observes_text)
        if in_lock_step(group, step, sits_out):
            # The same workers, one token more each: a counter, and the lanes' lengths.
            return StepResult(lane_lens=group.lock_step(), steady=steady)
        out = group.decode(step)
        if steady and out.wire is None and in_lock_step(group, step, sits_out):
            out.steady = True  # this step's run has every live worker: in lock-step from the next on
        return out

    def after_outputs(self, group: Group) -> list["Worker"]:
        return []

    def finished(self, group: Group, worker: "Worker") -> list["Worker"]:
        return []

    def record(self, worker: "Worker", finished: bool) -> "LaneRecord | None":
        return None


HOGWILD = HogwildKind()


def in_lock_step(group: Group, step: StepInput, sits_out: bool) -> bool:
    """Whether the group's next step is its log's last run going on: that run's decoding workers are the live
    ones (as many, none of them finished since: a worker that stopped and one that sat out may leave the count
    equal), every request was scheduled in this step, none of the group's sitting out (``sits_out``), no paragraph
    pending."""
    log = group.log
    return (step.all_scheduled and not step.speculative and not sits_out and bool(log.runs)
            and len(log.runs[-1].decoding) == group.num_live
            and not any(group.workers[w].finished for w in log.runs[-1].decoding)
            and not (group.tracker is not None and group.tracker.pending))
