"""The project's loggers. Pure, no vLLM import.

They are children of vLLM's ``vllm`` logger (``vllm.hogwild.<module>``), so the
level, handler and format a user sets for vLLM (``VLLM_LOGGING_LEVEL``, a logging
config) apply to the plugin's lines too, and they show in ``vllm serve``'s output.
"""

from __future__ import annotations

import logging


def get_logger(module: str) -> logging.Logger:
    return logging.getLogger("vllm.hogwild." + module.removeprefix("vllm_hogwild."))
