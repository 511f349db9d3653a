"""The ``vllm.general_plugins`` entry point.

vLLM calls :func:`register` in every process it starts (API server, engine
core, each worker, Ray actors). It is cheap and idempotent: it installs the
class wraps of :data:`vllm_hogwild.hooks.HOOKS` (the switch, the front end's
request check, fork/join output assembly, metrics, the CLI flag), each of which
calls straight through unless ``additional_config["hogwild"]`` is given. What
the switch itself changes for requests without Hogwild options is in the
README's opening paragraph.
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
