"""The workers: the model runners (V1 and V2), attention backends, worker classes, forced tokens, CPU sampling.

No class wraps here either. The workers' hooks, each by the plugin's code
that owns the object (``instance``) or in the worker's own process only.
Each row of a runner's adapter says which runner (``runner``); the V1 runner's
rows end at vLLM 0.33 (0.34 deleted it).

V1 (:mod:`vllm_hogwild.runner.v1`):

- the model runner's ``_prepare_inputs``: each step's wire becomes the
  attention metadata's Hogwild rows, and its forced tokens are written into
  the runner's batch. Retired by ``patches/03-attention-step-extras.patch``
  (top-level); its ``_dummy_run`` and ``propose_draft_token_ids`` clear the
  step's views (no diff would retire those: see their reasons); its
  ``_get_prompt_logprobs_dict`` adds forced tokens' log-probabilities,
  retired with the forced tokens' writing by ``12-runner-placed-tokens.patch``;
- the sampler's ``apply_logits_processors``: forced tokens with speculative
  decoding;
- vLLM 0.32 bugs fixed in a Hogwild worker process on the CPU with speculative
  decoding (:mod:`vllm_hogwild.runner.cpu_sampling`): the rejection sampler's
  ``expand_kernel`` fallback (``kernel``) and ``apply_top_k_only``
  (``function``). Retired by ``11-cpu-rejection-sampler.patch``;
- ``09-cpu-seeded-chunked-prefill.patch``: retires
  ``runner/v1.set_aside_discarded_generators`` (part of the adapter).

Model Runner V2 (:mod:`vllm_hogwild.runner.v2`), through the seams V2 has for
per-request state (its model state's ``model_specific_attn_metadata``, custom
logits processors of its interface):

- the runner's ``prepare_inputs``: the step's wire, the scheduler's cut runs
  rewound, the forced tokens written, the views made;
- the model state's ``prepare_attn``: the views passed to the Hogwild
  builders as ``model_specific_attn_metadata``;
- the prompt-logprobs worker's ``compute_prompt_logprobs``: forced tokens'
  log-probabilities.
"""

from __future__ import annotations

from dataclasses import replace

from vllm_hogwild.patches.points import *  # noqa: F401,F403  (the kinds, TouchPoint and the shared names)
from vllm_hogwild.patches.points import TouchPoint, same_kind  # noqa: F401

_RUNNER = "vllm.v1.worker.gpu_model_runner:GPUModelRunner"
_V1 = "vllm_hogwild.runner.v1"
_V2 = "vllm_hogwild.runner.v2"
NO_V2_PATCH = ("none: Model Runner V2 hands per-request state to the attention builders and the samplers through "
               "this seam; the adapter uses it as it is, and a hook of its own upstream would be the same call")

# -- the hooks: target -> (mechanism, where, patch) ----------------------------------------------------

