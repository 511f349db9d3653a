"""The ``vllm.general_plugins`` entry point.

vLLM calls :func:`register` in every process it starts (API server, engine
core, each worker, Ray actors). It is cheap and idempotent, and changes no
behaviour of vLLM for requests without Hogwild options: it only installs the
switch (which calls straight through unless ``additional_config["hogwild"]``
is given) and the front-end check of Hogwild request options.
"""

from __future__ import annotations

_registered = False


def register() -> None:
    """Entry point ``hogwild = vllm_hogwild.plugin:register``; safe to call any number of times."""
    global _registered
    if _registered:
        return
    from vllm_hogwild import hooks

    hooks.install()
    _registered = True


def is_registered() -> bool:
    return _registered
