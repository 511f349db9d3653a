"""Outputs in the front end: each token's accept step, and a fork/join request's lanes as one completion.

**Accept steps.** With speculative decoding a worker accepts one or more tokens per engine step,
and what it reads depends on when each co-worker token was accepted (the rule
in docs/user_guide.md, "Speculative decoding"). So each Hogwild completion
carries, beside its tokens, ``completion.hogwild["accept_steps"]``: one step
number per output token, non-decreasing; tokens accepted in the same engine
step share a number. Without speculation every token has its own step.

Numbering: the engine core sends each client one batch of outputs per step,
stamped with the step's time (``EngineCoreOutputs.timestamp``; the API server
may process a batch in chunks, which share it). Each output processor counts
the distinct stamps it has seen, so numbers are comparable within an engine
(every worker of a group lives in one engine core); only their order means
anything. O(1) per token. ``OutputProcessor.add_request`` marks a Hogwild
worker's state (:func:`add_request`), ``OutputProcessor.process_outputs``
numbers the step and records it per new token (:func:`process_outputs`),
``RequestState._new_completion_output`` attaches the numbers, all of them or
the delta's in ``DELTA`` output mode (:func:`new_completion_output`).

**Fork/join.** The same two wraps carry a fork/join lane's record
(:mod:`vllm_hogwild.core.forkjoin.lane_channel`, sent with its first output and its
last): ``process_outputs`` keeps the latest on the lane's request state, and
every completion of the lane gets it as ``completion.hogwild_lane``. The
client decodes the engine core's batches with the types that carry the record
(:func:`client_init`, on ``MPClient.__init__``); ``ParentRequest.get_outputs``
assembles the lanes into one completion (:func:`get_outputs`, with
:class:`~vllm_hogwild.serving.assembly.Assembly`), and the server's two stream
generators send the request's tree as one last event before ``[DONE]``
(:func:`completion_stream`, :func:`chat_stream`).

No diff here would retire these: accept steps are a public-API change to
propose, and one completion from a fork/join request's lanes is this plugin's
protocol (vLLM would need fork/join requests of its own).
"""

from __future__ import annotations

from typing import Any

from vllm_hogwild.core.forkjoin.lane_channel import output_types, record_of
from vllm_hogwild.core.options import spec_of
from vllm_hogwild.serving.assembly import ATTR as ASSEMBLY_ATTR
from vllm_hogwild.serving.assembly import Assembly, spec_of_parent
from vllm_hogwild.patches.points import *  # noqa: F401,F403  (the kinds, TouchPoint and the shared names)
from vllm_hogwild.patches.points import TouchPoint, class_wrap, same_kind  # noqa: F401

NO_PATCH_ACCEPT_STEPS = ("none: a per-token accept-step field in vLLM's CompletionOutput is a public-API change "
                         "to propose upstream, not a hook to retire")
NO_PATCH_FORKJOIN = ("none: one completion assembled from the lanes of a fork/join request is this plugin's "
                     "protocol; vLLM would need fork/join requests of its own to retire it")
NO_PATCH_LANE_CHANNEL = ("none: the client decodes with the plugin's subclass of vLLM's output structs; a "
                         "per-request field for plugins in EngineCoreOutput upstream would retire it")
_HERE = "vllm_hogwild.patches.outputs"
_OUTPUT_PROCESSOR = "vllm.v1.engine.output_processor"

HOOKS = {
    f"{_OUTPUT_PROCESSOR}:OutputProcessor.add_request": class_wrap(_HERE, "add_request", NO_PATCH_ACCEPT_STEPS),
    f"{_OUTPUT_PROCESSOR}:OutputProcessor.process_outputs": class_wrap(_HERE, "process_outputs", NO_PATCH_ACCEPT_STEPS),
    f"{_OUTPUT_PROCESSOR}:RequestState._new_completion_output":
        class_wrap(_HERE, "new_completion_output", NO_PATCH_ACCEPT_STEPS),
    "vllm.v1.engine.parallel_sampling:ParentRequest.get_outputs": class_wrap(_HERE, "get_outputs", NO_PATCH_FORKJOIN),
    "vllm.entrypoints.openai.completion.serving:OpenAIServingCompletion.completion_stream_generator":
        class_wrap(_HERE, "completion_stream", NO_PATCH_FORKJOIN),
    "vllm.entrypoints.openai.chat_completion.serving:OpenAIServingChat.chat_completion_stream_generator":
        class_wrap(_HERE, "chat_stream", NO_PATCH_FORKJOIN),
    "vllm.v1.engine.core_client:MPClient.__init__": class_wrap(_HERE, "client_init", NO_PATCH_LANE_CHANNEL),
}