HOOKS = {
    f"{_RUNNER}._prepare_inputs": ("instance", _V1, "03-attention-step-extras.patch"),
    f"{_RUNNER}._dummy_run": (
        "instance", _V1,
        "none: it clears the last real step's views before a dummy batch; patch 03 only hands the runner "
        "each real step's extras, so a reset at the start of _dummy_run upstream would still be needed"),
    f"{_RUNNER}.propose_draft_token_ids": (
        "instance", _V1,
        "none: a draft model proposes over plain attention, so the step's views are cleared first; patch 03 "
        "does not cover it, and a per-forward extras argument upstream would be needed to retire it"),
    f"{_RUNNER}._get_prompt_logprobs_dict": ("instance", _V1, "12-runner-placed-tokens.patch"),
    "vllm.v1.sample.sampler:Sampler.apply_logits_processors": (
        "instance", _V1,
        "none: vLLM refuses custom logits processors with speculative decoding by design; forcing runs "
        "as one where it applies, in the sampler"),
    "vllm.v1.sample.rejection_sampler:expand_kernel":
        ("kernel", "vllm_hogwild.runner.cpu_sampling", "11-cpu-rejection-sampler.patch"),
    "vllm.v1.sample.ops.topk_topp_sampler:apply_top_k_only":
        ("function", "vllm_hogwild.runner.cpu_sampling", "11-cpu-rejection-sampler.patch"),
    "vllm.v1.worker.gpu.model_runner:GPUModelRunner.prepare_inputs": (
        "instance", _V2,
        "none: V2 has no seam for a step's extras from the scheduler, and its decoding rows are built from its "
        "own last sampled token and drafts; a hook upstream would take the SchedulerOutput's extras to the "
        "model state (as 03 does for V1) and let forced tokens be fed (as 12 does for V1)"),
    "vllm.v1.worker.gpu.model_states.default:DefaultModelState.prepare_attn": ("instance", _V2, NO_V2_PATCH),
    "vllm.v1.cudagraph_dispatcher:CudagraphDispatcher.dispatch": (
        "instance", _V1,
        "none: a step whose Hogwild plan may not fit the buffers a full CUDA graph captured must not replay it, "
        "and the builders must know when one replays; vLLM's dispatcher asks the builders nothing per step (their "
        "CUDA graph support is one answer at start-up), so a per-step veto upstream would be a new builder hook"),
    "vllm.v1.worker.gpu.model_runner:GPUModelRunner.execute_model": (
        "instance", _V2,
        "none: V2 chooses the step's CUDA graph before prepare_inputs; the Hogwild plan's bound is taken from the "
        "SchedulerOutput first (a per-step builder hook upstream, as for the dispatch, would retire it)"),
    "vllm.v1.worker.gpu.cudagraph_utils:CudaGraphManager.dispatch": (
        "instance", _V2,
        "none: as V1's dispatcher: no builder is asked per step whether a batch may replay a full graph"),
    "vllm.v1.worker.gpu.sample.prompt_logprob:PromptLogprobsWorker.compute_prompt_logprobs": (
        "instance", _V2,
        "none: V2 computes log-probabilities of fed tokens only for prompts; the forced tokens' are added to the "
        "same dict, as 12 does for V1"),
}


# -- the rows ----------------------------------------------------------------------------------------

