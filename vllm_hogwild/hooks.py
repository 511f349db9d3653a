"""Every runtime hook the plugin installs into vLLM, in one place, each applied once.

1. ``EngineArgs.create_engine_config`` (the switch): when the engine options
   carry ``additional_config["hogwild"]``, select the Hogwild scheduler and
   worker classes (vLLM's own ``scheduler_cls`` / ``worker_cls`` knobs) and
   refuse models Hogwild cannot serve. Without the switch it calls through.
2. ``InputProcessor.process_inputs`` (the request check): a request that
   carries Hogwild options is validated in the front end, before any work
   starts, and its options are normalized for the engine core. Requests
   without Hogwild options pass through untouched. ``AsyncLLM.generate`` runs
   the same check when it is called, so that a server refuses a bad streaming
   request with HTTP 400 before its response starts.
3. ``EngineArgs.add_cli_args`` and ``EngineArgs.from_cli_args`` (the flags):
   add ``--plugin hogwild`` and ``--hogwild-*`` to ``vllm serve`` and fold them
   into ``additional_config["hogwild"]`` (:mod:`vllm_hogwild.serving.cli`).
4. ``StatLoggerManager.__init__`` (the metrics): when Hogwild is switched on,
   put :class:`~vllm_hogwild.serving.metrics.HogwildStatLogger` first among the
   front end's stat loggers (:mod:`vllm_hogwild.serving.metrics`).
5. ``OfflineInferenceMixin._add_chat_requests`` and
   ``OpenAIServingChat.render_chat_request`` (the collab preamble in chat): put
   the preamble into a ``collab`` request's conversation as a system message,
   before the chat template renders it (:mod:`vllm_hogwild.core.collab`); and
   ``OpenAIServingCompletion.create_completion`` /
   ``OpenAIServingChat.create_chat_completion`` (the answer): add a group's
   final answer to the response or the stream (:mod:`vllm_hogwild.serving.responses`).

The worker-side hook (the runner's ``_prepare_inputs``) is installed per
runner instance by :mod:`vllm_hogwild.engine.runner_hook`. ``patches/`` holds, for
each hook, the upstream change that would make it unnecessary.
"""

from __future__ import annotations

import copy
import functools
import inspect
import logging
import os

from vllm_hogwild.attention.paths import RUNTIME_KEY, resolve_here
from vllm_hogwild.core.options import (
    ENGINE_KEY,
    REFUSED_KEY,
    REQUEST_KEY,
    EngineOptions,
    HogwildOptionError,
    RequestOptions,
    check_request,
    parse_request,
    request_field,
    requested,
)

logger = logging.getLogger(__name__)

SCHEDULER_CLS = "vllm_hogwild.engine.scheduler.HogwildScheduler"
CPU_WORKER_CLS = "vllm_hogwild.engine.worker.HogwildCPUWorker"
CUDA_WORKER_CLS = "vllm_hogwild.engine.worker_cuda.HogwildGPUWorker"
DEFAULT_SCHEDULER_CLS = (None, "vllm.v1.core.sched.scheduler.Scheduler")

_installed = False


def install() -> None:
    global _installed
    if _installed:
        return
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.engine.input_processor import InputProcessor

    from vllm.v1.metrics.loggers import StatLoggerManager

    _wrap(EngineArgs, "create_engine_config", _create_engine_config)
    _wrap(InputProcessor, "process_inputs", _process_inputs)
    _wrap(AsyncLLM, "generate", _generate)
    _wrap(EngineArgs, "add_cli_args", _add_cli_args)
    _wrap(EngineArgs, "from_cli_args", _from_cli_args)
    _wrap(StatLoggerManager, "__init__", _stat_logger_manager_init)
    from vllm.entrypoints.common.offline import OfflineInferenceMixin
    from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
    from vllm.entrypoints.openai.completion.serving import OpenAIServingCompletion

    _wrap(OfflineInferenceMixin, "_add_chat_requests", _add_chat_requests)
    _wrap(OpenAIServingChat, "render_chat_request", _render_chat_request)
    _wrap(OpenAIServingChat, "create_chat_completion", _create_response)
    _wrap(OpenAIServingCompletion, "create_completion", _create_response)
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


@functools.lru_cache(maxsize=1)
def _validation_error_cls() -> type:
    from vllm.exceptions import VLLMValidationError

    class HogwildValidationError(VLLMValidationError, ValueError):
        """A bad Hogwild request: a client error (HTTP 400) for vLLM, a ``ValueError`` for users."""

    return HogwildValidationError


def request_error(err: HogwildOptionError) -> Exception:
    return _validation_error_cls()(str(err), parameter=err.parameter)


