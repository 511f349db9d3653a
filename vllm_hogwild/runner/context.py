"""The step's Hogwild state in one worker process: one :class:`StepContext`, set, read and reset.

The runner hook (:mod:`vllm_hogwild.runner.runner_hook`) sets it once per real
step, after vLLM has prepared the step's inputs: each Hogwild row's segments,
the batch's row order and size, and the tokens the scheduler forces, by logits
row. Every attention metadata builder of the step reads the views and records
the segment-attention plan it built for its metadata (:meth:`StepContext.add_plan`);
every layer's implementation finds the plan of the metadata it was handed
(:meth:`StepContext.plan_for`, by identity: a draft model's metadata has none).
The sampler's forcing takes the forced rows once (:meth:`StepContext.take_forced`).
A dummy run (profiling, CUDA-graph capture, an idle data-parallel rank) and a
draft model's proposal reset what they must first, so nothing of one batch is
ever applied to another. Like vLLM's own forward context and nano-vllm's
context: one object per process, no loose globals.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm_hogwild.core.group_views import StepSegments


@dataclass(frozen=True)
class StepViews:
    segments: StepSegments  # by request id: a row's segments, or each re-fed token's
    req_ids: tuple[str, ...]  # the batch's rows, in order
    num_tokens: int  # the batch's scheduled tokens: a builder checks it is building this batch


@dataclass
class StepContext:
    views: StepViews | None = None
    forced_rows: dict[int, int] | None = None  # logits row -> forced token (or ARGMAX), this step's sampler's
    _plans: list[tuple[Any, Any]] = field(default_factory=list)  # (metadata, its HogwildPlan), this step's

    def set(self, views: StepViews, forced_rows: dict[int, int] | None) -> None:
        """A real step's publication (it replaces everything of the step before)."""
        self.reset()
        self.views, self.forced_rows = views, forced_rows

    def reset(self) -> None:
        self.views, self.forced_rows = None, None
        self._plans.clear()

    def clear_views(self) -> None:
        """Builders that run now are not building the step's batch (a draft model's): no Hogwild rows."""
        self.views = None

    def take_forced(self) -> dict[int, int] | None:
        """The step's forced tokens by logits row, once."""
        rows, self.forced_rows = self.forced_rows, None
        return rows

    def add_plan(self, metadata: Any, step: Any) -> None:
        self._plans.append((metadata, step))

    def plan_for(self, metadata: Any) -> Any:
        """The plan a builder of this step recorded for ``metadata`` (None: plain attention)."""
        for built, step in self._plans:
            if built is metadata:
                return step
        return None


_STEP = StepContext()  # this process's; set by the runner hook, never rebound


def get_step() -> StepContext:
    return _STEP