def runner_v1() -> list[TouchPoint]:
    """runner/v1.py: the V1 model runner, wrapped per instance (vLLM 0.32 and 0.33)."""
    per_instance = RUNNER_V1 + ": wrapped per runner instance"
    FED_AHEAD = "runner/v1.write_fed_ahead / fed_ahead_logprobs (forced tokens fed ahead)"
    sampler_forcing = "runner/v1.install_sampler_forcing"
    set_aside = "runner/v1.set_aside_discarded_generators"
    rows = [
        TouchPoint(GPU_MODEL_RUNNER, "GPUModelRunner", CLASS, RUNNER_V1),
        TouchPoint(GPU_MODEL_RUNNER, "GPUModelRunner._prepare_inputs", METHOD, per_instance,
                   params=("self", "scheduler_output", "num_scheduled_tokens")),
        TouchPoint(GPU_MODEL_RUNNER, "GPUModelRunner._dummy_run", METHOD, per_instance, params=("self",)),
        TouchPoint(GPU_MODEL_RUNNER, "GPUModelRunner", SOURCE,
                   RUNNER_V1 + ": the runner calls the instance's _prepare_inputs",
                   text="self._prepare_inputs(scheduler_output"),
        TouchPoint(GPU_MODEL_RUNNER, "GPUModelRunner", SOURCE,
                   RUNNER_V1 + ": the runner calls the instance's _dummy_run", text="self._dummy_run("),
        TouchPoint(GPU_MODEL_RUNNER, "GPUModelRunner", SETTABLE, RUNNER_V1,
                   params=("_prepare_inputs", "_dummy_run", "propose_draft_token_ids", "_get_prompt_logprobs_dict")),
        TouchPoint(GPU_MODEL_RUNNER, "GPUModelRunner._get_prompt_logprobs_dict", METHOD,
                   per_instance + " (forced tokens' log-probabilities: runner/v1.fed_ahead_logprobs)",
                   params=("self", "hidden_states", "num_scheduled_tokens")),
        TouchPoint(GPU_MODEL_RUNNER, "GPUModelRunner", SOURCE,
                   RUNNER_V1 + ": the runner gets fed tokens' log-probabilities through the instance's method",
                   text="self._get_prompt_logprobs_dict("),
        *same_kind(GPU_MODEL_RUNNER, "GPUModelRunner", INIT_ATTRIBUTE, ("query_start_loc", "model_config"), FED_AHEAD),
        TouchPoint("vllm.v1.sample.sampler", "Sampler.compute_logprobs", METHOD, FED_AHEAD, params=("logits",),
                   decorator="staticmethod"),
        TouchPoint("vllm.v1.sample.sampler", "Sampler.gather_logprobs", METHOD, FED_AHEAD,
                   params=("logprobs", "num_logprobs", "token_ids"), decorator="staticmethod"),
        *same_kind(INPUT_BATCH, "InputBatch", INIT_ATTRIBUTE,
                   ("num_logprobs", "num_prompt_tokens", "token_ids_cpu", "is_token_ids", "num_tokens_no_spec"), FED_AHEAD),
        TouchPoint("vllm.v1.worker.gpu_input_batch", "CachedRequestState.output_token_ids", FIELD, FED_AHEAD),
        TouchPoint(GPU_MODEL_RUNNER, "GPUModelRunner.propose_draft_token_ids", METHOD,
                   per_instance + " (drafts with plain attention)",
                   params=("self", "scheduler_output", "sampled_token_ids")),
        TouchPoint(GPU_MODEL_RUNNER, "GPUModelRunner", SOURCE,
                   RUNNER_V1 + ": the runner drafts through the instance's method",
                   text="self.propose_draft_token_ids("),
        TouchPoint(GPU_MODEL_RUNNER, "GPUModelRunner.sampler", INIT_ATTRIBUTE, sampler_forcing),
        TouchPoint(GPU_MODEL_RUNNER, "GPUModelRunner.speculative_config", INIT_ATTRIBUTE, RUNNER_V1),
        TouchPoint("vllm.v1.sample.sampler", "Sampler.apply_logits_processors", METHOD,
                   sampler_forcing + " (forced tokens with speculative decoding)",
                   params=("self", "logits", "sampling_metadata")),
        TouchPoint("vllm.v1.sample.rejection_sampler", "RejectionSampler", SOURCE,
                   sampler_forcing + ": bonus rows go through the runner's sampler",
                   text="bonus_sampler_output = self.sampler("),
        TouchPoint(GPU_MODEL_RUNNER, "GPUModelRunner.input_batch", INIT_ATTRIBUTE, RUNNER_V1),
        TouchPoint(GPU_MODEL_RUNNER, "GPUModelRunner.discard_request_mask", INIT_ATTRIBUTE, set_aside),
        TouchPoint(GPU_MODEL_RUNNER, "GPUModelRunner._kernel_block_sizes", ATTRIBUTE,
                   "runner/worker.py (start-up check)"),
        TouchPoint("vllm.v1.worker.cpu_model_runner", "CPUModelRunner", CLASS, RUNNER_V1 + " (the CPU runner)",
                   base=f"{GPU_MODEL_RUNNER}.GPUModelRunner"),
        TouchPoint("vllm.v1.utils", "CpuGpuBuffer.np", INIT_ATTRIBUTE, set_aside),
        TouchPoint(INPUT_BATCH, "InputBatch.req_ids", ATTRIBUTE, RUNNER_V1),
        TouchPoint(INPUT_BATCH, "InputBatch.req_id_to_index", INIT_ATTRIBUTE, "runner/v1.restore_generators"),
        TouchPoint(INPUT_BATCH, "InputBatch.generators", INIT_ATTRIBUTE, set_aside),
        TouchPoint(INPUT_BATCH, "InputBatch.num_reqs", ATTRIBUTE, set_aside),
        TouchPoint(INPUT_BATCH, "InputBatch.num_computed_tokens_cpu", INIT_ATTRIBUTE,
                   "runner/v1.batch_rows (each lane's tokens before the step)"),
        TouchPoint(GPU_MODEL_RUNNER, "GPUModelRunner.requests", INIT_ATTRIBUTE,
                   "runner/v1.block_table (each lane's own block list)"),
        TouchPoint("vllm.v1.worker.gpu_input_batch", "CachedRequestState.block_ids", FIELD,
                   "runner/v1.block_table"),
        TouchPoint(GPU_MODEL_RUNNER, "GPUModelRunner", SOURCE,
                   "core/views/registry.py: the runner extends a request's block list in place",
                   text="block_ids.extend(new_ids)"),
        # full CUDA graphs: the step's graph chosen after _prepare_inputs, through the dispatcher instance
        TouchPoint(GPU_MODEL_RUNNER, "GPUModelRunner.cudagraph_dispatcher", INIT_ATTRIBUTE, GRAPH_CHOICE_V1),
        TouchPoint(CUDAGRAPH_DISPATCHER, "CudagraphDispatcher.dispatch", METHOD, GRAPH_CHOICE_V1,
                   params=("self", "num_tokens", "uniform_decode", "has_lora", "num_active_loras", "valid_modes",
                           "invalid_modes")),
        TouchPoint(CUDAGRAPH_DISPATCHER, "CudagraphDispatcher", SETTABLE, GRAPH_CHOICE_V1, params=("dispatch",)),
        TouchPoint(GPU_MODEL_RUNNER, "GPUModelRunner._determine_batch_execution_and_padding", SOURCE,
                   GRAPH_CHOICE_V1 + ": the step's graph is the dispatcher's answer, invalid_modes by keyword",
                   text="invalid_modes={CUDAGraphMode.FULL} if disable_full else None"),
        TouchPoint(GPU_MODEL_RUNNER, "GPUModelRunner.execute_model", SOURCE,
                   GRAPH_CHOICE_V1 + ": the graph is chosen after _prepare_inputs",
                   text="self._determine_batch_execution_and_padding("),
    ]
    return [replace(row, **V1_ONLY) for row in rows]


