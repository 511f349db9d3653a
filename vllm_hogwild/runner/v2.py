"""Model Runner V2's adapter (``vllm/v1/worker/gpu/``: CUDA's default, and vLLM's only runner from 0.34 on).

Worker process only. V2 keeps each request's state in its own device tensors
(``RequestState``: token ids, lengths, last sampled token, drafts), reorders
the batch itself, and hands per-request state to attention builders and
samplers through two seams this adapter uses as they are meant:

- its model state's ``prepare_attn`` takes a ``model_specific_attn_metadata``
  whose ``get_extra_attn_kwargs(builder, num_reqs)`` become keyword arguments
  of each metadata builder's ``build``: :class:`HogwildAttnMetadata` passes the
  step's views (``hogwild_views``) to the Hogwild builders, and to them only,
  with the target model's metadata only (a draft model and a dummy batch build
  theirs without them: plain attention);
- its sampler runs custom logits processors of V2's interface for every row
  it samples or verifies (the rejection sampler too): :class:`V2ForcedTokens`
  forces the step's tokens by request slot.

:func:`install` wraps three methods of this worker's instances (once), after
the runner has loaded its model:

- the runner's ``prepare_inputs`` (it sees the ``SchedulerOutput`` and returns
  the ordered batch): before vLLM, the accepted runs the scheduler cut short
  are rewound in V2's state (:func:`rewind`; V2 takes no length from the
  scheduler for a running request) and each request's block list is followed
  (:class:`BlockLists`; V2 keeps block tables only on the device); after vLLM,
  the forced tokens go into the batch's input ids and V2's token state
  (:func:`write_fed_ahead`), and the runner-neutral core
  (:mod:`vllm_hogwild.runner.worker_core`) turns the wire and the batch into
  the step's views and forced tokens;
- the model state's ``prepare_attn``: the views, for this batch only;
- the prompt-logprobs worker's ``compute_prompt_logprobs``: forced tokens'
  log-probabilities (:func:`fed_ahead_logprobs`).

V2 samples a seeded request from its seed and each token's position, so a
chunked prefill's discarded sample costs nothing (V1's generator set-aside has
no counterpart here).
"""

from __future__ import annotations

import inspect
from typing import Any, Mapping

import torch
from vllm.v1.worker.gpu.sample.logits_processor import LogitsProcessor

from vllm_hogwild.core.errors import HogwildOptionError
from vllm_hogwild.core.views.registry import BatchRow
from vllm_hogwild.core.options import spec_of
from vllm_hogwild.core.wire import FED_AHEAD_LOGPROBS
from vllm_hogwild.runner.context import StepViews, get_step
from vllm_hogwild.runner.forcing import force
from vllm_hogwild.runner.worker_core import WorkerCore


RUNNER_METHOD = "prepare_inputs"  # of the runner instance
EXECUTE_METHOD = "execute_model"  # of the runner instance (before V2 chooses the step's CUDA graph)
ATTENTION_METHOD = "prepare_attn"  # of the runner's model state
LOGPROBS_METHOD = "compute_prompt_logprobs"  # of the runner's prompt-logprobs worker
VIEWS_KWARG = "hogwild_views"  # the Hogwild builders' keyword argument (runner/backend.py)
MODEL_SPECIFIC = "model_specific_attn_metadata"  # the model state's prepare_attn parameter


class V2ForcedTokens(LogitsProcessor):
    """V2's logits processor for the tokens the engine forces: a Hogwild request's rows, by its slot."""

    def __init__(self, vllm_config, req_states) -> None:
        pass

    def add_request(self, req_idx: int, sampling_params) -> bool:
        # Only a Hogwild request may be forced; a batch of plain requests keeps V2's path without processors.
        return spec_of(sampling_params.extra_args) is not None

    def apply(self, logits: torch.Tensor, ctx) -> torch.Tensor:
        # Read, not taken: the rejection sampler may apply the processors chunk by chunk.
        return force(logits, get_step().forced, ctx.expanded_idx_mapping)