# -- the switch ---------------------------------------------------------------


def _create_engine_config(original, engine_args, *args, **kwargs):
    options = EngineOptions.from_additional_config(engine_args.additional_config)
    if options is None:
        return original(engine_args, *args, **kwargs)
    try:
        check_model(engine_args.create_model_config())
    except HogwildOptionError as err:
        # A model Hogwild cannot serve is served as stock vLLM; Hogwild
        # requests are then refused one by one, naming the reason.
        logger.warning("Hogwild is off for this model (%s); Hogwild requests will be refused", err)
        engine_args.additional_config = {
            **{k: v for k, v in engine_args.additional_config.items() if k != ENGINE_KEY},
            REFUSED_KEY: {"parameter": err.parameter, "message": str(err)},
        }
        return original(engine_args, *args, **kwargs)
    _select_classes(engine_args)
    config = original(engine_args, *args, **kwargs)
    check_engine(config)
    logger.info("Hogwild switched on: %s", options)
    return config


def _select_classes(engine_args, platform=None) -> None:
    """Set vLLM's own knobs for Hogwild: scheduler and worker classes, the attention backend and path.

    ``platform``: vLLM's ``current_platform`` (a stand-in in tests).
    """
    if platform is None:
        from vllm.platforms import current_platform as platform

    if engine_args.scheduler_cls not in DEFAULT_SCHEDULER_CLS and engine_args.scheduler_cls != SCHEDULER_CLS:
        raise HogwildOptionError("scheduler_cls", "Hogwild brings its own scheduler; leave scheduler_cls unset")
    if engine_args.worker_cls not in ("auto", CPU_WORKER_CLS, CUDA_WORKER_CLS):
        raise HogwildOptionError("worker_cls", "Hogwild brings its own worker; leave worker_cls unset")
    if platform.is_cpu():
        engine_args.worker_cls = CPU_WORKER_CLS
        path = resolve_here("cpu")
    elif platform.is_cuda():
        engine_args.worker_cls = CUDA_WORKER_CLS
        _select_flash_attention(engine_args)
        # The runner hook wraps the V1 model runner. CUDA graphs stay on: the Hogwild
        # builders report no full-graph support, so vLLM keeps piecewise graphs, between
        # whose pieces attention (and its per-step plan) runs eagerly (docs/architecture.md).
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
        path = resolve_here("cuda")
    else:
        raise HogwildOptionError("additional_config.hogwild",
                                 f"no Hogwild worker for platform {platform.device_name!r} yet")
    engine_args.scheduler_cls = SCHEDULER_CLS
    # The scheduler needs step k's sampled tokens (step ends, placed tokens, answers) before it
    # builds step k+1's views; async scheduling would schedule k+1 first (docs/architecture.md).
    engine_args.async_scheduling = False
    engine_args.additional_config = {**engine_args.additional_config, RUNTIME_KEY: {"attention": path}}
    from vllm_hogwild.engine.forcing import LOGITS_PROCESSOR

    processors = list(engine_args.logits_processors or [])
    if LOGITS_PROCESSOR not in processors:
        engine_args.logits_processors = [*processors, LOGITS_PROCESSOR]  # tokens the engine places


def _select_flash_attention(engine_args) -> None:
    """CUDA: Hogwild drives vLLM's FlashAttention backend; choose it unless the user chose another."""
    chosen = engine_args.attention_backend or getattr(engine_args.attention_config, "backend", None)
    name = getattr(chosen, "name", chosen)
    if name is None:
        engine_args.attention_backend = "FLASH_ATTN"  # vLLM would pick FlashInfer first on Blackwell GPUs
    elif str(name).upper() != "FLASH_ATTN":
        raise HogwildOptionError(
            "attention_backend", f"{name} has no Hogwild implementation; on CUDA Hogwild runs on FLASH_ATTN "
            "(leave --attention-backend unset or set it to FLASH_ATTN)")


def check_model(model_config) -> None:
    """Refuse models whose attention Hogwild cannot re-position (raises naming the field)."""
    from vllm_hogwild.core.rope import RopeSpec

    hf = model_config.hf_text_config
    RopeSpec.from_hf_config(hf)  # no RoPE, MRoPE, LongRoPE, ...: raises naming the field
    if model_config.get_sliding_window() is not None or getattr(hf, "layer_types", None) and any(
        t != "full_attention" for t in hf.layer_types
    ):
        raise HogwildOptionError("sliding_window", "models with sliding-window or non-attention layers are not supported")


