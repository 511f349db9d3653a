"""Forced text fed ahead, in the engine core: appended to a lane's request before vLLM schedules, taken back where
vLLM does not feed it, and sent to the client with the lane's next output, each token in its place.

A fork/join header's tokens after its first are fed in one engine step, not one a step
(:meth:`vllm_hogwild.core.groups.forkjoin_kind.ForkJoinKind.feed_ahead` decides which). The
scheduler appends them to the lane's request before vLLM schedules, so that vLLM's own
running loop feeds them with the lane's unfed token, within its token budget, and its
KV allocation and the room the plugin makes under KV pressure count them. What vLLM
does not feed in the step goes back (the request loses those tokens again, and the
lane's queue gets them back): a lane fed in part samples in that step all the same,
with the next forced token forced, exactly as without feeding ahead. The fed ones go
to the runner on the step's wire (its adapter writes them into the runner: ``runner/v1.py``,
``runner/v2.py``), and to the
client before the token the lane samples after them, with their log-probabilities
where the request asks for them (computed by the runner from the fed tokens' hidden
states, as a prompt token's).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.outputs import LogprobsLists
from vllm.v1.request import RequestStatus

from vllm_hogwild.core.wire import FED_AHEAD_LOGPROBS


class FedAhead:
    """One scheduler's forced text fed ahead: what it appended this step, and what waits for the lane's output."""

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        self.num_tokens = 0  # appended before the step being scheduled (the room maker's bound counts them)
        self._unsent: dict[str, list] = {}  # request id -> [fed forced tokens, their log-probabilities or None]

    def append(self) -> None:
        """Before vLLM schedules: each lane's forced tokens to feed this step, appended to its request."""
        ahead = self.scheduler.table.feed_ahead(_runs)
        for request, tokens in ahead:
            request.append_output_token_ids(tokens)
        self.num_tokens = sum(len(tokens) for _, tokens in ahead)

    def settle(self, output: Any) -> None:
        """vLLM has scheduled: the forced tokens it does not feed go back; the fed ones wait for the lane's output."""
        s = self.scheduler
        for request, count, samples in s.table.fed_ahead(output.num_scheduled_tokens):
            del request._output_token_ids[-count:]
            del request._all_token_ids[-count:]
            del request.block_hashes[request.num_tokens // s.hash_block_size:]  # a block of them was hashed
            if samples:  # fed in part: every token it has is computed, and it samples now, as vLLM would have it
                request.is_prefill_chunk = False
                s._inflight_prefills.discard(request)
                if isinstance(s, AsyncScheduler):
                    request.num_output_placeholders += s.num_sampled_tokens_per_step
        self.num_tokens = 0

    def sent(self, fed_ahead: dict) -> None:
        """The step's wire carries ``fed_ahead`` (request id -> (first index, tokens)): each lane's, unsent."""
        for request_id, (_, tokens) in fed_ahead.items():
            self._unsent[request_id] = [list(tokens), None]

    def take_logprobs(self, model_runner_output: Any) -> None:
        """Before vLLM reads the step's prompt-logprobs dict: the forced tokens' log-probabilities out of it."""
        found = model_runner_output.prompt_logprobs_dict
        keys = [k for k in found if k.startswith(FED_AHEAD_LOGPROBS)] if found else ()
        for key in keys:
            tensors = found.pop(key)
            entry = self._unsent.get(key[len(FED_AHEAD_LOGPROBS):])
            if entry is not None:
                entry[1] = tensors.tolists()

    def add_to_outputs(self, outputs: dict) -> None:
        """Each lane's fed forced tokens go with its next output, before the token it sampled after them. O(outputs)
        in a step with forced tokens to send, nothing otherwise."""
        if not self._unsent:
            return
        for batch in outputs.values():
            for output in batch.outputs:
                entry = self._unsent.pop(output.request_id, None)
                if entry is None:
                    continue
                tokens, logprobs = entry
                output.new_token_ids = [*tokens, *output.new_token_ids]
                if output.new_logprobs is not None:
                    if logprobs is None:
                        raise RuntimeError(f"Hogwild: request {output.request_id} asks for log-probabilities, "
                                           f"and its placed tokens came without them")
                    output.new_logprobs = _joined(logprobs, output.new_logprobs)
        requests = self.scheduler.requests
        for request_id in [r for r in self._unsent if r not in requests]:
            del self._unsent[request_id]  # it ended without an output (aborted)


def _runs(request: Any) -> bool:
    """vLLM runs the request, and no grammar follows its tokens (a structured output's grammar advances on
    the tokens vLLM samples: its placed tokens stay forced, one a step, and go through it)."""
    return request.status == RequestStatus.RUNNING and not request.use_structured_output


def _joined(first: LogprobsLists, then: LogprobsLists) -> LogprobsLists:
    """Rows of ``first``, then of ``then`` (a row's columns past the request's own logprobs are never read: the
    narrower is padded)."""
    width = max(first.logprob_token_ids.shape[1], then.logprob_token_ids.shape[1])

    def padded(ids: np.ndarray, lps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        extra = width - ids.shape[1]
        if not extra:
            return ids, lps
        return (np.pad(ids, ((0, 0), (0, extra))),
                np.pad(lps, ((0, 0), (0, extra)), constant_values=-np.inf))

    a_ids, a_lps = padded(first.logprob_token_ids, first.logprobs)
    b_ids, b_lps = padded(then.logprob_token_ids, then.logprobs)
    return LogprobsLists(np.concatenate([a_ids, b_ids]), np.concatenate([a_lps, b_lps]),
                         np.concatenate([first.sampled_token_ranks, then.sampled_token_ranks]), None)
