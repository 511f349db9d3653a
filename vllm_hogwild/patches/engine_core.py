"""The engine core: the Hogwild scheduler over vLLM's, its KV cache manager, requests and detokenizer.

No class wraps here: the engine core's hooks are the Hogwild scheduler
subclass (named through vLLM's own ``scheduler_cls``; its overrides below)
and a few methods of one object each, wrapped by the plugin's code that owns
the object (``instance``: a wrap of one object needs that object):

- ``KVCacheManager.allocate_slots`` of this engine's manager
  (:mod:`vllm_hogwild.scheduler.kv`): a group's budget is reserved at admission.
  Retired by ``patches/04-scheduler-lookahead.patch``;
- ``Scheduler._reserve_prefill_lookahead`` of this scheduler, while groups
  replay: each lane's chunk end. Retired by ``10-scheduler-chunk-limit.patch``;
- ``Scheduler._update_request_with_output`` (speculative decoding only) and
  each worker's ``Request._block_hasher``: no upstream diff would retire them
  (see each row's reason).

The rows also cover the step's wire (the ``SchedulerOutput`` attribute the
workers read) and the detokenizer the scheduler runs per worker.
"""

from __future__ import annotations

from vllm_hogwild.patches.points import *  # noqa: F401,F403  (the kinds, TouchPoint and the shared names)
from vllm_hogwild.patches.points import TouchPoint, same_kind  # noqa: F401

NO_PATCH_OVERRIDE = "none: subclassing through scheduler_cls is vLLM's own extension point"
_SCHEDULER = "vllm.v1.core.sched.scheduler:Scheduler"
_SCHED = "vllm_hogwild.scheduler.scheduler"

# -- the hooks: target -> (mechanism, where, patch) ----------------------------------------------------

HOOKS = {
    "vllm.v1.core.kv_cache_manager:KVCacheManager.allocate_slots":
        ("instance", "vllm_hogwild.scheduler.kv", "04-scheduler-lookahead.patch"),
    f"{_SCHEDULER}._reserve_prefill_lookahead": ("instance", _SCHED, "10-scheduler-chunk-limit.patch"),
    f"{_SCHEDULER}._update_request_with_output": (
        "instance", _SCHED,
        "none: with speculative decoding only, it cuts an accepted run where the engine forces text, token by "
        "token inside vLLM's own output loop; a per-token stop callback upstream would retire it"),
    "vllm.v1.request:Request._block_hasher": (
        "instance", _SCHED,
        "none: a worker's blocks past the prompt hold K/V computed under its own views, so their prefix-cache "
        "hashes are salted per lane; vLLM's cache_salt salts a whole request, prompt included"),
    **{f"{_SCHEDULER}.{name}": ("override", _SCHED, NO_PATCH_OVERRIDE)
       for name in ("add_request", "get_request_counts", "schedule", "update_from_output", "_free_blocks",
                    "_get_local_prefix_cache_hit", "make_stats", "shutdown")},
}


# -- the rows ----------------------------------------------------------------------------------------

