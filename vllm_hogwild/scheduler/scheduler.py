"""The Hogwild scheduler: vLLM's scheduler, and the glue that lets the pure core drive Hogwild groups.

Selected by the switch (``additional_config={"hogwild": {...}}``); requests
without Hogwild options take vLLM's own code paths untouched. What is decided
where:

- **admission and lock-step** (:mod:`vllm_hogwild.core.admission`): children
  of a Hogwild request are held out of the waiting queue until all ``n`` have
  arrived; a complete group is queued whole, in arrival order with a bounded
  overtake of plain requests, only when every member fits for its whole
  budget; a member's first allocation takes that budget (so a member never
  asks for a block later and never triggers a preemption; members also sit at
  the head of ``running``, which vLLM never preempts from); a member ahead of
  its group sits out a step;
- **protocol driving** (:mod:`vllm_hogwild.core.driver`): the tokens placed
  into lanes (step prefixes, the finisher), answers, the group's stop;
- **views** (:mod:`vllm_hogwild.core.group`, the wire of
  :mod:`vllm_hogwild.core.wire`): per step, each group's lane lengths,
  decoding members and the steps that joined the shared history; a group's
  block tables once. The workers build the views and segments.

Here: reading vLLM's requests and KV cache for the core, detokenizing each
sampled token incrementally (:mod:`vllm_hogwild.scheduler.detok`), keeping a
finished member's blocks until its group ends, and sending the metrics on the
plugin's own channel (:mod:`vllm_hogwild.core.stats_channel`). Per step and
group the work is O(members + new tokens), never O(view length).
"""

from __future__ import annotations

import inspect
import time
from typing import Any

from vllm.v1.core.sched.request_queue import create_request_queue
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request, RequestStatus

from vllm_hogwild.core.admission import Decision, Fairness, ahead_of_group, fits
from vllm_hogwild.core.group import Group, parse_member
from vllm_hogwild.core.options import EngineOptions, blocks_for_group, runtime_of, spec_of, spec_slack
from vllm_hogwild.core.stats import GroupEnd, HogwildStats
from vllm_hogwild.core.wire import STEP_ATTR, StepWire
from vllm_hogwild.scheduler.detok import TextStream
from vllm_hogwild.core.stats_channel import StatsSender
from vllm_hogwild.core.log import get_logger

logger = get_logger(__name__)


