"""The Hogwild scheduler: vLLM's scheduler, translating its requests for the group table and applying its answers.

Selected by the switch (``additional_config={"hogwild": {...}}``); requests
without Hogwild options take vLLM's own code paths untouched. Every decision
about a group (admission, lock-step, the wire, the protocol, preemption and
replay, parking, the end) is :class:`~vllm_hogwild.core.groups.table.GroupTable`'s;
this class only translates: a worker's request arrives (set aside, out of the
waiting queue), the table's admission is queued, the workers it says sit out the step do,
its wire rides on the ``SchedulerOutput``, each accepted run is shown to it
(and cut where it says), a finished worker's blocks are kept or freed as it
says. Under KV pressure (``kv: on-demand``) the room a step needs is made
before vLLM schedules (:mod:`vllm_hogwild.scheduler.kv`: whole groups and
plain requests preempted in vLLM's policy order, with vLLM's own
``_preempt_request``); a resumed group's lanes re-feed their tokens under the
table's chunk ends, its finished lanes through replay requests made here.
Also here, as engine-core glue: each worker's incremental detokenizer
(:mod:`vllm_hogwild.scheduler.detok`), the metrics channel, forced text fed ahead
(:mod:`vllm_hogwild.scheduler.placed`), and each fork/join
lane's record for the front end, on the plugin's own output field
(:mod:`vllm_hogwild.core.forkjoin.lane_channel`).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.request_queue import create_request_queue
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
from vllm.v1.request import Request, RequestStatus

from vllm_hogwild.core.groups.group import Phase
from vllm_hogwild.core.groups.admit import Room
from vllm_hogwild.core.groups.table import GroupTable
from vllm_hogwild.core.forkjoin.lane_channel import LaneRecord, output_types, with_record
from vllm_hogwild.core.log import get_logger
from vllm_hogwild.core.options import EngineOptions, runtime_of, spec_of, spec_slack
from vllm_hogwild.core.stats_channel import StatsSender
from vllm_hogwild.core.wire import STEP_ATTR
from vllm_hogwild.scheduler.detok import TextStream
from vllm_hogwild.scheduler.kv import BudgetedAllocation, LaneHashers, RoomMaker
from vllm_hogwild.scheduler.placed import FedAhead

logger = get_logger(__name__)

CAPPED = "_reserve_prefill_lookahead"  # vLLM's per-request chunk hook, wrapped on this instance while groups replay


class HogwildScheduler(Scheduler):
    def __new__(cls, *args: Any, **kwargs: Any):
        """With vLLM's async scheduling on, the engine gets :class:`HogwildAsyncScheduler`."""
        if cls is HogwildScheduler:
            config = kwargs.get("vllm_config", args[0] if args else None)
            if getattr(getattr(config, "scheduler_config", None), "async_scheduling", False):
                cls = HogwildAsyncScheduler
        return super().__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hogwild_options = EngineOptions.from_additional_config(self.vllm_config.additional_config)
        self.table = GroupTable(block_size=self.block_size, max_plain_wait=self.hogwild_options.max_plain_wait,
                                encode=self._encode, text_for=self._text_stream, hidden_for=self._hidden_text,
                                slack=spec_slack(self.vllm_config),
                                speculative=bool(self.num_spec_tokens), kv=self.hogwild_options.kv,
                                max_positions=self.max_model_len)
        if self.num_spec_tokens:  # lock-step counts steps, not tokens: each worker's accepted runs go through the table
            self._update_request_with_output = self._update_worker_with_output
        self._lane_hashers = LaneHashers(self.hash_block_size)  # a lane's blocks past its prompt hashed privately
        self.parked: dict[str, Request] = {}  # finished lanes' requests whose blocks co-workers still read
        self._resort = False  # workers were queued: vLLM appended those it admitted to `running`
        self._budget = BudgetedAllocation(self.kv_cache_manager, self.table)
        self._room_maker = RoomMaker(self)
        self._lane_records: dict[str, LaneRecord] = {}  # request id -> its record, to go with its next output
        self._fed_ahead = FedAhead(self)  # fork/join headers fed in one step
        self._replay_ends: dict[str, int] = {}  # this step's chunk end of each replaying lane
        self._rewound: dict[str, tuple[int, int, int]] = {}  # lengths set here since the last step (the wire's)
        self._hogwild_tokenizer = None
        self._special_texts: dict[int, str] | None = None  # special token id -> its text, where decoding skips it
        address = runtime_of(self.vllm_config.additional_config).get("stats")
        self._stats_sender = StatsSender(address, self.vllm_config.parallel_config.data_parallel_rank) \
            if address and self.log_stats else None

    # -- arrival -------------------------------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        spec = spec_of(request.sampling_params.extra_args if request.sampling_params else None)
        if spec is None:
            return super().add_request(request)
        request._block_hasher = self._lane_hashers.for_worker(request._block_hasher)
        super().add_request(request)
        self.waiting.remove_request(request)  # set aside, out of the waiting queue, until its group is admitted
        self.table.arrive(request.request_id, spec, request, prompt_len=request.num_prompt_tokens,
                          max_tokens=request.max_tokens, eos_token_id=request.sampling_params.eos_token_id,
                          arrival=request.arrival_time)

    def get_request_counts(self) -> tuple[int, int]:
        # Requests set aside wait too: the engine must keep stepping for them.
        num_running, num_waiting = super().get_request_counts()
        return num_running, num_waiting + self.table.num_aside

    # -- one step ------------------------------------------------------------------------------------

    def schedule(self, *args: Any, **kwargs: Any):
        table = self.table
        self._settle_replays()
        self._fed_ahead.append()  # before the room is made: the tokens it appends need room too
        preempted = self._room_maker.make_room() if table.on_demand and table.num_running_groups else False
        admission = None if preempted else table.admit(time.time(), self._room, self._oldest_plain_arrival)
        if admission is not None:
            for worker, tokens in admission.replays:
                admission.queue.append(self._replay_request(worker, tokens))
            self.waiting.prepend_requests(reversed(admission.queue))  # the queue's first ends up at the head
            for request in admission.queue if table.records_lanes else ():
                record = table.lane_record(request.request_id)
                if record is not None:  # a fork/join lane: how it takes part, with its first output
                    self._lane_records[request.request_id] = record
        self._budget.install(table.has_reservations)
        if self.num_spec_tokens:
            for request in table.drafts_to_drop():
                request.spec_token_ids = []
        sitting_out = self._sitting_out()
        if sitting_out:
            out = {id(r) for r in sitting_out}
            self.running = [r for r in self.running if id(r) not in out]
        if self._resort:  # workers first: vLLM preempts from the tail of `running` (it appends what it admits)
            workers, replays = table.workers, table.replays  # (the table's dicts: no call per request)
            self.running.sort(key=lambda r: r.request_id not in workers and r.request_id not in replays)
        idle = self._cap_replays()
        waiting, deferred_plain = self.waiting, ()
        if preempted:  # as vLLM does after a preemption: no new admissions this step
            self.waiting = create_request_queue(self.policy)
        elif admission.defer_newer_than is not None:  # a group that waited long enough keeps newer plain ones back
            deferred_plain = [r for r in self.waiting
                          if r.request_id not in table and r.arrival_time > admission.defer_newer_than]
            self.waiting.remove_requests(deferred_plain)
        output = super().schedule(*args, **kwargs)
        if preempted:
            waiting.prepend_requests(list(self.waiting))
            self.waiting = waiting
        for request in deferred_plain:
            self.waiting.add_request(request)
        if idle:
            self.waiting.prepend_requests(idle)
        if sitting_out:
            self.running = [*sitting_out, *self.running]
        for request_id in output.preempted_req_ids or ():
            if request_id in table.workers and table.workers[request_id].group.phase is not Phase.PREEMPTED:
                table.preempted_alone(request_id)  # the table's rules are there so that vLLM never does this
                logger.error("Hogwild worker %s was preempted alone; its group's views may diverge", request_id)
        scheduled = output.num_scheduled_tokens
        self._fed_ahead.settle(output)
        self._resort = bool(table.num_queued)  # some were queued: those vLLM admits now must move up next step
        wire = table.step(scheduled, output.scheduled_spec_decode_tokens, self._block_ids,
                          all_scheduled=len(scheduled) == len(self.running) - len(sitting_out),
                          has_tokens=bool(output.total_num_scheduled_tokens))
        if wire.fed_ahead:
            self._fed_ahead.sent(wire.fed_ahead)
        if self._rewound and output.total_num_scheduled_tokens:  # (a step without tokens reaches no worker)
            wire, self._rewound = replace(wire, rewound=self._rewound), {}
        setattr(output, STEP_ATTR, wire)
        return output

    def _sitting_out(self) -> list[Request]:
        """Running workers that sit this step out (as the table says: :meth:`GroupTable.who_sits_out`)."""
        return [r for r in self.table.who_sits_out() if r.status == RequestStatus.RUNNING]

    def _room(self) -> Room:
        return Room(self.kv_cache_manager.block_pool.get_num_free_blocks(), self.kv_cache_manager.watermark_blocks,
                    len(self.running), self.max_num_active_reqs)

    def _oldest_plain_arrival(self) -> float | None:
        return next((r.arrival_time for r in self.waiting if r.request_id not in self.table), None)

    def _block_ids(self, request_id: str) -> list[int]:
        """A lane's block ids (its first KV-cache group), read off the coordinator's own list: vLLM's
        ``get_block_ids`` builds a ``KVCacheBlocks`` on every call, and a step where 256 groups start or end
        asks for 1,024 lanes' blocks."""
        return [block.block_id for block in self.kv_cache_manager.coordinator.get_blocks(request_id)[0]]

    # -- preemption and replay -----------------------------------------------------------------------

    def preempt_group(self, group_id: str, timestamp: float) -> None:
        """Preempt a group whole: every lane's blocks freed (the prompt's full blocks stay in the prefix cache),
        its live workers set aside, out of vLLM's queues, until the table admits it again."""
        preemption = self.table.preempt(group_id)
        for request in preemption.requests:
            if request.status == RequestStatus.RUNNING:
                self.running.remove(request)
                self._preempt_request(request, timestamp)  # vLLM's own: blocks freed, status PREEMPTED
            self.waiting.remove_requests([request])  # the group waits whole, in the table
        for request in preemption.parked:
            self.parked.pop(request.request_id, None)
            self._free_request_blocks(request)
        if preemption.replays:
            self.finish_requests([r.request_id for r in preemption.replays], RequestStatus.FINISHED_ABORTED)
        logger.info("Hogwild group %s preempted whole (KV cache full); it resumes by replay", group_id)

    def _replay_request(self, worker, tokens: list[int]) -> Request:
        """A request that re-feeds a finished worker's lane (``tokens``: the lane and its last sampled token,
        which it never feeds). It is internal: it never samples, and nothing of it reaches the client."""
        original = worker.request
        request_id = f"{worker.request_id}@replay{worker.group.counters.num_preemptions}"
        hasher = self._lane_hashers.for_replay(original._block_hasher, worker.group.prompt_len, request_id)
        request = Request(request_id, list(tokens), SamplingParams(max_tokens=1, temperature=0.0), None,
                          client_index=original.client_index, arrival_time=original.arrival_time,
                          cache_salt=original.cache_salt, priority=original.priority, lora_request=original.lora_request,
                          block_hasher=hasher)
        self.requests[request_id] = request
        self.table.replay_request(worker, request)
        return request

    def _settle_replays(self) -> None:
        """Replaying lanes back to a consistent frontier; groups done replaying decode again (their replay
        requests finish and park); replay requests of groups that ended are aborted."""
        orphans = self.table.take_orphans()
        if orphans:
            self.finish_requests([r.request_id for r in orphans], RequestStatus.FINISHED_ABORTED)
        rollbacks, done = self.table.settle()
        for request, num_computed_tokens in rollbacks:
            request.num_computed_tokens = num_computed_tokens  # re-fed next step, as vLLM re-feeds rejected drafts
            self._rewind(request)
        if done:
            self.finish_requests([r.request_id for r in done], RequestStatus.FINISHED_STOPPED)

    def _rewind(self, request: Request, num_dropped: int = 0) -> None:
        """The request's length set here, past what vLLM's own rejections did (``num_dropped``: its last tokens
        dropped, the rest re-fed): the next step's wire says so, for a runner that keeps lengths of its own."""
        self._rewound[request.request_id] = (request.num_computed_tokens, request.num_tokens, num_dropped)

    def _cap_replays(self) -> list[Request]:
        """While a group replays, vLLM's per-request chunk hook stops each of its lanes at the table's chunk end.
        Returns the replaying lanes in vLLM's waiting queue with nothing to re-feed this step, taken out of it for
        the step (a chunk of no token there would stop vLLM's admissions for the step)."""
        replaying = self.table.replaying
        if replaying:
            budget = self.max_num_scheduled_tokens - len(self.running)  # room left for every other request's token
            self._replay_ends = self.table.replay_ends(max(1, budget), self.scheduler_config.long_prefill_token_threshold)
            setattr(self, CAPPED, self._capped_chunk)
            idle = [r for r in self.waiting if self._replay_ends.get(r.request_id) == 0]
            if idle:
                self.waiting.remove_requests(idle)
            return idle
        if CAPPED in self.__dict__:
            delattr(self, CAPPED)
            self._replay_ends = {}
        return []

    def _capped_chunk(self, request: Request, num_computed_tokens: int, num_new_tokens: int) -> int:
        n = Scheduler._reserve_prefill_lookahead(self, request, num_computed_tokens, num_new_tokens)
        end = self._replay_ends.get(request.request_id)
        return n if end is None else max(0, min(n, end - num_computed_tokens))

    def _get_local_prefix_cache_hit(self, request: Request):
        """vLLM's; a resumed lane's hit stops at the group's prompt, and short of the lane's end and of this step's
        chunk end: its later blocks are re-fed (with their views), and every lane re-feeds at least one token
        when it is scheduled (a chunk of no token would stop vLLM's admissions for the step)."""
        hit = super()._get_local_prefix_cache_hit(request)
        blocks, num_hit = hit[0], hit[1]
        if num_hit and request.request_id in self.table:
            cap = self.table.prefix_hit_cap(request.request_id, self.block_size)
            end = self._replay_ends.get(request.request_id)
            if cap is not None and end:
                cap = min(cap, (end - 1) // self.block_size * self.block_size)
            if cap is not None and num_hit > cap:
                blocks = self.kv_cache_manager.truncate_computed_blocks(blocks, cap)
                hit = (blocks, cap, *hit[2:])
        return hit

    # -- after the step ------------------------------------------------------------------------------

    def update_from_output(self, scheduler_output, model_runner_output):
        self._fed_ahead.take_logprobs(model_runner_output)
        outputs = super().update_from_output(scheduler_output, model_runner_output)  # workers that end are seen there
        self._fed_ahead.add_to_outputs(outputs)
        self.table.take_sampled()  # where the step's sampled tokens enter the groups
        if self._lane_records:
            self._send_lane_records(outputs)
        return outputs

    def _send_lane_records(self, outputs) -> None:
        """Each fork/join lane's new record goes with its output of this step, in the plugin's own field
        (:mod:`vllm_hogwild.core.forkjoin.lane_channel`); a record whose lane ended without an output (aborted) is
        dropped. O(outputs) in a step with records to send, nothing otherwise."""
        pending = self._lane_records
        output_type = output_types(EngineCoreOutput, EngineCoreOutputs)[0]
        for batch in outputs.values():
            items = batch.outputs
            for i, output in enumerate(items):
                record = pending.pop(output.request_id, None)
                if record is not None:
                    items[i] = with_record(output, record, output_type)
        for request_id in [r for r in pending if r not in self.requests]:
            del pending[request_id]

    def _update_worker_with_output(self, request: Request, new_token_ids: list[int], *args: Any, **kwargs: Any):
        """Speculative decoding (this instance's ``_update_request_with_output``): vLLM's, plus per worker:
        count the step, and keep an accepted run only up to where the table says the engine must force
        text: the rest is dropped as if rejected, so forced tokens follow exactly the token that called
        for them, as without speculation."""
        vllm_update = super()._update_request_with_output  # vLLM's (AsyncScheduler's, with async scheduling)
        worker = self.table.accept(request.request_id)
        if worker is None or len(new_token_ids) == 1 or not worker.group.driver.forces_tokens:
            new_token_ids, stopped = vllm_update(request, new_token_ids, *args, **kwargs)
        else:
            accepted, stopped = self.table.accept_run(
                worker, new_token_ids,
                lambda token: vllm_update(request, [token], *args, **kwargs)[1])
            if accepted < len(new_token_ids):
                if not stopped:  # what is dropped was computed as drafts: roll back as vLLM does for rejections
                    request.num_computed_tokens -= len(new_token_ids) - accepted
                    self._rewind(request, len(new_token_ids) - accepted)
                del new_token_ids[accepted:]
        if worker is not None and stopped:  # tokens accepted after the stop were computed but are not the lane's
            request.num_computed_tokens = min(request.num_computed_tokens, request.num_tokens - 1)
        return new_token_ids, stopped

    # -- the end of a lane ---------------------------------------------------------------------------

    def _free_blocks(self, request: Request) -> None:
        request_id = request.request_id
        if request_id in self.table.replays:  # a replay request: its lane's blocks, kept while its group goes on
            if self.table.replay_parked(request_id):
                self.parked[request_id] = request
                del self.requests[request_id]
                return
            return super()._free_blocks(request)
        if request_id not in self.table.workers:
            return super()._free_blocks(request)
        record = self.table.lane_record(request_id, finished=True) if self.table.records_lanes else None
        if record is not None:  # a fork/join lane: how it took part, with its last output (built after this)
            self._lane_records[request_id] = record
        parked = self.table.finish(request_id, self._block_ids)
        if parked is None:  # co-workers still read this lane: keep its blocks, drop the request
            self.parked[request_id] = request
            del self.requests[request_id]
            return
        for other in parked:
            if self.parked.pop(other.request_id, None) is not None:
                self._free_request_blocks(other)
        super()._free_blocks(request)

    # -- text and stats ------------------------------------------------------------------------------

    def _tokenizer(self):
        if self._hogwild_tokenizer is None:
            from vllm.tokenizers import cached_tokenizer_from_config

            self._hogwild_tokenizer = cached_tokenizer_from_config(model_config=self.vllm_config.model_config)
        return self._hogwild_tokenizer

    def _encode(self, text: str) -> list[int]:
        return list(self._tokenizer().encode(text, add_special_tokens=False))

    def _text_stream(self, request: Request):
        return TextStream(self._tokenizer(), request).next

    def _hidden_text(self, request: Request):
        """The text of the special tokens ``request``'s text skips (None: it skips none), token by token."""
        return self._special_text if request.sampling_params.skip_special_tokens else None

    def _special_text(self, token_id: int) -> str:
        """The token's text if decoding with ``skip_special_tokens`` leaves it out, else ""."""
        if self._special_texts is None:  # once: the tokenizer's special tokens (a few; tags may be among them)
            tokenizer = self._tokenizer()
            ids = set(getattr(tokenizer, "all_special_ids", ()))
            ids |= {i for i, t in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items()
                    if getattr(t, "special", False)}
            texts = {i: tokenizer.decode([i], skip_special_tokens=False) for i in ids}
            self._special_texts = {i: t for i, t in texts.items()
                                   if t and not tokenizer.decode([i], skip_special_tokens=True)}
        return self._special_texts.get(token_id, "")

    def make_stats(self, *args: Any, **kwargs: Any):
        stats = super().make_stats(*args, **kwargs)
        if stats is not None and self._stats_sender is not None:
            self._stats_sender.send(self.table.snapshot(self.kv_cache_manager.block_pool.get_num_free_blocks()))
        return stats

    def shutdown(self) -> None:
        if self._stats_sender is not None:
            self._stats_sender.close()
        super().shutdown()


class HogwildAsyncScheduler(HogwildScheduler, AsyncScheduler):
    """The Hogwild scheduler over vLLM's ``AsyncScheduler``, which vLLM runs when async scheduling is on: step
    k+1 is scheduled while step k runs, before its tokens are sampled.

    Plain requests keep it as in stock vLLM. A worker of a group sits out every step scheduled while its last
    step's output is still out (``num_output_placeholders``): each group step is then built, as without async
    scheduling, from every token sampled before it (its forced tokens, paragraph ends, answers and forks
    need them; a raw group's views would not, but its lanes' ends would differ when a worker stops). A group
    therefore decodes in every other engine step at most, the steps between going to plain requests.
    """

    def _sitting_out(self) -> list[Request]:
        sitting_out = super()._sitting_out()
        table = self.table
        if not table:
            return sitting_out
        out = {id(r) for r in sitting_out}
        waiting = [r for r in self.running if r.num_output_placeholders and id(r) not in out and r.request_id in table]
        if waiting:
            table.wait_for_outputs([r.request_id for r in waiting])
        return sitting_out + waiting