def scheduler() -> list[TouchPoint]:
    """scheduler/scheduler.py: the Hogwild scheduler over vLLM's, its KV cache manager, queues and requests."""
    queue_methods = (("add_request", ("self", "request")), ("prepend_request", ("self", "request")),
                     ("remove_request", ("self", "request")), ("remove_requests", ("self", "requests")),
                     ("__iter__", ("self",)))
    lock_step = "scheduler/scheduler.schedule (running workers sitting a lock-step step out)"
    return [
        TouchPoint(SCHEDULER, "Scheduler.__init__", METHOD, HOGWILD_SCHEDULER, params=("self", "vllm_config")),
        TouchPoint(SCHEDULER, "Scheduler.add_request", METHOD, HOGWILD_SCHEDULER, params=("self", "request")),
        TouchPoint(SCHEDULER, "Scheduler.schedule", METHOD, HOGWILD_SCHEDULER, params=("self",)),
        TouchPoint(SCHEDULER, "Scheduler.update_from_output", METHOD, HOGWILD_SCHEDULER + "; benchmarks/bench",
                   params=("self", "scheduler_output", "model_runner_output")),
        TouchPoint(SCHEDULER, "Scheduler._free_blocks", METHOD, HOGWILD_SCHEDULER, params=("self", "request")),
        TouchPoint(SCHEDULER, "Scheduler._free_request_blocks", METHOD, HOGWILD_SCHEDULER, params=("self", "request")),
        TouchPoint(SCHEDULER, "Scheduler.get_request_counts", METHOD, HOGWILD_SCHEDULER, params=("self",)),
        TouchPoint(SCHEDULER, "Scheduler.has_request", METHOD, HOGWILD_SCHEDULER + ": vLLM 0.33's own, not overridden: "
                   "a worker set aside stays in self.requests (out of the queues), so it is there", params=("self", "request_id"),
                   since="0.33"),
        TouchPoint(SCHEDULER, "Scheduler.has_request", SOURCE, HOGWILD_SCHEDULER + ": workers set aside and parked lanes as "
                   "vLLM's has_request sees them", text="return request_id in self.requests", since="0.33"),
        TouchPoint(SCHEDULER, "Scheduler._update_request_with_output", METHOD,
                   HOGWILD_SCHEDULER + " (accepted runs, steps per worker)",
                   params=("self", "request", "new_token_ids")),
        TouchPoint(SCHEDULER, "Scheduler", SOURCE,
                   HOGWILD_SCHEDULER + ": rejections roll num_computed_tokens back before the output is applied",
                   text="request.num_computed_tokens -= num_rejected"),
        TouchPoint(SCHEDULER, "Scheduler.make_stats", METHOD, HOGWILD_SCHEDULER, params=("self",)),
        TouchPoint(SCHEDULER, "Scheduler.shutdown", METHOD, HOGWILD_SCHEDULER + " (closes the stats channel)",
                   params=("self",)),
        TouchPoint(SCHEDULER, "Scheduler", SOURCE,
                   HOGWILD_SCHEDULER + ": allocations go through the instance's kv_cache_manager.allocate_slots",
                   text="self.kv_cache_manager.allocate_slots("),
        *same_kind(SCHEDULER, "Scheduler", INIT_ATTRIBUTE, ("vllm_config", "kv_cache_manager", "waiting", "running",
                                                            "requests", "policy", "max_num_active_reqs",
                                                            "block_size", "log_stats", "num_spec_tokens"),
                   HOGWILD_SCHEDULER),
        TouchPoint(KV_CACHE_MANAGER, "KVCacheManager.allocate_slots", METHOD,
                   "scheduler/kv.BudgetedAllocation.allocate_slots (binds by name)",
                   params=("self", "request", "num_new_tokens"),
                   keywords=("num_new_computed_tokens", "num_lookahead_tokens", "num_external_computed_tokens")),
        TouchPoint(KV_CACHE_MANAGER, "KVCacheManager", SETTABLE,
                   "scheduler/kv.py: allocate_slots replaced on the instance", params=("allocate_slots",)),
        TouchPoint(KV_CACHE_MANAGER, "KVCacheManager.block_pool", INIT_ATTRIBUTE, HOGWILD_SCHEDULER),
        TouchPoint(KV_CACHE_MANAGER, "KVCacheManager.watermark_blocks", INIT_ATTRIBUTE, HOGWILD_SCHEDULER),
        TouchPoint("vllm.v1.core.block_pool", "BlockPool.get_num_free_blocks", METHOD, HOGWILD_SCHEDULER,
                   params=("self",)),
        *(TouchPoint(REQUEST_QUEUE, f"RequestQueue.{method}", METHOD, HOGWILD_SCHEDULER, params=params)
          for method, params in queue_methods),
        TouchPoint(REQUEST, "Request", CLASS, HOGWILD_SCHEDULER),
        *same_kind(REQUEST, "Request", INIT_ATTRIBUTE, ("spec_token_ids",),
                   HOGWILD_SCHEDULER + " (drafts dropped where text is forced)", writes=True),
        *same_kind(REQUEST, "Request", INIT_ATTRIBUTE, ("request_id", "max_tokens", "num_prompt_tokens",
                                                        "arrival_time", "num_computed_tokens", "output_token_ids",
                                                        "sampling_params", "prompt_token_ids"), HOGWILD_SCHEDULER),
        *same_kind(REQUEST, "Request", ATTRIBUTE, ("num_tokens", "num_output_tokens"), HOGWILD_SCHEDULER),
        TouchPoint(REQUEST, "Request.is_finished", METHOD, HOGWILD_SCHEDULER, params=("self",)),
        *same_kind(REQUEST, "Request", INIT_ATTRIBUTE, ("status",), lock_step),
        TouchPoint(REQUEST, "RequestStatus.RUNNING", CONSTANT, lock_step),
        *async_scheduling(),
        *preemption_and_replay(),
    ]


