"""The table: :data:`TOUCH_POINTS`, every row of :mod:`.rows_front` and :mod:`.rows_engine` in a fixed order.

The kinds of touch point and :class:`TouchPoint` itself are in :mod:`.kinds`.
"""

from __future__ import annotations

from .kinds import SETTABLE, TouchPoint
from .rows_engine import (attention_backends, cpu_sampling, detokenizer, forcing, runner_hook, scheduler,
                          step_wire, tools, workers)
from .rows_front import (accept_steps, chat_and_answers, cpu_dist, forkjoin, metrics, request_and_response_models,
                         request_check, stream_check, switch_and_flags)


SECTIONS = (switch_and_flags, request_check, stream_check, metrics, chat_and_answers, request_and_response_models,
            cpu_dist, accept_steps, forkjoin, runner_hook, step_wire, attention_backends, workers, cpu_sampling, forcing, scheduler,
            detokenizer, tools)

TOUCH_POINTS: tuple[TouchPoint, ...] = tuple(row for section in SECTIONS for row in section())

# The attributes the plugin sets on vLLM objects (SETTABLE rows name them); the tests check each one.
SET_ATTRIBUTES = {point.target: point.params for point in TOUCH_POINTS if point.kind == SETTABLE}
