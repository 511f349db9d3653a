"""A Hogwild request in the front end: parsed once, checked before any work, stamped for the engine core.

The hooks that see a request, in order (:mod:`vllm_hogwild.hooks` installs them):

- the OpenAI routes (:func:`create_response`): the Hogwild fields are parsed
  and checked first, before vLLM turns the request into sampling parameters,
  so any bad value is a 400 naming its field; the group's answer is added to
  the response afterwards (:mod:`vllm_hogwild.serving.responses`);
- chat (:func:`add_chat_requests` offline, :func:`render_chat_request` in the
  server): a ``collab`` request's conversation gets the preamble as a system
  message, before the chat template renders it;
- ``AsyncLLM.generate`` (:func:`generate`): the sizes are checked when it is
  called, so that a bad streaming request is a 400 before its response starts;
- ``InputProcessor.process_inputs`` (:func:`process_inputs`): the last check,
  with the prompt's final length; a ``collab`` prompt gets its section headers
  (and, raw prompts, the preamble); the request's sampling parameters (a
  private copy) get the per-worker ``max_tokens`` and, for the engine core, the
  :class:`~vllm_hogwild.core.options.RequestSpec` in place of the options.

The options are parsed once per request: the first hook keeps them
(:class:`Parsed`) in the request's extra args where it owns that dict (the
server's request, a copy of the caller's parameters), and the later hooks
reuse them. Errors are ``VLLMValidationError`` (HTTP 400, a ``ValueError``
offline) naming the field.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass, replace
from typing import Any, Mapping

from vllm_hogwild.core.collab import extend_prompt, extended_len, with_preamble
from vllm_hogwild.core.options import (
    FLAT_PREFIX,
    REFUSED_KEY,
    REQUEST_KEY,
    SPEC_KEY,
    EngineOptions,
    HogwildOptionError,
    RequestOptions,
    RequestSpec,
    check_request,
    parse_request,
    request_field,
    requested,
    spec_slack,
)

PARSED_KEY = "_hogwild_parsed"  # extra_args entry: the request's options, parsed by an earlier hook


@dataclass(frozen=True)
class Parsed:
    options: RequestOptions
    client_patterns: bool  # the engine setting they were checked under
    preamble_in_chat: bool = False  # the chat template rendered the collab preamble


@functools.lru_cache(maxsize=1)
def _validation_error_cls() -> type:
    from vllm.exceptions import VLLMValidationError

    class HogwildValidationError(VLLMValidationError, ValueError):
        """A bad Hogwild request: a client error (HTTP 400) for vLLM, a ``ValueError`` for users."""

    return HogwildValidationError


def request_error(err: HogwildOptionError) -> Exception:
    return _validation_error_cls()(str(err), parameter=err.parameter)


def parsed(config, extra_args: Mapping[str, Any]) -> Parsed:
    """The request's options, checked against the engine's switch; parsed here unless an earlier hook did.

    Raises the client error vLLM turns into HTTP 400, naming the field.
    """
    try:
        engine_options = _engine_options(config, extra_args)
        found = extra_args.get(PARSED_KEY)
        if isinstance(found, Parsed) and found.client_patterns == engine_options.client_patterns:
            return found
        options = parse_request({k: v for k, v in extra_args.items() if k != PARSED_KEY},
                                client_patterns=engine_options.client_patterns)
    except HogwildOptionError as err:
        raise request_error(err) from None
    return Parsed(options, engine_options.client_patterns)


def kept(extra_args: Mapping[str, Any] | None, found: Parsed) -> dict[str, Any]:
    """A copy of ``extra_args`` that carries ``found`` for the hooks that follow."""
    return {**(extra_args or {}), PARSED_KEY: found}


def _engine_options(config, extra_args: Mapping[str, Any]) -> EngineOptions:
    engine_options = EngineOptions.from_additional_config(config.additional_config)
    if engine_options is not None:
        return engine_options
    refused = (config.additional_config or {}).get(REFUSED_KEY)
    if refused:
        raise HogwildOptionError(request_field(extra_args),
                                 f"this model cannot serve Hogwild requests ({refused['message']})")
    raise HogwildOptionError(
        request_field(extra_args),
        "Hogwild is not switched on for this engine; start it with `vllm serve MODEL --plugin hogwild` "
        "or, offline, LLM(..., additional_config={'hogwild': {}})")


def forkjoin_lanes(config, options: RequestOptions, n: int) -> int:
    """A fork/join request's lanes (the trunk and its branch lanes); ``n`` must be 1."""
    from vllm_hogwild.core.forkjoin import branch_lanes

    try:
        if spec_slack(config):
            raise HogwildOptionError("hogwild_protocol", f"fork/join requests ({options.protocol}) are not served "
                                                         "with speculative decoding yet; start the engine without "
                                                         "--speculative-config")
        if n != 1:
            raise HogwildOptionError("n", f"a fork/join request ({options.protocol}) is one completion: n 1, not {n}; "
                                          "its branches are lanes of their own")
        engine = EngineOptions.from_additional_config(config.additional_config)
        return 1 + branch_lanes(options.protocol, options.max_branches, engine.max_workers)
    except HogwildOptionError as err:
        raise request_error(err) from None