ATTR = "hogwild_accept_steps"  # on vLLM's RequestState: the worker's accept steps so far
LANE_ATTR = "hogwild_lane"  # on vLLM's RequestState and CompletionOutput: a fork/join lane's latest record


def add_request(original, self, request, *args: Any, **kwargs: Any):
    result = original(self, request, *args, **kwargs)
    params = getattr(request, "sampling_params", None)
    if params is not None and spec_of(params.extra_args) is not None:
        state = self.request_states.get(request.request_id)
        if state is not None and getattr(state, ATTR, None) is None:
            setattr(state, ATTR, [])
    return result


def process_outputs(original, self, engine_core_outputs, engine_core_timestamp=None, *args: Any, **kwargs: Any):
    if engine_core_timestamp is not None and engine_core_timestamp != getattr(self, "_hogwild_stamp", None):
        self._hogwild_stamp = engine_core_timestamp
        self._hogwild_step = getattr(self, "_hogwild_step", 0) + 1
    step = getattr(self, "_hogwild_step", 0)
    states = self.request_states
    for output in engine_core_outputs:
        record = record_of(output)
        if record is None and not output.new_token_ids:
            continue
        state = states.get(output.request_id)  # once per output: its record and its tokens' steps
        if state is None:
            continue
        if record is not None:
            setattr(state, LANE_ATTR, record)
        steps = getattr(state, ATTR, None)
        if steps is not None and output.new_token_ids:
            steps.extend([step] * len(output.new_token_ids))
    return original(self, engine_core_outputs, engine_core_timestamp, *args, **kwargs)


def new_completion_output(original, self, token_ids, finish_reason, stop_reason, *args: Any, **kwargs: Any):
    completion = original(self, token_ids, finish_reason, stop_reason, *args, **kwargs)
    steps = getattr(self, ATTR, None)
    if steps is not None:
        n = len(completion.token_ids)
        completion.hogwild = {"accept_steps": steps[len(steps) - n:] if n else []}
        record = getattr(self, LANE_ATTR, None)
        if record is not None:
            completion.hogwild_lane = record
    return completion


# -- fork/join --------------------------------------------------------------------------------------

def client_init(original, self, *args: Any, **kwargs: Any):
    """vLLM's ``MPClient.__init__``: in an engine with Hogwild on, the client decodes each batch of outputs with
    the types that carry a fork/join lane's record (:func:`~vllm_hogwild.core.forkjoin.lane_channel.output_types`: vLLM's
    own decoder would drop the field)."""
    original(self, *args, **kwargs)
    from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
    from vllm.v1.serial_utils import MsgpackDecoder

    from vllm_hogwild.core.options import EngineOptions

    if EngineOptions.from_additional_config(self.vllm_config.additional_config) is not None:
        self.decoder = MsgpackDecoder(output_types(EngineCoreOutput, EngineCoreOutputs)[1])


def get_outputs(original, parent, child_request_id: str, completion_output):
    """vLLM's ``ParentRequest.get_outputs``; a fork/join request's lanes come out as one completion."""
    assembly = getattr(parent, ASSEMBLY_ATTR, None)
    if assembly is None:  # the parent's first output: is it a fork/join request? (kept: False if not)
        spec = spec_of_parent(parent)
        if spec is None:
            setattr(parent, ASSEMBLY_ATTR, False)
            return original(parent, child_request_id, completion_output)
        from vllm.sampling_params import RequestOutputKind

        assembly = Assembly(spec, streaming=parent.sampling_params.output_kind != RequestOutputKind.FINAL_ONLY)
        setattr(parent, ASSEMBLY_ATTR, assembly)
    elif assembly is False:
        return original(parent, child_request_id, completion_output)
    outputs, finished = original(parent, child_request_id, completion_output)  # vLLM's bookkeeping of children
    if not assembly.streaming:
        return ([assembly.whole(outputs)] if outputs else []), finished
    delta = assembly.stream(completion_output, finished)
    return ([] if delta is None else [delta]), finished