def runner_v2() -> list[TouchPoint]:
    """runner/v2.py: Model Runner V2 (vLLM 0.32 to 0.34), through its seams for per-request state."""
    per_instance = RUNNER_V2 + ": wrapped per instance"
    model_state = "vllm.v1.worker.gpu.model_states"
    logprobs = f"{V2_SAMPLE}.prompt_logprob"
    FED_AHEAD = RUNNER_V2 + ".write_fed_ahead / fed_ahead_logprobs (forced tokens fed ahead)"
    rewind = RUNNER_V2 + ".rewind (accepted runs the scheduler cut)"
    blocks = RUNNER_V2 + ".BlockLists (each lane's block list)"
    refused = RUNNER_V2 + ".check_runner (settings that reshape the batch, refused)"
    rows = [
        TouchPoint(V2_RUNNER, "GPUModelRunner", CLASS, RUNNER_V2),
        TouchPoint("vllm.v1.worker.cpu.model_runner", "CPUModelRunner", CLASS, RUNNER_V2 + " (the CPU runner)",
                   base=f"{V2_RUNNER}.GPUModelRunner"),
        TouchPoint(V2_RUNNER, "GPUModelRunner.prepare_inputs", METHOD, per_instance,
                   params=("self", "scheduler_output", "batch_req_state", "batch_desc", "num_active_loras")),
        TouchPoint(V2_RUNNER, "GPUModelRunner", SOURCE, RUNNER_V2 + ": the runner calls the instance's prepare_inputs",
                   text="input_batch = self.prepare_inputs(scheduler_output"),
        TouchPoint(V2_RUNNER, "GPUModelRunner", SOURCE,
                   RUNNER_V2 + ": the runner builds the step's metadata through its model state's prepare_attn",
                   text="attn_metadata = self.model_state.prepare_attn(input_batch"),
        TouchPoint(V2_RUNNER, "GPUModelRunner", SOURCE,
                   RUNNER_V2 + ": the runner gets fed tokens' log-probabilities through its worker's method",
                   text="self.prompt_logprobs_worker.compute_prompt_logprobs("),
        TouchPoint(V2_RUNNER, "GPUModelRunner", SETTABLE, RUNNER_V2, params=("prepare_inputs", "execute_model")),
        # full CUDA graphs: the step's graph chosen first in execute_model, through the graph manager instance
        TouchPoint(V2_RUNNER, "GPUModelRunner.execute_model", METHOD, GRAPH_CHOICE_V2,
                   params=("self", "scheduler_output")),
        TouchPoint(V2_RUNNER, "GPUModelRunner", SOURCE, GRAPH_CHOICE_V2 + ": dummy runs go through the instance",
                   text="self.execute_model("),
        TouchPoint(V2_RUNNER, "GPUModelRunner.cudagraph_manager", INIT_ATTRIBUTE, GRAPH_CHOICE_V2),
        TouchPoint(CUDAGRAPH_UTILS, "CudaGraphManager.dispatch", METHOD, GRAPH_CHOICE_V2,
                   params=("self", "num_reqs", "num_tokens")),
        TouchPoint(CUDAGRAPH_UTILS, "ModelCudaGraphManager", CLASS, GRAPH_CHOICE_V2,
                   base=f"{CUDAGRAPH_UTILS}.CudaGraphManager"),
        TouchPoint(CUDAGRAPH_UTILS, "CudaGraphManager", SETTABLE, GRAPH_CHOICE_V2, params=("dispatch",)),
        *same_kind(CUDAGRAPH_UTILS, "BatchExecutionDescriptor", FIELD,
                   ("cg_mode", "num_tokens", "num_reqs", "num_active_loras", "num_ubatches"), GRAPH_CHOICE_V2),
        TouchPoint("vllm.v1.worker.gpu.dp_utils", "dispatch_cg_and_sync_dp", SOURCE,
                   GRAPH_CHOICE_V2 + ": the step's graph is the manager's answer",
                   text="batch_desc = cudagraph_manager.dispatch("),
        *same_kind(V2_RUNNER, "GPUModelRunner", INIT_ATTRIBUTE, ("req_states", "sampler", "model_config",
                                                                  "prompt_logprobs_worker"), RUNNER_V2),
        TouchPoint(V2_RUNNER, "GPUModelRunner.model_state", ATTRIBUTE, RUNNER_V2 + " (made as the model loads)"),
        TouchPoint(V2_RUNNER, "GPUModelRunner.load_model", METHOD, "runner/worker.py: the adapter after the model",
                   params=("self",)),
        *same_kind(V2_RUNNER, "GPUModelRunner", INIT_ATTRIBUTE, ("pcp_manager", "ubatch_runner",
                                                                  "adaptive_verification", "batch_sharder", "use_pp"),
                   refused),
        TouchPoint(V2_RUNNER, "GPUModelRunner", SOURCE, "runner/worker.kernel_block_sizes (start-up check)",
                   text="self.kernel_block_sizes,"),
        # the model state: the views go to the Hogwild builders as model-specific metadata
        TouchPoint(f"{model_state}.default", "DefaultModelState", CLASS, RUNNER_V2,
                   base=f"{model_state}.interface.ModelState"),
        TouchPoint(f"{model_state}.default", "DefaultModelState.prepare_attn", METHOD, per_instance,
                   params=("self", "input_batch"), keywords=("model_specific_attn_metadata",)),
        TouchPoint(f"{model_state}.default", "DefaultModelState", SETTABLE, RUNNER_V2, params=("prepare_attn",)),
        TouchPoint(f"{model_state}.interface", "ModelSpecificAttnMetadata", CLASS, RUNNER_V2 + ".HogwildAttnMetadata"),
        TouchPoint(f"{model_state}.interface", "ModelSpecificAttnMetadata.get_extra_attn_kwargs", METHOD,
                   RUNNER_V2 + ".HogwildAttnMetadata", params=("self", "attn_metadata_builder", "num_reqs")),
        TouchPoint("vllm.v1.worker.gpu.attn_utils", "build_attn_metadata", SOURCE,
                   RUNNER_V2 + ": the model-specific metadata's keyword arguments reach each builder",
                   text="model_specific_attn_metadata.get_extra_attn_kwargs("),
        TouchPoint("vllm.v1.worker.utils", "AttentionGroup.build_metadata", SOURCE,
                   RUNNER_V2 + ": ... as keyword arguments of the builder's build (runner/backend.py: hogwild_views)",
                   text="**kwargs,"),
        # the batch V2 made: its rows, their lengths, its input ids
        *same_kind(V2_INPUT_BATCH, "InputBatch", FIELD,
                   ("req_ids", "num_tokens", "num_computed_tokens_np", "num_scheduled_tokens", "num_draft_tokens_per_req",
                    "idx_mapping_np", "query_start_loc_np", "input_ids"), RUNNER_V2 + ".batch_rows / write_fed_ahead"),
        # V2's own state of each request: its slot, token ids, length, computed tokens, last sampled token
        *same_kind(V2_STATES, "RequestState", INIT_ATTRIBUTE,
                   ("req_id_to_index", "all_token_ids", "total_len", "num_computed_tokens", "last_sampled_tokens"),
                   f"{FED_AHEAD}; {rewind}"),
        TouchPoint("vllm.v1.worker.gpu.buffer_utils", "StagedWriteTensor.stage_write", METHOD, FED_AHEAD,
                   params=("self", "index", "start", "x")),
        TouchPoint("vllm.v1.worker.gpu.buffer_utils", "StagedWriteTensor.stage_write_elem", METHOD,
                   f"{FED_AHEAD}; {rewind}", params=("self", "index", "x")),
        TouchPoint("vllm.v1.worker.gpu.buffer_utils", "StagedWriteTensor.apply_write", METHOD, f"{FED_AHEAD}; {rewind}",
                   params=("self",)),
        TouchPoint("vllm.v1.worker.gpu.buffer_utils", "StagedWriteTensor.gpu", INIT_ATTRIBUTE, f"{FED_AHEAD}; {rewind}"),
        TouchPoint(V2_INPUT_BATCH, "_combine_sampled_and_draft_tokens_kernel", SOURCE,
                   RUNNER_V2 + ".write_fed_ahead: a decoding row is its last sampled token and its drafts, at its end",
                   text="tl.store(input_ids_ptr + logits_start, last_token_id)"),
        TouchPoint(V2_INPUT_BATCH, "_post_update_kernel", SOURCE,
                   rewind + ": V2 advances a request's computed tokens from its own sampler's result",
                   text="computed_delta = query_len - num_rejected"),
        TouchPoint(SCHEDULER, "Scheduler", SOURCE, blocks + ": V2 gets a resumed request as a new one, whole",
                   text="scheduled_new_reqs.extend(scheduled_resumed_reqs)", before="0.34"),
        TouchPoint(SCHEDULER, "Scheduler", SOURCE, blocks + ": V2 gets a resumed request as a new one, whole",
                   text="A resumed request is re-sent in full, like a new one", since="0.34"),
        *same_kind(SCHEDULER_OUTPUT, "SchedulerOutput", FIELD, ("scheduled_new_reqs", "scheduled_cached_reqs",
                                                               "finished_req_ids"), blocks),
        TouchPoint(SCHEDULER_OUTPUT, "NewRequestData.req_id", FIELD, blocks),
        TouchPoint(SCHEDULER_OUTPUT, "NewRequestData.block_ids", FIELD, blocks),
        *same_kind(SCHEDULER_OUTPUT, "CachedRequestData", FIELD, ("req_ids", "new_block_ids"), blocks),
        # sampling: the forced tokens' log-probabilities and output counts, as V2's sampler computes its own
        TouchPoint(logprobs, "PromptLogprobsWorker.compute_prompt_logprobs", METHOD, per_instance,
                   params=("self", "logits_fn", "hidden_states", "input_batch")),
        TouchPoint(logprobs, "PromptLogprobsWorker", SETTABLE, RUNNER_V2, params=("compute_prompt_logprobs",)),
        TouchPoint(f"{V2_SAMPLE}.logprob", "compute_topk_scores", FUNCTION, FED_AHEAD,
                   params=("logits", "num_logprobs", "sampled_token_ids"), keywords=("logits_mode",)),
        TouchPoint(f"{V2_SAMPLE}.states", "NO_LOGPROBS", CONSTANT, FED_AHEAD),
        TouchPoint(f"{V2_SAMPLE}.states", "SamplingStates.num_logprobs", INIT_ATTRIBUTE, FED_AHEAD),
        *same_kind(f"{V2_SAMPLE}.sampler", "Sampler", INIT_ATTRIBUTE, ("sampling_states", "penalties_state"),
                   f"{FED_AHEAD}; {rewind}"),
        TouchPoint(f"{V2_SAMPLE}.penalties", "PenaltiesState.output_bin_counts", INIT_ATTRIBUTE,
                   f"{FED_AHEAD}; {rewind}"),
        # forced tokens: a logits processor of V2's interface, which its sampler and rejection sampler run
        TouchPoint(V2_LOGITS_PROCESSOR, "LogitsProcessor", CLASS, RUNNER_V2 + ".V2ForcedTokens"),
        TouchPoint(V2_LOGITS_PROCESSOR, "LogitsProcessor", ABSTRACT, RUNNER_V2 + ".V2ForcedTokens implements it",
                   params=("apply",)),
        TouchPoint(V2_LOGITS_PROCESSOR, "LogitsProcessor.__init__", METHOD, RUNNER_V2 + ".V2ForcedTokens",
                   params=("self", "vllm_config", "req_states")),
        TouchPoint(V2_LOGITS_PROCESSOR, "LogitsProcessor.add_request", METHOD, RUNNER_V2 + ".V2ForcedTokens",
                   params=("self", "req_idx", "sampling_params")),
        TouchPoint(V2_LOGITS_PROCESSOR, "LogitsProcessor.apply", METHOD, RUNNER_V2 + ".V2ForcedTokens",
                   params=("self", "logits", "ctx")),
        TouchPoint(V2_LOGITS_PROCESSOR, "LogitsContext.expanded_idx_mapping", FIELD,
                   RUNNER_V2 + ".V2ForcedTokens (each logits row's request slot)"),
        TouchPoint(f"{V2_LOGITS_PROCESSOR}.loader", "_load_v2_logitsprocs_by_fqcns", SOURCE,
                   "switch.select_runner: 'module:Class' in logits_processors", text='split(":")'),
        TouchPoint(f"{V2_SAMPLE}.sampler", "Sampler.apply_sampling_params", SOURCE,
                   RUNNER_V2 + ".V2ForcedTokens: the sampler runs custom processors",
                   text="logits = processor.apply(logits, ctx)"),
        TouchPoint("vllm.v1.worker.gpu.spec_decode.rejection_sampler", "RejectionSampler", SOURCE,
                   RUNNER_V2 + ".V2ForcedTokens: so does the rejection sampler",
                   text="self.sampler.apply_sampling_params("),
    ]
    return [replace(row, **V2_ONLY) for row in rows]


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
    graphs = CPU_BACKEND + ": full CUDA graphs on the Triton path (HogwildBuilderMixin.hogwild_freeze)"
    return [
        TouchPoint(ATTENTION_BACKEND, "AttentionCGSupport.NEVER", CONSTANT,
                   CPU_BACKEND + ": no full CUDA graphs on the torch path"),
        TouchPoint(ATTENTION_BACKEND, "AttentionCGSupport.UNIFORM_BATCH", CONSTANT,
                   CPU_BACKEND + ": full CUDA graphs for uniform decode batches on the Triton path"),
        TouchPoint(ATTENTION_BACKEND, "AttentionMetadataBuilder.build_for_cudagraph_capture", METHOD, graphs,
                   params=("self", "common_attn_metadata")),
        *same_kind(ATTENTION_BACKEND, "AttentionMetadataBuilder", INIT_ATTRIBUTE, ("vllm_config", "kv_cache_spec"),
                   graphs),
        TouchPoint("vllm.v1.worker.utils", "AttentionGroup.build_metadata_for_cudagraph_capture", SOURCE,
                   RUNNER_V1 + ": the V1 runner captures through the builder's method",
                   text=".build_for_cudagraph_capture(", **V1_ONLY),
        TouchPoint("vllm.v1.worker.gpu.attn_utils", "build_attn_metadata", SOURCE,
                   RUNNER_V2 + ": V2 captures through the builder's method", text="for_cudagraph_capture"),
        TouchPoint("vllm.config.compilation", "CompilationConfig.max_cudagraph_capture_size", FIELD, graphs),
        TouchPoint("vllm.config.compilation", "CUDAGraphMode.FULL", CONSTANT, "runner/v1.py, runner/v2.py: "
                   "install_graph_choice"),
        TouchPoint("vllm.config.compilation", "CUDAGraphMode.NONE", CONSTANT, GRAPH_CHOICE_V2),
        TouchPoint("vllm.config", "CUDAGraphMode", CONSTANT, "runner/v1.py, runner/v2.py: install_graph_choice"),
        TouchPoint("vllm.config.scheduler", "SchedulerConfig.max_num_seqs", FIELD, graphs),
        TouchPoint("vllm.config.model", "ModelConfig.get_num_attention_heads", METHOD, graphs,
                   params=("self", "parallel_config")),
        TouchPoint(KV_CACHE_INTERFACE, "AttentionSpec.head_size", FIELD, graphs),
        TouchPoint(KV_CACHE_INTERFACE, "AttentionSpec.num_kv_heads", FIELD, CPU_BACKEND + " (the planner's heads)"),
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
                   params=("key", "value", "key_cache", "value_cache", "slot_mapping", "isa"),
                   keywords=("k_scale", "v_scale", "kv_cache_dtype"), before="0.34"),
        TouchPoint("vllm._cpu_ops", "cpu_attn_reshape_and_cache", FUNCTION, "runner/cpu_layout.py: the probe",
                   params=("key", "value", "key_cache", "value_cache", "slot_mapping", "isa"),
                   keywords=("k_scale", "v_scale", "kv_cache_dtype"), since="0.34"),
        # An FP8 cache: its dtype on the implementation and the builder, each layer's scales (vLLM's own).
        TouchPoint(CPU_ATTENTION, "CPUAttentionBackendImpl.kv_cache_dtype", INIT_ATTRIBUTE,
                   CPU_BACKEND + ".hogwild_quant (an FP8 cache)"),
        TouchPoint(CPU_ATTENTION, "CPUAttentionMetadataBuilder.kv_cache_dtype", INIT_ATTRIBUTE,
                   CPU_BACKEND + ": the layout probe of an FP8 cache"),
        TouchPoint(CPU_ATTENTION, "CPUAttentionBackend.supported_kv_cache_dtypes", ATTRIBUTE,
                   "switch.check_engine: the FP8 encodings Hogwild reads are vLLM's CPU ones"),
        TouchPoint(FLASH_ATTENTION, "FlashAttentionImpl.kv_cache_dtype", INIT_ATTRIBUTE,
                   CUDA_BACKEND + ": hogwild_quant (an FP8 cache)"),
        TouchPoint(ATTENTION_LAYER, "set_default_quant_scales", SOURCE,
                   CPU_BACKEND + ".hogwild_quant: each layer's K/V scales as floats", text="layer._k_scale_float = 1.0"),
        TouchPoint("vllm.utils.torch_utils", "STR_DTYPE_TO_TORCH_DTYPE", CONSTANT,
                   "attention/kv_layout.py: an FP8 cache is bytes (uint8)"),
        TouchPoint(FLASH_ATTENTION, "FlashAttentionImpl", SOURCE,
                   CUDA_BACKEND + ": FlashAttention's cache split, read the same way",
                   text="key_cache, value_cache = kv_cache.transpose(1, 2).split(self.head_size, dim=-1)"),
    ]


