"""The step's Hogwild views, handed from the model runner to the attention metadata builder.

Worker process only. The scheduler attaches the step's wire
(:class:`~vllm_hogwild.core.wire.StepWire`) to the ``SchedulerOutput``; the
runner hook (:func:`install_runner_hook`, wrapping ``_prepare_inputs`` of this
worker's runner instance) applies it to this process's
:class:`~vllm_hogwild.core.group_views.ViewRegistry`, which turns it into each
decoding worker's segments, and sets them with the batch's final row order in
the process's :class:`~vllm_hogwild.runner.context.StepContext`; every metadata
builder of the step reads them when it builds the step's attention metadata.
Every real step sets the context afresh; a dummy run (profiling, CUDA graph
capture, an idle data-parallel rank) and a draft model's proposal clear it
first (the same hook wraps ``_dummy_run`` and ``propose_draft_token_ids``), and
views that do not match the batch being built are an error, never silently
ignored.

The same hook writes the placed tokens the scheduler appended for this step
into the runner's batch, and (wrapping ``_get_prompt_logprobs_dict``) adds
their log-probabilities (:mod:`vllm_hogwild.runner.placed`). It hands the
tokens the scheduler forces this step (step prefixes
it places into lanes) to the sampler's logits processor, by logits row, and
keeps the seeded generators of rows whose sampled token will be discarded (a
prefill chunk) out of this step's sampling (:func:`set_aside_discarded_generators`).
"""

from __future__ import annotations

import os
from typing import Any

from vllm_hogwild.core.group_views import BatchRow, ViewRegistry
from vllm_hogwild.core.wire import STEP_ATTR
from vllm_hogwild.runner.context import StepViews, get_step
from vllm_hogwild.runner.placed import placed_logprobs, write_placed

# A control for the tests only: a resumed group re-feeds its lanes as plain prefills (each lane reading itself),
# which is not what its tokens were produced under; the oracle tests show that it misses.
PLAIN_REPLAY_ENV = "VLLM_HOGWILD_TEST_PLAIN_REPLAY"

HOOKED_METHOD = "_prepare_inputs"
DUMMY_RUN_METHOD = "_dummy_run"
DRAFT_METHOD = "propose_draft_token_ids"  # speculative decoding's proposer (a draft model runs its layers)
PROMPT_LOGPROBS_METHOD = "_get_prompt_logprobs_dict"  # log-probabilities of fed tokens: placed ones too
WRAPPED_METHODS = (HOOKED_METHOD, DUMMY_RUN_METHOD, DRAFT_METHOD, PROMPT_LOGPROBS_METHOD)  # of the runner instance


