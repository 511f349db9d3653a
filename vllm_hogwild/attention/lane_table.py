"""Every Hogwild lane's block table on the device, kept from step to step: a step uploads what changed.

Segment attention on the torch and Triton paths walks a lane's blocks through this table
(``blocks[row, k]``: the physical block holding the lane's positions ``[k * block_size, (k + 1) *
block_size)``), so a step's plan names lanes and positions, never blocks: its size does not grow with
the views' length. The worker's view registry gives each lane a *slot* (a small integer, reused once
the lane's group ends) and a *generation* (new each time a slot is given out,
:class:`~vllm_hogwild.core.views.registry.ViewRegistry`); slot ``s`` is row ``s`` here. Per step, for
every lane the step reads, one comparison of its table's length and generation with what the row holds
finds the lanes that changed (a new lane, a new block: a lane grows by at most a block a decode step),
and only their new entries are uploaded, in one copy. A table without a slot (rows given as objects:
tests, benchmarks) takes a scratch row for the one plan, uploaded whole.

**Shared prompt blocks are read once.** vLLM's prefix caching gives every lane of a group the same
physical blocks for the prompt's full blocks. When a row is first filled, its leading blocks are
compared with those of the row that first showed the same first block (its *canonical* row); the
number of equal leading blocks is kept (``split``), and a plan reads a lane's positions before
``split * block_size`` through the canonical row instead. The blocks are the same memory, so the
result is the same bit for bit, and the N workers' prompt reads become one read with N readers. A
canonical row's own ``split`` is the longest prefix any row shares with it, so its reads are cut at
the same block as theirs (the rest of its prompt and its own text then start in one block and are read
together). When a canonical row is given to another lane, the rows that read through it are pointed at
one of themselves.
"""

from __future__ import annotations

from array import array
from typing import Sequence

import torch


class LaneTableFull(RuntimeError):
    """A frozen table (its tensor captured in a CUDA graph) has no room for the step's lanes."""


class PinnedStaging:
    """Host-to-device copies that never wait for the device's queue: each goes from one of two pinned buffers
    in turn, and a buffer is refilled only once its copy of two sends ago is done (at once, in steady state),
    so a copy still in flight is never overwritten. A copy from ordinary (pageable) memory would first wait
    for everything queued on the device: every step, for the host work of the step before."""

    def __init__(self) -> None:
        self.buffers: list = [None, None]  # (pinned tensor, event) each
        self.turn = 0

    def send(self, host: torch.Tensor, device: torch.device) -> torch.Tensor:
        """``host`` (a CPU tensor) on ``device``, copied asynchronously; the result is a new device tensor."""
        slot = self.buffers[self.turn]
        if slot is not None:
            slot[1].synchronize()
        if slot is None or slot[0].numel() < host.numel() or slot[0].dtype != host.dtype:
            slot = (torch.empty(max(host.numel(), 1024), dtype=host.dtype, pin_memory=True), torch.cuda.Event())
            self.buffers[self.turn] = slot
        self.turn ^= 1
        pinned = slot[0][: host.numel()].view(host.shape)
        pinned.copy_(host)
        out = pinned.to(device, non_blocking=True)
        slot[1].record()
        return out


def _longs(a: array) -> torch.Tensor:
    """An ``array('q')`` as a long tensor sharing its memory (no copy; the array must outlive it)."""
    return torch.frombuffer(a, dtype=torch.long) if len(a) else torch.zeros(0, dtype=torch.long)