def async_scheduling() -> list[TouchPoint]:
    """scheduler/scheduler.HogwildAsyncScheduler: the Hogwild scheduler over vLLM's AsyncScheduler."""
    return [
        TouchPoint("vllm.v1.core.sched.async_scheduler", "AsyncScheduler", CLASS,
                   HOGWILD_SCHEDULER + " (HogwildAsyncScheduler's base, after HogwildScheduler)"),
        TouchPoint("vllm.v1.core.sched.async_scheduler", "AsyncScheduler._update_request_with_output", METHOD,
                   HOGWILD_SCHEDULER + " (the speculative wrap calls the next one in the MRO)",
                   params=("self", "request", "new_token_ids")),
        TouchPoint("vllm.config.scheduler", "SchedulerConfig.async_scheduling", FIELD,
                   HOGWILD_SCHEDULER + " (HogwildScheduler.__new__ picks the async class)"),
    ]


def preemption_and_replay() -> list[TouchPoint]:
    """scheduler/scheduler.py and scheduler/kv.py: making room, preempting groups whole, replay requests."""
    room = "scheduler/kv.RoomMaker"
    replay = "scheduler/scheduler (replay of a resumed group)"
    return [
        TouchPoint(SCHEDULER, "Scheduler._preempt_request", METHOD, room + "; scheduler/scheduler.preempt_group",
                   params=("self", "request", "timestamp")),
        TouchPoint(SCHEDULER, "Scheduler.finish_requests", METHOD, replay + ": replay requests end",
                   params=("self", "request_ids", "finished_status")),
        TouchPoint(SCHEDULER, "Scheduler._reserve_prefill_lookahead", METHOD,
                   replay + ": each lane's chunk end (an instance wrap while groups replay)",
                   params=("self", "request", "num_computed_tokens", "num_new_tokens")),
        TouchPoint(SCHEDULER, "Scheduler", SOURCE, replay + ": the running loop asks the instance's chunk hook",
                   text="num_new_tokens = self._reserve_prefill_lookahead("),
        TouchPoint(SCHEDULER, "Scheduler._get_local_prefix_cache_hit", METHOD,
                   replay + ": a resumed lane's hit stops at its group's prompt", params=("self", "request")),
        TouchPoint(SCHEDULER, "Scheduler", SOURCE, room + ": vLLM admits no waiting request after a preemption",
                   text="if not preempted_reqs and self._pause_state != PauseState.PAUSED_ALL:"),
        *same_kind(SCHEDULER, "Scheduler", INIT_ATTRIBUTE,
                   ("max_num_scheduled_tokens", "num_lookahead_tokens", "max_model_len", "num_sampled_tokens_per_step",
                    "adaptive_long_prefill_threshold", "hash_block_size", "scheduler_config", "_inflight_prefills"),
                   room),
        *same_kind("vllm.config.scheduler", "SchedulerConfig", FIELD,
                   ("long_prefill_token_threshold", "max_num_batched_tokens"), room),
        TouchPoint(KV_CACHE_MANAGER, "KVCacheManager.coordinator", INIT_ATTRIBUTE, room + " (blocks each request holds)"),
        TouchPoint("vllm.v1.core.kv_cache_coordinator", "KVCacheCoordinator.get_blocks", METHOD,
                   room + "; " + HOGWILD_SCHEDULER + "._block_ids (a lane's blocks for its group's shape and end record)",
                   params=("self", "request_id")),
        TouchPoint(KV_CACHE_MANAGER, "KVCacheManager.truncate_computed_blocks", METHOD,
                   "scheduler/scheduler._get_local_prefix_cache_hit", params=("self", "blocks", "num_computed_tokens")),
        TouchPoint(REQUEST_QUEUE, "create_request_queue", FUNCTION, room + ": the waiting queue's deferred plain requests",
                   params=("policy",)),
        TouchPoint(REQUEST_QUEUE, "RequestQueue.prepend_requests", METHOD, room, params=("self", "requests")),
        TouchPoint(REQUEST, "Request.__init__", METHOD, replay + ": a finished lane's replay request",
                   params=("self", "request_id", "prompt_token_ids", "sampling_params", "pooling_params"),
                   keywords=("client_index", "arrival_time", "cache_salt", "priority", "lora_request",
                             "block_hasher")),
        *same_kind(REQUEST, "Request", INIT_ATTRIBUTE,
                   ("client_index", "cache_salt", "priority", "lora_request", "num_output_placeholders",
                    "block_hashes", "all_token_ids"), replay),
        *same_kind(REQUEST, "Request", INIT_ATTRIBUTE, ("_block_hasher",),
                   "scheduler/kv.LaneHashers (a lane's blocks past its prompt hashed privately)", writes=True),
        *same_kind(REQUEST, "Request", ATTRIBUTE, ("num_tokens_with_spec",), room),
        TouchPoint(REQUEST, "Request.update_block_hashes", METHOD, replay, params=("self",)),
        TouchPoint(REQUEST, "RequestStatus.FINISHED_STOPPED", CONSTANT, replay),
        TouchPoint(REQUEST, "RequestStatus.FINISHED_ABORTED", CONSTANT, replay),
        TouchPoint("vllm.sampling_params", "SamplingParams", CLASS, replay),
        TouchPoint("vllm.v1.core.sched.request_queue", "SchedulingPolicy", CLASS, room + " (the policy's name)"),
        TouchPoint(REQUEST, "Request.append_output_token_ids", METHOD, FED_AHEAD, params=("self", "token_ids")),
        TouchPoint(REQUEST, "Request.use_structured_output", ATTRIBUTE, FED_AHEAD + " (no feeding ahead under a "
                   "grammar)"),
        *same_kind(REQUEST, "Request", INIT_ATTRIBUTE, ("_output_token_ids", "_all_token_ids", "is_prefill_chunk"),
                   FED_AHEAD + " (forced tokens vLLM did not feed taken back)", writes=True),
        TouchPoint("vllm.v1.core.sched.async_scheduler", "AsyncScheduler._update_after_schedule", SOURCE,
                   FED_AHEAD + ": a request that samples gets its output placeholders after scheduling",
                   text="request.num_output_placeholders += ("),
        TouchPoint("vllm.v1.outputs", "ModelRunnerOutput.prompt_logprobs_dict", FIELD,
                   FED_AHEAD + ": forced tokens' log-probabilities taken out before vLLM reads it"),
        TouchPoint("vllm.v1.outputs", "LogprobsTensors.tolists", METHOD, FED_AHEAD,
                   params=("self", "cu_num_generated_tokens")),
        TouchPoint("vllm.v1.outputs", "LogprobsLists", CLASS, FED_AHEAD),
        *same_kind("vllm.v1.engine", "EngineCoreOutput", FIELD, ("new_token_ids", "new_logprobs"),
                   FED_AHEAD + " (fed forced tokens before the sampled one)"),
    ]


