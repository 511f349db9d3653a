"""Every runtime hook the plugin installs into vLLM, in one place, each applied once.

1. ``EngineArgs.create_engine_config`` (the switch): when the engine options
   carry ``additional_config["hogwild"]``, select the Hogwild scheduler and
   worker classes (vLLM's own ``scheduler_cls`` / ``worker_cls`` knobs) and
   refuse models Hogwild cannot serve. Without the switch it calls through.
2. ``InputProcessor.process_inputs`` (the request check): a request that
   carries Hogwild options is validated in the front end, before any work
   starts, and its options are normalized for the engine core. Requests
   without Hogwild options pass through untouched.

The worker-side hook (the runner's ``_prepare_inputs``) is installed per
runner instance by :mod:`vllm_hogwild.step_context`. ``patches/`` holds, for
each hook, the upstream change that would make it unnecessary.
"""

from __future__ import annotations

import copy
import functools
import logging
import os

from vllm_hogwild.options import (
    REQUEST_KEY,
    EngineOptions,
    HogwildOptionError,
    check_request,
    parse_request,
    requested,
)

logger = logging.getLogger(__name__)

SCHEDULER_CLS = "vllm_hogwild.scheduler.HogwildScheduler"
CPU_WORKER_CLS = "vllm_hogwild.worker.HogwildCPUWorker"
CUDA_WORKER_CLS = "vllm_hogwild.worker_cuda.HogwildGPUWorker"
DEFAULT_SCHEDULER_CLS = (None, "vllm.v1.core.sched.scheduler.Scheduler")

_installed = False


def install() -> None:
    global _installed
    if _installed:
        return
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine.input_processor import InputProcessor

    _wrap(EngineArgs, "create_engine_config", _create_engine_config)
    _wrap(InputProcessor, "process_inputs", _process_inputs)
    _installed = True


def _wrap(owner: type, name: str, wrapper) -> None:
    original = getattr(owner, name)
    if getattr(original, "_hogwild_original", None) is not None:
        return

    @functools.wraps(original)
    def hooked(self, *args, **kwargs):
        return wrapper(original, self, *args, **kwargs)

    hooked._hogwild_original = original  # type: ignore[attr-defined]
    setattr(owner, name, hooked)


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
    _select_classes(engine_args)
    config = original(engine_args, *args, **kwargs)
    check_model(config)
    logger.info("Hogwild switched on: %s", options)
    return config


def _select_classes(engine_args) -> None:
    from vllm.platforms import current_platform

    if engine_args.scheduler_cls not in DEFAULT_SCHEDULER_CLS and engine_args.scheduler_cls != SCHEDULER_CLS:
        raise HogwildOptionError("scheduler_cls", "Hogwild brings its own scheduler; leave scheduler_cls unset")
    if engine_args.worker_cls not in ("auto", CPU_WORKER_CLS, CUDA_WORKER_CLS):
        raise HogwildOptionError("worker_cls", "Hogwild brings its own worker; leave worker_cls unset")
    if current_platform.is_cpu():
        engine_args.worker_cls = CPU_WORKER_CLS
    elif current_platform.is_cuda():
        engine_args.worker_cls = CUDA_WORKER_CLS
        # The runner hook wraps the V1 model runner; the segment rows are
        # overwritten in Python after the native kernel, which CUDA graphs
        # would skip on replay.
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
        engine_args.enforce_eager = True
    else:
        raise HogwildOptionError("additional_config.hogwild",
                                 f"no Hogwild worker for platform {current_platform.device_name!r} yet")
    engine_args.scheduler_cls = SCHEDULER_CLS
    engine_args.async_scheduling = False  # the scheduler builds views from settled token counts


def check_model(config) -> None:
    """Refuse models whose attention Hogwild cannot re-position (raises naming the field)."""
    from vllm_hogwild.rope import RopeSpec

    model_config = config.model_config
    hf = model_config.hf_text_config
    RopeSpec.from_hf_config(hf)  # no RoPE, MRoPE, LongRoPE, ...: ValueError naming rope_type
    if model_config.get_sliding_window() is not None or getattr(hf, "layer_types", None) and any(
        t != "full_attention" for t in hf.layer_types
    ):
        raise HogwildOptionError("sliding_window", "models with sliding-window or non-attention layers are not supported")
    if config.cache_config.cache_dtype not in ("auto", None):
        raise HogwildOptionError("kv_cache_dtype", "Hogwild reads the KV cache unquantized; use kv_cache_dtype='auto'")
    if config.speculative_config is not None:
        raise HogwildOptionError("speculative_config", "speculative decoding with Hogwild is not supported yet")


# -- the request check --------------------------------------------------------


def _process_inputs(original, processor, request_id, prompt, params, *args, **kwargs):
    user_max_tokens = getattr(params, "max_tokens", None)
    request = original(processor, request_id, prompt, params, *args, **kwargs)
    p = request.params
    extra = getattr(p, "extra_args", None)
    if not requested(extra):
        return request
    config = processor.vllm_config
    try:
        options = parse_request(extra)
        max_tokens = check_request(
            EngineOptions.from_additional_config(config.additional_config),
            num_workers=p.n,
            prompt_len=len(request.prompt_token_ids or ()),
            max_tokens=p.max_tokens if user_max_tokens is not None else None,
            max_model_len=config.model_config.max_model_len,
            block_size=config.cache_config.block_size,
            num_kv_blocks=config.cache_config.num_gpu_blocks,
        )
    except HogwildOptionError as err:
        raise request_error(err) from None
    p = copy.copy(p)  # never mutate the caller's SamplingParams
    p.max_tokens = max_tokens
    p.extra_args = {k: v for k, v in extra.items() if k != REQUEST_KEY and not k.startswith("hogwild_")}
    p.extra_args[REQUEST_KEY] = {**options.to_dict(), "num_workers": p.n}
    request.sampling_params = p
    return request
