"""The block manager's side of Hogwild groups in the engine core: making room, reserving budgets, private blocks.

The rules live in :class:`~vllm_hogwild.core.groups.table.GroupTable`; this
module applies them to vLLM's KV-cache manager:

- :class:`RoomMaker` (``kv: on-demand``): before vLLM schedules a step, the
  blocks its running requests will ask for are counted as vLLM's own loop
  would ask; when they do not fit, whole units are preempted in vLLM's policy
  order (:func:`~vllm_hogwild.core.groups.policy.preemption_order`): a plain
  request with vLLM's own ``_preempt_request``, a group whole
  (:meth:`~vllm_hogwild.scheduler.scheduler.HogwildScheduler.preempt_group`).
  vLLM's loop then never needs to preempt, so it never takes a lone worker;
- :class:`BudgetedAllocation` (``kv: reserve``): a wrap of this scheduler's
  ``kv_cache_manager.allocate_slots`` under which a worker's first allocation
  takes its whole budget. vLLM calls ``allocate_slots`` for every running
  request every step, so the instance attribute is wrapped only while a first
  allocation is to come, and put back after. Wrapping takes whatever the
  instance has then, and unwrapping restores it, so nothing set on the
  instance meanwhile by anyone else (vLLM's own scheduler tests patch it) is
  lost. ``patches/04-*`` is the upstream change (a lookahead per request) that
  would retire the wrap;
- :class:`LaneHashers`: a lane's prefix-cache hashes past its group's
  prompt are the lane's own, so K/V computed under Hogwild views is never
  served to another request.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import time
from typing import Any, Callable

from vllm_hogwild.core.groups.policy import Unit, preemption_order
from vllm_hogwild.core.groups.table import GroupTable

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


class LaneHashers:
    """The prefix-cache hashers of lanes (one per scheduler): a lane's hashes past its group's prompt are its own.

    A lane's blocks past the prompt's full blocks hold K/V computed under the lane's views, so their hashes are
    vLLM's salted with the lane (the request id): no other request (a plain one with the same tokens, a
    sibling lane) ever finds them in the prefix cache. The prompt's full blocks keep vLLM's hashes
    (co-workers and other requests with the same prompt share them).

    vLLM calls a request's hasher for every token it gains, and the call site in ``Request`` stays fast only
    while it sees one function: every worker of the engine shares one (:meth:`for_worker`, its salt and
    prompt read from the request), which returns early exactly as vLLM's own does. A function per lane cost
    about 0.3 ms per engine step at 1,024 workers (``docs/benchmarks.md``, "Scheduler overhead"). A replay
    request (rare: a preempted group resuming) has a prompt longer than its group's, so it gets a function of
    its own (:meth:`for_replay`)."""

    def __init__(self, hash_block_size: int) -> None:
        self.hash_block_size = hash_block_size
        self._workers: dict[Callable, Callable] = {}  # vLLM's hasher -> the one its workers share
        self._bases: dict[Callable, Callable] = {}  # a workers' hasher -> vLLM's under it

    def base(self, hasher: Callable) -> Callable:
        """vLLM's own hasher under ``hasher`` (``hasher`` itself when it is not a lane's)."""
        return self._bases.get(hasher, hasher)

    def for_worker(self, hasher: Callable | None) -> Callable | None:
        """The hasher of every worker whose request is its lane from position 0 (``hasher``: vLLM's or a lane's;
        None, prefix caching off: None)."""
        if hasher is None:
            return None
        base = self.base(hasher)
        shared = self._workers.get(base)
        if shared is None:
            size = self.hash_block_size

            def hash_worker_lane(request) -> list[bytes]:
                start = len(request.block_hashes) * size
                if start + size > request.num_tokens:
                    return []  # no block filled since the last call (vLLM's own test)
                return _salted(base(request), start // size, request.num_prompt_tokens // size, request.request_id)

            shared = self._workers[base] = hash_worker_lane
            self._bases[shared] = base
        return shared

    def for_replay(self, hasher: Callable | None, prompt_len: int, request_id: str) -> Callable | None:
        """The hasher of a replay request (``hasher``: its worker's, None with prefix caching off; ``prompt_len``:
        its group's prompt, shorter than its own, which is the whole lane; ``request_id``: its own, the salt)."""
        if hasher is None:
            return None
        return functools.partial(_replay_hashes, self.base(hasher), self.hash_block_size,
                                 prompt_len // self.hash_block_size, request_id)


def _replay_hashes(base, size: int, shared_blocks: int, lane: str, request) -> list[bytes]:
    start = len(request.block_hashes) * size
    if start + size > request.num_tokens:
        return []
    return _salted(base(request), start // size, shared_blocks, lane)


def _salted(hashes: list[bytes], first: int, shared_blocks: int, lane: str) -> list[bytes]:
    """vLLM's hashes of blocks ``first``, ``first + 1``, ...: those from ``shared_blocks`` on salted with ``lane``."""
    salt = b"hogwild-lane:" + lane.encode()
    return [h if first + i < shared_blocks else hashlib.sha256(salt + h).digest() for i, h in enumerate(hashes)]


class RoomMaker:
    """``kv: on-demand``: room for the step's running requests, by preempting whole units before vLLM schedules."""

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler

    def make_room(self) -> bool:
        """Preempt units, newest (or least urgent) first, until what this step's running requests ask for fits;
        True when something was preempted. O(1) when the pool has room for any step."""
        s = self.scheduler
        pool = s.kv_cache_manager.block_pool
        forked = s.table.forked_lanes()
        if pool.get_num_free_blocks() >= self.bound(forked):
            return False  # no allocation of this step can fail
        needs = self.needs(forked)
        total = sum(needs.values())
        if total <= pool.get_num_free_blocks():
            return False
        preempted, now = False, time.monotonic()
        for unit in preemption_order(self.units(needs), by_priority=s.policy.name == "PRIORITY"):
            if total <= pool.get_num_free_blocks():
                break
            if unit.is_group:
                s.preempt_group(unit.key, now)
            else:
                request = s.requests[unit.key]
                s.running.remove(request)
                s._preempt_request(request, now)  # vLLM's own: exactly as vLLM preempts a plain request
            total -= unit.need
            preempted = True
        return preempted

    def bound(self, forked: list[tuple[str, int, int]]) -> int:
        """At most the blocks this step's allocations take: a decoding request feeds its last token and drafts
        (and asks for look-ahead slots), one block's worth at most; a prefilling one its chunk; a lane a fork
        took (``forked``, as :meth:`needs` takes it) its first allocation. O(prefills + forked lanes)."""
        s = self.scheduler
        bs = s.block_size
        per_decode = -(-(1 + s.num_spec_tokens + s.num_lookahead_tokens) // bs)
        chunked = [*s._inflight_prefills, *(w.lane_request for g in s.table.replaying for w in g.workers)]
        chunks = sum(-(-min(r.num_tokens - r.num_computed_tokens, s.max_num_scheduled_tokens) // bs) + 1
                     for r in chunked)
        first = sum(-(-slots // bs) for _, slots, _ in forked)
        ahead = s._fed_ahead.num_tokens  # forced tokens appended for this step (a block each at most)
        return len(s.running) * per_decode + chunks + first + ahead  # (vLLM preempts for running requests only)

    def needs(self, forked: list[tuple[str, int, int]]) -> dict[str, int]:
        """The blocks each running request's allocation will ask for this step, as vLLM's running loop asks
        (its token budget, long-prefill threshold, replay chunk ends and look-ahead), in its order; and the
        first allocations of lanes a fork took (:meth:`~vllm_hogwild.core.groups.table.GroupTable.forked_lanes`)."""
        s = self.scheduler
        budget, threshold = s.max_num_scheduled_tokens, s.scheduler_config.long_prefill_token_threshold
        num_running, num_waiting = s.get_request_counts()
        if num_running + num_waiting <= 1:
            threshold = 0
        elif threshold > 0 and s.adaptive_long_prefill_threshold:
            threshold = max(threshold, s.scheduler_config.max_num_batched_tokens // (num_running + num_waiting))
        ends = s.table.replay_ends(max(1, budget - len(s.running))) if s.table.replaying else {}
        held = s.kv_cache_manager.coordinator.get_blocks
        bs, lookahead, limit = s.block_size, s.num_lookahead_tokens, s.max_model_len - s.num_sampled_tokens_per_step
        needs = {}
        for request in s.running:
            computed = request.num_computed_tokens
            n = request.num_tokens_with_spec + request.num_output_placeholders - computed
            if 0 < threshold < n:
                n = threshold
            if ends:
                end = ends.get(request.request_id)
                if end is not None:
                    n = min(n, end - computed)
            n = min(n, budget, limit - computed)
            if n <= 0:
                continue
            budget -= n
            blocks = -(-min(computed + n + lookahead, s.max_model_len) // bs) - len(held(request.request_id)[0])
            if blocks > 0:
                needs[request.request_id] = blocks
        # Lanes a fork took wait in vLLM's queue for their first blocks (their group's trunk waits for them): they
        # count as their group's need, so that a step in which every group waits at a fork still makes room.
        manager = s.kv_cache_manager
        watermark = manager.watermark_blocks  # (vLLM keeps it free of a waiting request's allocation, once)
        for request_id, slots, prompt_len in forked:
            # (with prefix caching the prompt's full blocks are the trunk's, shared)
            needs[request_id] = -(-slots // bs) - (prompt_len // bs if manager.enable_caching else 0) + watermark
            watermark = 0
        return needs

    def units(self, needs: dict[str, int]) -> list[Unit]:
        """Every running group (one unit, whatever it holds) and every running plain request."""
        s = self.scheduler
        coordinator, units = s.kv_cache_manager.coordinator, []
        for group in s.table.running_groups:
            lanes = [w.lane_request_id for w in group.workers]
            units.append(Unit(group.group_id, True, group.arrival, group.workers[0].request.priority,
                              sum(needs.get(r, 0) for r in lanes),
                              len({b.block_id for r in lanes for b in coordinator.get_blocks(r)[0]})))
        for request in s.running:
            if request.request_id not in s.table:
                units.append(Unit(request.request_id, False, request.arrival_time, request.priority,
                                  needs.get(request.request_id, 0), len(coordinator.get_blocks(request.request_id)[0])))
        return units