class LaneTable:
    """Rows ``[0, num_slots)``: the registry's slots; rows ``[num_slots, num_slots + num_scratch)``: scratch
    rows for tables without a slot, refilled by every plan. ``blocks``: int32 ``[rows, max_blocks]`` on
    ``device``; host state in CPU tensors and dicts."""

    def __init__(self, device: torch.device | str = "cpu", num_slots: int = 16, max_blocks: int = 64,
                 num_scratch: int = 16) -> None:
        self.device = torch.device(device)
        self.num_slots, self.max_blocks, self.num_scratch = num_slots, max_blocks, num_scratch
        self.frozen = False  # captured in a graph: the tensor may not be replaced
        self.blocks = torch.zeros(num_slots + num_scratch, max_blocks, dtype=torch.int32, device=self.device)
        n = num_slots + num_scratch
        self.gen = torch.full((n,), -1, dtype=torch.long)  # the generation each row holds (-1: none)
        self.count = torch.zeros(n, dtype=torch.long)  # entries uploaded
        self.canon = torch.arange(n)  # the row a row's first `split` blocks are read through
        self.split = torch.zeros(n, dtype=torch.long)
        self.host: list[Sequence[int] | None] = [None] * n  # what each row holds
        self.first: dict[int, int] = {}  # first physical block -> its canonical slot row
        self.deps: dict[int, set[int]] = {}  # canonical row -> rows that read through it
        self.num_uploaded = 0  # entries uploaded, over the table's life (a check for the tests)
        self.staging = PinnedStaging()
        self.version = 0  # changes whenever a row's lane or its canonical row does (a plan's shape then changes)

    # -- capacity ------------------------------------------------------------------------------------

    def reserve(self, num_slots: int, max_blocks: int, num_scratch: int | None = None) -> None:
        """Room for ``num_slots`` slots, ``max_blocks`` blocks a lane and ``num_scratch`` scratch rows."""
        num_scratch = self.num_scratch if num_scratch is None else num_scratch
        if num_slots <= self.num_slots and max_blocks <= self.max_blocks and num_scratch <= self.num_scratch:
            return
        if self.frozen:
            raise LaneTableFull(f"the lane table was captured with {self.num_slots} slots of {self.max_blocks} "
                                f"blocks and {self.num_scratch} scratch rows; the step needs {num_slots}, "
                                f"{max_blocks} and {num_scratch}")
        slots = max(num_slots, self.num_slots, 2 * self.num_slots if num_slots > self.num_slots else 0)
        width = max(max_blocks, self.max_blocks, 2 * self.max_blocks if max_blocks > self.max_blocks else 0)
        scratch = max(num_scratch, self.num_scratch)
        old = self.num_slots
        blocks = torch.zeros(slots + scratch, width, dtype=torch.int32, device=self.device)
        blocks[:old, : self.max_blocks] = self.blocks[:old]
        self.blocks = blocks
        extra = slots - old

        def grow(t: torch.Tensor, fill) -> torch.Tensor:
            return torch.cat([t[:old], torch.full((extra,), fill, dtype=t.dtype), torch.full((scratch,), fill,
                                                                                              dtype=t.dtype)])

        self.gen, self.count, self.split = grow(self.gen, -1), grow(self.count, 0), grow(self.split, 0)
        canon = torch.arange(slots + scratch)
        canon[:old] = self.canon[:old]
        self.canon = canon
        self.host = self.host[:old] + [None] * (extra + scratch)
        self.num_slots, self.max_blocks, self.num_scratch = slots, width, scratch

    # -- a step --------------------------------------------------------------------------------------

    def sync(self, tables: Sequence[Sequence[int]], slots: array, gens: array) -> tuple[torch.Tensor, torch.Tensor]:
        """Upload what changed of ``tables`` (``slots[k]``, ``gens[k]``: table ``k``'s slot and generation; slot
        -1: none) -> each table's row and its length in blocks, ``[len(tables)]`` each (long, host)."""
        num = len(tables)
        lens_a = array("q", map(len, tables))
        lens = _longs(lens_a)
        slot_t, gen_t = _longs(slots), _longs(gens)
        lowest = min(slots) if num else 0
        need_slots = max(slots) + 1 if num else 0
        scratch_ids: dict[tuple[int, ...], int] = {}  # a table's blocks -> its scratch row (equal tables: one row)
        scratch_of = [k for k in range(num) if slots[k] < 0] if lowest < 0 else []
        for k in scratch_of:
            scratch_ids.setdefault(tuple(tables[k]), len(scratch_ids))
        self.reserve(need_slots, max(lens_a) if num else 0, len(scratch_ids))
        rows = slot_t.clone() if lowest >= 0 else torch.where(slot_t >= 0, slot_t, 0)
        entries: list[tuple[int, int, Sequence[int]]] = []  # (row, first position, blocks)
        if need_slots > 0:
            owned = slot_t >= 0
            changed = owned & ((self.gen[rows] != gen_t) | (lens > self.count[rows]))
            for k in changed.nonzero().flatten().tolist():  # only the lanes whose table changed
                row = slots[k]
                if self.gen[row] != gens[k]:
                    self._reset(row, gens[k])
                have = int(self.count[row])
                if len(tables[k]) > have:
                    entries.append((row, have, tables[k]))
                    self.count[row] = len(tables[k])
                    self.host[row] = tables[k]
                    if have == 0:
                        self._alias(row, tables[k])
        if scratch_ids:
            self.version += 1  # scratch rows are filled anew by every plan
            base = self.num_slots
            first: dict[int, int] = {}
            for k in scratch_of:
                row = base + scratch_ids[tuple(tables[k])]
                rows[k] = row
                if self.host[row] is not tables[k]:
                    self.host[row], self.count[row] = tables[k], len(tables[k])
                    entries.append((row, 0, tables[k]))
                    self.canon[row], self.split[row] = row, 0
                    if len(tables[k]):
                        c = first.setdefault(tables[k][0], row)
                        if c != row:
                            shared = _common_prefix(self.host[c], tables[k])
                            self.canon[row], self.split[row] = c, shared
                            self.split[c] = max(int(self.split[c]), shared)
        if entries:
            self._upload(entries)
        return rows, lens

    def release_scratch(self) -> None:
        """The scratch rows' tables are not kept past a plan (their objects may die and their ids be reused)."""
        base = self.num_slots
        for row in range(base, base + self.num_scratch):
            self.host[row] = None

    def _upload(self, entries: list[tuple[int, int, Sequence[int]]]) -> None:
        """New entries ``(row, first position, table)``, scattered into the table on its device in one copy."""
        r, c, v = array("q"), array("q"), array("q")
        for row, have, table in entries:
            n = len(table) - have
            r.extend([row] * n)
            c.extend(range(have, len(table)))
            v.extend(table[have:])
        self.num_uploaded += len(v)
        triples = torch.stack([_longs(r), _longs(c), _longs(v)])  # [3, n]
        if self.device.type == "cuda":  # from pinned memory, without waiting for the device's queue
            triples = self.staging.send(triples, self.device)
        self.blocks.index_put_((triples[0], triples[1]), triples[2].to(torch.int32))

    def _reset(self, row: int, gen: int) -> None:
        """Row ``row`` now holds another lane: nothing of the last one stays, nor any row's reads through it."""
        self.version += 1
        canon = int(self.canon[row])
        if canon != row:
            self.deps.get(canon, set()).discard(row)
        deps = sorted(self.deps.pop(row, ()))
        old = self.host[row]
        if old is not None and len(old) and self.first.get(old[0]) == row:
            del self.first[old[0]]
        if deps:  # they read their prompt through this row: the first of them now holds it for the rest
            head, rest = deps[0], deps[1:]
            head_shared = int(self.split[head])
            self.canon[head], self.split[head] = head, 0
            self.first[self.host[head][0]] = head
            for d in rest:
                self.canon[d] = head
                self.split[d] = min(int(self.split[d]), head_shared)
                self.split[head] = max(int(self.split[head]), int(self.split[d]))
            if rest:
                self.deps[head] = set(rest)
        self.gen[row], self.count[row], self.host[row] = gen, 0, None
        self.canon[row], self.split[row] = row, 0

    def _alias(self, row: int, table: Sequence[int]) -> None:
        if not len(table):
            return
        c = self.first.setdefault(table[0], row)
        if c == row:
            return
        shared = _common_prefix(self.host[c], table)
        self.canon[row], self.split[row] = c, shared
        self.split[c] = max(int(self.split[c]), shared)
        self.version += 1
        self.deps.setdefault(c, set()).add(row)


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading entries ``a`` and ``b`` share (once a lane, at its first upload: its prompt blocks)."""
    n = min(len(a), len(b))
    k = 0
    while k < n and a[k] == b[k]:
        k += 1
    return k
