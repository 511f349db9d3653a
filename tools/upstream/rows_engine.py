"""The table's rows for the engine core and the workers: the step's wire, attention, workers, scheduler."""

from __future__ import annotations

from .kinds import *  # noqa: F401,F403  (the kinds, TouchPoint and the shared names)
from .kinds import TouchPoint, same_kind  # noqa: F401


def runner_hook() -> list[TouchPoint]:
    """runner/runner_hook.py and runner/forcing.py's sampler: the model runner, wrapped per instance."""
    per_instance = RUNNER_HOOK + ": wrapped per runner instance"
    sampler_forcing = "runner/forcing.install_sampler_forcing"
    set_aside = "runner/runner_hook.set_aside_discarded_generators"
    return [
        TouchPoint(GPU_MODEL_RUNNER, "GPUModelRunner", CLASS, RUNNER_HOOK),
        TouchPoint(GPU_MODEL_RUNNER, "GPUModelRunner._prepare_inputs", METHOD, per_instance,
                   params=("self", "scheduler_output", "num_scheduled_tokens")),
        TouchPoint(GPU_MODEL_RUNNER, "GPUModelRunner._dummy_run", METHOD, per_instance, params=("self",)),
        TouchPoint(GPU_MODEL_RUNNER, "GPUModelRunner", SOURCE,
                   RUNNER_HOOK + ": the runner calls the instance's _prepare_inputs",
                   text="self._prepare_inputs(scheduler_output"),
        TouchPoint(GPU_MODEL_RUNNER, "GPUModelRunner", SOURCE,
                   RUNNER_HOOK + ": the runner calls the instance's _dummy_run", text="self._dummy_run("),
        TouchPoint(GPU_MODEL_RUNNER, "GPUModelRunner", SETTABLE, RUNNER_HOOK,
                   params=("_prepare_inputs", "_dummy_run", "propose_draft_token_ids")),
        TouchPoint(GPU_MODEL_RUNNER, "GPUModelRunner.propose_draft_token_ids", METHOD,
                   per_instance + " (drafts with plain attention)",
                   params=("self", "scheduler_output", "sampled_token_ids")),
        TouchPoint(GPU_MODEL_RUNNER, "GPUModelRunner", SOURCE,
                   RUNNER_HOOK + ": the runner drafts through the instance's method",
                   text="self.propose_draft_token_ids("),
        TouchPoint(GPU_MODEL_RUNNER, "GPUModelRunner.sampler", INIT_ATTRIBUTE, sampler_forcing),
        TouchPoint(GPU_MODEL_RUNNER, "GPUModelRunner.speculative_config", INIT_ATTRIBUTE, RUNNER_HOOK),
        TouchPoint("vllm.v1.sample.sampler", "Sampler.apply_logits_processors", METHOD,
                   sampler_forcing + " (forced tokens with speculative decoding)",
                   params=("self", "logits", "sampling_metadata")),
        TouchPoint("vllm.v1.sample.rejection_sampler", "RejectionSampler", SOURCE,
                   sampler_forcing + ": bonus rows go through the runner's sampler",
                   text="bonus_sampler_output = self.sampler("),
        TouchPoint(GPU_MODEL_RUNNER, "GPUModelRunner.input_batch", INIT_ATTRIBUTE, RUNNER_HOOK),
        TouchPoint(GPU_MODEL_RUNNER, "GPUModelRunner.discard_request_mask", INIT_ATTRIBUTE, set_aside),
        TouchPoint(GPU_MODEL_RUNNER, "GPUModelRunner._kernel_block_sizes", ATTRIBUTE,
                   "runner/worker.py (start-up check)"),
        TouchPoint("vllm.v1.worker.cpu_model_runner", "CPUModelRunner", CLASS, RUNNER_HOOK + " (the CPU runner)",
                   base=f"{GPU_MODEL_RUNNER}.GPUModelRunner"),
        TouchPoint("vllm.v1.utils", "CpuGpuBuffer.np", INIT_ATTRIBUTE, set_aside),
        TouchPoint(INPUT_BATCH, "InputBatch.req_ids", ATTRIBUTE, RUNNER_HOOK),
        TouchPoint(INPUT_BATCH, "InputBatch.req_id_to_index", INIT_ATTRIBUTE, "runner/runner_hook.restore_generators"),
        TouchPoint(INPUT_BATCH, "InputBatch.generators", INIT_ATTRIBUTE, set_aside),
        TouchPoint(INPUT_BATCH, "InputBatch.num_reqs", ATTRIBUTE, set_aside),
        TouchPoint(INPUT_BATCH, "InputBatch.num_computed_tokens_cpu", INIT_ATTRIBUTE,
                   "runner/runner_hook.batch_rows (each lane's tokens before the step)"),
        TouchPoint(GPU_MODEL_RUNNER, "GPUModelRunner.requests", INIT_ATTRIBUTE,
                   "runner/runner_hook.block_table (each lane's own block list)"),
        TouchPoint("vllm.v1.worker.gpu_input_batch", "CachedRequestState.block_ids", FIELD,
                   "runner/runner_hook.block_table"),
        TouchPoint(GPU_MODEL_RUNNER, "GPUModelRunner", SOURCE,
                   "core/group_views.py: the runner extends a request's block list in place",
                   text="block_ids.extend(new_ids)"),
    ]