async def completion_stream(original, serving, request, engine_inputs, result_generator, *args, **kwargs):
    """``/v1/completions``, streamed: a fork/join request's tree in one last event before ``[DONE]``."""
    results, box = _recording(request, result_generator)
    async for event in _with_tree(original(serving, request, engine_inputs, results, *args, **kwargs), box):
        yield event


async def chat_stream(original, serving, request, result_generator, *args, **kwargs):
    """``/v1/chat/completions``, streamed: a fork/join request's tree in one last event before ``[DONE]``."""
    results, box = _recording(request, result_generator)
    async for event in _with_tree(original(serving, request, results, *args, **kwargs), box):
        yield event


TREE_EVENT = "hogwild"  # the last event: {"choices": [], "hogwild": {...the tree...}}


def _recording(request, result_generator):
    """``(results, box)``: the results as they come, and the tree of the last one put in ``box`` (None: not a
    fork/join request; the results are vLLM's own)."""
    from vllm_hogwild.serving.requests import PARSED_KEY, Parsed

    found = (getattr(request, "vllm_xargs", None) or {}).get(PARSED_KEY)
    if not (isinstance(found, Parsed) and found.options.forks):
        return result_generator, None
    box: dict = {}

    async def recorded():
        async for item in result_generator:
            res = item[1] if isinstance(item, tuple) else item  # completions: (prompt index, output)
            tree = getattr(res.outputs[0], "hogwild", None) if res.outputs else None
            if tree is not None:
                box["tree"] = tree
            yield item

    return recorded(), box


async def _with_tree(events, box: dict | None):
    import json

    head: dict = {}
    async for event in events:
        if box is not None and not head and event.startswith("data: {"):
            try:
                chunk = json.loads(event[len("data: "):])
                head = {k: chunk[k] for k in ("id", "object", "created", "model") if k in chunk}
            except ValueError:
                pass
        if box is not None and "tree" in box and event.startswith("data: [DONE]"):
            yield f"data: {json.dumps({**head, 'choices': [], TREE_EVENT: box['tree']})}\n\n"
        yield event


# -- the rows ----------------------------------------------------------------------------------------

def accept_steps() -> list[TouchPoint]:
    """Accept steps: each output token's accept step, from the engine's outputs to the response."""
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


FORKJOIN = "patches/outputs.get_outputs and serving/assembly.Assembly (a fork/join request's lanes as one completion)"


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


LANE_CHANNEL = "core/forkjoin/lane_channel.py (a fork/join lane's record on the plugin's own output field)"


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
        TouchPoint(CORE_CLIENT, "MPClient.__init__", METHOD, "patches/outputs.client_init: the subclass decoder",
                   params=("self", "asyncio_mode", "vllm_config"), own=True, call="sync"),
        TouchPoint(CORE_CLIENT, "MPClient.decoder", INIT_ATTRIBUTE, "patches/outputs.client_init", writes=True),
        TouchPoint(CORE_CLIENT, "MPClient.vllm_config", INIT_ATTRIBUTE, "patches/outputs.client_init"),
        TouchPoint(CORE_CLIENT, "SyncMPClient.__init__", SOURCE, "patches/outputs.client_init: the output thread "
                   "takes the decoder MPClient.__init__ left", text="decoder = self.decoder"),
        TouchPoint(CORE_CLIENT, "AsyncMPClient._ensure_output_queue_task", SOURCE, "patches/outputs.client_init: the "
                   "output task takes the decoder MPClient.__init__ left", text="decoder = self.decoder"),
        TouchPoint("vllm.v1.serial_utils", "MsgpackDecoder", CLASS, "patches/outputs.client_init"),
    ]


SECTIONS = (accept_steps, forkjoin)
