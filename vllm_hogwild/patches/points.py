"""The table's vocabulary: one :class:`TouchPoint` per vLLM object the plugin imports, wraps, subclasses, calls, reads or writes.

Each row names the vLLM module and the dotted path inside it, the kind of thing
the plugin relies on (see the kind constants below), what exactly it relies on
(parameters, decorator, sync/async, a default, a line of source...) and where
the plugin uses it; a row the plugin changes at run time also carries its
:class:`Hook` (how it is changed, by which code, and the upstream diff in the
checkout's top-level ``patches/`` that would retire it, or why none would). Also the vLLM modules and the
places in the plugin that several rows name. The rows live in the area modules
of this folder beside the code that wraps them; the whole table: :mod:`.table`.
Pure data: no vLLM import.
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


HOOK_MECHANISMS = ("class", "instance", "override", "kernel", "function")


@dataclass(frozen=True)
class Hook:
    """How the plugin changes a touch point at run time. Five mechanisms:

    - ``class``: a method of a vLLM class, wrapped in every process by :func:`vllm_hogwild.patches.install`
      with ``hook`` (``"module:function"`` in this folder, called as ``function(original, self, ...)``);
    - ``instance``: a method of one vLLM object, wrapped by the plugin's code that owns that object
      (``where``: this engine's scheduler and KV-cache manager, this worker's model runner and sampler);
    - ``override``: a method the Hogwild scheduler subclass overrides (vLLM names the class through its own
      ``scheduler_cls`` knob; private methods among them may move in any release);
    - ``kernel``: a Triton kernel whose CPU fallback the plugin's worker re-registers through vLLM's own
      kernel dispatcher, in its process, only where vLLM's fallback is broken;
    - ``function``: a vLLM module function the plugin's worker replaces in its process, only where vLLM's
      is broken.
    """

    target: str  # "module:Class.method", or "module:name" for a kernel or a function (the row's own target)
    mechanism: str  # one of HOOK_MECHANISMS
    where: str  # the plugin module whose code changes it
    patch: str  # the diff in the top-level patches/ that would retire it, or "none: why"
    hook: str = ""  # class wraps: "module:function" of the wrapper

    @property
    def owner(self) -> tuple[str, str]:
        module, _, qualname = self.target.partition(":")
        return module, qualname.rpartition(".")[0]

    @property
    def method(self) -> str:
        return self.target.partition(":")[2].rpartition(".")[2]


def class_wrap(where: str, function: str, patch: str) -> tuple[str, str, str, str]:
    """A class wrap's mark in an area module's ``HOOKS``: ``(mechanism, where, patch, hook)``."""
    return ("class", where, patch, f"{where}:{function}")


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
    own: bool = False  # must be defined in the class's own __dict__ (patches.install replaces it there)
    defined_by: str | None = None  # methods: the class (simple name) that must define it in the MRO
    base: str | None = None  # classes: "module.Class" it must subclass
    text: str | None = None  # SOURCE: what the source must contain; READS: the parameter's name
    default: Any = NO_DEFAULT  # FIELD: its declared default
    writes: bool = False  # FIELD / attributes the plugin assigns: the class must not be frozen (pydantic: nor
    #                       validate assignments; the plugin may store its own objects in them)
    hook: Hook | None = None  # the plugin changes it at run time (set by the table from the area's HOOKS)
    since: str | None = None  # the first vLLM release ("0.33") the row applies to (None: every one checked)
    before: str | None = None  # the first vLLM release it no longer applies to (the thing is gone there)
    runner: str | None = None  # the model runner whose adapter relies on it: "v1" (runner/v1.py) or "v2"
    #                            (runner/v2.py); None: both, or no runner (the engine core, the front end)

    def applies_to(self, version: str) -> bool:
        """Whether the row holds for vLLM ``version`` ("0.33.0", "0.32.0+cpu"; "?": every row applies)."""
        release = _release(version)
        if release is None:
            return True
        return (self.since is None or release >= _release(self.since)) and \
            (self.before is None or release < _release(self.before))

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
    def leaf(self) -> str:
        return self.name.rpartition(".")[2]



def _release(version: str) -> tuple[int, int] | None:
    """(major, minor) of a version string, or None when it has none."""
    parts = version.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


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
GPU_MODEL_RUNNER = "vllm.v1.worker.gpu_model_runner"  # the V1 runner (gone in 0.34)
INPUT_BATCH = "vllm.v1.worker.gpu_input_batch"
V2_RUNNER = "vllm.v1.worker.gpu.model_runner"  # Model Runner V2
V2_INPUT_BATCH = "vllm.v1.worker.gpu.input_batch"
V2_STATES = "vllm.v1.worker.gpu.states"
V2_SAMPLE = "vllm.v1.worker.gpu.sample"
V2_LOGITS_PROCESSOR = "vllm.v1.worker.gpu.sample.logits_processor"
SCHEDULER_OUTPUT = "vllm.v1.core.sched.output"
CUDAGRAPH_DISPATCHER = "vllm.v1.cudagraph_dispatcher"  # the V1 runner's
CUDAGRAPH_UTILS = "vllm.v1.worker.gpu.cudagraph_utils"  # Model Runner V2's
ATTENTION_BACKEND = "vllm.v1.attention.backend"
CPU_ATTENTION = "vllm.v1.attention.backends.cpu_attn"
FLASH_ATTENTION = "vllm.v1.attention.backends.flash_attn"
BACKEND_REGISTRY = "vllm.v1.attention.backends.registry"
ATTENTION_LAYER = "vllm.model_executor.layers.attention.attention"
KV_CACHE_INTERFACE = "vllm.v1.kv_cache_interface"
PLATFORM_INTERFACE = "vllm.platforms.interface"
LOGITS_PROCESSOR = "vllm.v1.sample.logits_processor"  # V1's interface (gone in 0.34)
SCHEDULER = "vllm.v1.core.sched.scheduler"
KV_CACHE_MANAGER = "vllm.v1.core.kv_cache_manager"
REQUEST_QUEUE = "vllm.v1.core.sched.request_queue"
REQUEST = "vllm.v1.request"
DETOKENIZER = "vllm.v1.engine.detokenizer"
SAMPLING_PARAMS = "vllm.sampling_params"
ENGINE_CORE_REQUEST = "vllm.v1.engine"

# -- where the plugin uses them (the `used_by` texts several rows share) ------------------------------------

REQUEST_CHECK = "patches/requests.process_inputs (the request check)"
STREAM_CHECK = "patches/requests.generate (the check before a stream starts)"
METRICS = "patches/metrics.stat_logger_manager_init, serving/metrics.HogwildStatLogger"
CHAT_PREAMBLE = "patches/requests.add_chat_requests / render_chat_request (the collab preamble in chat)"
ANSWER_FIELD = "patches/requests.create_response (checks first; the answer field: serving/responses.py)"
ACCEPT_STEPS_IN_RESPONSES = ("patches/requests.completion_response / chat_full_response "
                             "(accept steps: serving/responses.py)")
ACCEPT_STEPS = "patches/outputs.py (each output token's accept step)"
RUNNER_V1 = "runner/v1.py"
RUNNER_V2 = "runner/v2.py"
GRAPH_CHOICE_V1 = "runner/v1.install_graph_choice (a step's full CUDA graph)"
GRAPH_CHOICE_V2 = "runner/v2.install_graph_choice (a step's full CUDA graph)"
STEP_WIRE = "scheduler/scheduler.py -> runner/v1.py, runner/v2.py"
CPU_BACKEND = "runner/backend.py"
CUDA_BACKEND = "runner/backend_cuda.py"
CPU_WORKER = "runner/worker.py"
CUDA_WORKER = "runner/worker_cuda.py"
FORCING = "runner/forcing.py"
V1_ONLY = dict(runner="v1", before="0.34")  # rows of the V1 runner's adapter: vLLM 0.34 deleted that runner
V2_ONLY = dict(runner="v2")
CPU_SAMPLING = "runner/cpu_sampling.py"
HOGWILD_SCHEDULER = "scheduler/scheduler.py"
TEXT_STREAM = "scheduler/detok.TextStream"
TOOLS = "tools/demo.py, benchmarks/bench"