class BlockLists:
    """Each request's block list (its first KV-cache group), as the scheduler sends it: V2 keeps block tables
    only on the device, and a lane's views read its blocks every step. Extended in place, as vLLM's V1 runner
    keeps its own (the views notice a new list when a preempted lane comes back as a new request)."""

    def __init__(self) -> None:
        self.lists: dict[str, list[int]] = {}

    def update(self, scheduler_output: Any) -> None:
        lists = self.lists
        for request_id in scheduler_output.finished_req_ids:
            lists.pop(request_id, None)
        for request_id in scheduler_output.preempted_req_ids or ():
            lists.pop(request_id, None)
        for new in scheduler_output.scheduled_new_reqs:  # V2 gets resumed requests as new ones, whole
            lists[new.req_id] = list(new.block_ids[0])
        cached = scheduler_output.scheduled_cached_reqs
        for request_id, new_ids in zip(cached.req_ids, cached.new_block_ids):
            if new_ids is not None and request_id in lists:
                lists[request_id].extend(new_ids[0])

    def get(self, request_id: str) -> list[int] | None:
        return self.lists.get(request_id)


def _attn_metadata_class():
    """:class:`HogwildAttnMetadata`, made on first use (V2's model-state module is heavy to import)."""
    from vllm.v1.worker.gpu.model_states.interface import ModelSpecificAttnMetadata

    from vllm_hogwild.runner.backend import HogwildBuilderMixin

    class HogwildAttnMetadata(ModelSpecificAttnMetadata):
        """The step's views for V2's ``build_attn_metadata``: to the Hogwild builders only."""

        def __init__(self, views: StepViews) -> None:
            self.views = views

        def get_extra_attn_kwargs(self, attn_metadata_builder: Any, num_reqs: int) -> dict[str, Any]:
            if isinstance(attn_metadata_builder, HogwildBuilderMixin):
                return {VIEWS_KWARG: self.views}
            return {}

    return HogwildAttnMetadata


def check_runner(runner: Any) -> None:
    """Refuse V2 features that change the batch's rows behind the views' back, naming the setting."""
    refused = {
        "pcp_manager": "prefill_context_parallel_size",
        "ubatch_runner": "enable_dbo",
        "adaptive_verification": "speculative_config.enable_adaptive_verification",
        "batch_sharder": "enable_batch_sharded_sampling",
    }
    for attribute, setting in refused.items():
        if getattr(runner, attribute, None) is not None:
            raise HogwildOptionError(setting, "Hogwild's views follow V2's batch row by row; this setting splits "
                                              "or reshapes the batch (turn it off)")
    if getattr(runner, "use_pp", False):
        raise HogwildOptionError("pipeline_parallel_size", "Hogwild runs on one pipeline stage")


def install(runner: Any) -> None:
    """Wrap the runner's ``prepare_inputs``, its model state's ``prepare_attn`` and its prompt-logprobs worker's
    ``compute_prompt_logprobs`` (these instances only, once). After the runner has loaded its model."""
    original = getattr(runner, RUNNER_METHOD)
    if getattr(original, "_hogwild_hook", False):
        return
    model_state = runner.model_state
    prepare_attn = getattr(model_state, ATTENTION_METHOD)
    if MODEL_SPECIFIC not in inspect.signature(prepare_attn).parameters:
        raise HogwildOptionError("model", f"V2's {type(model_state).__name__} passes no per-request state to the "
                                          "attention builders; Hogwild runs models with V2's default model state")
    core = WorkerCore()
    context = core.context
    blocks = BlockLists()
    attn_metadata = _attn_metadata_class()
    pending: list = [None, None]  # this step's batch and its views, for the model state's prepare_attn

    def prepare_inputs(scheduler_output, *args, **kwargs):
        wire = core.begin(scheduler_output)
        pending[0] = pending[1] = None
        blocks.update(scheduler_output)
        if wire is not None and wire.rewound:
            rewind(runner, wire.rewound)  # before vLLM reads the lanes' lengths for positions
        batch = original(scheduler_output, *args, **kwargs)
        if wire is not None and wire.fed_ahead:
            write_fed_ahead(runner, batch, wire.fed_ahead)
            context.publish(fed_ahead=wire.fed_ahead)
        views = core.views(wire, batch.req_ids, batch.num_tokens, lambda lanes: batch_rows(batch, lanes),
                           blocks.get)
        if views.segments:
            pending[0], pending[1] = batch, views
        context.publish(forced=core.forced_by(wire, runner.req_states.req_id_to_index.get))
        return batch

    prepare_inputs._hogwild_hook = True  # type: ignore[attr-defined]
    setattr(runner, RUNNER_METHOD, prepare_inputs)

    def prepare_attn_with_views(input_batch, *args, **kwargs):
        if pending[0] is input_batch:  # the step's batch (a dummy batch, or a ubatch's, is another object)
            kwargs[MODEL_SPECIFIC] = attn_metadata(pending[1])
            pending[0] = pending[1] = None
        return prepare_attn(input_batch, *args, **kwargs)

    setattr(model_state, ATTENTION_METHOD, prepare_attn_with_views)

    execute = getattr(runner, EXECUTE_METHOD)

    def execute_model(scheduler_output, *args, **kwargs):
        manager = runner.cudagraph_manager  # (made with the KV cache, after the model loads)
        if manager is not None and not getattr(manager.dispatch, "_hogwild_hook", False):
            install_graph_choice(manager, core)
        core.before_graph_choice(scheduler_output)  # V2 chooses the step's CUDA graph before prepare_inputs
        return execute(scheduler_output, *args, **kwargs)

    setattr(runner, EXECUTE_METHOD, execute_model)

    logprobs_worker = runner.prompt_logprobs_worker
    if logprobs_worker is not None:  # (the last pipeline stage's; Hogwild runs one)
        compute = getattr(logprobs_worker, LOGPROBS_METHOD)

        def compute_with_fed_ahead(logits_fn, hidden_states, input_batch, *args, **kwargs):
            out = compute(logits_fn, hidden_states, input_batch, *args, **kwargs)
            fed_ahead = context.take_fed_ahead()
            return fed_ahead_logprobs(runner, fed_ahead, logits_fn, hidden_states, input_batch, out) if fed_ahead else out

        setattr(logprobs_worker, LOGPROBS_METHOD, compute_with_fed_ahead)