def _worker(module: str, worker: str, used_by: str) -> list[TouchPoint]:
    """One vLLM worker the plugin subclasses (the runner's adapter chosen at init_device and installed once the
    model is loaded, the checks at start-up)."""
    return [
        TouchPoint(module, worker, CLASS, used_by),
        TouchPoint(module, f"{worker}.init_device", METHOD, used_by + ": the runner's adapter chosen",
                   params=("self",)),
        TouchPoint(module, f"{worker}.load_model", METHOD, used_by + ": the runner's adapter installed",
                   params=("self",)),
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
    """runner/cpu_sampling.py: vLLM 0.32's CPU rejection sampler (the V1 runner's), fixed in the worker process."""
    rejection = "vllm.v1.sample.rejection_sampler"
    topk = "vllm.v1.sample.ops.topk_topp_sampler"
    rows = [
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
    return [replace(row, **V1_ONLY) for row in rows]


def forcing() -> list[TouchPoint]:
    """runner/v1.py's forced tokens as a logits processor of V1's interface (runner/forcing.py: the forcing)."""
    FORCING = RUNNER_V1 + ".V1ForcedTokens"
    rows = [
        TouchPoint(LOGITS_PROCESSOR, "LogitsProcessor", CLASS, FORCING),
        TouchPoint(LOGITS_PROCESSOR, "BatchUpdate", CLASS, FORCING),
        TouchPoint(LOGITS_PROCESSOR, "LogitsProcessor", ABSTRACT, FORCING + " (V1ForcedTokens implements these)",
                   params=("__init__", "apply", "is_argmax_invariant", "update_state")),
        TouchPoint(LOGITS_PROCESSOR, "LogitsProcessor.__init__", METHOD, FORCING,
                   params=("self", "vllm_config", "device", "is_pin_memory")),
        TouchPoint(LOGITS_PROCESSOR, "LogitsProcessor.apply", METHOD, FORCING, params=("self", "logits")),
        TouchPoint(LOGITS_PROCESSOR, "LogitsProcessor.update_state", METHOD, FORCING, params=("self", "batch_update")),
        TouchPoint(LOGITS_PROCESSOR, "LogitsProcessor.is_argmax_invariant", METHOD, FORCING, params=("self",)),
        TouchPoint(LOGITS_PROCESSOR, "_load_logitsprocs_by_fqcns", SOURCE,
                   "switch.select_runner: 'module:Class' in logits_processors", text='split(":")'),
    ]
    return [replace(row, **V1_ONLY) for row in rows]


SECTIONS = (runner_v1, runner_v2, attention_backends, workers, cpu_sampling, forcing)