def step_wire() -> list[TouchPoint]:
    """The SchedulerOutput carries the step's wire from the scheduler to the runner hook, through every executor."""
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
                   "the SchedulerOutput pickled by Ray)", params=("self", "execute_model_input")),
    ]


def _attention_backend(module: str, backend: str, builder: str, implementation: str, metadata: str,
                       used_by: str) -> list[TouchPoint]:
    """One attention backend the plugin subclasses: its builder, its implementation and its metadata."""
    return [
        TouchPoint(module, backend, CLASS, used_by),
        TouchPoint(module, f"{backend}.get_builder_cls", METHOD, used_by, params=(), decorator="staticmethod"),
        TouchPoint(module, f"{backend}.get_impl_cls", METHOD, used_by, params=(), decorator="staticmethod"),
        TouchPoint(module, builder, CLASS, used_by, base=f"{ATTENTION_BACKEND}.AttentionMetadataBuilder"),
        TouchPoint(module, f"{builder}.__init__", METHOD, used_by,
                   params=("self", "kv_cache_spec", "layer_names", "vllm_config", "device")),
        TouchPoint(module, f"{builder}.build", METHOD, used_by,
                   params=("self", "common_prefix_len", "common_attn_metadata", "fast_build")),
        TouchPoint(module, f"{builder}.get_cudagraph_support", METHOD, used_by,
                   params=("cls", "vllm_config", "kv_cache_spec"), decorator="classmethod"),
        TouchPoint(module, implementation, CLASS, used_by),
        TouchPoint(module, f"{implementation}.forward", METHOD, used_by,
                   params=("self", "layer", "query", "key", "value", "kv_cache", "attn_metadata", "output")),
        TouchPoint(module, f"{implementation}.num_heads", INIT_ATTRIBUTE, used_by),
        TouchPoint(module, f"{implementation}.head_size", INIT_ATTRIBUTE, used_by),
        TouchPoint(module, f"{implementation}.scale", INIT_ATTRIBUTE, used_by),
        TouchPoint(module, f"{metadata}.num_actual_tokens", FIELD, used_by),
    ]


def attention_backends() -> list[TouchPoint]:
    """runner/backend.py and backend_cuda.py: the Hogwild attention backends over vLLM's CPU and FlashAttention."""
    return [
        TouchPoint(ATTENTION_BACKEND, "AttentionCGSupport.NEVER", CONSTANT,
                   CPU_BACKEND + ": no full CUDA graphs with Hogwild on"),
        TouchPoint(ATTENTION_BACKEND, "AttentionMetadataBuilder.device", INIT_ATTRIBUTE,
                   CPU_BACKEND + " (the plan's device)"),
        TouchPoint(ATTENTION_BACKEND, "CommonAttentionMetadata.replace", METHOD,
                   "runner/backend.without_native_context", params=("self",)),
        *same_kind(ATTENTION_BACKEND, "CommonAttentionMetadata", FIELD,
                   ("num_reqs", "num_actual_tokens", "query_start_loc_cpu", "seq_lens", "seq_lens_cpu_upper_bound",
                    "_num_computed_tokens_cache"), CPU_BACKEND),
        TouchPoint(KV_CACHE_INTERFACE, "KVCacheSpec.block_size", FIELD, CPU_BACKEND + " (HogwildBuilderMixin)"),
        *_attention_backend(CPU_ATTENTION, "CPUAttentionBackend", "CPUAttentionMetadataBuilder",
                            "CPUAttentionBackendImpl", "CPUAttentionMetadata", CPU_BACKEND),
        *_attention_backend(FLASH_ATTENTION, "FlashAttentionBackend", "FlashAttentionMetadataBuilder",
                            "FlashAttentionImpl", "FlashAttentionMetadata", CUDA_BACKEND),
        *same_kind(CPU_ATTENTION, "CPUAttentionMetadataBuilder", INIT_ATTRIBUTE, ("isa", "dtype", "block_size",
                                                                                  "head_dim"),
                   CPU_BACKEND + ": the cache layout probe"),
        TouchPoint(CPU_ATTENTION, "CPUAttentionBackendImpl", SOURCE,
                   "runner/cpu_layout.py: the CPU cache's K|V split",
                   text="key_cache, value_cache = kv_cache.chunk(2, dim=2)"),
        TouchPoint("vllm._custom_ops", "cpu_attn_reshape_and_cache", FUNCTION, "runner/cpu_layout.py: the probe",
                   params=("key", "value", "key_cache", "value_cache", "slot_mapping", "isa")),
        TouchPoint(FLASH_ATTENTION, "FlashAttentionImpl", SOURCE,
                   CUDA_BACKEND + ": FlashAttention's cache split, read the same way",
                   text="key_cache, value_cache = kv_cache.transpose(1, 2).split(self.head_size, dim=-1)"),
    ]


