"""Every runtime hook the plugin puts into vLLM, in one index; the class wraps are installed here, once.

:func:`install` runs from :func:`vllm_hogwild.plugin.register` in every vLLM
process. Each hook calls straight through unless Hogwild is switched on for
the engine or the request carries Hogwild options. :data:`HOOKS` is the whole
list, of five kinds:

- ``class``: a method of a vLLM class, wrapped here in every process;
- ``instance``: a method of one vLLM object, wrapped by the plugin's code that
  owns that object (this engine's scheduler and KV-cache manager, this
  worker's model runner and sampler), never the class;
- ``override``: a method the Hogwild scheduler subclass overrides (vLLM names
  the class through its own ``scheduler_cls`` knob; private methods among them
  may move in any release);
- ``kernel``: a Triton kernel whose CPU fallback the plugin's worker
  re-registers through vLLM's own kernel dispatcher (``register_kernels``),
  in its process, only where vLLM's fallback is broken;
- ``function``: a vLLM module function the plugin's worker replaces in its
  process, only where vLLM's is broken.

Each row names the upstream vLLM change in ``patches/`` that would make it
unnecessary, or says why there is none. What each hook does lives beside the
code it drives (``where``). ``tests/unit/test_hooks_index.py`` holds this index
against the code; ``tools.upstream`` checks every target against
a vLLM release.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass

_installed = False

NO_PATCH_ACCEPT_STEPS = ("none: a per-token accept-step field in vLLM's CompletionOutput is a public-API change "
                         "to propose upstream, not a hook to retire")
NO_PATCH_FLAGS = ("none: the flags are a convenience over vLLM's own --additional-config '{\"hogwild\": {...}}', "
                  "which needs no hook")
NO_PATCH_FORKJOIN = ("none: one completion assembled from the lanes of a fork/join request is this plugin's "
                     "protocol; vLLM would need fork/join requests of its own to retire it")
NO_PATCH_LANE_CHANNEL = ("none: the client decodes with the plugin's subclass of vLLM's output structs; a "
                         "per-request field for plugins in EngineCoreOutput upstream would retire it")
NO_PATCH_OVERRIDE = "none: subclassing through scheduler_cls is vLLM's own extension point"


@dataclass(frozen=True)
class Hook:
    target: str  # "module:Class.method", or "module:name" for a kernel or a function
    kind: str  # "class", "instance", "override", "kernel" or "function"
    where: str  # the plugin module whose code it drives
    patch: str  # the file in patches/ that would retire it, or "none: why"
    hook: str = ""  # class wraps: "module:function" of the wrapper, called as wrapper(original, self, ...)

    @property
    def owner(self) -> tuple[str, str]:
        module, _, qualname = self.target.partition(":")
        return module, qualname.rpartition(".")[0]

    @property
    def method(self) -> str:
        return self.target.partition(":")[2].rpartition(".")[2]


def _class(target: str, where: str, wrapper: str, patch: str) -> Hook:
    return Hook(target, "class", where, patch, f"{where}:{wrapper}")

_SCHEDULER = "vllm.v1.core.sched.scheduler:Scheduler"
_RUNNER = "vllm.v1.worker.gpu_model_runner:GPUModelRunner"

HOOKS: tuple[Hook, ...] = (
    # -- class wraps (installed below, in every process) --
    _class("vllm.engine.arg_utils:EngineArgs.create_engine_config",
           "vllm_hogwild.switch", "create_engine_config", "01-config-plugins.patch"),
    _class("vllm.engine.arg_utils:EngineArgs.add_cli_args",
           "vllm_hogwild.serving.cli", "hook_add_cli_args", NO_PATCH_FLAGS),
    _class("vllm.engine.arg_utils:EngineArgs.from_cli_args",
           "vllm_hogwild.serving.cli", "hook_from_cli_args", NO_PATCH_FLAGS),
    _class("vllm.entrypoints.openai.completion.serving:OpenAIServingCompletion.create_completion",
           "vllm_hogwild.serving.requests", "create_response", "08-request-plugins.patch"),
    _class("vllm.entrypoints.openai.chat_completion.serving:OpenAIServingChat.create_chat_completion",
           "vllm_hogwild.serving.requests", "create_response", "08-request-plugins.patch"),
    _class("vllm.entrypoints.openai.chat_completion.serving:OpenAIServingChat.render_chat_request",
           "vllm_hogwild.serving.requests", "render_chat_request", "08-request-plugins.patch"),
    _class("vllm.entrypoints.openai.completion.serving:OpenAIServingCompletion.request_output_to_completion_response",
           "vllm_hogwild.serving.requests", "completion_response", NO_PATCH_ACCEPT_STEPS),
    _class("vllm.entrypoints.openai.chat_completion.serving:OpenAIServingChat.chat_completion_full_generator",
           "vllm_hogwild.serving.requests", "chat_full_response", NO_PATCH_ACCEPT_STEPS),
    _class("vllm.entrypoints.common.offline:OfflineInferenceMixin._add_chat_requests",
           "vllm_hogwild.serving.requests", "add_chat_requests", "08-request-plugins.patch"),
    _class("vllm.v1.engine.async_llm:AsyncLLM.generate",
           "vllm_hogwild.serving.requests", "generate", "07-generate-preflight.patch"),
    _class("vllm.v1.engine.input_processor:InputProcessor.process_inputs",
           "vllm_hogwild.serving.requests", "process_inputs", "02-request-validators.patch"),
    _class("vllm.v1.metrics.loggers:StatLoggerManager.__init__",
           "vllm_hogwild.serving.metrics", "hook_stat_logger_manager_init", "06-scheduler-plugin-stats.patch"),
    _class("vllm.v1.engine.output_processor:OutputProcessor.add_request",
           "vllm_hogwild.serving.accept_steps", "add_request", NO_PATCH_ACCEPT_STEPS),
    _class("vllm.v1.engine.output_processor:OutputProcessor.process_outputs",
           "vllm_hogwild.serving.accept_steps", "process_outputs", NO_PATCH_ACCEPT_STEPS),
    _class("vllm.v1.engine.output_processor:RequestState._new_completion_output",
           "vllm_hogwild.serving.accept_steps", "new_completion_output", NO_PATCH_ACCEPT_STEPS),
    _class("vllm.v1.engine.parallel_sampling:ParentRequest.get_outputs",
           "vllm_hogwild.serving.forkjoin", "get_outputs", NO_PATCH_FORKJOIN),
    _class("vllm.entrypoints.openai.completion.serving:OpenAIServingCompletion.completion_stream_generator",
           "vllm_hogwild.serving.forkjoin", "completion_stream", NO_PATCH_FORKJOIN),
    _class("vllm.entrypoints.openai.chat_completion.serving:OpenAIServingChat.chat_completion_stream_generator",
           "vllm_hogwild.serving.forkjoin", "chat_stream", NO_PATCH_FORKJOIN),
    _class("vllm.v1.engine.core_client:MPClient.__init__",
           "vllm_hogwild.serving.forkjoin", "client_init", NO_PATCH_LANE_CHANNEL),
    # -- instance wraps (each by the code that owns the object) --
    Hook("vllm.v1.core.kv_cache_manager:KVCacheManager.allocate_slots", "instance", "vllm_hogwild.scheduler.kv",
         "04-scheduler-lookahead.patch"),
    Hook(f"{_RUNNER}._prepare_inputs", "instance", "vllm_hogwild.runner.runner_hook", "03-attention-step-extras.patch"),
    Hook(f"{_RUNNER}._dummy_run", "instance", "vllm_hogwild.runner.runner_hook",
         "none: it clears the last real step's views before a dummy batch; patch 03 only hands the runner "
         "each real step's extras, so a reset at the start of _dummy_run upstream would still be needed"),
    Hook(f"{_RUNNER}.propose_draft_token_ids", "instance", "vllm_hogwild.runner.runner_hook",
         "none: a draft model proposes over plain attention, so the step's views are cleared first; patch 03 "
         "does not cover it, and a per-forward extras argument upstream would be needed to retire it"),
    Hook(f"{_SCHEDULER}._reserve_prefill_lookahead", "instance", "vllm_hogwild.scheduler.scheduler",
         "10-scheduler-chunk-limit.patch"),
    Hook(f"{_SCHEDULER}._update_request_with_output", "instance", "vllm_hogwild.scheduler.scheduler",
         "none: with speculative decoding only, it cuts an accepted run where the engine places text, token by "
         "token inside vLLM's own output loop; a per-token stop callback upstream would retire it"),
    Hook("vllm.v1.request:Request._block_hasher", "instance", "vllm_hogwild.scheduler.scheduler",
         "none: a worker's blocks past the prompt hold K/V computed under its own views, so their prefix-cache "
         "hashes are salted per lane; vLLM's cache_salt salts a whole request, prompt included"),
    Hook("vllm.v1.sample.sampler:Sampler.apply_logits_processors", "instance", "vllm_hogwild.runner.forcing",
         "none: vLLM refuses custom logits processors with speculative decoding by design; forcing runs "
         "as one where it applies, in the sampler"),
    # -- vLLM 0.32 bugs fixed in a Hogwild worker process (the CPU, with speculative decoding) --
    Hook("vllm.v1.sample.rejection_sampler:expand_kernel", "kernel", "vllm_hogwild.runner.cpu_sampling",
         "11-cpu-rejection-sampler.patch"),
    Hook("vllm.v1.sample.ops.topk_topp_sampler:apply_top_k_only", "function", "vllm_hogwild.runner.cpu_sampling",
         "11-cpu-rejection-sampler.patch"),
    # -- overrides of the scheduler subclass --
    *(Hook(f"{_SCHEDULER}.{name}", "override", "vllm_hogwild.scheduler.scheduler", NO_PATCH_OVERRIDE)
      for name in ("add_request", "get_request_counts", "schedule", "update_from_output", "_free_blocks",
                   "_get_local_prefix_cache_hit", "make_stats", "shutdown")),
)


def install() -> None:
    """Wrap every ``class`` hook's target (once per process)."""
    global _installed
    if _installed:
        return
    for hook in HOOKS:
        if hook.kind == "class":
            module, qualname = hook.owner
            owner = getattr(importlib.import_module(module), qualname)
            where, _, name = hook.hook.partition(":")
            _wrap(owner, hook.method, getattr(importlib.import_module(where), name))
    _installed = True


def _wrap(owner: type, name: str, wrapper) -> None:
    """Replace ``owner.name`` by ``wrapper(original, first_arg, ...)``, keeping static/class methods so."""
    raw = owner.__dict__[name]
    kind = type(raw) if isinstance(raw, (staticmethod, classmethod)) else None
    original = raw.__func__ if kind else raw
    if getattr(original, "_hogwild_original", None) is not None:
        return

    @functools.wraps(original)
    def hooked(first, *args, **kwargs):
        return wrapper(original, first, *args, **kwargs)

    hooked._hogwild_original = original  # type: ignore[attr-defined]
    setattr(owner, name, kind(hooked) if kind else hooked)
