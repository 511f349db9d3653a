"""A CUDA graph's life on the CPU: a Hogwild decode step's attention captured once, then replayed step after step.

    TRITON_INTERPRET=1 python -m tests.graph_replay_check

A full CUDA graph records kernel launches with their arguments (the very tensors) once, at capture, and
replays exactly those launches later; only the contents of the tensors change between replays. This script
does that without a GPU, with the Triton kernels under Triton's interpreter:

1. **Capture.** A :class:`~vllm_hogwild.attention.step_plan.StepPlanner` reserves buffers for a capture size
   (``CAPTURE_ROWS`` decode rows) and is frozen; the attention of ``LAYERS`` layers runs once on its empty
   plan (no Hogwild row, as in vLLM's capture batch) and every kernel launch is recorded, arguments and all,
   through the kernel module's launch seam: 2 launches a layer. That forward runs under
   :class:`tests.host_guard.NoHostWork` (no allocation, no value read into Python; the launches themselves
   are outside it, see there).
2. **Replay.** ``STEPS`` decode steps of several groups in the same KV cache: each step writes every
   decoding worker's new token into the cache (lanes cross block boundaries and take new blocks), a worker
   finishes (its row leaves, its lane stays readable), a group leaves and another joins in its lane slots
   (new generations), a ``combined`` group's paragraph joins its shared history (a change of structure),
   within the capture size. Each step the planner writes the step's plan into the same buffers, new queries
   are copied into the captured query tensor, and the recorded launches run again as recorded. Every row
   of every layer is compared with the dense float64 oracle (:mod:`tests.oracle`), and every buffer must
   still be the tensor captured.
3. **Controls.** A replay whose plan was not updated for its step must miss the oracle; a forward on a plan
   whose partial buffers do not exist yet (an allocation) must fail the guard.

Prints one JSON line per step and a summary line ``{"replay": ...}``, then ``{"ok": ...}``.
"""

from __future__ import annotations

import json
import math
import random
import sys
from dataclasses import dataclass, field

import torch

from tests.host_guard import HostWork, NoHostWork
from tests.oracle import dense_view_attention
from vllm_hogwild.attention import segment_attention as sa
from vllm_hogwild.attention import triton_attention as ta
from vllm_hogwild.attention.kv_layout import PlainPagedKV, write_tokens
from vllm_hogwild.attention.step_plan import StepPlanner
from vllm_hogwild.core.views.registry import LaneSlots
from vllm_hogwild.core.views.rope import RopeSpec
from vllm_hogwild.core.views.spans import SegmentColumns, Span, build_views, segments_of

HQ, H, D, BS = 4, 2, 32, 16
LAYERS = 2
CAPTURE_ROWS = 8
STEPS = 24
NUM_BLOCKS = 160
THETA = 1e4
TOLERANCE = 1e-5


def rope() -> RopeSpec:
    return RopeSpec.from_hf_config({"model_type": "llama", "rope_theta": THETA, "head_dim": D,
                                    "hidden_size": D * HQ, "num_attention_heads": HQ})


@dataclass
class Lane:
    blocks: list[int]
    keys: list[torch.Tensor]  # per layer [n, H, D] float64, what the cache holds
    values: list[torch.Tensor]

    def __len__(self) -> int:
        return self.keys[0].shape[0]


@dataclass
class Group:
    name: str
    layout: str
    prompt_len: int
    lanes: list[Lane]
    slots: list[tuple[int, int]]
    decoding: list[int]
    history: list[Span] = field(default_factory=list)
    paragraph_starts: list[int] = field(default_factory=list)


