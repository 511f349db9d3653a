"""The Hogwild scheduler: vLLM's scheduler plus group admission, lock-step and shared-KV lifetime.

Selected by the switch (``additional_config={"hogwild": {...}}``); requests
without Hogwild options take vLLM's own code paths untouched.

A Hogwild request reaches the engine core as its ``n`` children, one by one.
The scheduler:

- **forms the group**: children are kept out of the waiting queue until all
  ``n`` have arrived;
- **admits it whole**: only when every member fits for its whole budget
  (``prompt + max_tokens`` slots each, the prompt's full blocks shared), and
  then allocates those slots up front, so a member never asks for a block
  later and so is never the request that triggers a preemption. Members are
  also kept at the head of the running list, which is the end vLLM never
  preempts from;
- **keeps lock-step**: a member that is ahead of its group (it finished its
  prefill while a sibling is still prefilling) is held back a step, so every
  worker feeds its k-th token in the same step;
- **keeps finished members' blocks** until the whole group ends (co-workers
  still read them);
- **ships the views**: after vLLM's own ``schedule()``, the segments every
  decoding member reads are attached to the ``SchedulerOutput`` as
  ``hogwild_segments`` (request id -> segments), which the runner hook hands
  to the attention backend in the worker process;
- **cuts steps** (``combined``, ``interleaved``): shows each member's newly
  sampled tokens, decoded, to the group's step tracker before building views;
- **places tokens** (``named`` and ``collab`` protocols): queues each step
  prefix as token ids and ships, per step, the token each such member must
  sample (``hogwild_forced``, applied by :mod:`vllm_hogwild.engine.forcing`); once a
  worker writes a match of ``answer_pattern``, every live member's next token
  is its end of sequence; when the budget runs out without one (``collab``),
  the finisher's suffix and greedy tokens go to one member and the others end;
- **reads section headers** (``collab``) from the tail of the group's prompt,
  where the front end put them (:mod:`vllm_hogwild.core.collab`);
- **reports**: groups running and waiting, and one record per ended group,
  ride on vLLM's own ``SchedulerStats`` to the front end, where
  :mod:`vllm_hogwild.serving.metrics` turns them into Prometheus series.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

from vllm.v1.core.sched.request_queue import create_request_queue
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request

from vllm_hogwild.core.admission import Decision, Fairness
from vllm_hogwild.core.group import Group, Lane, parse_member, prompt_separators, step_segments
from vllm_hogwild.serving.metrics import attach_snapshot
from vllm_hogwild.engine.runner_hook import FORCED_ATTR, SEGMENTS_ATTR
from vllm_hogwild.engine.forcing import ARGMAX
from vllm_hogwild.core.options import NAMED_PROTOCOLS, REQUEST_KEY, EngineOptions, RequestOptions, blocks_for_group
from vllm_hogwild.core.protocol import FINISHER_SUFFIX, RedundancyChecks, step_prefix
from vllm_hogwild.core.views import Separators

logger = logging.getLogger(__name__)


class HogwildScheduler(Scheduler):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hogwild_options = EngineOptions.from_additional_config(self.vllm_config.additional_config)
        self.fairness = Fairness(self.hogwild_options.max_plain_wait)
        self.groups: dict[str, Group] = {}  # by group id, in arrival order
        self.group_of: dict[str, Group] = {}  # member request id -> group
        self.gathering: dict[str, list[Request]] = {}  # group id -> members not yet queued
        self.parked: dict[str, Request] = {}  # finished members whose blocks co-workers still read
        self.stats = SchedulerStats()
        self._hogwild_tokenizer = None  # loaded for the first group that cuts its text into steps
        self._finisher_suffixes: dict[str, list[int]] = {}  # token ids of each task's finisher suffix
        self._allocate_slots = self.kv_cache_manager.allocate_slots
        self._allocate_sig = inspect.signature(self._allocate_slots)
        self.kv_cache_manager.allocate_slots = self._allocate_with_budget  # this instance only

    # -- arrival -------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        spec = _hogwild_spec(request)
        if spec is None:
            return super().add_request(request)
        num_workers, options, tail = spec
        group_id, index = parse_member(request.request_id, num_workers)
        group = self.groups.get(group_id)
        if group is None:
            prompt_end, separators = prompt_separators(tail) if tail else (None, Separators())
            group = Group(group_id, num_workers, options, request.max_tokens,
                          prompt_len=request.num_prompt_tokens, block_size=self.block_size,
                          arrival_time=time.monotonic(), prompt_end=prompt_end, separators=separators,
                          arrival=request.arrival_time)
            self.groups[group_id] = group
            self.gathering[group_id] = []
        group.member_ids[index] = request.request_id
        self.group_of[request.request_id] = group
        if options.protocol in NAMED_PROTOCOLS:
            self._place(group, index, step_prefix(index, 1, num_workers))
        super().add_request(request)
        # Held out of the waiting queue until the group is complete and fits.
        self.waiting.remove_request(request)
        self.gathering[group_id].append(request)

    def get_request_counts(self) -> tuple[int, int]:
        # Gathering members wait too: the engine must keep stepping for them.
        num_running, num_waiting = super().get_request_counts()
        return num_running, num_waiting + sum(len(m) for m in self.gathering.values())

    # -- one step ------------------------------------------------------------

    def schedule(self, *args: Any, **kwargs: Any):
        held_plain = self._admit_groups()
        held = self._lock_step_holds()
        if held:
            self.running = [r for r in self.running if r not in held]
        # Members first: vLLM preempts from the tail of `running`.
        self.running.sort(key=lambda r: r.request_id not in self.group_of)
        if held_plain:  # a group that has waited long enough keeps newer plain requests back
            waiting, self.waiting = self.waiting, create_request_queue(self.policy)
            for request in waiting:
                if request not in held_plain:
                    self.waiting.add_request(request)
        output = super().schedule(*args, **kwargs)
        if held_plain:
            for request in waiting:
                if request in held_plain:
                    self.waiting.add_request(request)
        if held:
            self.running = [*held, *self.running]
        for req_id in output.preempted_req_ids or ():
            if req_id in self.group_of:
                self.stats.num_member_preemptions += 1
                logger.error("Hogwild member %s was preempted; its group's views may diverge", req_id)
        self._count_prefill(output.num_scheduled_tokens)
        setattr(output, SEGMENTS_ATTR, self._step_segments(output.num_scheduled_tokens))
        setattr(output, FORCED_ATTR, self._forced_tokens(output.num_scheduled_tokens))
        return output

    def _place(self, group: Group, worker: int, text: str) -> None:
        """Queue ``text`` to be placed into ``worker``'s lane, one forced token per step."""
        group.placing[worker].extend(self._tokenizer().encode(text, add_special_tokens=False))

    def _forced_tokens(self, num_scheduled: dict[str, int]) -> dict[str, int]:
        """The token each member that samples this step must produce, where the engine places text.

        ``ARGMAX`` stands for "the model's most likely token" (the finisher's greedy tokens).
        """
        sampling = [r for r in num_scheduled if r in self.group_of
                    and self.requests[r].num_computed_tokens >= self.requests[r].num_tokens]
        for group in {self.group_of[r].group_id: self.group_of[r] for r in sampling}.values():
            if group.options.finisher and group.finisher is None and not group.answered:
                self._maybe_start_finisher(group)
        forced = {}
        for req_id in sampling:
            group = self.group_of[req_id]
            worker = group.index_of(req_id)
            queue = group.placing[worker]
            if queue:
                forced[req_id] = queue.popleft()
                group.placed[worker].add(self.requests[req_id].num_output_tokens)
        return forced

    def _maybe_start_finisher(self, group: Group) -> None:
        """When the budget's last tokens are reached without an answer, one worker asks for it.

        The lowest live worker gets the task's finisher suffix, then
        ``finisher`` greedy tokens, as its last ``len(suffix) + finisher``
        tokens (after a step prefix it is placing, if there is room for both);
        every other live worker ends now, so its rest joins the
        history and the finisher's view is the whole shared transcript. Budgets
        of at most twice that length have no finisher.
        """
        task = group.options.task
        if task not in self._finisher_suffixes:
            self._finisher_suffixes[task] = self._tokenizer().encode(FINISHER_SUFFIX[task], add_special_tokens=False)
        suffix = self._finisher_suffixes[task]
        reserve = len(suffix) + group.options.finisher
        members = [self.requests.get(m) or self.parked[m] for m in group.member_ids]
        live = [w for w, r in enumerate(members) if not r.is_finished()]
        if not live or group.max_tokens <= 2 * reserve:
            return
        first, queue = members[live[0]], group.placing[live[0]]
        room = first.max_tokens - first.num_output_tokens - len(queue)  # after a step prefix being placed
        if room > reserve:
            return
        group.finisher = live[0]
        if room <= len(suffix):
            queue.clear()  # no room for the prefix and the suffix: the prefix gives way
        queue.extend([*suffix, *[ARGMAX] * group.options.finisher])
        self._stop_group(group, members, keep=live[0])

    def _count_prefill(self, num_scheduled: dict[str, int]) -> None:
        for req_id, n in num_scheduled.items():
            group = self.group_of.get(req_id)
            if group is not None:
                request = self.requests[req_id]
                before = request.num_computed_tokens - n  # counts were advanced by schedule()
                prefill = max(0, min(n, request.num_prompt_tokens - before))
                group.num_prefill_tokens += prefill
                group.prefill_by_worker[group.index_of(req_id)] += prefill

    def _admit_groups(self) -> set[Request]:
        """Queue complete groups, oldest first, while they fit and fairness allows; return plain requests to hold back.

        See :mod:`vllm_hogwild.core.admission` for the fairness rule.
        """
        if not self.gathering:
            return set()
        now = time.time()  # vLLM's arrival times are wall-clock
        oldest_plain = next((r.arrival_time for r in self.waiting if r.request_id not in self.group_of), None)
        for group_id, members in list(self.gathering.items()):
            group = self.groups[group_id]
            if not group.is_complete:
                continue
            decision = self.fairness.decide(now, group.arrival, self._fits(group), oldest_plain)
            if decision is Decision.WAIT:
                return set()  # FCFS among groups: a later group does not overtake
            if decision is Decision.HOLD_NEWER:
                return {r for r in self.waiting if r.request_id not in self.group_of and r.arrival_time > group.arrival}
            del self.gathering[group_id]
            group.admitted_time = time.monotonic()
            members = [r for r in members if not r.is_finished()]
            members.sort(key=lambda r: group.index_of(r.request_id))
            for request in reversed(members):
                self.waiting.prepend_request(request)
        return set()

    def _fits(self, group: Group) -> bool:
        queued = [r for r in self.waiting if r.request_id in self.group_of]
        if len(self.running) + len(queued) + group.num_workers > self.max_num_active_reqs:
            return False
        bs = self.block_size
        # Queued members have not allocated their budget yet: count it as taken.
        promised = sum(-(-(r.num_prompt_tokens + r.max_tokens) // bs) for r in queued)
        need = blocks_for_group(group.prompt_len, group.max_tokens, group.num_workers, bs)
        free = self.kv_cache_manager.block_pool.get_num_free_blocks()
        return need + promised + self.kv_cache_manager.watermark_blocks <= free

    def _lock_step_holds(self) -> list[Request]:
        """Running members ahead of their group's slowest live member."""
        held = []
        by_group: dict[str, list[Request]] = {}
        for r in self.running:
            group = self.group_of.get(r.request_id)
            if group is not None:
                by_group.setdefault(group.group_id, []).append(r)
        for group_id, running in by_group.items():
            group = self.groups[group_id]
            live = [self.requests[m] for m in group.member_ids
                    if m in self.requests and not self.requests[m].is_finished()]
            slowest = min(r.num_output_tokens for r in live)
            held += [r for r in running if r.num_output_tokens > slowest]
        return held

    def _step_segments(self, num_scheduled: dict[str, int]) -> dict[str, tuple]:
        out: dict[str, tuple] = {}
        groups = {self.group_of[r].group_id: self.group_of[r] for r in num_scheduled if r in self.group_of}
        for group in groups.values():
            members = [self.requests.get(m) or self.parked[m] for m in group.member_ids]
            if group.observes_text:
                for w, request in enumerate(members):
                    self._observe_sampled(group, w, request)
                if group.answered:
                    self._stop_group(group, members)
            if any(r.num_computed_tokens < group.prompt_len for r in members):
                continue  # someone still prefills: every decode row reads the prompt alone
            decoding = [
                w for w, r in enumerate(members)
                if num_scheduled.get(r.request_id, 0)
                and r.num_computed_tokens - num_scheduled[r.request_id] >= r.num_prompt_tokens
            ]
            if not decoding:
                continue  # prefill steps read the prompt alone: plain attention
            lanes = self._lanes(group)
            for w, segments in step_segments(group, lanes, decoding).items():
                out[group.member_ids[w]] = segments
        return out

    def _observe_sampled(self, group: Group, worker: int, request: Request) -> None:
        """Decode the tokens ``worker`` sampled since last time: steps, prefixes, answers."""
        tokens = request.output_token_ids
        matchers = group.answer_matchers
        for i in range(group.num_observed[worker], len(tokens)):
            text = self._tokenizer().decode([tokens[i]])
            placed = i in group.placed[worker]
            ended = group.steps is not None and group.steps.on_sampled(
                worker, group.prompt_len + i, text, can_end=not placed)
            if ended and group.options.protocol in NAMED_PROTOCOLS and group.finisher is None:
                group.num_steps[worker] += 1
                # The group's tokens seen so far: the others' as last observed, this worker's up to i.
                seen = sum(group.num_observed) - group.num_observed[worker] + i + 1
                check = RedundancyChecks(group.options.redundancy_every).due(group.checked_at[worker], seen)
                if check:
                    group.checked_at[worker] = seen
                self._place(group, worker, step_prefix(worker, group.num_steps[worker], group.num_workers, check))
            if matchers is not None and matchers[worker].feed(text):
                group.answered = True
        group.num_observed[worker] = len(tokens)

    def _stop_group(self, group: Group, members: list[Request], keep: int | None = None) -> None:
        """A worker wrote the answer: every live member (but ``keep``) samples its end of sequence next."""
        for w, request in enumerate(members):
            eos = request.sampling_params.eos_token_id
            if w != keep and not request.is_finished() and eos is not None and list(group.placing[w]) != [eos]:
                group.placing[w].clear()
                group.placing[w].append(eos)

    def _tokenizer(self):
        if self._hogwild_tokenizer is None:
            from vllm.tokenizers import cached_tokenizer_from_config

            self._hogwild_tokenizer = cached_tokenizer_from_config(model_config=self.vllm_config.model_config)
        return self._hogwild_tokenizer

    def _lanes(self, group: Group) -> list[Lane]:
        lanes = []
        for member_id in group.member_ids:
            request = self.requests.get(member_id) or self.parked[member_id]
            lanes.append(Lane(tuple(self.kv_cache_manager.get_block_ids(member_id)[0]), request.num_computed_tokens))
        return lanes

    # -- budget and lifetime -------------------------------------------------

    def _allocate_with_budget(self, request: Request, *args: Any, **kwargs: Any):
        """vLLM's ``allocate_slots``; a member's first call takes its whole budget."""
        if request.request_id not in self.group_of:
            return self._allocate_slots(request, *args, **kwargs)
        bound = self._allocate_sig.bind(request, *args, **kwargs)
        a = bound.arguments
        have = (request.num_computed_tokens + a.get("num_new_computed_tokens", 0)
                + a.get("num_external_computed_tokens", 0) + a["num_new_tokens"])
        budget = request.num_prompt_tokens + request.max_tokens
        a["num_lookahead_tokens"] = max(a.get("num_lookahead_tokens", 0), budget - have)
        return self._allocate_slots(*bound.args, **bound.kwargs)

    def _free_blocks(self, request: Request) -> None:
        group = self.group_of.get(request.request_id)
        if group is None:
            return super()._free_blocks(request)
        worker = group.index_of(request.request_id)
        group.finished.add(worker)
        if group.observes_text:
            self._observe_sampled(group, worker, request)
        if group.steps is not None:
            group.steps.stop(worker, request.num_computed_tokens)
        if not group.is_done:
            # Co-workers still read this lane: keep its blocks, drop the request.
            self.parked[request.request_id] = request
            del self.requests[request.request_id]
            return
        if group.steps is not None:
            group.steps.join([lane.num_tokens for lane in self._lanes(group)])  # the last rests, for the record
        self.stats.record_group_end(group, self._lanes(group), [
            (self.requests.get(m) or self.parked[m]).num_output_tokens for m in group.member_ids
        ])
        for member_id in group.member_ids:
            parked = self.parked.pop(member_id, None)
            if parked is not None:
                self._free_request_blocks(parked)
            del self.group_of[member_id]
        self.groups.pop(group.group_id, None)
        self.gathering.pop(group.group_id, None)
        super()._free_blocks(request)

    # -- stats ---------------------------------------------------------------

    def make_stats(self, *args: Any, **kwargs: Any):
        stats = super().make_stats(*args, **kwargs)
        if stats is not None:  # vLLM's log_stats is on (the server's default)
            running = sum(1 for g in self.groups.values() if g.group_id not in self.gathering)
            free = self.kv_cache_manager.block_pool.get_num_free_blocks()
            attach_snapshot(stats, self.stats.snapshot(running, len(self.gathering), free))
        return stats


@dataclass
class GroupEnd:
    num_workers: int
    prompt_len: int
    lane_lens: list[int]
    num_blocks_held: int  # distinct blocks holding the group's tokens at its end
    num_prefill_tokens: int  # prompt tokens computed for the group (prefix-cache hits excluded)
    num_prefill_saved: int  # prompt tokens computed once for the group instead of once per worker
    output_lens: list[int]  # tokens each worker generated
    coworker_reads: list[int]  # co-worker tokens each worker attended, summed over its steps
    admission_wait_s: float | None  # first member's arrival to the group's admission (None: never admitted)
    latency_s: float  # first member's arrival to the group's end
    history: list[tuple[int, int, int]] = field(default_factory=list)  # (lane, start, end) of steps, as joined
    finisher: int | None = None  # the worker the finisher ran on


@dataclass
class SchedulerStats:
    num_member_preemptions: int = 0
    ended: deque = field(default_factory=lambda: deque(maxlen=1024))  # GroupEnd, newest last
    _unreported: list = field(default_factory=list)  # GroupEnd not yet in a snapshot

    def record_group_end(self, group: Group, lanes: list[Lane], output_lens: list[int]) -> None:
        used: set[int] = set()
        for lane in lanes:
            used.update(lane.block_ids[: -(-lane.num_tokens // group.block_size)])
        now = time.monotonic()
        end = GroupEnd(
            group.num_workers, group.prompt_len, [l.num_tokens for l in lanes], len(used),
            group.num_prefill_tokens, group.num_prefill_saved, output_lens, list(group.coworker_reads),
            admission_wait_s=(group.admitted_time - group.arrival_time) if group.admitted_time else None,
            latency_s=now - group.arrival_time,
            history=[(s.lane, s.start, s.end) for s in (group.steps.history if group.steps else ())],
            finisher=group.finisher,
        )
        self.ended.append(end)
        self._unreported.append(end)
        del self._unreported[:-1024]

    def snapshot(self, groups_running: int, groups_waiting: int, free_blocks: int) -> dict[str, Any]:
        """What the front end's metrics need since the last snapshot (plain types: it crosses processes)."""
        ended, self._unreported = self._unreported, []
        return {
            "groups_running": groups_running,
            "groups_waiting": groups_waiting,
            "kv_free_blocks": free_blocks,
            "member_preemptions": self.num_member_preemptions,
            "ended": [asdict(e) for e in ended],
        }


def _hogwild_spec(request: Request) -> tuple[int, RequestOptions, dict | None] | None:
    """``(num_workers, options, prompt tail)`` stamped on the request by the front end, or ``None``."""
    params = request.sampling_params
    extra = (params.extra_args or {}) if params is not None else {}
    spec = extra.get(REQUEST_KEY)
    if not isinstance(spec, dict) or "num_workers" not in spec:
        return None
    options = RequestOptions(**{k: v for k, v in spec.items() if k not in ("num_workers", "prompt_tail")})
    return int(spec["num_workers"]), options, spec.get("prompt_tail")