def check_sizes(config, options: RequestOptions, num_workers: int, prompt_len: int, max_tokens: int | None) -> int:
    """The per-worker ``max_tokens`` of a request with these options, checked against the engine."""
    view_lanes = None
    if options.forks:
        num_workers = forkjoin_lanes(config, options, num_workers)
        view_lanes = num_workers if options.branches == "hogwild" else 2
    try:
        if options.protocol in ("named", "collab"):
            from vllm_hogwild.core.protocol import names

            names(num_workers)  # raises naming n
        return check_request(
            EngineOptions.from_additional_config(config.additional_config),
            num_workers=num_workers, prompt_len=prompt_len, max_tokens=max_tokens,
            max_model_len=config.model_config.max_model_len, block_size=config.cache_config.block_size,
            num_kv_blocks=config.cache_config.num_gpu_blocks, slack=spec_slack(config), view_lanes=view_lanes,
        )
    except HogwildOptionError as err:
        raise request_error(err) from None


# -- the hooks -----------------------------------------------------------------------------------------

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
        with_accept_steps(response, [o for res in final_res_batch for o in res.outputs], by_index=False)
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
        with_accept_steps(response, list(last[0].outputs), by_index=True)
    return response


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
    num_workers, fork_now, open_goal = p.n, None, ""
    if found.options.forks:
        num_workers = forkjoin_lanes(processor.vllm_config, found.options, p.n)
        fork_now, open_goal = _prompt_fork(processor, request, p, found.options, num_workers, max_tokens)
    p = copy.copy(p)  # never mutate the caller's SamplingParams
    p.max_tokens = max_tokens
    p.n = num_workers
    p.extra_args = {k: v for k, v in extra.items()
                    if k not in (REQUEST_KEY, PARSED_KEY) and not k.startswith(FLAT_PREFIX)}
    p.extra_args[SPEC_KEY] = RequestSpec(found.options, num_workers, tail, fork_now, open_goal).to_wire()
    request.sampling_params = p
    return request


PROMPT_TAIL_TOKENS = 8192  # a fork/join prompt's goal is looked for in its last this many tokens


def _prompt_fork(processor, request, params, options: RequestOptions, num_lanes: int, max_tokens: int):
    """``(fork_now, open_goal)`` of a fork/join request's prompt (see :class:`RequestSpec`); its sampling
    parameters checked: the engine ends lanes with their end of sequence, which these would defeat."""
    from vllm_hogwild.core.forkjoin import FAMILIES, ForkTooWide, decide, prompt_goal

    check_forkjoin_params(params, options)
    if request.prompt_token_ids is None or processor.tokenizer is None:
        raise request_error(HogwildOptionError(
            "prompt", "a fork/join request reads its prompt's text: send text or token ids, with a tokenizer"))
    family = FAMILIES[options.protocol]
    text = processor.tokenizer.decode(request.prompt_token_ids[-PROMPT_TAIL_TOKENS:])
    parts, open_goal = prompt_goal(family, text)
    if parts is None:
        return None, open_goal
    try:
        fork = decide(family, text.rstrip(), depth=0, budget_left=max_tokens, max_branches=num_lanes - 1)
    except ForkTooWide as err:
        raise request_error(HogwildOptionError(
            "hogwild_max_branches", f"the prompt ends in a goal of {err.num_parts} parts: more than this request's "
                            f"{err.cap} branch lanes (raise hogwild_max_branches, up to --hogwild-max-workers - 1)"))
    return (None if fork is None else fork.numbers), ""


def check_forkjoin_params(params, options: RequestOptions) -> None:
    """The sampling parameters a fork/join request refuses, each named: the engine ends its branch lanes with
    their end of sequence, and stop strings would end one lane, not the request."""
    from vllm.sampling_params import RequestOutputKind

    ends = "the engine ends its branch lanes with their end of sequence"
    refused = {
        "ignore_eos": (params.ignore_eos, ends),
        "min_tokens": (params.min_tokens > 0, ends),
        "stop": (bool(params.stop), "a stop string would end one lane, not the request; use stop_token_ids"),
        "output_kind": (params.output_kind == RequestOutputKind.CUMULATIVE,
                        "a fork/join request streams deltas or comes whole, not cumulative outputs"),
    }
    for name, (bad, why) in refused.items():
        if bad:
            raise request_error(HogwildOptionError(name, f"not with a fork/join request ({options.protocol}): {why}"))