def check_engine(config, platform=None) -> None:
    """Refuse engine settings Hogwild cannot run with (raises naming the flag)."""
    if platform is None:
        from vllm.platforms import current_platform as platform

    if config.cache_config.cache_dtype not in ("auto", None):
        raise HogwildOptionError("kv_cache_dtype", "Hogwild reads the KV cache unquantized; use kv_cache_dtype='auto'")
    import torch

    if platform.is_cuda() and config.model_config.dtype not in (torch.float16, torch.bfloat16):
        raise HogwildOptionError(
            "dtype", f"{config.model_config.dtype} on CUDA: FlashAttention, which Hogwild drives there, takes "
            "float16 or bfloat16 (use --dtype bfloat16); float32 runs on the CPU")
    if config.speculative_config is not None:
        raise HogwildOptionError("speculative_config", "speculative decoding with Hogwild is not supported yet")


# -- the flags ----------------------------------------------------------------


def _add_cli_args(original, parser, *args, **kwargs):
    from vllm_hogwild.serving.cli import add_cli_args

    return add_cli_args(original(parser, *args, **kwargs))


def _from_cli_args(original, cls, args, *rest, **kwargs):
    from vllm_hogwild.serving.cli import fold_cli_args

    engine_args = original(cls, args, *rest, **kwargs)
    fold_cli_args(args, engine_args)
    return engine_args


# -- the metrics --------------------------------------------------------------


def _stat_logger_manager_init(original, manager, vllm_config, *args, **kwargs):
    if EngineOptions.from_additional_config(vllm_config.additional_config) is not None:
        from vllm_hogwild.serving.metrics import HogwildStatLogger

        bound = inspect.signature(original).bind(manager, vllm_config, *args, **kwargs)
        custom = bound.arguments.get("custom_stat_loggers") or []
        bound.arguments["custom_stat_loggers"] = [HogwildStatLogger, *custom]
        return original(*bound.args, **bound.kwargs)
    return original(manager, vllm_config, *args, **kwargs)


# -- the collaboration protocol's preamble in chat -----------------------------


def _add_chat_requests(original, llm, messages, params, *args, **kwargs):
    """``LLM.chat`` / ``LLM.enqueue_chat``: a ``collab`` request's conversation gets the preamble."""
    from vllm.renderers.inputs.preprocess import conversation_to_seq

    from vllm_hogwild.core.collab import collab_options, marked, with_preamble

    conversations = conversation_to_seq(messages)
    seq_params = llm._params_to_seq(params, len(conversations))
    new_convs, new_params, changed = [], [], False
    for conversation, p in zip(conversations, seq_params):
        options = collab_options(getattr(p, "extra_args", None))
        if options is not None:
            conversation = with_preamble(conversation, options, p.n)
            p = copy.copy(p)  # never mutate the caller's SamplingParams
            p.extra_args = marked(p.extra_args)
            changed = True
        new_convs.append(conversation)
        new_params.append(p)
    if not changed:
        return original(llm, messages, params, *args, **kwargs)
    return original(llm, new_convs, new_params, *args, **kwargs)


async def _render_chat_request(original, serving, request, *args, **kwargs):
    """``/v1/chat/completions``: a ``collab`` request's messages get the preamble before the template."""
    from vllm_hogwild.core.collab import collab_options, marked, with_preamble

    options = collab_options(request.vllm_xargs)
    if options is not None:
        request.messages = with_preamble(request.messages, options, request.n or 1)
        request.vllm_xargs = marked(request.vllm_xargs)
    return await original(serving, request, *args, **kwargs)


async def _create_response(original, serving, request, *args, **kwargs):
    """Both OpenAI routes: the Hogwild fields checked first, and a group's final answer in the response.

    The check runs before vLLM turns the request into sampling parameters, so a
    bad Hogwild value is a 400 naming its field rather than vLLM's own message
    about ``extra_args`` (see :mod:`vllm_hogwild.serving.responses` for the answer).
    """
    from vllm_hogwild.serving.responses import with_answer

    if requested(getattr(request, "vllm_xargs", None)):
        check_options(serving.engine_client.vllm_config, request.vllm_xargs)
    return with_answer(request, await original(serving, request, *args, **kwargs))


# -- the request check --------------------------------------------------------