def install_runner_hook(runner: Any) -> None:
    """Wrap ``runner._prepare_inputs``, ``_dummy_run``, ``propose_draft_token_ids`` and ``_get_prompt_logprobs_dict``
    (this instance only, once)."""
    original = getattr(runner, HOOKED_METHOD)
    if getattr(original, "_hogwild_hook", False):
        return

    set_aside: dict[str, Any] = {}  # request id -> its seeded generator, kept out of this step's sampling
    registry = ViewRegistry(plain_replay=os.environ.get(PLAIN_REPLAY_ENV) == "1")  # this process's groups
    step = get_step()
    placed_now: list = [None]  # this step's placed tokens (the wire's), for their log-probabilities

    def prepare_inputs(scheduler_output, *args, **kwargs):
        step.reset()  # never let a previous step's views outlive it
        restore_generators(runner.input_batch, set_aside)
        wire = getattr(scheduler_output, STEP_ATTR, None)
        placed_now[0] = wire.placed if wire is not None and wire.placed else None
        if placed_now[0]:
            write_placed(runner, placed_now[0])  # before vLLM gathers the step's token ids
        result = original(scheduler_output, *args, **kwargs)
        set_aside_discarded_generators(runner, set_aside)
        # After the original: it may reorder the batch rows.
        req_ids = tuple(runner.input_batch.req_ids)
        segments = registry.apply(wire, lambda lanes: batch_rows(runner, scheduler_output, req_ids, lanes),
                                  lambda request_id: block_table(runner, request_id))
        forced = None
        if wire is not None and wire.forced:
            forced = {row: wire.forced[r] for row, r in enumerate(req_ids) if r in wire.forced}
        step.set(StepViews(segments, req_ids, scheduler_output.total_num_scheduled_tokens), forced)
        return result

    prepare_inputs._hogwild_hook = True  # type: ignore[attr-defined]
    setattr(runner, HOOKED_METHOD, prepare_inputs)

    prompt_logprobs = getattr(runner, PROMPT_LOGPROBS_METHOD)

    def prompt_logprobs_with_placed(hidden_states, num_scheduled_tokens):
        out = prompt_logprobs(hidden_states, num_scheduled_tokens)
        placed, placed_now[0] = placed_now[0], None
        return placed_logprobs(runner, placed, hidden_states, out) if placed else out

    setattr(runner, PROMPT_LOGPROBS_METHOD, prompt_logprobs_with_placed)

    dummy_run = getattr(runner, DUMMY_RUN_METHOD)

    def dummy_run_without_views(*args, **kwargs):
        step.reset()  # a dummy batch is not the last real step's batch
        return dummy_run(*args, **kwargs)

    setattr(runner, DUMMY_RUN_METHOD, dummy_run_without_views)

    propose = getattr(runner, DRAFT_METHOD, None)
    if propose is not None:
        def propose_without_views(*args, **kwargs):
            # A draft model drafts from its lane alone (plain attention): its batch is not the step's,
            # and drafts only need to be likely; the target's verification reads the views.
            step.clear_views()
            return propose(*args, **kwargs)

        setattr(runner, DRAFT_METHOD, propose_without_views)


def batch_rows(runner: Any, scheduler_output: Any, req_ids: tuple[str, ...], lanes) -> list[BatchRow]:
    """The batch's rows of Hogwild lanes (``lanes``: request ids the views know): computed tokens before
    this step (the runner's own count), scheduled tokens and drafts (the scheduler's)."""
    computed = runner.input_batch.num_computed_tokens_cpu
    scheduled = scheduler_output.num_scheduled_tokens
    drafts = scheduler_output.scheduled_spec_decode_tokens
    return [BatchRow(r, int(computed[i]), scheduled[r], len(drafts.get(r, ())))
            for i, r in enumerate(req_ids) if r in lanes]


def block_table(runner: Any, request_id: str):
    """The runner's own block list of a request (its first KV-cache group), which vLLM extends in place."""
    state = runner.requests.get(request_id)
    return None if state is None else state.block_ids[0]


def set_aside_discarded_generators(runner: Any, set_aside: dict[str, Any]) -> None:
    """Keep the seeded generators of this step's discarded rows out of its sampling.

    A row whose prefill is chunked is sampled anyway and its token thrown
    away; vLLM then rewinds the row's generator by a Philox offset, which CPU
    generators do not have (``RuntimeError: CPU Generator does not use
    offset``, and the engine dies). Without its generator the row samples
    from the global RNG (the token is discarded either way) and the seeded
    generator is exactly where an unchunked prefill would find it. vLLM's
    rewind then finds no generator for the row. Put back by
    :func:`restore_generators` at the next step. ``vllm_hogwild/patches/09-*`` is the
    upstream fix.
    """
    batch = runner.input_batch
    discard = runner.discard_request_mask.np[: batch.num_reqs]
    if not batch.generators or not discard.any():
        return
    for row in discard.nonzero()[0].tolist():
        generator = batch.generators.pop(row, None)
        if generator is not None:
            set_aside[batch.req_ids[row]] = generator


def restore_generators(batch: Any, set_aside: dict[str, Any]) -> None:
    """Put set-aside generators back at their requests' current rows (rows move between steps)."""
    for req_id, generator in set_aside.items():
        row = batch.req_id_to_index.get(req_id)
        if row is not None:
            batch.generators[row] = generator
    set_aside.clear()
