"""Requests in the front end: the checks, the collab preamble in chat, the answer and accept-step fields.

Every Hogwild request passes these class wraps, in order; what they check and
build is :mod:`vllm_hogwild.serving.requests` (parsing, sizes, the fork/join
lanes) and :mod:`vllm_hogwild.serving.responses` (answers, accept steps):

- the OpenAI routes (:func:`create_response`, both ``create_completion`` and
  ``create_chat_completion``): the Hogwild fields are parsed and checked
  first, so any bad value is a 400 naming its field; the group's answer is
  added to the response afterwards. ``08-request-plugins.patch``;
- chat (:func:`add_chat_requests` offline, :func:`render_chat_request` in the
  server): a ``collab`` request's conversation gets the preamble as a system
  message before the chat template renders it. ``08-request-plugins.patch``;
- ``AsyncLLM.generate`` (:func:`generate`): the sizes are checked when it is
  called, so a bad streaming request is a 400 before its response starts.
  ``07-generate-preflight.patch``;
- ``InputProcessor.process_inputs`` (:func:`process_inputs`): the last check,
  with the prompt's final length; a ``collab`` prompt gets its section headers;
  the request's sampling parameters (a private copy) get the per-worker
  ``max_tokens`` and, for the engine core, the
  :class:`~vllm_hogwild.core.options.RequestSpec`. ``02-request-validators.patch``;
- whole responses (:func:`completion_response`, :func:`chat_full_response`):
  each choice's accept steps when the request asked (no patch: a per-token
  field in vLLM's ``CompletionOutput`` is a public-API change to propose).

The rows here also cover the request and response models, and the offline
entry points the demo and the benchmarks use (``tools``).
"""

from __future__ import annotations

import copy
from dataclasses import replace

from vllm_hogwild.core.protocol.collab import extend_prompt, extended_len, with_preamble
from vllm_hogwild.core.options import (FLAT_PREFIX, REQUEST_KEY, SPEC_KEY, HogwildOptionError, RequestSpec,
                                       requested)
from vllm_hogwild.serving.requests import (PARSED_KEY, Parsed, prompt_fork, check_forkjoin_params, check_sizes,
                                           forkjoin_lanes, kept, parsed, request_error)

from vllm_hogwild.patches.points import *  # noqa: F401,F403  (the kinds, TouchPoint and the shared names)
from vllm_hogwild.patches.points import TouchPoint, class_wrap, same_kind  # noqa: F401


# -- the hooks: target -> (mechanism, where, patch, wrapper) ---------------------------------------

NO_PATCH_ACCEPT_STEPS = ("none: a per-token accept-step field in vLLM's CompletionOutput is a public-API change "
                         "to propose upstream, not a hook to retire")
_HERE = "vllm_hogwild.patches.request_hooks"
_COMPLETION = "vllm.entrypoints.openai.completion.serving:OpenAIServingCompletion"
_CHAT = "vllm.entrypoints.openai.chat_completion.serving:OpenAIServingChat"

HOOKS = {
    f"{_COMPLETION}.create_completion": class_wrap(_HERE, "create_response", "08-request-plugins.patch"),
    f"{_CHAT}.create_chat_completion": class_wrap(_HERE, "create_response", "08-request-plugins.patch"),
    f"{_CHAT}.render_chat_request": class_wrap(_HERE, "render_chat_request", "08-request-plugins.patch"),
    f"{_COMPLETION}.request_output_to_completion_response":
        class_wrap(_HERE, "completion_response", NO_PATCH_ACCEPT_STEPS),
    f"{_CHAT}.chat_completion_full_generator": class_wrap(_HERE, "chat_full_response", NO_PATCH_ACCEPT_STEPS),
    "vllm.entrypoints.common.offline:OfflineInferenceMixin._add_chat_requests":
        class_wrap(_HERE, "add_chat_requests", "08-request-plugins.patch"),
    "vllm.v1.engine.async_llm:AsyncLLM.generate": class_wrap(_HERE, "generate", "07-generate-preflight.patch"),
    "vllm.v1.engine.input_processor:InputProcessor.process_inputs":
        class_wrap(_HERE, "process_inputs", "02-request-validators.patch"),
}


