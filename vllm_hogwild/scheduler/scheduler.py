"""The Hogwild scheduler: vLLM's scheduler, translating its requests for the group table and applying its answers.

Selected by the switch (``additional_config={"hogwild": {...}}``); requests
without Hogwild options take vLLM's own code paths untouched. Every decision
about a group (admission, lock-step, the wire, the protocol, parking, the end)
is :class:`~vllm_hogwild.core.group_table.GroupTable`'s; this class only
translates: a worker's request arrives (held out of the waiting queue), the
table's admission is queued, its holds sit out the step, its wire rides on the
``SchedulerOutput``, each accepted run is shown to it (and cut where it says),
and a finished worker's blocks are kept or freed as it says. Also here, as
engine-core glue: each worker's incremental detokenizer
(:mod:`vllm_hogwild.scheduler.detok`), the budget wrap of ``allocate_slots``
(:mod:`vllm_hogwild.scheduler.kv`) and the metrics channel.
"""

from __future__ import annotations

import time
from typing import Any

from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request, RequestStatus

from vllm_hogwild.core.group_table import GroupTable, Room
from vllm_hogwild.core.log import get_logger
from vllm_hogwild.core.options import EngineOptions, runtime_of, spec_of, spec_slack
from vllm_hogwild.core.stats_channel import StatsSender
from vllm_hogwild.core.wire import STEP_ATTR
from vllm_hogwild.scheduler.detok import TextStream
from vllm_hogwild.scheduler.kv import BudgetedAllocation

logger = get_logger(__name__)