def install_graph_choice(manager, core: WorkerCore) -> None:
    """Wrap the runner's CUDA graph manager's ``dispatch`` (this instance): a step whose Hogwild rows may not fit
    the captured plan buffers runs without a full graph (eager, as V2 runs a batch no graph holds), and a full
    graph's choice is recorded for the builders."""
    from vllm.config import CUDAGraphMode

    original = manager.dispatch

    def dispatch(num_reqs, num_tokens, *args, **kwargs):
        descriptor = original(num_reqs, num_tokens, *args, **kwargs)
        if descriptor.cg_mode == CUDAGraphMode.FULL and core.context.eager_attention:
            descriptor = type(descriptor)(cg_mode=CUDAGraphMode.NONE, num_tokens=num_tokens, num_reqs=num_reqs,
                                          num_active_loras=descriptor.num_active_loras,
                                          num_ubatches=descriptor.num_ubatches)
        core.graph_chosen(descriptor.cg_mode == CUDAGraphMode.FULL)
        return descriptor

    dispatch._hogwild_hook = True  # type: ignore[attr-defined]
    manager.dispatch = dispatch


def batch_rows(batch: Any, lanes: Mapping[str, object]) -> list[BatchRow]:
    """The batch's rows of Hogwild lanes, from V2's own batch: tokens computed before the step (the
    scheduler's count, which V2 mirrors on the host), tokens fed and drafts."""
    computed, scheduled, drafts = batch.num_computed_tokens_np, batch.num_scheduled_tokens, \
        batch.num_draft_tokens_per_req
    return [BatchRow(r, int(computed[i]), int(scheduled[i]), 0 if drafts is None else int(drafts[i]))
            for i, r in enumerate(batch.req_ids) if r in lanes]


def rewind(runner: Any, rewound: Mapping[str, tuple[int, int, int]]) -> None:
    """Lengths the scheduler set past what V2's own sampler did (``rewound``: request id -> (tokens computed,
    tokens, tokens dropped)): V2's state of each request as the scheduler has it. V2 advances a request's
    lengths on the device from its own sampler's result and takes none from the scheduler for a running request;
    the scheduler cuts an accepted run where the engine must force the next token (the rest dropped, as if
    rejected) and rolls a resumed group's lanes back to re-feed them. Its computed tokens, its length, its last
    sampled token (which it feeds next) and the output counts its penalties read."""
    states = runner.req_states
    ids = states.all_token_ids.gpu
    counts = runner.sampler.penalties_state.output_bin_counts if runner.sampler is not None else None
    for request_id, (num_computed, num_tokens, num_dropped) in rewound.items():
        slot = states.req_id_to_index.get(request_id)
        if slot is None:
            continue
        states.num_computed_tokens.stage_write_elem(slot, num_computed)
        states.total_len.stage_write_elem(slot, num_tokens)
        states.last_sampled_tokens[slot, 0] = ids[slot, num_tokens - 1]
        if counts is not None and num_dropped:
            dropped = ids[slot, num_tokens: num_tokens + num_dropped].to(torch.long)
            counts[slot].index_add_(0, dropped, torch.full_like(dropped, -1, dtype=counts.dtype))
    states.num_computed_tokens.apply_write()
    states.total_len.apply_write()


