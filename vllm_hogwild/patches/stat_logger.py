"""Metrics: the plugin's stat logger among vLLM's. Front end.

``StatLoggerManager.__init__`` is wrapped (:func:`hook_stat_logger_manager_init`):
with Hogwild on, :class:`~vllm_hogwild.serving.metrics.HogwildStatLogger` goes
first among the loggers; it reads the scheduler's snapshots from the plugin's
own stats channel (:mod:`vllm_hogwild.core.stats_channel`). Both are retired by
``patches/06-scheduler-plugin-stats.patch``.
"""

from __future__ import annotations

import inspect

from vllm_hogwild.core.options import EngineOptions

from vllm_hogwild.patches.points import *  # noqa: F401,F403  (the kinds, TouchPoint and the shared names)
from vllm_hogwild.patches.points import TouchPoint, class_wrap  # noqa: F401


# -- the hooks: target -> (mechanism, where, patch, wrapper) ---------------------------------------

HOOKS = {
    "vllm.v1.metrics.loggers:StatLoggerManager.__init__":
        class_wrap("vllm_hogwild.patches.stat_logger", "hook_stat_logger_manager_init", "06-scheduler-plugin-stats.patch"),
}


# -- the class wraps ---------------------------------------------------------------------------------

def hook_stat_logger_manager_init(original, manager, vllm_config, *args, **kwargs):
    """``StatLoggerManager.__init__``: with Hogwild on, :class:`HogwildStatLogger` goes first among the loggers."""
    if EngineOptions.from_additional_config(vllm_config.additional_config) is not None:
        from vllm_hogwild.serving.metrics import HogwildStatLogger

        bound = inspect.signature(original).bind(manager, vllm_config, *args, **kwargs)
        custom = bound.arguments.get("custom_stat_loggers") or []
        bound.arguments["custom_stat_loggers"] = [HogwildStatLogger, *custom]
        return original(*bound.args, **bound.kwargs)
    return original(manager, vllm_config, *args, **kwargs)


# -- the rows ----------------------------------------------------------------------------------------

def metrics() -> list[TouchPoint]:
    """serving/metrics.py: the plugin's aggregate stat logger beside vLLM's."""
    return [
        TouchPoint(STAT_LOGGERS, "StatLoggerManager.__init__", METHOD, METRICS, params=("self", "vllm_config"),
                   keywords=("custom_stat_loggers",), own=True),
        TouchPoint(STAT_LOGGERS, "StatLoggerManager.__init__", SOURCE,
                   METRICS + ": a class factory is an aggregate logger",
                   text="issubclass(stat_logger_factory, AggregateStatLoggerBase)"),
        TouchPoint(STAT_LOGGERS, "StatLoggerManager.__init__", SOURCE, METRICS + ": built with these keywords",
                   text="stat_logger_factory(vllm_config=vllm_config, engine_indexes=self.engine_indexes"),
        TouchPoint(STAT_LOGGERS, "AggregateStatLoggerBase", CLASS, METRICS),
        TouchPoint(STAT_LOGGERS, "AggregateStatLoggerBase", ABSTRACT, METRICS + " (HogwildStatLogger implements these)",
                   params=("__init__", "record", "log_engine_initialized")),
        TouchPoint(STAT_LOGGERS, "AggregateStatLoggerBase.__init__", METHOD, METRICS,
                   params=("self", "vllm_config", "engine_indexes")),
        TouchPoint(STAT_LOGGERS, "AggregateStatLoggerBase.record", METHOD, METRICS,
                   params=("self", "scheduler_stats", "iteration_stats", "mm_cache_stats", "engine_idx")),
        TouchPoint(STAT_LOGGERS, "AggregateStatLoggerBase.log_engine_initialized", METHOD, METRICS, params=("self",)),
    ]


SECTIONS = (metrics,)