def _worker(module: str, worker: str, used_by: str) -> list[TouchPoint]:
    """One vLLM worker the plugin subclasses (the runner hook at init_device, the checks at start-up)."""
    return [
        TouchPoint(module, worker, CLASS, used_by),
        TouchPoint(module, f"{worker}.init_device", METHOD, used_by + ": the runner hook", params=("self",)),
        TouchPoint(module, f"{worker}.initialize_from_config", METHOD, used_by + ": the start-up checks",
                   params=("self", "kv_cache_config")),
        TouchPoint(module, f"{worker}.model_runner", ATTRIBUTE, used_by),
        TouchPoint(module, f"{worker}.vllm_config", INIT_ATTRIBUTE, used_by),
        TouchPoint(module, f"{worker}.cache_config", INIT_ATTRIBUTE, used_by),
    ]


def workers() -> list[TouchPoint]:
    """runner/worker.py, worker_cuda.py and backend_override.py."""
    backend_override = "runner/backend_override.py"
    return [
        *_worker("vllm.v1.worker.cpu_worker", "CPUWorker", CPU_WORKER),
        *_worker("vllm.v1.worker.gpu_worker", "Worker", CUDA_WORKER),
        TouchPoint("vllm.config", "get_layers_from_vllm_config", FUNCTION, CPU_WORKER,
                   params=("vllm_config", "layer_type")),
        TouchPoint("vllm.model_executor.layers.attention_layer_base", "AttentionLayerBase", CLASS, CPU_WORKER),
        TouchPoint(ATTENTION_LAYER, "Attention", CLASS, CPU_WORKER,
                   base="vllm.model_executor.layers.attention_layer_base.AttentionLayerBase"),
        TouchPoint(ATTENTION_LAYER, "Attention.impl", INIT_ATTRIBUTE, CPU_WORKER + " (layer.impl)"),
        TouchPoint(KV_CACHE_INTERFACE, "KVCacheConfig.kv_cache_groups", FIELD, CPU_WORKER),
        TouchPoint(BACKEND_REGISTRY, "AttentionBackendEnum", CLASS, CPU_WORKER),
        TouchPoint(BACKEND_REGISTRY, "AttentionBackendEnum.CPU_ATTN", CONSTANT, CPU_WORKER),
        TouchPoint(BACKEND_REGISTRY, "AttentionBackendEnum.FLASH_ATTN", CONSTANT, CUDA_WORKER),
        TouchPoint(BACKEND_REGISTRY, "register_backend", FUNCTION, backend_override, params=("backend", "class_path")),
        TouchPoint("vllm.v1.attention.selector", "_cached_get_attn_backend", FUNCTION, backend_override,
                   decorator="cache"),
    ]