def write_fed_ahead(runner: Any, batch: Any, fed_ahead: Mapping[str, tuple[int, tuple[int, ...]]]) -> None:
    """Each request's forced tokens fed this step (``fed_ahead``: request id -> (index of the first among its output
    tokens, tokens)) into V2's token state and this batch's input ids.

    The row feeds the request's last sampled token, then the forced ones. V2 builds a decoding row from its
    last sampled token and its drafts alone, so the forced tokens join its token ids (and its length, and the
    output counts its penalties read) after the last sampled one, and the row's input ids are rewritten from
    there: the last sampled token first, the forced ones after it, any drafts (V2's own, at the row's end) as
    they are.
    """
    states = runner.req_states
    ids = states.all_token_ids.gpu
    counts = runner.sampler.penalties_state.output_bin_counts if runner.sampler is not None else None
    row_of = {r: i for i, r in enumerate(batch.req_ids) if r in fed_ahead}
    copies = []
    for request_id, (_, tokens) in fed_ahead.items():
        i = row_of.get(request_id)
        if i is None:
            raise RuntimeError(f"Hogwild: the scheduler forced tokens in request {request_id}, which this step's "
                               f"batch does not feed")
        slot, n = int(batch.idx_mapping_np[i]), int(batch.num_computed_tokens_np[i])  # n: the last sampled token
        states.all_token_ids.stage_write(slot, n + 1, tokens)
        states.total_len.stage_write_elem(slot, n + 1 + len(tokens))
        copies.append((slot, n, len(tokens), int(batch.query_start_loc_np[i])))
        if counts is not None:
            counts[slot].index_add_(0, torch.tensor(tokens, dtype=torch.long, device=counts.device),
                                    torch.ones(len(tokens), dtype=counts.dtype, device=counts.device))
    states.all_token_ids.apply_write()
    states.total_len.apply_write()
    for slot, n, k, start in copies:
        batch.input_ids[start: start + 1 + k] = ids[slot, n: n + 1 + k]


def fed_ahead_logprobs(runner: Any, fed_ahead: Mapping[str, tuple[int, tuple[int, ...]]], logits_fn, hidden_states,
                    batch: Any, out: dict) -> dict:
    """``out`` (the step's prompt-logprobs dict) with each forced token's log-probabilities, for the requests
    that ask for them, as V2's sampler computes a sampled token's (raw logits; forced text skips the sampling
    processors, as a prompt does). Row position ``j`` of a request's row gives forced token ``j``'s. They travel
    to the scheduler under :data:`FED_AHEAD_LOGPROBS` keys (:mod:`vllm_hogwild.scheduler.placed`)."""
    from vllm.v1.worker.gpu.sample.logprob import compute_topk_scores
    from vllm.v1.worker.gpu.sample.states import NO_LOGPROBS

    num_logprobs = runner.sampler.sampling_states.num_logprobs
    logits_mode = runner.model_config.logprobs_mode in ("raw_logits", "processed_logits")
    row_of = {r: i for i, r in enumerate(batch.req_ids) if r in fed_ahead}
    for request_id, (_, tokens) in fed_ahead.items():
        i = row_of.get(request_id)
        n = NO_LOGPROBS if i is None else int(num_logprobs[batch.idx_mapping_np[i]])
        if n == NO_LOGPROBS:
            continue
        start = int(batch.query_start_loc_np[i])
        logits = logits_fn(hidden_states[start: start + len(tokens)])
        target = torch.tensor(tokens, dtype=torch.int64, device=logits.device)
        out[FED_AHEAD_LOGPROBS + request_id] = compute_topk_scores(logits, n, target, logits_mode=logits_mode)
    return out