# -- the class wraps ---------------------------------------------------------------------------------

async def create_response(original, serving, request, *args, **kwargs):
    """Both OpenAI routes: the Hogwild fields checked first, and a group's final answer in the response."""
    from vllm_hogwild.serving.responses import with_answer

    options = None
    if requested(getattr(request, "vllm_xargs", None)):
        found = parsed(serving.engine_client.vllm_config, request.vllm_xargs)
        request.vllm_xargs = kept(request.vllm_xargs, found)  # the server's own request: later hooks reuse it
        options = found.options
        if options.accept_steps and getattr(request, "stream", False):
            field = "hogwild.accept_steps" if "accept_steps" in (request.vllm_xargs.get("hogwild") or {}) \
                else "hogwild_accept_steps"
            raise request_error(HogwildOptionError(
                field, "accept steps come with whole responses (stream false); a streamed choice's tokens "
                "arrive as they are accepted"))
    return with_answer(options, await original(serving, request, *args, **kwargs))


def completion_response(original, serving, final_res_batch, request, *args, **kwargs):
    """``/v1/completions``, a whole response: each choice's accept steps when the request asked."""
    from vllm_hogwild.serving.responses import with_accept_steps

    response = original(serving, final_res_batch, request, *args, **kwargs)
    if _asked_accept_steps(request):
        with_accept_steps(response, [o for res in final_res_batch for o in res.outputs], by_index=False,
                          steps=_asked_steps(request))
    return response


async def chat_full_response(original, serving, request, result_generator, *args, **kwargs):
    """``/v1/chat/completions``, a whole response: each choice's accept steps when the request asked."""
    from vllm_hogwild.serving.responses import with_accept_steps

    if not _asked_accept_steps(request):
        return await original(serving, request, result_generator, *args, **kwargs)
    last = []

    async def recorded():
        async for res in result_generator:
            last[:] = [res]
            yield res

    response = await original(serving, request, recorded(), *args, **kwargs)
    if last:
        with_accept_steps(response, list(last[0].outputs), by_index=True, steps=_asked_steps(request))
    return response


def _asked_steps(request) -> bool:
    """Whether the request asked for its tokens' accept steps (``hogwild_accept_steps``)."""
    found = (getattr(request, "vllm_xargs", None) or {}).get(PARSED_KEY)
    return isinstance(found, Parsed) and found.options.accept_steps


def _asked_accept_steps(request) -> bool:
    """Whether each choice carries fields of its completion output: accept steps, or a fork/join tree."""
    found = (getattr(request, "vllm_xargs", None) or {}).get(PARSED_KEY)
    return isinstance(found, Parsed) and (found.options.accept_steps or found.options.forks)


async def render_chat_request(original, serving, request, *args, **kwargs):
    """``/v1/chat/completions``: a ``collab`` request's messages get the preamble before the template."""
    found = (request.vllm_xargs or {}).get(PARSED_KEY)
    if isinstance(found, Parsed) and found.options.protocol == "collab":
        request.messages = with_preamble(request.messages, found.options, request.n or 1)
        request.vllm_xargs = kept(request.vllm_xargs, replace(found, preamble_in_chat=True))
    return await original(serving, request, *args, **kwargs)


def add_chat_requests(original, llm, messages, params, *args, **kwargs):
    """``LLM.chat`` / ``LLM.enqueue_chat``: a ``collab`` request's conversation gets the preamble."""
    from vllm.renderers.inputs.preprocess import conversation_to_seq

    conversations = conversation_to_seq(messages)
    seq_params = llm._params_to_seq(params, len(conversations))
    new_convs, new_params, changed = [], [], False
    for conversation, p in zip(conversations, seq_params):
        extra = getattr(p, "extra_args", None)
        if requested(extra):
            found = parsed(llm.llm_engine.vllm_config, extra)
            p = copy.copy(p)  # never mutate the caller's SamplingParams
            if found.options.protocol == "collab":
                conversation = with_preamble(conversation, found.options, p.n)
                found = replace(found, preamble_in_chat=True)
            p.extra_args = kept(extra, found)
            changed = True
        new_convs.append(conversation)
        new_params.append(p)
    if not changed:
        return original(llm, messages, params, *args, **kwargs)
    return original(llm, new_convs, new_params, *args, **kwargs)


