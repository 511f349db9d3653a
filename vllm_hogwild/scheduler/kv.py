"""The block manager's side of the KV budget rule: a wrap of this scheduler's ``kv_cache_manager.allocate_slots``.

The rule itself lives in :class:`~vllm_hogwild.core.group_table.GroupTable`
(a worker's first allocation takes its whole budget). vLLM calls
``allocate_slots`` for every running request every step, so the instance
attribute is wrapped only while the table has a first allocation to come, and
put back after. Wrapping takes whatever the instance has then, and unwrapping
restores it, so nothing set on the instance meanwhile by anyone else (vLLM's
own scheduler tests patch it) is lost. ``patches/10-*`` is the upstream change
(a lookahead per request) that would retire the wrap.
"""

from __future__ import annotations

import inspect
from typing import Any

from vllm_hogwild.core.group_table import GroupTable

WRAPPED = "allocate_slots"  # the KVCacheManager method, wrapped on this instance only


class BudgetedAllocation:
    def __init__(self, manager: Any, table: GroupTable) -> None:
        self._manager = manager
        self._table = table
        self._original = manager.allocate_slots  # what the wrap calls while installed
        self._signature = inspect.signature(self._original)
        self._previous: Any = None  # the instance's own attribute before the wrap (None: the class's method)
        self._installed = False

    def install(self, on: bool) -> None:
        """Wrap ``allocate_slots`` while ``on``, unwrap otherwise; a no-op when already so."""
        if on == self._installed:
            return
        manager = self._manager
        if on:
            self._previous = manager.__dict__.get(WRAPPED)
            self._original = manager.allocate_slots
            setattr(manager, WRAPPED, self.allocate_slots)
        elif manager.__dict__.get(WRAPPED) == self.allocate_slots:
            if self._previous is None:
                delattr(manager, WRAPPED)
            else:
                setattr(manager, WRAPPED, self._previous)
        self._installed = on

    def allocate_slots(self, request: Any, *args: Any, **kwargs: Any):
        """vLLM's ``allocate_slots``; a worker's first call takes its whole budget (later calls find it there)."""
        budget = self._table.first_allocation(request.request_id)
        if budget is None:
            return self._original(request, *args, **kwargs)
        bound = self._signature.bind(request, *args, **kwargs)
        a = bound.arguments
        have = (request.num_computed_tokens + a.get("num_new_computed_tokens", 0)
                + a.get("num_external_computed_tokens", 0) + a["num_new_tokens"])
        a["num_lookahead_tokens"] = max(a.get("num_lookahead_tokens", 0), budget - have)
        blocks = self._original(*bound.args, **bound.kwargs)
        if blocks is not None:
            self._table.allocated(request.request_id)
        return blocks