FED_AHEAD = "scheduler/placed.py"


def step_wire() -> list[TouchPoint]:
    """The SchedulerOutput carries the step's wire from the scheduler to the runner's adapter, through every executor."""
    return [
        *same_kind(SCHEDULER_OUTPUT, "SchedulerOutput", FIELD, ("num_scheduled_tokens", "total_num_scheduled_tokens",
                                                               "preempted_req_ids", "scheduled_spec_decode_tokens"),
                   STEP_WIRE),
        TouchPoint(SCHEDULER_OUTPUT, "SchedulerOutput", SETTABLE, STEP_WIRE + ": the step's wire (core/wire.STEP_ATTR)",
                   params=SCHEDULER_OUTPUT_ATTRS),
        TouchPoint(SCHEDULER_OUTPUT, "SchedulerOutput.make_empty", METHOD, "tests (the pickling round trip)",
                   decorator="classmethod"),
        TouchPoint("vllm.distributed.device_communicators.shm_broadcast", "MessageQueue.enqueue", SOURCE,
                   STEP_WIRE + ": the mp executor pickles the SchedulerOutput (its __dict__ travels)",
                   text="pickler.dump(obj)"),
        TouchPoint(PLATFORM_INTERFACE, "Platform.ray_device_key", ATTRIBUTE, "tests/ray_cpu.py (the CPU Ray shim)"),
        TouchPoint("vllm.v1.executor.ray_executor_v2", "RayExecutorV2", CLASS,
                   STEP_WIRE + ": the Ray executor (vLLM 0.32's default, VLLM_USE_RAY_V2_EXECUTOR_BACKEND=1) is a "
                   "MultiprocExecutor: the same MessageQueue pickling",
                   base="vllm.v1.executor.multiproc_executor.MultiprocExecutor"),
        TouchPoint("vllm.v1.executor.ray_utils", "RayWorkerWrapper.execute_model_ray", METHOD,
                   STEP_WIRE + ": the legacy Ray executor (VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0, a compiled Ray graph; "
                   "the SchedulerOutput pickled by Ray); vLLM 0.33 removed it (RayExecutorV2 is its only Ray "
                   "executor, the row above)", params=("self", "execute_model_input"), before="0.33"),
    ]