def cpu_sampling() -> list[TouchPoint]:
    """runner/cpu_sampling.py: vLLM 0.32's CPU rejection sampler, fixed in the worker process."""
    rejection = "vllm.v1.sample.rejection_sampler"
    topk = "vllm.v1.sample.ops.topk_topp_sampler"
    return [
        TouchPoint("vllm.triton_utils", "HAS_TRITON", CONSTANT, CPU_SAMPLING + " (CPU fallbacks are registered "
                   "only without Triton)"),
        TouchPoint("vllm.triton_utils.dispatcher", "register_kernels", FUNCTION, CPU_SAMPLING, params=("overrides",)),
        TouchPoint("vllm.triton_utils.dispatcher", "KernelOverride.func", INIT_ATTRIBUTE,
                   CPU_SAMPLING + ": the fallback registered now, probed"),
        TouchPoint("vllm.platforms.cpu", "CpuPlatform.register_triton_kernel_overrides", SOURCE,
                   CPU_SAMPLING + ": the kernel it replaces has a CPU fallback",
                   text='"vllm.v1.sample.rejection_sampler.expand_kernel"'),
        TouchPoint("vllm.v1.worker.worker_base", "WorkerWrapperBase.init_worker", SOURCE,
                   CPU_SAMPLING + ": vLLM registers its fallbacks before the worker exists",
                   text="current_platform.register_triton_kernel_overrides()"),
        TouchPoint(rejection, "expand_kernel", CONSTANT, CPU_SAMPLING),
        TouchPoint("vllm.utils.cpu_triton_utils", "_expand_kernel_impl", FUNCTION,
                   CPU_SAMPLING + ": the fix takes its parameters", exact=True,
                   params=("output", "input_val", "cu_num_tokens", "replace_from", "replace_to", "MAX_NUM_TOKENS")),
        TouchPoint(topk, "apply_top_k_only", FUNCTION, CPU_SAMPLING, exact=True, params=("logits", "k")),
        TouchPoint(topk, "apply_top_k_top_p_pytorch", SOURCE,
                   CPU_SAMPLING + ": the sampler finds apply_top_k_only on its module",
                   text="return apply_top_k_only(logits, k)"),
    ]


def forcing() -> list[TouchPoint]:
    """runner/forcing.py: forced tokens as a logits processor."""
    return [
        TouchPoint(LOGITS_PROCESSOR, "LogitsProcessor", CLASS, FORCING),
        TouchPoint(LOGITS_PROCESSOR, "BatchUpdate", CLASS, FORCING),
        TouchPoint(LOGITS_PROCESSOR, "LogitsProcessor", ABSTRACT, FORCING + " (ForcedTokens implements these)",
                   params=("__init__", "apply", "is_argmax_invariant", "update_state")),
        TouchPoint(LOGITS_PROCESSOR, "LogitsProcessor.__init__", METHOD, FORCING,
                   params=("self", "vllm_config", "device", "is_pin_memory")),
        TouchPoint(LOGITS_PROCESSOR, "LogitsProcessor.apply", METHOD, FORCING, params=("self", "logits")),
        TouchPoint(LOGITS_PROCESSOR, "LogitsProcessor.update_state", METHOD, FORCING, params=("self", "batch_update")),
        TouchPoint(LOGITS_PROCESSOR, "LogitsProcessor.is_argmax_invariant", METHOD, FORCING, params=("self",)),
        TouchPoint(LOGITS_PROCESSOR, "_load_logitsprocs_by_fqcns", SOURCE,
                   FORCING + ": 'module:Class' in logits_processors", text='split(":")'),
    ]