class World:
    """A paged KV cache per layer, its free blocks, and the groups decoding in it."""

    def __init__(self, seed: int = 0) -> None:
        self.gen = torch.Generator().manual_seed(seed)
        self.rng = random.Random(seed)
        self.free = list(range(NUM_BLOCKS))
        self.rng.shuffle(self.free)
        noise = lambda: torch.randn(NUM_BLOCKS, BS, H, D, generator=self.gen)  # noqa: E731 - spare blocks hold noise
        self.kv = [PlainPagedKV(noise(), noise()) for _ in range(LAYERS)]
        self.slots = LaneSlots()
        self.groups: dict[str, Group] = {}

    def _random(self, n: int) -> torch.Tensor:
        return torch.randn(n, H, D, generator=self.gen).to(torch.float32).to(torch.float64)

    def _write(self, lane: Lane, start: int) -> None:
        pos = torch.arange(start, len(lane))
        table = torch.tensor(lane.blocks)
        for layer in range(LAYERS):
            write_tokens(self.kv[layer], table[pos // BS] * BS + pos % BS, lane.keys[layer][start:],
                         lane.values[layer][start:])

    def admit(self, name: str, workers: int, prompt_len: int, generated: int, layout: str = "contiguous") -> None:
        """A group whose lanes share the prompt's full blocks (prefix caching) and hold ``generated`` tokens each."""
        prompt = [(self._random(prompt_len), self._random(prompt_len)) for _ in range(LAYERS)]
        shared = [self.free.pop() for _ in range(prompt_len // BS)]
        lanes = []
        for w in range(workers):
            keys = [torch.cat([k, self._random(generated)]) for k, _ in prompt]
            values = [torch.cat([v, self._random(generated)]) for _, v in prompt]
            n = prompt_len + generated
            blocks = shared + [self.free.pop() for _ in range(-(-n // BS) - len(shared))]
            lanes.append(Lane(blocks, keys, values))
            self._write(lanes[-1], 0 if w == 0 else len(shared) * BS)
        self.groups[name] = Group(name, layout, prompt_len, lanes, [self.slots.take() for _ in lanes],
                                  list(range(workers)), paragraph_starts=[prompt_len] * workers)

    def leave(self, name: str) -> None:
        group = self.groups.pop(name)
        for slot, _ in group.slots:
            self.slots.give_back(slot)
        mine = {b for lane in group.lanes for b in lane.blocks}
        self.free.extend(sorted(mine))

    def decode(self) -> int:
        """Every decoding worker writes one token; the blocks taken."""
        taken = 0
        for group in self.groups.values():
            for w in group.decoding:
                lane = group.lanes[w]
                if len(lane) % BS == 0:
                    lane.blocks.append(self.free.pop())
                    taken += 1
                for layer in range(LAYERS):
                    lane.keys[layer] = torch.cat([lane.keys[layer], self._random(1)])
                    lane.values[layer] = torch.cat([lane.values[layer], self._random(1)])
                self._write(lane, len(lane) - 1)
        return taken

    def rows(self) -> tuple[SegmentColumns, list[int], list]:
        """The step's rows as the worker's registry gives them: a contiguous group's as columns, a combined
        group's as segments; each with its view, its group and lane (for the oracle)."""
        columns, tokens, views = SegmentColumns(), [], []
        for group in self.groups.values():
            lens = [len(lane) for lane in group.lanes]
            tables = [tuple(lane.blocks) for lane in group.lanes]
            if group.layout == "contiguous":
                base = columns.add_tables(tables, group.slots)
                for w in group.decoding:
                    if columns.add_contiguous(w, group.prompt_len, lens, base):
                        tokens.append(len(tokens))
                        views.append((group, build_views("contiguous", group.prompt_len, lens, readers=[w])[0]))
                continue
            for w in group.decoding:
                view = build_views(group.layout, group.prompt_len, lens, readers=[w], history=group.history,
                                   paragraph_starts=group.paragraph_starts)[0]
                segments = segments_of(view, tables, group.slots)
                if segments is not None:
                    columns.add_row(segments)
                    tokens.append(len(tokens))
                    views.append((group, view))
        return columns, tokens, views


def oracle(views, query: torch.Tensor, layer: int, inv_freq: torch.Tensor) -> torch.Tensor:
    outs = []
    for r, (group, view) in enumerate(views):
        k = torch.cat([group.lanes[s.lane].keys[layer][s.start: s.end] for s in view.spans])
        v = torch.cat([group.lanes[s.lane].values[layer][s.start: s.end] for s in view.spans])
        stored = torch.cat([torch.arange(s.start, s.end) for s in view.spans])
        view_pos = torch.cat([torch.arange(a, a + s.num_tokens) for a, s in zip(view.view_starts(), view.spans)])
        is_own = torch.zeros(view.num_tokens, dtype=torch.bool)
        is_own[view.num_tokens - view.own.num_tokens:] = True
        q_pos = torch.tensor([view.own.end - 1])
        q_view = torch.tensor([view.view_pos(view.own.lane, view.own.end - 1)])
        outs.append(dense_view_attention(query[r: r + 1].to(torch.float64), q_pos, q_view, k, v, stored, view_pos,
                                         is_own, inv_freq, True, 1 / math.sqrt(D)))
    return torch.cat(outs)


def rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.to(torch.float64) - ref).abs().max() / ref.abs().max()).item()


def buffers_of(planner: StepPlanner) -> dict[str, int]:
    b = planner.buffers
    out = {"packed": b.packed.data_ptr(), "lanes": planner.lanes.blocks.data_ptr()}
    for key, tensors in b.partials.items():
        out.update({f"partials{key}.{i}": t.data_ptr() for i, t in enumerate(tensors)})
    return out


def capture(planner: StepPlanner, query: torch.Tensor, kv, outs, guard: NoHostWork | None):
    """The layers' attention on an empty plan, every launch recorded (and run): what a graph holds."""
    launches = []
    real = ta._launch

    def record(kernel, grid, *args, **meta):
        launches.append((kernel, grid, args, meta))
        with guard.paused() if guard else _nothing():
            real(kernel, grid, *args, **meta)

    plan = sa.SegmentAttentionPlan(sa.PlanMode.TRITON, query.shape[0], planner.rope, items=planner.empty())
    ta._launch = record
    try:
        with guard if guard else _nothing():
            for layer in range(LAYERS):
                sa.run(plan, query, kv[layer], out=outs[layer])
    finally:
        ta._launch = real
    return launches


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def replay(launches) -> None:
    for kernel, grid, args, meta in launches:
        kernel[grid](*args, **meta)


def guard_control() -> str | None:
    """A forward that allocates (its plan's partial buffers were never made) must fail the guard."""
    planner = StepPlanner(BS, rope(), "cpu", num_kv_heads=H)
    world = World(seed=5)
    world.admit("X", 2, 20, 3)
    columns, tokens, _ = world.rows()
    plan = sa.plan_columns(columns, tokens, BS, rope(), sa.PlanMode.TRITON, planner=planner)
    query = torch.randn(len(tokens), HQ, D)
    out = torch.zeros_like(query)
    guard = NoHostWork()
    real = ta._launch
    ta._launch = lambda kernel, grid, *a, **m: None  # nothing to run: the guard fails before any launch
    try:
        with guard:
            sa.run(plan, query, world.kv[0], out=out)
    except HostWork as e:
        return str(e)
    finally:
        ta._launch = real
    return None


def main() -> int:
    spec = rope()
    inv_freq = spec.inv_freq.to(torch.float64)
    world = World()
    planner = StepPlanner(BS, spec, "cpu", num_kv_heads=H)
    planner.reserve(rows=CAPTURE_ROWS, pairs=8 * CAPTURE_ROWS, items=8 * CAPTURE_ROWS, slots=16, max_blocks=32)
    planner.freeze(HQ, D)
    query = torch.randn(CAPTURE_ROWS, HQ, D)
    outs = [torch.zeros(CAPTURE_ROWS, HQ, D) for _ in range(LAYERS)]
    guard = NoHostWork()
    launches = capture(planner, query, world.kv, outs, guard)
    captured = buffers_of(planner)
    ok = len(launches) == 2 * LAYERS
    world.admit("A", 3, 21, 3)
    world.admit("B", 2, 37, 5)
    world.admit("D", 2, 19, 4, layout="combined")
    events = {4: "D: worker 0's paragraph joins the history", 8: "B leaves", 10: "C joins in B's slots",
              14: "A: worker 2 finishes", 18: "D: worker 1's paragraph joins the history"}
    errors, blocks_taken, kept, stale_err = [], 0, 0, None
    gen = torch.Generator().manual_seed(7)
    for step in range(STEPS):
        if step == 4 or step == 18:
            d = world.groups["D"]
            w = 0 if step == 4 else 1
            end = len(d.lanes[w].keys[0])
            d.history.append(Span(w, d.paragraph_starts[w], end))
            d.paragraph_starts[w] = end
        if step == 8:
            world.leave("B")
        if step == 10:
            world.admit("C", 2, 30, 2)
        if step == 14:
            world.groups["A"].decoding.remove(2)
        blocks_taken += world.decode()
        columns, tokens, views = world.rows()
        rebuilt = planner.num_rebuilt
        planner.plan(columns, tokens)
        kept += planner.num_rebuilt == rebuilt
        rows = len(tokens)
        query[:rows] = torch.randn(rows, HQ, D, generator=gen)
        if step == 12:  # a control: the recorded launches once more on the plan of the step before
            world.decode()
            stale_columns, stale_tokens, stale_views = world.rows()
            replay(launches)
            stale_err = rel_err(outs[0][:rows], oracle(stale_views, query, 0, inv_freq))
            planner.plan(stale_columns, stale_tokens)
            views = stale_views
        replay(launches)
        step_errs = [rel_err(outs[layer][:rows], oracle(views, query, layer, inv_freq)) for layer in range(LAYERS)]
        same = buffers_of(planner) == captured
        errors.append(max(step_errs))
        line = {"step": step, "rows": rows, "groups": sorted(world.groups), "event": events.get(step, ""),
                "rel_err": max(step_errs), "buffers_as_captured": same}
        ok &= max(step_errs) <= TOLERANCE and same and rows <= CAPTURE_ROWS
        print(json.dumps(line), flush=True)
    control = guard_control()
    summary = {"steps": STEPS, "layers": LAYERS, "capture_rows": CAPTURE_ROWS, "launches_captured": len(launches),
               "max_rel_err": max(errors), "blocks_taken": blocks_taken, "plans_kept": kept,
               "plans_rebuilt": STEPS - kept, "lane_uploads": planner.lanes.num_uploaded,
               "stale_plan_rel_err": stale_err, "guard_ops": len(guard.ops), "guard_control": control}
    ok &= blocks_taken >= 6 and stale_err is not None and stale_err > 1e-3 and control is not None
    ok &= 0 < kept < STEPS
    print(json.dumps({"replay": summary}), flush=True)
    print(json.dumps({"ok": bool(ok)}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
