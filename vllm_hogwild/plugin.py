"""The ``vllm.general_plugins`` entry point.

vLLM calls :func:`register` in every process it starts (API server, engine
core, each worker, Ray actors). It is cheap and idempotent: it installs the
class wraps of :data:`vllm_hogwild.patches.HOOKS` (the switch, the CLI flags,
the front end's request checks, accept steps, fork/join output assembly,
metrics), each of which calls straight through unless
``additional_config["hogwild"]`` is given or the request carries Hogwild
options. What
the switch itself changes for requests without Hogwild options is in
docs/user_guide.md, "What the switch changes, for a GPU operator".
"""

from __future__ import annotations

_registered = False


def register() -> None:
    """Entry point ``hogwild = vllm_hogwild.plugin:register``; safe to call any number of times."""
    global _registered
    if _registered:
        return
    from vllm_hogwild import patches

    patches.install()
    _registered = True


def is_registered() -> bool:
    return _registered