class HogwildScheduler(Scheduler):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hogwild_options = EngineOptions.from_additional_config(self.vllm_config.additional_config)
        self.fairness = Fairness(self.hogwild_options.max_plain_wait)
        self.groups: dict[str, Group] = {}  # by group id, in arrival order
        self.group_of: dict[str, Group] = {}  # member request id -> group
        self.gathering: dict[str, list[Request]] = {}  # group id -> members not yet queued
        self.parked: dict[str, Request] = {}  # finished members whose blocks co-workers still read
        self._members: dict[str, list[Request]] = {}  # group id -> its members' requests, in worker order
        self.stats = HogwildStats()
        self._texts: dict[str, TextStream] = {}  # member id -> its incremental detokenizer
        self._ended: list[str] = []  # groups whose shape the workers hold, ended since the last wire
        self._hogwild_tokenizer = None
        self._unbudgeted: set[str] = set()  # members queued whose first allocation (their whole budget) is to come
        self._allocate_slots = self.kv_cache_manager.allocate_slots  # what the wrapper calls while installed
        self._allocate_sig = inspect.signature(self._allocate_slots)
        self._allocate_wrapped = False
        self._slack = spec_slack(self.vllm_config)  # speculative decoding: slots past a lane's budget
        address = runtime_of(self.vllm_config.additional_config).get("stats")
        self._stats_sender = StatsSender(address, self.vllm_config.parallel_config.data_parallel_rank) \
            if address and self.log_stats else None

    # -- arrival -------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        spec = spec_of(request.sampling_params.extra_args if request.sampling_params else None)
        if spec is None:
            return super().add_request(request)
        group_id, index = parse_member(request.request_id, spec.num_workers)
        group = self.groups.get(group_id)
        if group is None:
            group = Group.create(group_id, spec, request.max_tokens, request.num_prompt_tokens,
                                 arrival=request.arrival_time, arrival_time=time.monotonic(), encode=self._encode)
            self.groups[group_id] = group
            self.gathering[group_id] = []
        group.member_ids[index] = request.request_id
        self._members.setdefault(group_id, [None] * spec.num_workers)[index] = request
        self.group_of[request.request_id] = group
        if group.driver.observes_text:
            self._texts[request.request_id] = TextStream(self._tokenizer(), request)
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
        self._wrap_allocate(bool(self._unbudgeted))
        if self.num_spec_tokens:
            self._drop_drafts_where_text_is_placed()
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
                self._unbudgeted.add(req_id)  # its blocks were freed: it allocates again
                self.stats.num_member_preemptions += 1
                logger.error("Hogwild member %s was preempted; its group's views may diverge", req_id)
        setattr(output, STEP_ATTR, self._wire(output))
        return output

    def _wire(self, output) -> StepWire:
        """This step's wire: new shapes, each group's step, forced tokens, ended groups. O(N) per group."""
        scheduled = output.num_scheduled_tokens
        drafts = output.scheduled_spec_decode_tokens
        shapes, steps, forced = [], [], {}
        seen: set[str] = set()
        for req_id in scheduled:
            group = self.group_of.get(req_id)
            if group is None or group.group_id in seen:
                continue
            seen.add(group.group_id)
            members = self._members[group.group_id]
            if group.driver.places_tokens:  # a member's first sample may be placed too: before the prefill check
                self._place_tokens(group, members, scheduled, forced, drafts)
            if not group.prefilled:
                self._count_prefill(group, members, scheduled)
                if any(r.num_computed_tokens < group.prompt_len for r in members):
                    continue  # someone still prefills: every decode row reads the prompt alone
                group.prefilled = True
            decoding = [w for w, r in enumerate(members) if (n := scheduled.get(r.request_id))
                        and r.num_computed_tokens - n >= r.num_prompt_tokens]  # a prefill chunk's row reads its lane
            if group.in_step and len(decoding) < len(members) - len(group.finished):
                group.in_step = False  # a live member sat this step out: it is behind now
            if not decoding:
                continue  # prefill rows read their own lane: plain attention
            if not group.shape_sent:
                shapes.append(group.shape([self.kv_cache_manager.get_block_ids(m)[0] for m in group.member_ids]))
                group.shape_sent = True
            if drafts:  # co-workers read accepted tokens only: a lane's drafts are its own rows' alone
                num_drafts = [len(drafts.get(r.request_id, ())) for r in members]
                steps.append(group.step([r.num_computed_tokens - d for r, d in zip(members, num_drafts)],
                                        decoding, num_drafts))
            else:
                steps.append(group.step([r.num_computed_tokens for r in members], decoding))
        ended = ()
        if self._ended and output.total_num_scheduled_tokens:  # a step without tokens never reaches the workers
            ended, self._ended = tuple(self._ended), []
        return StepWire(tuple(shapes), tuple(steps), ended, forced)

    def _place_tokens(self, group: Group, members: list[Request], scheduled: dict[str, int],
                      forced: dict[str, int], drafts: dict[str, Any]) -> None:
        """The token each member that samples this step must produce, where the protocol places text.

        A member verifying drafts this step (its queue filled after scheduling: the finisher started)
        gets its token next step: a forced token applies to a request's bonus row only. Its accepted
        run is then cut after its first token (:meth:`_update_request_with_output`).
        """
        driver = group.driver
        finisher = driver.maybe_start_finisher([None if r.is_finished() else r.num_output_tokens for r in members])
        if finisher is not None:  # everyone else ends now: its rest joins the history the finisher reads
            self._stop(group, members, keep=finisher)
        for w, r in enumerate(members):
            if (r.request_id in scheduled and r.num_computed_tokens >= r.num_tokens  # it samples this step
                    and not drafts.get(r.request_id)):
                token = driver.forced(w, r.num_output_tokens)
                if token is not None:
                    forced[r.request_id] = token

    def _stop(self, group: Group, members: list[Request], keep: int | None = None) -> None:
        live = [w for w, r in enumerate(members) if not r.is_finished()]
        group.driver.stop(live, [r.sampling_params.eos_token_id for r in members], keep=keep)

    def _count_prefill(self, group: Group, members: list[Request], scheduled: dict[str, int]) -> None:
        for w, request in enumerate(members):
            n = scheduled.get(request.request_id, 0)
            if n:
                before = request.num_computed_tokens - n  # counts were advanced by schedule()
                group.counters.prefill_by_worker[w] += max(0, min(n, request.num_prompt_tokens - before))

    # -- after the step ------------------------------------------------------

    def update_from_output(self, scheduler_output, model_runner_output):
        outputs = super().update_from_output(scheduler_output, model_runner_output)  # members that end are seen there
        touched = {}
        for req_id in scheduler_output.num_scheduled_tokens:
            group = self.group_of.get(req_id)
            if group is not None and group.driver.observes_text:
                request = self.requests.get(req_id)
                if request is not None:
                    self._observe(group, group.index_of(req_id), request)
                    touched[group.group_id] = group
        for group in touched.values():
            if group.driver.answered:  # a worker wrote the answer: everyone samples its end next
                self._stop(group, self._members[group.group_id])
        return outputs

    def _update_request_with_output(self, request: Request, new_token_ids: list[int], *args: Any, **kwargs: Any):
        """vLLM's, plus per member: count the step, and with speculative decoding keep an accepted run
        only up to where the engine must place text (a step ends and its next prefix is queued, an
        answer, the finisher's room): the rest is dropped as if rejected, so forced tokens follow
        exactly the token that called for them, as without speculation."""
        group = self.group_of.get(request.request_id)
        if group is None:
            return super()._update_request_with_output(request, new_token_ids, *args, **kwargs)
        worker = group.index_of(request.request_id)
        group.sampled_steps[worker] += 1
        if len(new_token_ids) == 1 or not group.driver.places_tokens:
            new_token_ids, stopped = super()._update_request_with_output(request, new_token_ids, *args, **kwargs)
        else:
            kept = 0
            for token in new_token_ids:
                _, stopped = super()._update_request_with_output(request, [token], *args, **kwargs)
                kept += 1
                if stopped:
                    break
                self._observe(group, worker, request)
                if group.driver.may_place(worker, request.num_output_tokens):
                    break
            if kept < len(new_token_ids):
                if not stopped:  # what is dropped was computed as drafts: roll back as vLLM does for rejections
                    request.num_computed_tokens -= len(new_token_ids) - kept
                del new_token_ids[kept:]
        if stopped:  # tokens accepted after the stop were computed but are not the lane's
            request.num_computed_tokens = min(request.num_computed_tokens, request.num_tokens - 1)
        return new_token_ids, stopped

    def _drop_drafts_where_text_is_placed(self) -> None:
        """Members whose next token the engine may place verify no drafts (forced tokens apply to a
        request's first sampled row only)."""
        for group_id, members in self._members.items():
            group = self.groups[group_id]
            if not group.driver.places_tokens or group_id in self.gathering:
                continue
            for w, request in enumerate(members):
                if request is not None and request.spec_token_ids and group.driver.may_place(w, request.num_output_tokens):
                    request.spec_token_ids = []

    def _observe(self, group: Group, worker: int, request: Request) -> None:
        """Show the driver the text of every token ``worker`` sampled since last time."""
        driver = group.driver
        if not driver.observes_text:
            return
        text, tokens = self._texts[request.request_id], request.output_token_ids
        for i in range(driver.num_observed[worker], len(tokens)):
            driver.observe(worker, i, text.next(tokens[i]))

    # -- admission -----------------------------------------------------------

    def _admit_groups(self) -> set[Request]:
        """Queue complete groups, oldest first, while they fit and fairness allows; return plain requests to hold back."""
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
            group.counters.admitted_time = time.monotonic()
            members = sorted((r for r in members if not r.is_finished()), key=lambda r: group.index_of(r.request_id))
            for request in reversed(members):
                self.waiting.prepend_request(request)
                self._unbudgeted.add(request.request_id)
        return set()

    def _fits(self, group: Group) -> bool:
        queued = [r for r in self.waiting if r.request_id in self.group_of]
        bs = self.block_size
        # Queued members have not allocated their budget yet: count it as taken.
        promised = sum(-(-(r.num_prompt_tokens + r.max_tokens + self._slack) // bs) for r in queued)
        return fits(blocks_for_group(group.prompt_len, group.max_tokens, group.num_workers, bs, self._slack), promised,
                    self.kv_cache_manager.watermark_blocks, self.kv_cache_manager.block_pool.get_num_free_blocks(),
                    len(self.running) + len(queued), group.num_workers, self.max_num_active_reqs)

    def _lock_step_holds(self) -> list[Request]:
        """Running members ahead of their group's slowest live member.

        Only groups that may be out of step are looked at: members finish their prefill in
        different steps, and a member left out of a step (vLLM's token budget) falls behind.
        A prefilled group whose live members are even stays even while all are scheduled.
        """
        held = []
        for group_id, members in self._members.items():
            group = self.groups[group_id]
            if group.in_step or group_id in self.gathering:
                continue
            ahead = ahead_of_group([None if r.is_finished() else n for r, n in zip(members, group.sampled_steps)])
            held += [members[w] for w in ahead if members[w].status == RequestStatus.RUNNING]
            group.in_step = group.prefilled and not ahead
        return held

    # -- budget and lifetime -------------------------------------------------

    def _wrap_allocate(self, on: bool) -> None:
        """A member's first allocation takes its whole budget: this instance's ``allocate_slots`` is wrapped
        only while such a member waits (vLLM calls it for every running request every step). Wrapping
        takes whatever the instance has then, and unwrapping puts it back, so nothing set on the
        instance meanwhile by anyone else is lost."""
        if on == self._allocate_wrapped:
            return
        manager = self.kv_cache_manager
        if on:
            self._allocate_prev = manager.__dict__.get("allocate_slots")  # None: the class's method
            self._allocate_slots = manager.allocate_slots
            manager.allocate_slots = self._allocate_with_budget
        elif manager.__dict__.get("allocate_slots") == self._allocate_with_budget:
            if self._allocate_prev is None:
                del manager.allocate_slots
            else:
                manager.allocate_slots = self._allocate_prev
        self._allocate_wrapped = on

    def _allocate_with_budget(self, request: Request, *args: Any, **kwargs: Any):
        """vLLM's ``allocate_slots``; a member's first call takes its whole budget (later calls find it there)."""
        request_id = request.request_id
        if request_id not in self._unbudgeted:
            return self._allocate_slots(request, *args, **kwargs)
        bound = self._allocate_sig.bind(request, *args, **kwargs)
        a = bound.arguments
        have = (request.num_computed_tokens + a.get("num_new_computed_tokens", 0)
                + a.get("num_external_computed_tokens", 0) + a["num_new_tokens"])
        budget = request.num_prompt_tokens + request.max_tokens + self._slack
        a["num_lookahead_tokens"] = max(a.get("num_lookahead_tokens", 0), budget - have)
        blocks = self._allocate_slots(*bound.args, **bound.kwargs)
        if blocks is not None:
            self._unbudgeted.discard(request_id)
        return blocks

    def _free_blocks(self, request: Request) -> None:
        group = self.group_of.get(request.request_id)
        if group is None:
            return super()._free_blocks(request)
        worker = group.index_of(request.request_id)
        group.finished.add(worker)
        self._unbudgeted.discard(request.request_id)
        self._observe(group, worker, request)
        self._texts.pop(request.request_id, None)
        if group.tracker is not None:
            group.tracker.stop(worker, request.num_computed_tokens)
        if not group.is_done:
            # Co-workers still read this lane: keep its blocks, drop the request.
            self.parked[request.request_id] = request
            del self.requests[request.request_id]
            return
        self._record_end(group, request)
        for member_id in group.member_ids:
            parked = self.parked.pop(member_id, None)
            if parked is not None:
                self._free_request_blocks(parked)
            del self.group_of[member_id]
        self.groups.pop(group.group_id, None)
        self.gathering.pop(group.group_id, None)
        self._members.pop(group.group_id, None)
        if group.shape_sent:
            self._ended.append(group.group_id)
        super()._free_blocks(request)

    def _record_end(self, group: Group, last: Request) -> None:
        members = [self.parked.get(m) or last for m in group.member_ids]
        lanes = [(self.kv_cache_manager.get_block_ids(m)[0], r.num_computed_tokens)
                 for m, r in zip(group.member_ids, members)]
        if group.tracker is not None:
            group.tracker.join([n for _, n in lanes])  # the last rests, for the record
        used: set[int] = set()
        for block_ids, n in lanes:
            used.update(block_ids[: -(-n // self.block_size)])
        c, now = group.counters, time.monotonic()
        self.stats.record(GroupEnd(
            group.num_workers, group.prompt_len, [n for _, n in lanes], len(used), c.num_prefill_tokens,
            c.prefill_saved(group.prompt_len), [r.num_output_tokens for r in members], list(c.coworker_reads),
            admission_wait_s=(c.admitted_time - group.arrival_time) if c.admitted_time else None,
            latency_s=now - group.arrival_time,
            history=[(s.lane, s.start, s.end) for s in (group.tracker.history if group.tracker else ())],
            finisher=group.driver.finisher,
        ))

    # -- text and stats ------------------------------------------------------

    def _tokenizer(self):
        if self._hogwild_tokenizer is None:
            from vllm.tokenizers import cached_tokenizer_from_config

            self._hogwild_tokenizer = cached_tokenizer_from_config(model_config=self.vllm_config.model_config)
        return self._hogwild_tokenizer

    def _encode(self, text: str) -> list[int]:
        return list(self._tokenizer().encode(text, add_special_tokens=False))

    def make_stats(self, *args: Any, **kwargs: Any):
        stats = super().make_stats(*args, **kwargs)
        if stats is not None and self._stats_sender is not None:
            running = sum(1 for g in self.groups.values() if g.group_id not in self.gathering)
            free = self.kv_cache_manager.block_pool.get_num_free_blocks()
            self._stats_sender.send(self.stats.snapshot(running, len(self.gathering), free))
        return stats

    def shutdown(self) -> None:
        if self._stats_sender is not None:
            self._stats_sender.close()
        super().shutdown()

