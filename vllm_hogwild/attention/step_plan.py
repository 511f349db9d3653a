"""The step's segment-attention plan for the torch and Triton paths: from the columns, in tensor ops.

A step's Hogwild rows arrive as :class:`~vllm_hogwild.core.views.spans.SegmentColumns` (every row a
single query token: a multi-token row is one row per token, each reading its own text up to itself). The
plan names lanes and positions, never blocks, so its size is the number of segments, flat in the views'
length; the kernels walk a lane's blocks through the :class:`~vllm_hogwild.attention.lane_table.LaneTable`,
which a step updates by what changed (a new lane, a new block).

- **pairs**: one per (row, segment), in row order (``row_pair_ptr``); each pair is one query token rotated
  by its segment's ``delta`` (``pair_cos``/``pair_sin``) reading positions ``[start, pair_end)`` of a lane.
  A segment that begins in a lane's shared prompt blocks becomes two pairs: the shared part read through
  the lane's canonical row (the lane table's ``canon``), and the rest.
- **items**: the pairs that read the same lane from the same block on, whatever their own start and end: one
  item is read once for all of its readers (``item_reader_ptr`` into ``reader_pair``), each reader masked to
  its own positions. Every worker of a group
  reads each co-worker's text and the shared prompt, so a group of N has about 2N + 1 items for N * N
  pairs, and each KV block of an item is loaded once a step for all its readers.
- **splits**: the Triton kernel cuts every item into ``num_splits`` runs of blocks (more when the step has
  few items: a GPU needs programs) and writes a partial softmax per (pair, split); the merge kernel
  combines a row's partials. The torch path reads each item whole.

Every tensor lives in :class:`PlanBuffers`: filled in place each step and sized for a capacity that
grows until the buffers are frozen (captured by a CUDA graph: then a step that needs more raises
:class:`PlanCapacityError` and must not replay the graph). On a GPU the integers of a step go to the
device in one copy from pinned memory (two staging buffers in turn, so a copy still in flight is never
overwritten); the rotations are computed there from the pairs' deltas.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Sequence

import torch

from vllm_hogwild.attention.lane_table import LaneTable, LaneTableFull, _longs
from vllm_hogwild.core.views.rope import RopeSpec
from vllm_hogwild.core.views.spans import SegmentColumns

# Work units (item, split, KV head) a Triton launch aims for, per program of its persistent grid: a GPU's SMs
# each run several programs, and a step with few items (one group, long views) is split until they have work.
UNITS_PER_PROGRAM = 2
MAX_SPLITS = 32  # splits of one item (bounds the partials a pair writes)
FORCED_SPLITS: int | None = None  # tests: every item cut into this many splits (within the partial slots)
MIN_PARTIAL_SLOTS = 4096  # partial slots (pair, split) a step may use at least


class PlanCapacityError(RuntimeError):
    """Frozen buffers (captured by a CUDA graph) cannot hold the step's plan."""


def default_programs(device: torch.device) -> int:
    """The Triton kernels' persistent grid: a few programs per SM on a GPU (each runs one warp); four elsewhere
    (Triton's interpreter runs every program in turn)."""
    if device.type == "cuda":
        return 8 * torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def _pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


# Fields of the packed int32 buffer, each [capacity]: name -> which capacity (+1 for pointer arrays).
_INT_FIELDS = (
    ("counts", "fixed", 0),  # [4]: rows, pairs, items, splits
    ("row_token", "rows", 0),
    ("row_pair_ptr", "rows", 1),
    ("pair_token", "pairs", 0),
    ("pair_item", "pairs", 0),
    ("pair_start", "pairs", 0),
    ("pair_end", "pairs", 0),
    ("pair_delta", "pairs", 0),
    ("reader_pair", "pairs", 0),
    ("item_lane", "items", 0),
    ("item_start", "items", 0),
    ("item_end", "items", 0),
    ("item_reader_ptr", "items", 1),
)


