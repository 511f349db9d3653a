"""Placed text fed ahead, in the model runner: its tokens into the runner's batch, its log-probabilities out.

Worker process only. A fork/join header's tokens after its first are fed in
one engine step (:meth:`vllm_hogwild.core.forkjoin_group.ForkJoinKind.place_ahead`):
the scheduler appends them to the lane's request, and the step's wire
(:attr:`vllm_hogwild.core.wire.StepWire.placed`) brings them here, where vLLM's
runner would otherwise know only the tokens it sampled itself.

- :func:`write_placed`, before vLLM prepares the step's inputs: each request's
  output tokens from the first placed one on become exactly the scheduler's (a
  request that rejoins the batch under async scheduling already has them, from
  vLLM's own copy of its tokens), and its batch row's token ids with them;
- :func:`placed_logprobs`, after the forward pass, for a request that asks for
  log-probabilities: each placed token's, from the hidden state of the token
  before it, as vLLM computes a prompt token's (placed text skips the sampling
  processors, as a prompt does). They travel to the scheduler in the step's
  prompt-logprobs dict under :data:`PLACED_LOGPROBS` keys, which the scheduler
  takes out before vLLM reads the dict and puts in the lane's output, each
  token's in its place (:mod:`vllm_hogwild.scheduler.placed`).
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from vllm_hogwild.core.wire import PLACED_LOGPROBS


def write_placed(runner: Any, placed: Mapping[str, tuple[int, tuple[int, ...]]]) -> None:
    """Each request's placed tokens (``placed``: request id -> (index of the first among its output tokens,
    tokens)) into the runner's own state of it and its batch row, exactly: what the runner holds of the request
    from that index on becomes these tokens."""
    batch = runner.input_batch
    for request_id, (first, tokens) in placed.items():
        state = runner.requests.get(request_id)
        if state is None:
            raise RuntimeError(f"Hogwild: the scheduler placed tokens in request {request_id}, which this "
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


def placed_logprobs(runner: Any, placed: Mapping[str, tuple[int, tuple[int, ...]]], hidden_states: torch.Tensor,
                    out: dict) -> dict:
    """``out`` (the step's prompt-logprobs dict) with each placed token's log-probabilities, for the requests
    that ask for them. A request's row feeds its unfed token, then its placed ones: the hidden state of row
    position ``j`` gives placed token ``j``'s."""
    batch = runner.input_batch
    for request_id, (_, tokens) in placed.items():
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
        out[PLACED_LOGPROBS + request_id] = type(gathered)(*(t.cpu() for t in gathered[:3]))
    return out