def scheduler() -> list[TouchPoint]:
    """scheduler/scheduler.py: the Hogwild scheduler over vLLM's, its KV cache manager, queues and requests."""
    queue_methods = (("add_request", ("self", "request")), ("prepend_request", ("self", "request")),
                     ("remove_request", ("self", "request")), ("remove_requests", ("self", "requests")),
                     ("__iter__", ("self",)))
    lock_step = "scheduler/scheduler.schedule (lock-step holds of running workers)"
    return [
        TouchPoint(SCHEDULER, "Scheduler.__init__", METHOD, HOGWILD_SCHEDULER, params=("self", "vllm_config")),
        TouchPoint(SCHEDULER, "Scheduler.add_request", METHOD, HOGWILD_SCHEDULER, params=("self", "request")),
        TouchPoint(SCHEDULER, "Scheduler.schedule", METHOD, HOGWILD_SCHEDULER, params=("self",)),
        TouchPoint(SCHEDULER, "Scheduler.update_from_output", METHOD, HOGWILD_SCHEDULER + "; benchmarks/bench",
                   params=("self", "scheduler_output", "model_runner_output")),
        TouchPoint(SCHEDULER, "Scheduler._free_blocks", METHOD, HOGWILD_SCHEDULER, params=("self", "request")),
        TouchPoint(SCHEDULER, "Scheduler._free_request_blocks", METHOD, HOGWILD_SCHEDULER, params=("self", "request")),
        TouchPoint(SCHEDULER, "Scheduler.get_request_counts", METHOD, HOGWILD_SCHEDULER, params=("self",)),
        TouchPoint(SCHEDULER, "Scheduler._update_request_with_output", METHOD,
                   HOGWILD_SCHEDULER + " (accepted runs, steps per member)",
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
        TouchPoint(KV_CACHE_MANAGER, "KVCacheManager.get_block_ids", METHOD, HOGWILD_SCHEDULER,
                   params=("self", "request_id")),
        TouchPoint(KV_CACHE_MANAGER, "KVCacheManager.block_pool", INIT_ATTRIBUTE, HOGWILD_SCHEDULER),
        TouchPoint(KV_CACHE_MANAGER, "KVCacheManager.watermark_blocks", INIT_ATTRIBUTE, HOGWILD_SCHEDULER),
        TouchPoint("vllm.v1.core.block_pool", "BlockPool.get_num_free_blocks", METHOD, HOGWILD_SCHEDULER,
                   params=("self",)),
        *(TouchPoint(REQUEST_QUEUE, f"RequestQueue.{method}", METHOD, HOGWILD_SCHEDULER, params=params)
          for method, params in queue_methods),
        TouchPoint(REQUEST, "Request", CLASS, HOGWILD_SCHEDULER),
        *same_kind(REQUEST, "Request", INIT_ATTRIBUTE, ("spec_token_ids",),
                   HOGWILD_SCHEDULER + " (drafts dropped where text is placed)", writes=True),
        *same_kind(REQUEST, "Request", INIT_ATTRIBUTE, ("request_id", "max_tokens", "num_prompt_tokens",
                                                        "arrival_time", "num_computed_tokens", "output_token_ids",
                                                        "sampling_params", "prompt_token_ids"), HOGWILD_SCHEDULER),
        *same_kind(REQUEST, "Request", ATTRIBUTE, ("num_tokens", "num_output_tokens"), HOGWILD_SCHEDULER),
        TouchPoint(REQUEST, "Request.is_finished", METHOD, HOGWILD_SCHEDULER, params=("self",)),
        *same_kind(REQUEST, "Request", INIT_ATTRIBUTE, ("status",), lock_step),
        TouchPoint(REQUEST, "RequestStatus.RUNNING", CONSTANT, lock_step),
        *preemption_and_replay(),
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
        TouchPoint("vllm.v1.core.kv_cache_coordinator", "KVCacheCoordinator.get_blocks", METHOD, room,
                   params=("self", "request_id")),
        TouchPoint(KV_CACHE_MANAGER, "KVCacheManager.truncate_computed_blocks", METHOD,
                   "scheduler/scheduler._get_local_prefix_cache_hit", params=("self", "blocks", "num_computed_tokens")),
        TouchPoint(REQUEST_QUEUE, "create_request_queue", FUNCTION, room + ": the waiting queue held back",
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
                   "scheduler/kv.lane_private_hasher (a lane's blocks past its prompt hashed privately)", writes=True),
        *same_kind(REQUEST, "Request", ATTRIBUTE, ("num_tokens_with_spec",), room),
        TouchPoint(REQUEST, "Request.update_block_hashes", METHOD, replay, params=("self",)),
        TouchPoint(REQUEST, "RequestStatus.FINISHED_STOPPED", CONSTANT, replay),
        TouchPoint(REQUEST, "RequestStatus.FINISHED_ABORTED", CONSTANT, replay),
        TouchPoint("vllm.sampling_params", "SamplingParams", CLASS, replay),
        TouchPoint("vllm.v1.core.sched.request_queue", "SchedulingPolicy", CLASS, room + " (the policy's name)"),
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


def tools() -> list[TouchPoint]:
    """tools/demo.py and benchmarks/bench."""
    return [
        TouchPoint("vllm", "LLM", CONSTANT, TOOLS),
        TouchPoint("vllm", "SamplingParams", CONSTANT, TOOLS),
        TouchPoint(ENTRYPOINTS_LLM, "LLM.llm_engine", INIT_ATTRIBUTE, TOOLS + "; serving/requests.add_chat_requests"),
        TouchPoint(ENTRYPOINTS_LLM, "LLM.enqueue_chat", METHOD, "tools/demo.py",
                   params=("self", "messages", "sampling_params"), keywords=("use_tqdm",)),
        TouchPoint(LLM_ENGINE, "LLMEngine.engine_core", INIT_ATTRIBUTE, "benchmarks/bench"),
        TouchPoint(LLM_ENGINE, "LLMEngine.vllm_config", INIT_ATTRIBUTE,
                   "benchmarks/bench; serving/requests.add_chat_requests"),
        TouchPoint(LLM_ENGINE, "LLMEngine.step", METHOD, "tools/demo.py", params=("self",)),
        TouchPoint(LLM_ENGINE, "LLMEngine.has_unfinished_requests", METHOD, "tools/demo.py", params=("self",)),
        TouchPoint("vllm.v1.engine.core_client", "InprocClient.engine_core", INIT_ATTRIBUTE, "benchmarks/bench"),
        TouchPoint("vllm.v1.engine.core", "EngineCore.scheduler", INIT_ATTRIBUTE, "benchmarks/bench"),
    ]
