"""Every place the plugin touches vLLM at run time, in this one folder: the rows and the runtime hooks.

One module per area of vLLM the plugin touches, each with what it relies on
there (its rows: :class:`~vllm_hogwild.patches.points.TouchPoint`), how it
changes it at run time (its ``HOOKS``: each a
:class:`~vllm_hogwild.patches.points.Hook` on one of its rows) and the class
wraps themselves. The diffs to vLLM that would retire the hooks
(``NN-*.patch``, against the pinned vLLM, numbered below) are not here: they
live in the checkout's top-level ``patches/`` folder, whose ``README.md``
indexes them, links each to the module here whose hook it retires, and says
how to apply them (a source-distribution file, not in the wheel):

- :mod:`.config`: the switch and the ``--hogwild-*`` flags (01, 05);
- :mod:`.requests`: the request checks, the collab preamble in chat, the
  answer and accept-step fields (02, 07, 08);
- :mod:`.metrics`: the plugin's stat logger (06);
- :mod:`.outputs`: accept steps and a fork/join request's lanes as one
  completion (no diff: this plugin's protocol);
- :mod:`.engine_core`: the scheduler subclass, its instance wraps, the step's
  wire (04, 10);
- :mod:`.workers`: the model runner, attention backends, forcing, CPU
  sampling fixes (03, 09, 11).

:mod:`.touch_points` joins them into :data:`TOUCH_POINTS`, the one table (a row with
a hook is a runtime hook; :data:`HOOKS` lists them). :func:`install` wraps
every ``class`` hook's target, once per process, from
:func:`vllm_hogwild.plugin.register`; each wrap calls straight through unless
Hogwild is switched on for the engine or the request carries Hogwild options.
The other kinds are installed by the code that owns their object.
``tools/upstream`` (development only) checks every row against a vLLM release;
``tests/unit/test_hooks_index.py`` holds the hooks to the code both ways.
"""

from __future__ import annotations

import functools
import importlib

from vllm_hogwild.patches.points import Hook, TouchPoint
from vllm_hogwild.patches.touch_points import HOOKS, SET_ATTRIBUTES, TOUCH_POINTS

__all__ = ["HOOKS", "SET_ATTRIBUTES", "TOUCH_POINTS", "Hook", "TouchPoint", "install"]

_installed = False


def install() -> None:
    """Wrap every ``class`` hook's target (once per process)."""
    global _installed
    if _installed:
        return
    for hook in HOOKS:
        if hook.mechanism == "class":
            module, qualname = hook.owner
            owner = getattr(importlib.import_module(module), qualname)
            where, _, name = hook.hook.partition(":")
            _wrap(owner, hook.method, getattr(importlib.import_module(where), name))
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
