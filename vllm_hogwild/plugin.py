"""The ``vllm.general_plugins`` entry point.

vLLM calls :func:`register` in every process it starts (API server, engine
core, each worker, Ray actors). It must be cheap, idempotent, and change
nothing in vLLM unless Hogwild is switched on.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

_registered = False


def register() -> None:
    """Entry point ``hogwild = vllm_hogwild.plugin:register``; safe to call any number of times."""
    global _registered
    if _registered:
        return
    _registered = True
    # Nothing is installed into vLLM yet: the scheduler, attention backend and
    # runner hook are selected only when Hogwild is switched on (engine option
    # ``additional_config={"hogwild": {...}}``), which arrives with the vLLM
    # integration. Until then the plugin is dormant by construction.
    logger.debug("vllm-hogwild plugin loaded (dormant)")


def is_registered() -> bool:
    return _registered
