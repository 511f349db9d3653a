"""Tokens the engine forces into a lane: make a logits row sample a given token. No vLLM import.

The scheduler decides, per step, which worker must produce which token (a
paragraph prefix such as ``**Alice [2]:** ``, one token per step) and ships it on
the ``SchedulerOutput``; the runner's adapter keys it as its logits processor
finds the rows (:meth:`vllm_hogwild.runner.worker_core.WorkerCore.forced_by`).
:func:`force` leaves one finite logit in each such row, so whatever the
sampling parameters the row samples that token (or, for ``ARGMAX``, its most
likely token: the finisher's greedy tokens). The token is then an ordinary
token of the lane: fed next step, its K/V computed once by its writer, seen in
the worker's text. vLLM reports log-probabilities from the logits before any
processor (both runners), so a forced token's logprob is still the model's own.

The processors themselves are the runners': ``V1ForcedTokens`` in
:mod:`vllm_hogwild.runner.v1` (V1's interface; with speculative decoding V1 takes no
custom processor, and the adapter runs :func:`force` at the end of its sampler's
own processors) and ``V2ForcedTokens`` in :mod:`vllm_hogwild.runner.v2` (V2's interface, which its
rejection sampler runs too). A worker whose next token may be forced verifies no
drafts (the scheduler drops them), so its row is its only one.
"""

from __future__ import annotations

from typing import Mapping

import torch

from vllm_hogwild.core.wire import ARGMAX  # a forced "token": the row's most likely token


def force(logits: torch.Tensor, forced: Mapping[int, int], row_keys: torch.Tensor | None = None) -> torch.Tensor:
    """``logits`` with one finite logit (0) in each forced row, in place.

    ``logits``: ``[num_rows, vocab]``; ``forced``: key -> token (or ``ARGMAX``); ``row_keys``: ``[num_rows]``,
    each row's key (None: a row's key is its index). No host synchronisation: the rows are found on the
    logits' device.
    """
    if not forced:
        return logits
    device = logits.device
    keys = torch.tensor(list(forced), dtype=torch.long, device=device)
    tokens = torch.tensor(list(forced.values()), dtype=torch.long, device=device)
    if row_keys is None:
        row_keys = torch.arange(logits.shape[0], device=device)
    match = row_keys.to(torch.long)[:, None] == keys[None, :]  # [num_rows, num_forced]
    hit = match.any(dim=1)  # [num_rows]
    chosen = (match.long() * tokens[None, :]).sum(dim=1)  # a forced row's token; 0 elsewhere
    if ARGMAX in forced.values():
        chosen = torch.where(chosen == ARGMAX, logits.argmax(dim=-1), chosen)
    chosen = chosen[:, None]
    kept = torch.where(hit[:, None], torch.zeros((), dtype=logits.dtype, device=device), logits.gather(1, chosen))
    logits.masked_fill_(hit[:, None], float("-inf"))
    logits.scatter_(1, chosen, kept)  # a forced row's token gets 0; any other row gets its own value back
    return logits
