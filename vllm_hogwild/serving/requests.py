"""A Hogwild request in the front end: parsed once, checked before any work, stamped for the engine core.

What the request hooks (:mod:`vllm_hogwild.patches.request_hooks`, in the order a
request meets them) check and build: the options parsed once per request
(:func:`parsed`: the first hook keeps them, :class:`Parsed`, in the request's
extra args where it owns that dict, the server's request or a copy of the
caller's parameters, and the later hooks reuse them, :func:`kept`); the sizes
(:func:`check_sizes`: workers, prompt, ``max_tokens`` against the engine's
limits); a fork/join request's lanes (:func:`forkjoin_lanes`), the goal its
prompt ends in (:func:`prompt_fork`) and the sampling parameters it refuses
(:func:`check_forkjoin_params`). Errors are ``VLLMValidationError`` (HTTP 400,
a ``ValueError`` offline) naming the field (:func:`request_error`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Mapping

from vllm_hogwild.core.options import (
    REFUSED_KEY,
    EngineOptions,
    HogwildOptionError,
    RequestOptions,
    check_request,
    parse_request,
    request_field,
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
    from vllm_hogwild.core.forkjoin.families import branch_lanes

    try:
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
            from vllm_hogwild.core.protocol_text import names

            names(num_workers)  # raises naming n
        return check_request(
            EngineOptions.from_additional_config(config.additional_config),
            num_workers=num_workers, prompt_len=prompt_len, max_tokens=max_tokens,
            max_model_len=config.model_config.max_model_len, block_size=config.cache_config.block_size,
            num_kv_blocks=config.cache_config.num_gpu_blocks, slack=spec_slack(config), view_lanes=view_lanes,
        )
    except HogwildOptionError as err:
        raise request_error(err) from None


# -- fork/join ------------------------------------------------------------------------------------------

PROMPT_TAIL_TOKENS = 8192  # a fork/join prompt's goal is looked for in its last this many tokens


def prompt_fork(processor, request, params, options: RequestOptions, num_workers: int, max_tokens: int):
    """``(fork_now, open_goal, unforked)`` of a fork/join request's prompt (see :class:`RequestSpec`); its
    sampling parameters checked: the engine ends lanes with their end of sequence, which these would defeat.

    A prompt that ends in a complete goal of more parts than the request's branch lanes is refused (HTTP 400
    naming ``hogwild_max_branches``), in every family and before the family's own rules; a goal the family's
    rules do not fork (NPR: more than 5 plans, too little budget) goes on as one sequence, with the reason."""
    from vllm_hogwild.core.forkjoin.families import FAMILIES, ForkTooWide, NoFork, decide, prompt_goal

    check_forkjoin_params(params, options)
    if request.prompt_token_ids is None or processor.tokenizer is None:
        raise request_error(HogwildOptionError(
            "prompt", "a fork/join request reads its prompt's text: send text or token ids, with a tokenizer"))
    family = FAMILIES[options.protocol]
    text = processor.tokenizer.decode(request.prompt_token_ids[-PROMPT_TAIL_TOKENS:])
    parts, open_goal = prompt_goal(family, text)
    if parts is None:
        return None, open_goal, None
    try:
        fork = decide(family, text.rstrip(), depth=0, budget_left=max_tokens, max_branches=num_workers - 1)
    except ForkTooWide as err:
        raise request_error(HogwildOptionError(
            "hogwild_max_branches", f"the prompt ends in a goal of {err.num_parts} parts: more than this request's "
                            f"{err.cap} branch lanes (raise hogwild_max_branches, up to --hogwild-max-workers - 1)"))
    if isinstance(fork, NoFork):
        return None, "", f"the prompt's goal: {fork.reason}"
    return fork.numbers, "", None


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
