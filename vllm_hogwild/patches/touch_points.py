"""The one table: :data:`TOUCH_POINTS`, every area module's rows in a fixed order, each hook marked on its row.

Each area module of this folder gives its ``SECTIONS`` (functions returning
rows) and its ``HOOKS`` (target -> ``(mechanism, where, patch[, wrapper])``); here
every hook is set on the one row of its target that says what the plugin
relies on of it (a method, function, constant or attribute row), so a hook
without a row fails at import. :data:`HOOKS` is a view: the marked rows'
hooks, in table order. Pure data: no vLLM import.
"""

from __future__ import annotations

from dataclasses import replace

from vllm_hogwild.patches import config, engine_core, outputs, request_hooks, stat_logger, workers
from vllm_hogwild.patches.points import (CONSTANT, FUNCTION, INIT_ATTRIBUTE, METHOD, SETTABLE, Hook,
                                         TouchPoint)

AREAS = (config, request_hooks, stat_logger, outputs, engine_core, workers)
_HOOKABLE = (METHOD, FUNCTION, CONSTANT, INIT_ATTRIBUTE)  # the kinds of row a hook can mark


def _marked(rows: list[TouchPoint], hooks: dict[str, tuple]) -> tuple[TouchPoint, ...]:
    by_target: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        if row.kind in _HOOKABLE:
            by_target.setdefault(f"{row.module}:{row.name}", []).append(i)
    for target, mark in hooks.items():
        found = by_target.get(target, [])
        if len(found) != 1:
            raise ValueError(f"the hook on {target} needs exactly one method, function, constant or attribute row "
                             f"for its target; the table has {len(found)}")
        rows[found[0]] = replace(rows[found[0]], hook=Hook(target, *mark))
    return tuple(rows)


TOUCH_POINTS: tuple[TouchPoint, ...] = _marked(
    [row for area in AREAS for section in area.SECTIONS for row in section()],
    {target: mark for area in AREAS for target, mark in area.HOOKS.items()})

HOOKS: tuple[Hook, ...] = tuple(row.hook for row in TOUCH_POINTS if row.hook is not None)

# The attributes the plugin sets on vLLM objects (SETTABLE rows name them); the tests check each one.
SET_ATTRIBUTES = {point.target: point.params for point in TOUCH_POINTS if point.kind == SETTABLE}