def detokenizer() -> list[TouchPoint]:
    """scheduler/detok.py: vLLM's incremental detokenizer, handed a stand-in request."""
    stand_in_fields = ("request_id", "sampling_params", "prompt_token_ids", "prompt_embeds")
    readers_of_the_stand_in = (("IncrementalDetokenizer", "from_new_request"),
                               ("BaseIncrementalDetokenizer", "__init__"),
                               ("FastIncrementalDetokenizer", "__init__"),
                               ("SlowIncrementalDetokenizer", "__init__"))
    return [
        TouchPoint("vllm.tokenizers", "cached_tokenizer_from_config", FUNCTION, "scheduler/scheduler._tokenizer",
                   keywords=("model_config",)),
        TouchPoint(DETOKENIZER, "IncrementalDetokenizer.from_new_request", METHOD, TEXT_STREAM,
                   params=("cls", "tokenizer", "request"), decorator="classmethod"),
        *(TouchPoint(DETOKENIZER, f"{cls}.{method}", READS, TEXT_STREAM + " (a stand-in request)",
                     params=stand_in_fields, text="request") for cls, method in readers_of_the_stand_in),
        TouchPoint(DETOKENIZER, "FastIncrementalDetokenizer.decode_next", METHOD, TEXT_STREAM,
                   params=("self", "next_token_id")),
        TouchPoint(DETOKENIZER, "SlowIncrementalDetokenizer.decode_next", METHOD, TEXT_STREAM,
                   params=("self", "next_token_id")),
    ]


SECTIONS = (step_wire, scheduler, detokenizer)
