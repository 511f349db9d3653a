"""Speculative decoding's part of the group table (:class:`~vllm_hogwild.core.groups.table.GroupTable`): which
workers verify no drafts, and where an accepted run of tokens is cut. Pure, no vLLM import.

A worker whose next token the engine may force (a paragraph's prefix, an answer,
the finisher's room) verifies no drafts: forced tokens apply to a request's first
sampled row only. An accepted run is kept up to the first token that stops the
worker or after which the engine must force the next one; the rest is dropped as
if rejected; each kept token enters its group's state as it is accepted
(:meth:`~vllm_hogwild.core.groups.group.Group.accept_sampled`). The sit-out decisions compare
the engine steps in which each worker accepted tokens (``Worker.sampled_steps``,
counted by :meth:`GroupTable.accept <vllm_hogwild.core.groups.table.GroupTable.accept>`).
Functions of the data they are given: this part keeps no index of its own.
"""

from __future__ import annotations

from typing import Any, Iterable

from vllm_hogwild.core.groups.group import Group, Worker


def drafts_to_drop(running: Iterable[Group]) -> list[Any]:
    """Requests of the ``running`` groups whose next token the engine may force: they verify no drafts (forced
    tokens apply to a request's first sampled row only)."""
    out = []
    for group in running:
        if not group.driver.forces_tokens:
            continue
        for w in group.workers:
            if not w.finished and group.driver.may_force(w.index, w.request.num_output_tokens):
                out.append(w.request)
    return out


def must_force(worker: Worker) -> bool:
    """After each token of an accepted run: whether the engine must force the worker's next token (a
    paragraph ended and queued its prefix, an answer, the finisher's room); the run is cut there."""
    group = worker.group
    group.accept_sampled(worker)
    return group.driver.may_force(worker.index, worker.request.num_output_tokens)


def accept_run(worker: Worker, tokens: list[int], accept) -> tuple[int, bool]:
    """``accept(token) -> stopped`` for each token of an accepted run, up to the first that stops the worker or
    after which the engine must force the next token. ``(accepted, stopped)``."""
    accepted, stopped = 0, False
    for token in tokens:
        stopped = accept(token)
        accepted += 1
        if stopped or must_force(worker):
            break
    return accepted, stopped
