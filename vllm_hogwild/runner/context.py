"""The step's Hogwild state in one worker process: one :class:`StepContext`, set, read and reset.

The runner's adapter (:mod:`vllm_hogwild.runner.v1`, :mod:`vllm_hogwild.runner.v2`)
resets it when a real step starts and fills it once vLLM has prepared the step's
inputs: the tokens the scheduler forces, keyed as the adapter's logits processor
finds its rows, and the forced tokens fed this step; on the V1 runner also each
Hogwild row's views (V2 hands them to its builders with the step's metadata).
Every attention metadata builder of the step plans segment attention from the
views and records the plan for its metadata (:meth:`StepContext.add_plan`);
every layer's implementation finds the plan of the metadata it was handed
(:meth:`StepContext.plan_for`, by identity: a draft model's or a dummy batch's
metadata has none). Nothing of one batch is ever applied to another. Like vLLM's
own forward context and nano-vllm's context: one object per process, no loose
globals.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from vllm_hogwild.core.views.registry import StepSegments


@dataclass(frozen=True)
class StepViews:
    segments: StepSegments  # by request id: a row's segments, or each re-fed token's
    req_ids: tuple[str, ...]  # the batch's rows, in order
    num_tokens: int  # the batch's scheduled tokens: a builder checks it is building this batch


@dataclass
class StepContext:
    views: StepViews | None = None  # V1: read by the builders; V2 passes them with the step's metadata instead
    # forced token (or ARGMAX) by the key the adapter's logits processor matches rows with (V1: logits row;
    # V2: the request's slot in the runner's state)
    forced: dict[int, int] = field(default_factory=dict)
    fed_ahead: Mapping[str, tuple[int, tuple[int, ...]]] | None = None  # the wire's forced tokens fed this step
    _plans: list[tuple[Any, Any]] = field(default_factory=list)  # (metadata, its HogwildPlan), this step's
    # Full CUDA graphs (the Triton path): the room the builders' frozen plan buffers have, (rows, pairs, lane
    # slots), once captured (None: no full graph holds a Hogwild plan); whether this step's Hogwild rows may
    # need more (the runner's adapter then keeps the step from replaying a full graph); and whether the step
    # replays one (the builders then leave the native metadata as the graph captured it). The adapter sets
    # the last two each step, before vLLM chooses the step's graph: reset() leaves them.
    graph_room: tuple[int, int, int] | None = None
    eager_attention: bool = False
    full_graph: bool = False

    def publish(self, *, views: StepViews | None = None, forced: dict[int, int] | None = None,
                fed_ahead: Mapping[str, tuple[int, tuple[int, ...]]] | None = None) -> None:
        """What the adapter found of the step, as it finds it (what is not given stays as it is)."""
        if views is not None:
            self.views = views
        if forced is not None:
            self.forced = forced
        if fed_ahead is not None:
            self.fed_ahead = fed_ahead

    def reset(self) -> None:
        """A real step starts (or a dummy batch): nothing of the step before applies."""
        self.views, self.forced, self.fed_ahead = None, {}, None
        self._plans.clear()

    def clear_views(self) -> None:
        """Builders that run now are not building the step's batch (a draft model's): no Hogwild rows."""
        self.views = None

    def take_forced(self) -> dict[int, int]:
        """The step's forced tokens, once (V1: its sampler runs the processors once per step)."""
        forced, self.forced = self.forced, {}
        return forced

    def take_fed_ahead(self) -> Mapping[str, tuple[int, tuple[int, ...]]] | None:
        """The step's forced tokens, once (for their log-probabilities)."""
        fed_ahead, self.fed_ahead = self.fed_ahead, None
        return fed_ahead

    def add_plan(self, metadata: Any, plan: Any) -> None:
        self._plans.append((metadata, plan))

    def plan_for(self, metadata: Any) -> Any:
        """The plan a builder of this step recorded for ``metadata`` (None: plain attention)."""
        for built, plan in self._plans:
            if built is metadata:
                return plan
        return None


_STEP = StepContext()  # this process's; filled by the runner's adapter, never rebound


def get_step() -> StepContext:
    return _STEP
