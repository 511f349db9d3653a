"""Speculative decoding's part of the group table (:class:`~vllm_hogwild.core.groups.table.GroupTable`): which
workers verify no drafts, and where an accepted run of tokens is cut. Pure, no vLLM import.

A worker whose next token the engine may place (a paragraph's prefix, an answer,
the finisher's room) verifies no drafts: forced tokens apply to a request's first
sampled row only. An accepted run is kept up to the first token that stops the
worker or after which the engine must place the next one; the rest is dropped as
if rejected. The holds compare the engine steps in which each worker accepted
tokens, counted here. A mixin of the table, as
:mod:`vllm_hogwild.core.groups.preempt` is: it reads the table's own indexes.
"""

from __future__ import annotations

from typing import Any

from vllm_hogwild.core.groups.group import Worker


class Drafts:
    def drafts_to_drop(self) -> list[Any]:
        """Speculative decoding: requests whose next token the engine may place verify no drafts (forced
        tokens apply to a request's first sampled row only)."""
        out = []
        for group in self._running.values():
            if not group.driver.places_tokens:
                continue
            for w in group.workers:
                if not w.finished and group.driver.may_place(w.index, w.request.num_output_tokens):
                    out.append(w.request)
        return out

    def accept(self, request_id: str) -> Worker | None:
        """Speculative decoding: the request accepted tokens this step (one or more): its worker, with the
        step counted; None: a plain request."""
        worker = self.workers.get(request_id)
        if worker is not None:
            worker.sampled_steps += 1
        return worker

    def must_place(self, worker: Worker) -> bool:
        """After each token of an accepted run: whether the engine must place the worker's next token (a
        paragraph ended and queued its prefix, an answer, the finisher's room); the run is cut there."""
        self._observe(worker)
        return worker.group.driver.may_place(worker.index, worker.request.num_output_tokens)

    def accept_run(self, worker: Worker, tokens: list[int], accept) -> tuple[int, bool]:
        """Speculative decoding: ``accept(token) -> stopped`` for each token of an accepted run, up to the first
        that stops the worker or after which the engine must place the next token. ``(accepted, stopped)``."""
        accepted, stopped = 0, False
        for token in tokens:
            stopped = accept(token)
            accepted += 1
            if stopped or self.must_place(worker):
                break
        return accepted, stopped