@dataclass
class PlanBuffers:
    """Every tensor a plan hands the kernels, for capacities ``rows``, ``pairs`` and ``items``."""

    device: torch.device
    rows: int = 0
    pairs: int = 0
    items: int = 0
    slots: int = 0  # partial slots (pair, split)
    frozen: bool = False
    ints: dict = field(default_factory=dict)  # name -> int32 [capacity] view of `packed`
    offsets: dict = field(default_factory=dict)  # name -> where it starts in `packed`
    packed: torch.Tensor | None = None
    staging: list = field(default_factory=list)  # pinned host buffers and their copy events (a GPU)
    turn: int = 0
    partials: dict = field(default_factory=dict)  # (num_q_heads, head_dim) -> (m, l, acc)
    written: object = None  # the step shape whose every field is in the buffers (None: none, or unknown)

    def reserve(self, rows: int, pairs: int, items: int) -> None:
        if rows <= self.rows and pairs <= self.pairs and items <= self.items and self.packed is not None:
            return
        if self.frozen:
            raise PlanCapacityError(f"plan buffers were captured for {self.rows} rows, {self.pairs} pairs and "
                                    f"{self.items} items; the step needs {rows}, {pairs} and {items}")
        self.rows, self.pairs, self.items = (max(_pow2(n), have) for n, have in
                                             ((rows, self.rows), (pairs, self.pairs), (items, self.items)))
        self.slots = max(self.pairs, MIN_PARTIAL_SLOTS)
        sizes = {"fixed": 4, "rows": self.rows, "pairs": self.pairs, "items": self.items}
        # Every field starts on 64 bytes: Triton specializes a pointer on its alignment, and the offsets change
        # with the capacities.
        spans = [(name, -(-(sizes[kind] + extra) // 16) * 16, sizes[kind] + extra) for name, kind, extra in _INT_FIELDS]
        self.packed = torch.zeros(sum(width for _, width, _ in spans), dtype=torch.int32, device=self.device)
        self.ints, self.offsets, at = {}, {}, 0
        for name, width, n in spans:
            self.ints[name], self.offsets[name] = self.packed[at: at + n], at
            at += width
        total = at
        self.staging, self.written = [], None
        if self.device.type == "cuda":
            for _ in range(2):
                self.staging.append((torch.zeros(total, dtype=torch.int32, pin_memory=True), torch.cuda.Event()))
        self.partials = {}

    def partial_buffers(self, num_q_heads: int, head_dim: int):
        """The partial softmax slots ``m, l [slots, Hq]`` and ``acc [slots, Hq, D]`` (float32), made once."""
        key = (num_q_heads, head_dim)
        if key not in self.partials:
            if self.frozen:
                raise PlanCapacityError(f"no partial buffers for {num_q_heads} heads of {head_dim} were captured")
            s = self.slots
            self.partials[key] = (torch.empty(s, num_q_heads, dtype=torch.float32, device=self.device),
                                  torch.empty(s, num_q_heads, dtype=torch.float32, device=self.device),
                                  torch.empty(s, num_q_heads, head_dim, dtype=torch.float32, device=self.device))
        return self.partials[key]

    def write(self, values: dict[str, torch.Tensor], static: dict[str, torch.Tensor] | None = None) -> None:
        """The step's integers into the buffers (host tensors): ``values`` change every step, ``static`` (given
        when they change) stay until the next ``static``. A GPU gets them in one copy from a pinned staging
        buffer; both staging buffers hold the static fields, so either one copied whole is the whole plan."""
        if self.device.type != "cuda":
            for name, v in {**values, **(static or {})}.items():
                self.ints[name][: len(v)] = v
            return
        turns = (self.turn, self.turn ^ 1) if static else (self.turn,)
        for t in turns:  # the copy from a staging buffer two steps ago is done (at once, in steady state)
            self.staging[t][1].synchronize()
        for t in turns:
            host = self.staging[t][0]
            for name, v in static.items() if static else ():
                host[self.offsets[name]: self.offsets[name] + len(v)] = v
        host, event = self.staging[self.turn]
        for name, v in values.items():
            host[self.offsets[name]: self.offsets[name] + len(v)] = v
        self.turn ^= 1
        self.packed.copy_(host, non_blocking=True)
        event.record()


@dataclass
class TorchBucket:
    """Items of about one length and reader count, for the torch path: read whole, padded."""

    item_first_block: torch.Tensor  # [Wb] first logical block of each item
    block_ids: torch.Tensor  # [Wb, NB] physical blocks (padding: block 0, masked)
    reader_pair: torch.Tensor  # [Wb, R] (num_pairs: padding)
    reader_start: torch.Tensor  # [Wb, R] the first position each reader sees
    reader_end: torch.Tensor  # [Wb, R] one past the last (0: padding)


@dataclass
class ItemPlan:
    """A step's pairs and items (see the module docstring); ``num_*`` are the live counts, the tensors are
    the buffers (longer)."""

    buffers: PlanBuffers
    lanes: LaneTable
    inv_freq: torch.Tensor  # [rotary_dim / 2] float64 on the device: the Triton kernel's rotations
    num_rows: int
    num_pairs: int
    num_items: int
    num_splits: int
    block_size: int
    num_programs: int = 4  # the Triton kernels' persistent grid
    always_launch: bool = False  # launch even with no pair (a plan a CUDA graph captures)
    pair_row: torch.Tensor | None = None  # [P] each pair's row (the torch path)
    pair_cos: torch.Tensor | None = None  # [P, rotary_dim / 2] (the torch path)
    pair_sin: torch.Tensor | None = None
    torch_buckets: list[TorchBucket] | None = None

    @property
    def ints(self) -> dict[str, torch.Tensor]:
        """The buffers' int32 fields by name (``counts``, ``row_token``, ``pair_end``, ``item_start``, ...)."""
        return self.buffers.ints


@dataclass
class HostItems:
    """The step's pairs and items on the host, before they go to the buffers (long tensors)."""

    row_token: torch.Tensor  # [R]
    row_pair_ptr: torch.Tensor  # [R + 1]
    pair_row: torch.Tensor  # [P]
    pair_token: torch.Tensor  # [P]
    pair_start: torch.Tensor  # [P]
    pair_end: torch.Tensor  # [P]
    pair_delta: torch.Tensor  # [P]
    pair_item: torch.Tensor  # [P]
    reader_pair: torch.Tensor  # [P] pairs grouped by item
    item_lane: torch.Tensor  # [W]
    item_start: torch.Tensor  # [W]
    item_end: torch.Tensor  # [W]
    item_reader_ptr: torch.Tensor  # [W + 1]


@dataclass
class _Shape:
    """What of a step's items stays while its rows keep their lanes, starts and query tokens (a decode step after
    another): everything but the ends and the rotations. ``key``: copies of the columns that decide it."""

    key: tuple
    lanes_version: int
    split_segments: torch.Tensor  # [K] segments that begin in shared blocks (read in part through the canon)
    split_shared: torch.Tensor  # [K] where their shared part ends
    split_tail: torch.Tensor  # [K] whether they go on past it (then a second pair)
    pair_segment: torch.Tensor | None  # [P] each pair's segment (None: a pair is a segment)
    pair_head: torch.Tensor | None  # [P] the pair is the shared part of its segment
    pair_shared: torch.Tensor | None  # [P]
    items: HostItems  # ends and rotations as of the step that built it


def _key(columns: SegmentColumns, tokens: array) -> tuple:
    return (array("q", columns.slots), array("q", columns.gens), array("q", columns.table),
            array("q", columns.start), array("q", columns.row_ptr), array("q", tokens))


def _same_key(key: tuple, columns: SegmentColumns, tokens: array) -> bool:
    slots, gens, table, start, row_ptr, toks = key
    return (row_ptr == columns.row_ptr and table == columns.table and start == columns.start
            and toks == tokens and slots == columns.slots and gens == columns.gens)


def _shape(columns: SegmentColumns, tokens: array, lane_of: torch.Tensor, lanes: LaneTable, bs: int,
           end: torch.Tensor, delta: torch.Tensor, keep: torch.Tensor | None = None) -> _Shape:
    """The step's items from scratch (a structure change: a group admitted or gone, a row joining or leaving, a
    fork or a join, a replay); ``keep``: the segments to read (None: all)."""
    num_rows = len(columns)
    tab, start = _longs(columns.table), _longs(columns.start)
    seg_row = torch.repeat_interleave(_longs(columns.row_ptr).diff())
    if keep is not None:
        tab, start, end, delta, seg_row = tab[keep], start[keep], end[keep], delta[keep], seg_row[keep]
    lane = lane_of[tab]
    shared = lanes.split[lane] * bs  # positions before it are read through the canonical row
    split = start < shared
    split_segments = split.nonzero().flatten()
    tail = split & (end > shared)
    pair_segment = pair_head = pair_shared = None
    if len(split_segments):  # [start, end) -> [start, min(end, shared)) of the canonical row, then the rest
        n = 1 + tail.long()
        idx = torch.repeat_interleave(n)
        part = torch.arange(len(idx)) - (n.cumsum(0) - n)[idx]  # 0: first (or only) part, 1: the rest
        head = split[idx] & (part == 0)
        lane = torch.where(head, lanes.canon[lane[idx]], lane[idx])
        start = torch.where(part == 1, shared[idx], start[idx])
        end = torch.where(head, torch.minimum(end[idx], shared[idx]), end[idx])
        delta, seg_row = delta[idx], seg_row[idx]
        pair_segment, pair_head, pair_shared = idx, head, shared[idx]
    tokens_t = _longs(tokens).clone()
    if len(tokens_t) != num_rows:
        raise ValueError(f"{num_rows} rows but {len(tokens_t)} query tokens")
    pairs_per_row = torch.bincount(seg_row, minlength=num_rows)
    if num_rows and bool((pairs_per_row == 0).any()):
        raise ValueError("a query row needs tokens and segments")
    first = start // bs
    key_base = int(first.max()) + 1 if len(first) else 1
    keys, pair_item = torch.unique(lane * key_base + first, return_inverse=True)  # (lane, first block): an item
    num_items = len(keys)
    readers = torch.bincount(pair_item, minlength=num_items)
    item_start = torch.full((num_items,), torch.iinfo(torch.long).max).scatter_reduce_(0, pair_item, start, "amin")
    items = HostItems(
        row_token=tokens_t, row_pair_ptr=torch.cat([torch.zeros(1, dtype=torch.long), pairs_per_row.cumsum(0)]),
        pair_row=seg_row, pair_token=tokens_t[seg_row], pair_start=start, pair_end=end, pair_delta=delta,
        pair_item=pair_item, reader_pair=torch.argsort(pair_item, stable=True), item_lane=keys // key_base,
        item_start=item_start, item_end=_item_end(num_items, pair_item, end),
        item_reader_ptr=torch.cat([torch.zeros(1, dtype=torch.long), readers.cumsum(0)]),
    )
    return _Shape(_key(columns, tokens), lanes.version, split_segments, shared[split_segments],
                  tail[split_segments], pair_segment, pair_head, pair_shared, items)


def _item_end(num_items: int, pair_item: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
    return torch.zeros(num_items, dtype=torch.long).scatter_reduce_(0, pair_item, end, "amax", include_self=False)


def host_items(columns: SegmentColumns, tokens: Sequence[int], lanes: LaneTable, block_size: int,
               last: _Shape | None = None) -> tuple[HostItems, _Shape, bool]:
    """The pairs and items of ``columns`` (row ``r``'s query token ``tokens[r]``), the lane table updated;
    ``last``: the shape of the step before, kept when nothing but ends and rotations changed (then only they
    are computed). Returns the items, their shape and whether it is ``last``."""
    bs = block_size
    tokens = tokens if isinstance(tokens, array) else array("q", tokens)
    lane_of, lens = lanes.sync(columns.tables, columns.slots, columns.gens)  # [tables] lane-table row, length
    end, delta = _longs(columns.end), _longs(columns.delta)
    if len(end):
        tab = _longs(columns.table)
        past = end > lens[tab] * bs
        if bool(past.any()):
            s = int(past.nonzero()[0, 0])
            raise ValueError(f"segment ends at {int(end[s])} past its {int(lens[tab[s]])} blocks")
        keep = end > _longs(columns.start)
        if not bool(keep.all()):  # empty segments (rare): left out, and the shape not kept for the next step
            return _shape(columns, tokens, lane_of, lanes, bs, end, delta, keep).items, None, False
    kept = (last is not None and last.lanes_version == lanes.version and _same_key(last.key, columns, tokens)
            and bool(torch.equal(end[last.split_segments] > last.split_shared, last.split_tail)))
    if not kept:
        last = _shape(columns, tokens, lane_of, lanes, bs, end, delta)
        return last.items, last, False
    h = last.items
    if last.pair_segment is not None:
        seg_end = end[last.pair_segment]
        end = torch.where(last.pair_head, torch.minimum(seg_end, last.pair_shared), seg_end)
        delta = delta[last.pair_segment]
    h.pair_end, h.pair_delta = end.clone(), delta.clone()
    h.item_end = _item_end(len(h.item_end), h.pair_item, h.pair_end)
    return h, last, True


class StepPlanner:
    """One builder's plans, step after step: its lane table and buffers persist (see the module docstring)."""

    def __init__(self, block_size: int, rope: RopeSpec, device: torch.device | str = "cpu",
                 num_kv_heads: int = 1, num_programs: int | None = None) -> None:
        self.block_size, self.rope, self.device = block_size, rope, torch.device(device)
        self.num_kv_heads = num_kv_heads
        self.num_programs = num_programs or default_programs(self.device)
        self.always_launch = False  # set once a CUDA graph captures the plan's launches
        self.lanes = LaneTable(self.device)
        self.buffers = PlanBuffers(self.device)
        self._inv_freq = rope.inv_freq.to(device=self.device, dtype=torch.float64).contiguous()
        self._last: _Shape | None = None  # the last step's shape (kept while only ends and rotations change)
        self.num_rebuilt = 0  # plans made from scratch (a check for the tests)

    def reserve(self, rows: int, pairs: int, items: int, slots: int, max_blocks: int, scratch: int = 16) -> None:
        """Room for a step of ``rows`` rows, ``pairs`` pairs and ``items`` items over ``slots`` lanes of up to
        ``max_blocks`` blocks (and ``scratch`` tables without a slot)."""
        self.buffers.reserve(rows, pairs, items)
        self.lanes.reserve(slots, max_blocks, scratch)

    def freeze(self, num_q_heads: int, head_dim: int) -> None:
        """From now on the buffers stay these tensors (a CUDA graph captures them), the partial buffers for
        ``num_q_heads`` heads of ``head_dim`` included, and every plan launches its kernels, with or without
        work: a graph replays the launches it captured whatever the step. A step that needs more room than
        reserved raises :class:`PlanCapacityError`."""
        self.buffers.reserve(1, 1, 1)
        self.buffers.partial_buffers(num_q_heads, head_dim)
        self.buffers.frozen = self.lanes.frozen = True
        self.always_launch = True

    def forget_shape(self) -> None:
        """The next plan is made from scratch (its lane table kept): what a change of structure costs."""
        self._last = None

    @property
    def frozen(self) -> bool:
        return self.buffers.frozen

    def fits(self, rows: int, pairs: int, slots: int, max_blocks: int) -> bool:
        """Whether a step of ``rows`` rows reading ``pairs`` segments (each at most two pairs), over lanes of
        slots below ``slots`` with at most ``max_blocks`` blocks, fits frozen buffers."""
        b, lanes = self.buffers, self.lanes
        return (rows <= b.rows and 2 * pairs <= b.pairs and 2 * pairs <= b.items and slots <= lanes.num_slots
                and max_blocks <= lanes.max_blocks)

    def empty(self) -> ItemPlan:
        """A plan with no row (a CUDA graph's capture, a step without Hogwild rows): its launches do nothing."""
        b = self.buffers
        b.reserve(1, 1, 1)
        if b.written != "empty":  # (plain steps in a row write it once)
            b.write({}, {"counts": torch.tensor([0, 0, 0, 1])})
            b.written, self._last = "empty", None
        return ItemPlan(b, self.lanes, self._inv_freq, 0, 0, 0, 1, self.block_size, self.num_programs,
                        self.always_launch)

    def plan(self, columns: SegmentColumns, tokens: Sequence[int], for_torch: bool = False) -> ItemPlan:
        """The step's plan into the buffers; ``for_torch``: also the torch path's buckets."""
        try:
            h, shape, kept = host_items(columns, tokens, self.lanes, self.block_size, self._last)
        except LaneTableFull as e:
            raise PlanCapacityError(str(e)) from e
        finally:
            self.lanes.release_scratch()
        num_rows, num_pairs, num_items = len(h.row_token), len(h.pair_end), len(h.item_end)
        b = self.buffers
        b.reserve(num_rows, num_pairs, num_items)
        splits = self.num_splits(num_pairs, num_items)
        values = {"pair_end": h.pair_end, "pair_delta": h.pair_delta, "item_end": h.item_end}
        static = None
        if not kept or b.written is not shape:  # the whole plan; a kept shape writes what a decode step changes
            self.num_rebuilt += 1
            static = dict(counts=torch.tensor([num_rows, num_pairs, num_items, splits]), row_token=h.row_token,
                          row_pair_ptr=h.row_pair_ptr, pair_token=h.pair_token, pair_item=h.pair_item,
                          pair_start=h.pair_start,
                          reader_pair=h.reader_pair, item_lane=h.item_lane, item_start=h.item_start,
                          item_reader_ptr=h.item_reader_ptr)
        b.write(values, static)
        self._last, b.written = shape, shape
        plan = ItemPlan(b, self.lanes, self._inv_freq, num_rows, num_pairs, num_items, splits, self.block_size,
                        self.num_programs, self.always_launch)
        if for_torch:  # the torch path's rotations (the Triton kernel makes its own from the deltas)
            cos, sin = self.rope.cos_sin(h.pair_delta)
            plan.pair_cos, plan.pair_sin = cos.to(self.device), sin.to(self.device)
            plan.pair_row = h.pair_row.to(self.device)
            plan.torch_buckets = self._torch_buckets(h)
        return plan

    def num_splits(self, num_pairs: int, num_items: int) -> int:
        """Splits of every item this step: enough work units for a GPU, within the partial slots."""
        if not num_pairs:
            return 1
        want = FORCED_SPLITS or UNITS_PER_PROGRAM * self.num_programs // max(1, num_items * self.num_kv_heads)
        return max(1, min(want, MAX_SPLITS if FORCED_SPLITS is None else FORCED_SPLITS,
                          self.buffers.slots // num_pairs))

    def _torch_buckets(self, h: HostItems) -> list[TorchBucket]:
        """Items grouped by (blocks, readers) rounded up to powers of two: a few padded batches."""
        bs = self.block_size
        first = h.item_start // bs
        num_blocks = (h.item_end + bs - 1) // bs - first
        readers = h.item_reader_ptr.diff()
        if not len(first):
            return []
        nb_w = 2 ** torch.ceil(torch.log2(num_blocks.double())).long()
        r_w = 2 ** torch.ceil(torch.log2(readers.double())).long()
        rank = torch.arange(len(h.reader_pair)) - h.item_reader_ptr[:-1][h.pair_item[h.reader_pair]]
        out = []
        for nb, r in torch.unique(torch.stack([nb_w, r_w], 1), dim=0).tolist():
            items = ((nb_w == nb) & (r_w == r)).nonzero().flatten()
            pos = torch.full((len(first),), -1, dtype=torch.long)
            pos[items] = torch.arange(len(items))
            sel = pos[h.pair_item[h.reader_pair]] >= 0  # readers (in reader order) of this bucket's items
            at, k = pos[h.pair_item[h.reader_pair]][sel], rank[sel]
            pairs = h.reader_pair[sel]
            reader_pair = torch.full((len(items), r), len(h.pair_end), dtype=torch.long)
            reader_start = torch.zeros(len(items), r, dtype=torch.long)
            reader_end = torch.zeros(len(items), r, dtype=torch.long)
            reader_pair[at, k], reader_end[at, k] = pairs, h.pair_end[pairs]
            reader_start[at, k] = h.pair_start[pairs]
            logical = first[items][:, None] + torch.arange(nb)[None, :]
            valid = logical < (first + num_blocks)[items][:, None]
            lane = h.item_lane[items][:, None].expand(-1, nb)
            dev = lambda t: t.to(self.device)  # noqa: E731
            blocks = self.lanes.blocks[dev(lane), dev(torch.where(valid, logical, 0))].long()
            blocks = torch.where(dev(valid), blocks, 0)
            out.append(TorchBucket(dev(first[items]), blocks, dev(reader_pair), dev(reader_start),
                                   dev(reader_end)))
        return out