class HogwildScheduler(Scheduler):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hogwild_options = EngineOptions.from_additional_config(self.vllm_config.additional_config)
        self.table = GroupTable(block_size=self.block_size, max_plain_wait=self.hogwild_options.max_plain_wait,
                                encode=self._encode, text_for=self._text_stream, slack=spec_slack(self.vllm_config),
                                speculative=bool(self.num_spec_tokens))
        if self.num_spec_tokens:  # lock-step counts steps, not tokens: each worker's accepted runs go through the table
            self._update_request_with_output = self._update_worker_with_output
        self.parked: dict[str, Request] = {}  # finished workers' requests whose blocks co-workers still read
        self._resort = False  # workers were queued: vLLM appended those it admitted to `running`
        self._budget = BudgetedAllocation(self.kv_cache_manager, self.table)
        self._hogwild_tokenizer = None
        address = runtime_of(self.vllm_config.additional_config).get("stats")
        self._stats_sender = StatsSender(address, self.vllm_config.parallel_config.data_parallel_rank) \
            if address and self.log_stats else None

    # -- arrival -------------------------------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        spec = spec_of(request.sampling_params.extra_args if request.sampling_params else None)
        if spec is None:
            return super().add_request(request)
        super().add_request(request)
        self.waiting.remove_request(request)  # held out of the waiting queue until its group is admitted
        self.table.arrive(request.request_id, spec, request, prompt_len=request.num_prompt_tokens,
                          max_tokens=request.max_tokens, eos_token_id=request.sampling_params.eos_token_id,
                          arrival=request.arrival_time)

    def get_request_counts(self) -> tuple[int, int]:
        # Held workers wait too: the engine must keep stepping for them.
        num_running, num_waiting = super().get_request_counts()
        return num_running, num_waiting + self.table.num_held

    # -- one step ------------------------------------------------------------------------------------

    def schedule(self, *args: Any, **kwargs: Any):
        table = self.table
        admission = table.admit(time.time(), self._room, self._oldest_plain_arrival)  # vLLM's arrivals: wall clock
        for request in reversed(admission.queue):
            self.waiting.prepend_request(request)
        self._budget.install(table.has_unbudgeted)
        if self.num_spec_tokens:
            for request in table.drafts_to_drop():
                request.spec_token_ids = []
        held = [r for r in table.holds() if r.status == RequestStatus.RUNNING]
        if held:
            self.running = [r for r in self.running if r not in held]
        if self._resort:  # workers first: vLLM preempts from the tail of `running` (it appends what it admits)
            self.running.sort(key=lambda r: r.request_id not in table)
        held_plain = ()
        if admission.hold_newer_than is not None:  # a group that has waited long enough keeps newer plain requests back
            held_plain = [r for r in self.waiting
                          if r.request_id not in table and r.arrival_time > admission.hold_newer_than]
            self.waiting.remove_requests(held_plain)
        output = super().schedule(*args, **kwargs)
        for request in held_plain:
            self.waiting.add_request(request)
        if held:
            self.running = [*held, *self.running]
        for request_id in output.preempted_req_ids or ():
            if request_id in table:  # the budget rule never lets vLLM preempt a worker; if it did, say so
                table.preempted(request_id)
                logger.error("Hogwild worker %s was preempted; its group's views may diverge", request_id)
        scheduled = output.num_scheduled_tokens
        self._resort = bool(table.num_queued)  # some were queued: those vLLM admits now must move up next step
        setattr(output, STEP_ATTR, table.step(scheduled, output.scheduled_spec_decode_tokens, self._block_ids,
                                              all_scheduled=len(scheduled) == len(self.running) - len(held),
                                              has_tokens=bool(output.total_num_scheduled_tokens)))
        return output

    def _room(self) -> Room:
        return Room(self.kv_cache_manager.block_pool.get_num_free_blocks(), self.kv_cache_manager.watermark_blocks,
                    len(self.running), self.max_num_active_reqs)

    def _oldest_plain_arrival(self) -> float | None:
        return next((r.arrival_time for r in self.waiting if r.request_id not in self.table), None)

    def _block_ids(self, request_id: str) -> list[int]:
        return self.kv_cache_manager.get_block_ids(request_id)[0]

    # -- after the step ------------------------------------------------------------------------------

    def update_from_output(self, scheduler_output, model_runner_output):
        outputs = super().update_from_output(scheduler_output, model_runner_output)  # workers that end are seen there
        self.table.after_outputs()
        return outputs

    def _update_worker_with_output(self, request: Request, new_token_ids: list[int], *args: Any, **kwargs: Any):
        """Speculative decoding (this instance's ``_update_request_with_output``): vLLM's, plus per worker:
        count the step, and keep an accepted run only up to where the table says the engine must place
        text: the rest is dropped as if rejected, so forced tokens follow exactly the token that called
        for them, as without speculation."""
        worker = self.table.accept(request.request_id)
        if worker is None or len(new_token_ids) == 1 or not worker.group.driver.places_tokens:
            new_token_ids, stopped = Scheduler._update_request_with_output(self, request, new_token_ids, *args, **kwargs)
        else:
            kept = 0
            for token in new_token_ids:
                _, stopped = Scheduler._update_request_with_output(self, request, [token], *args, **kwargs)
                kept += 1
                if stopped or self.table.must_place(worker):
                    break
            if kept < len(new_token_ids):
                if not stopped:  # what is dropped was computed as drafts: roll back as vLLM does for rejections
                    request.num_computed_tokens -= len(new_token_ids) - kept
                del new_token_ids[kept:]
        if worker is not None and stopped:  # tokens accepted after the stop were computed but are not the lane's
            request.num_computed_tokens = min(request.num_computed_tokens, request.num_tokens - 1)
        return new_token_ids, stopped

    # -- the end of a worker -------------------------------------------------------------------------

    def _free_blocks(self, request: Request) -> None:
        if request.request_id not in self.table:
            return super()._free_blocks(request)
        parked = self.table.finish(request.request_id, self._lane_blocks)
        if parked is None:  # co-workers still read this lane: keep its blocks, drop the request
            self.parked[request.request_id] = request
            del self.requests[request.request_id]
            return
        for other in parked:
            if self.parked.pop(other.request_id, None) is not None:
                self._free_request_blocks(other)
        super()._free_blocks(request)

    def _lane_blocks(self, request_id: str) -> list[int]:
        return self.kv_cache_manager.get_block_ids(request_id)[0]

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

    def make_stats(self, *args: Any, **kwargs: Any):
        stats = super().make_stats(*args, **kwargs)
        if stats is not None and self._stats_sender is not None:
            self._stats_sender.send(self.table.snapshot(self.kv_cache_manager.block_pool.get_num_free_blocks()))
        return stats

    def shutdown(self) -> None:
        if self._stats_sender is not None:
            self._stats_sender.close()
        super().shutdown()