def _process_inputs(original, processor, request_id, prompt, params, *args, **kwargs):
    from vllm_hogwild.core.collab import PREAMBLE_MARK, collab_options, extend_prompt

    user_max_tokens = getattr(params, "max_tokens", None)
    request = original(processor, request_id, prompt, params, *args, **kwargs)
    p = request.params
    extra = getattr(p, "extra_args", None)
    if not requested(extra):
        return request
    spec = {"num_workers": p.n}
    collab = collab_options(extra)
    if collab is not None:
        # The collaboration protocol's text goes into the group's prompt (raw prompts: the preamble
        # too; chat got it as a system message). Checked below with the prompt's new length.
        if request.prompt_token_ids is None or request.mm_features:
            raise request_error(HogwildOptionError(
                "prompt", "the collab protocol extends the prompt's tokens: send text or token ids"))
        ids, tail = extend_prompt(processor.tokenizer, request.prompt_token_ids, collab, p.n,
                                  in_chat=bool(extra.get(PREAMBLE_MARK)))
        request.prompt_token_ids = ids
        spec["prompt_tail"] = tail.to_dict()
    options, max_tokens = check(
        processor.vllm_config, extra, num_workers=p.n, prompt_len=len(request.prompt_token_ids or ()),
        max_tokens=p.max_tokens if user_max_tokens is not None else None,
    )
    p = copy.copy(p)  # never mutate the caller's SamplingParams
    p.max_tokens = max_tokens
    p.extra_args = {k: v for k, v in extra.items()
                    if k not in (REQUEST_KEY, PREAMBLE_MARK) and not k.startswith("hogwild_")}
    p.extra_args[REQUEST_KEY] = {**options.to_dict(), **spec}
    request.sampling_params = p
    return request


def _generate(original, engine, prompt, sampling_params, request_id, *args, **kwargs):
    """Check a Hogwild request before the server starts its response.

    ``AsyncLLM.generate`` is an async generator: its own input processing
    runs on the first iteration, after a streaming response has already
    begun, and an error then arrives inside the stream. Running the same
    check at call time turns a bad Hogwild field into an HTTP 400, streaming
    or not; the check in ``process_inputs`` still runs (and, for requests
    whose prompt length is unknown here, is the one that decides).
    """
    extra = getattr(sampling_params, "extra_args", None)
    if requested(extra):
        from vllm.renderers.inputs.preprocess import extract_prompt_len

        try:
            prompt_len = extract_prompt_len(engine.model_config, prompt)
        except Exception:  # an EngineCoreRequest, a streaming input, ...: checked later
            prompt_len = None
        if prompt_len is not None:
            from vllm_hogwild.core.collab import PREAMBLE_MARK, collab_options, extended_len

            collab = collab_options(extra)
            if collab is not None and engine.tokenizer is not None:
                prompt_len = extended_len(engine.tokenizer, prompt_len, collab, sampling_params.n,
                                          in_chat=bool(extra.get(PREAMBLE_MARK)))
            check(engine.vllm_config, extra, num_workers=sampling_params.n, prompt_len=prompt_len,
                  max_tokens=sampling_params.max_tokens)
    return original(engine, prompt, sampling_params, request_id, *args, **kwargs)


def check_options(config, extra_args) -> RequestOptions:
    """The request's Hogwild options, checked against the engine's switch (no sizes yet).

    Raises the client error vLLM turns into HTTP 400, naming the field.
    """
    try:
        return _options(config, extra_args)[1]
    except HogwildOptionError as err:
        raise request_error(err) from None


def _options(config, extra_args) -> tuple[EngineOptions, RequestOptions]:
    engine_options = EngineOptions.from_additional_config(config.additional_config)
    if engine_options is None:
        refused = (config.additional_config or {}).get(REFUSED_KEY)
        if refused:
            raise HogwildOptionError(
                request_field(extra_args),
                f"this model cannot serve Hogwild requests ({refused['message']})",
            )
        raise HogwildOptionError(
            request_field(extra_args),
            "Hogwild is not switched on for this engine; start it with `vllm serve MODEL --plugin hogwild` "
            "or, offline, LLM(..., additional_config={'hogwild': {}})",
        )
    from vllm_hogwild.core.collab import PREAMBLE_MARK

    options = parse_request({k: v for k, v in extra_args.items() if k != PREAMBLE_MARK},
                            client_patterns=engine_options.client_patterns)
    return engine_options, options


def check(config, extra_args, num_workers: int, prompt_len: int, max_tokens: int | None):
    """Validate a Hogwild request against the engine: ``(options, per-worker max_tokens)``.

    Raises the client error vLLM turns into HTTP 400, naming the field.
    """
    try:
        engine_options, options = _options(config, extra_args)
        if options.protocol in ("named", "collab"):
            from vllm_hogwild.core.protocol import names

            names(num_workers)  # raises naming n
        max_tokens = check_request(
            engine_options,
            num_workers=num_workers,
            prompt_len=prompt_len,
            max_tokens=max_tokens,
            max_model_len=config.model_config.max_model_len,
            block_size=config.cache_config.block_size,
            num_kv_blocks=config.cache_config.num_gpu_blocks,
        )
    except HogwildOptionError as err:
        raise request_error(err) from None
    return options, max_tokens