def generate(original, engine, prompt, sampling_params, request_id, *args, **kwargs):
    """Check a Hogwild request before the server starts its response.

    ``AsyncLLM.generate`` is an async generator: its own input processing
    runs on the first iteration, after a streaming response has already
    begun, and an error then arrives inside the stream. Running the check at
    call time turns a bad Hogwild request into an HTTP 400, streaming or not;
    the check in ``process_inputs`` still runs (and, for requests whose prompt
    length is unknown here, is the one that decides).
    """
    extra = getattr(sampling_params, "extra_args", None)
    if requested(extra):
        from vllm.renderers.inputs.preprocess import extract_prompt_len

        found = parsed(engine.vllm_config, extra)
        try:
            prompt_len = extract_prompt_len(engine.model_config, prompt)
        except Exception:  # an EngineCoreRequest, a streaming input, ...: checked later
            prompt_len = None
        if prompt_len is not None:
            if found.options.protocol == "collab" and engine.tokenizer is not None:
                prompt_len = extended_len(engine.tokenizer, prompt_len, found.options, sampling_params.n,
                                          in_chat=found.preamble_in_chat)
            check_sizes(engine.vllm_config, found.options, sampling_params.n, prompt_len, sampling_params.max_tokens)
        if found.options.forks:
            check_forkjoin_params(sampling_params, found.options)
        sampling_params = copy.copy(sampling_params)  # never mutate the caller's SamplingParams
        sampling_params.extra_args = kept(extra, found)
    return original(engine, prompt, sampling_params, request_id, *args, **kwargs)


def process_inputs(original, processor, request_id, prompt, params, *args, **kwargs):
    user_max_tokens = getattr(params, "max_tokens", None)
    request = original(processor, request_id, prompt, params, *args, **kwargs)
    p = request.params
    extra = getattr(p, "extra_args", None)
    if not requested(extra):
        return request
    found = parsed(processor.vllm_config, extra)
    tail = None
    if found.options.protocol == "collab":
        # The collaboration protocol's text goes into the group's prompt (raw prompts: the preamble
        # too; chat got it as a system message). Checked below with the prompt's new length.
        if request.prompt_token_ids is None or request.mm_features:
            raise request_error(HogwildOptionError(
                "prompt", "the collab protocol extends the prompt's tokens: send text or token ids"))
        ids, tail = extend_prompt(processor.tokenizer, request.prompt_token_ids, found.options, p.n,
                                  in_chat=found.preamble_in_chat)
        request.prompt_token_ids = ids
    max_tokens = check_sizes(processor.vllm_config, found.options, p.n, len(request.prompt_token_ids or ()),
                             p.max_tokens if user_max_tokens is not None else None)
    num_workers, fork_now, open_goal, unforked = p.n, None, "", None
    if found.options.forks:
        num_workers = forkjoin_lanes(processor.vllm_config, found.options, p.n)
        fork_now, open_goal, unforked = prompt_fork(processor, request, p, found.options, num_workers, max_tokens)
    p = copy.copy(p)  # never mutate the caller's SamplingParams
    p.max_tokens = max_tokens
    p.n = num_workers
    p.extra_args = {k: v for k, v in extra.items()
                    if k not in (REQUEST_KEY, PARSED_KEY) and not k.startswith(FLAT_PREFIX)}
    p.extra_args[SPEC_KEY] = RequestSpec(found.options, num_workers, tail, fork_now, open_goal,
                                        unforked).to_wire()
    request.sampling_params = p
    return request


# -- the rows ----------------------------------------------------------------------------------------

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


SECTIONS = (request_check, stream_check, chat_and_answers, request_and_response_models, tools)
