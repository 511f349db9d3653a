"""Tokens the engine places into a lane: a logits processor that makes a row sample a given token.

The scheduler decides, per step, which worker must produce which token (a
step prefix such as ``**Alice [2]:** ``, one token per step) and ships it on
the ``SchedulerOutput``; the runner hook turns it into logits rows
(:meth:`vllm_hogwild.runner.context.StepContext.take_forced`). This processor, which the
switch adds to the engine's ``logits_processors``, leaves one finite logit in
each such row, so whatever the sampling parameters the row samples that
token (or, for ``ARGMAX``, its most likely token: the finisher's greedy
tokens). The token is then an ordinary token of the lane: fed next step, its K/V
computed once by its writer, seen in the worker's text. vLLM reports
log-probabilities from the logits before any processor, so a forced token's
logprob is still the model's own.

With speculative decoding vLLM takes no custom logits processor; the worker
then runs the same function (:func:`apply_forced`) at the end of the sampler's
own ``apply_logits_processors`` (:func:`install_sampler_forcing`), which vLLM calls for the bonus rows
(one per request, in batch order). A worker whose next token may be forced
verifies no drafts (the scheduler drops them), so its bonus row is its only row.
"""

from __future__ import annotations

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor

from vllm_hogwild.core.wire import ARGMAX  # a forced "token": the row's most likely token
from vllm_hogwild.runner.context import get_step

LOGITS_PROCESSOR = "vllm_hogwild.runner.forcing:ForcedTokens"


class ForcedTokens(LogitsProcessor):
    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        self.device = device

    def is_argmax_invariant(self) -> bool:
        return False  # it changes what greedy sampling picks

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        pass  # rows come with each step, from the scheduler

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return apply_forced(logits)


def apply_forced(logits: torch.Tensor) -> torch.Tensor:
    """Leave one finite logit in each row the step forces (rows: one per request, in batch order)."""
    rows = get_step().take_forced()
    if not rows:
        return logits
    index = torch.tensor(list(rows), dtype=torch.long, device=logits.device)
    tokens = torch.tensor(list(rows.values()), dtype=torch.long, device=logits.device)
    greedy = tokens == ARGMAX
    if bool(greedy.any()):
        tokens = torch.where(greedy, logits[index].argmax(dim=-1), tokens)
    logits[index] = float("-inf")
    logits[index, tokens] = 0.0
    return logits


def install_sampler_forcing(sampler) -> None:
    """Speculative decoding: forced tokens at the end of the sampler's ``apply_logits_processors``
    (vLLM takes no custom logits processor then; it calls this for the bonus rows only)."""
    original = sampler.apply_logits_processors

    def apply_logits_processors(logits, *args, **kwargs):
        return apply_forced(original(logits, *args, **kwargs))

    sampler.apply_logits_processors = apply_logits_processors
