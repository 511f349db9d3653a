"""Every runtime hook the plugin installs into vLLM, in one place, each applied once.

Installed by :func:`vllm_hogwild.plugin.register` in every vLLM process. Each
hook calls straight through unless Hogwild is switched on for the engine or
the request carries Hogwild options. The table below is the whole list; what
each does lives beside the code it drives:

============================================================  ===============================================
vLLM target                                                   hook
============================================================  ===============================================
``EngineArgs.create_engine_config``                           the switch (:mod:`vllm_hogwild.switch`)
``EngineArgs.add_cli_args``, ``EngineArgs.from_cli_args``     ``--plugin hogwild``, ``--hogwild-*``
                                                              (:mod:`vllm_hogwild.serving.cli`)
``OpenAIServingCompletion.create_completion``,                the Hogwild fields checked first; the answer
``OpenAIServingChat.create_chat_completion``                  field (:mod:`vllm_hogwild.serving.requests`,
                                                              :mod:`vllm_hogwild.serving.responses`)
``OpenAIServingChat.render_chat_request``,                    the collab preamble in chat
``OfflineInferenceMixin._add_chat_requests``
``OpenAIServingCompletion.request_output_to_completion_response``,  each choice's accept steps, when asked
``OpenAIServingChat.chat_completion_full_generator``               (:mod:`vllm_hogwild.serving.responses`)
``AsyncLLM.generate``                                         the check before a stream starts
``InputProcessor.process_inputs``                             the last check; the spec for the engine core
``StatLoggerManager.__init__``                                the Hogwild metrics (:mod:`vllm_hogwild.serving.metrics`)
``OutputProcessor.add_request``,                              each output token's accept step
``OutputProcessor.process_outputs``,                          (:mod:`vllm_hogwild.serving.accept_steps`)
``RequestState._new_completion_output``
============================================================  ===============================================

The worker-side hooks (the model runner's ``_prepare_inputs``, ``_dummy_run`` and
``propose_draft_token_ids``) are installed per runner instance by
:mod:`vllm_hogwild.runner.runner_hook`; with speculative decoding the worker wraps its
sampler's ``apply_logits_processors`` (:func:`vllm_hogwild.runner.forcing.install_sampler_forcing`). ``patches/`` holds, for each hook, the
upstream change that would make it unnecessary.
"""

from __future__ import annotations

import functools

_installed = False


def install() -> None:
    global _installed
    if _installed:
        return
    from vllm.engine.arg_utils import EngineArgs
    from vllm.entrypoints.common.offline import OfflineInferenceMixin
    from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
    from vllm.entrypoints.openai.completion.serving import OpenAIServingCompletion
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.engine.input_processor import InputProcessor
    from vllm.v1.engine.output_processor import OutputProcessor, RequestState
    from vllm.v1.metrics.loggers import StatLoggerManager

    from vllm_hogwild import switch
    from vllm_hogwild.serving import accept_steps, cli, metrics, requests

    for owner, name, hook in [
        (EngineArgs, "create_engine_config", switch.create_engine_config),
        (EngineArgs, "add_cli_args", cli.hook_add_cli_args),
        (EngineArgs, "from_cli_args", cli.hook_from_cli_args),
        (OpenAIServingCompletion, "create_completion", requests.create_response),
        (OpenAIServingChat, "create_chat_completion", requests.create_response),
        (OpenAIServingChat, "render_chat_request", requests.render_chat_request),
        (OpenAIServingCompletion, "request_output_to_completion_response", requests.completion_response),
        (OpenAIServingChat, "chat_completion_full_generator", requests.chat_full_response),
        (OfflineInferenceMixin, "_add_chat_requests", requests.add_chat_requests),
        (AsyncLLM, "generate", requests.generate),
        (InputProcessor, "process_inputs", requests.process_inputs),
        (StatLoggerManager, "__init__", metrics.hook_stat_logger_manager_init),
        (OutputProcessor, "add_request", accept_steps.add_request),
        (OutputProcessor, "process_outputs", accept_steps.process_outputs),
        (RequestState, "_new_completion_output", accept_steps.new_completion_output),
    ]:
        _wrap(owner, name, hook)
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
