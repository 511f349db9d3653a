"""Accept steps: the engine step at which each output token of a Hogwild worker was accepted. Front-end.

With speculative decoding a worker accepts one or more tokens per engine step,
and what it reads depends on when each co-worker token was accepted (the rule
in docs/user_guide.md, "Speculative decoding"). So each Hogwild completion
carries, beside its tokens, ``completion.hogwild["accept_steps"]``: one step
number per output token, non-decreasing; tokens accepted in the same engine
step share a number. Without speculation every token has its own step.

Numbering: the engine core sends each client one batch of outputs per step,
stamped with the step's time (``EngineCoreOutputs.timestamp``; the API server
may process a batch in chunks, which share it). Each output processor counts
the distinct stamps it has seen, so numbers are comparable within an engine
(every worker of a group lives in one engine core); only their order means
anything. O(1) per token.

Hooks (``vllm_hogwild.hooks``): ``OutputProcessor.add_request`` marks a
Hogwild worker's state, ``OutputProcessor.process_outputs`` numbers the step
and records it per new token, ``RequestState._new_completion_output`` attaches
the numbers (all of them, or the delta's in ``DELTA`` output mode). The same
two wraps carry a fork/join lane's record (:mod:`vllm_hogwild.core.lane_channel`,
sent with its first output and its last): ``process_outputs`` keeps the latest
on the lane's request state, and every completion of the lane gets it as
``completion.hogwild_lane``, so the front end learns a branch's fork from its
first token (``vllm_hogwild/serving/forkjoin.py``).
"""

from __future__ import annotations

from typing import Any

from vllm_hogwild.core.lane_channel import record_of
from vllm_hogwild.core.options import spec_of

ATTR = "hogwild_accept_steps"  # on vLLM's RequestState: the worker's accept steps so far
LANE_ATTR = "hogwild_lane"  # on vLLM's RequestState and CompletionOutput: a fork/join lane's latest record


def add_request(original, self, request, *args: Any, **kwargs: Any):
    result = original(self, request, *args, **kwargs)
    params = getattr(request, "sampling_params", None)
    if params is not None and spec_of(params.extra_args) is not None:
        state = self.request_states.get(request.request_id)
        if state is not None and getattr(state, ATTR, None) is None:
            setattr(state, ATTR, [])
    return result


def process_outputs(original, self, engine_core_outputs, engine_core_timestamp=None, *args: Any, **kwargs: Any):
    if engine_core_timestamp is not None and engine_core_timestamp != getattr(self, "_hogwild_stamp", None):
        self._hogwild_stamp = engine_core_timestamp
        self._hogwild_step = getattr(self, "_hogwild_step", 0) + 1
    step = getattr(self, "_hogwild_step", 0)
    states = self.request_states
    for output in engine_core_outputs:
        record = record_of(output)
        if record is not None and (state := states.get(output.request_id)) is not None:
            setattr(state, LANE_ATTR, record)
        if output.new_token_ids:
            state = states.get(output.request_id)
            steps = getattr(state, ATTR, None) if state is not None else None
            if steps is not None:
                steps.extend([step] * len(output.new_token_ids))
    return original(self, engine_core_outputs, engine_core_timestamp, *args, **kwargs)


def new_completion_output(original, self, token_ids, finish_reason, stop_reason, *args: Any, **kwargs: Any):
    completion = original(self, token_ids, finish_reason, stop_reason, *args, **kwargs)
    steps = getattr(self, ATTR, None)
    if steps is not None:
        n = len(completion.token_ids)
        completion.hogwild = {"accept_steps": steps[len(steps) - n:] if n else []}
        record = getattr(self, LANE_ATTR, None)
        if record is not None:
            completion.hogwild_lane = record
    return completion
