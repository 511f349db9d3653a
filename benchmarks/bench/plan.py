"""``bench plan``: the host time of a decode step's segment-attention plan, the GPU path beside the CPU path.

What the attention metadata builder does once a step for the Hogwild rows, timed on this CPU without an engine
(host time is CPU time): G ``contiguous`` groups of N workers whose views are L tokens (the prompt half of them,
the rest split among the workers' text, as ``bench decode`` lays a group out), decoding step after step. Each
step every lane grows by a token and takes a new block when it fills one; the step's rows reach the builder as
the registry makes them (:class:`~vllm_hogwild.core.views.spans.SegmentColumns`, each lane with its slot), and

- **GPU path**: the Triton path's plan (:class:`~vllm_hogwild.attention.step_plan.StepPlanner`, its lane table
  and buffers kept from step to step, as the builder keeps them): ``steady``, a decode step after another (the
  common case: only ends, rotations and new blocks are written); ``rebuild``, a step that plans from scratch
  (a group admitted or gone, a row joining or leaving: the step's structure changed), timed on a planner
  whose structure is invalidated before each sample. On a GPU the same host work ends in one copy to the device;
  here the plan's tensors stay on the CPU;
- **CPU path**: the compiled CPU op's plan (:func:`~vllm_hogwild.attention.cpu_plan.plan_csr`) of the same
  columns, which plans every step from scratch;
- ``columns``: building the step's columns (the view registry's per-row work, for scale; it is the same on
  both paths).

Medians over ``--rounds`` rounds of each row's median step (a round runs every row once, in turn, each with fresh
groups for ``--steps`` steps, the first two not timed). The targets (docs/benchmarks.md, "The plan's host time"): one group of 8 at 32k-token views at most
0.3 ms and at most 1.3x its time at 1k; 32 groups of 8 at 4k at most 2 ms; 256 groups of 4 at 1k at most 3 ms;
each against the steady GPU path.
"""

from __future__ import annotations

import statistics
import time
from array import array

import torch

from vllm_hogwild.attention import cpu_plan
from vllm_hogwild.attention.step_plan import StepPlanner
from vllm_hogwild.core.views.rope import RopeSpec
from vllm_hogwild.core.views.spans import SegmentColumns

from . import common as c

BLOCK_SIZE = 16
HEAD_DIM, NUM_Q_HEADS, NUM_KV_HEADS = 64, 9, 3  # SmolLM2-135M's attention (the rotary dimension matters)
FULL = [(1, n, view) for n in (2, 4, 8) for view in (1024, 4096, 16384, 32768)] + [(32, 8, 4096), (256, 4, 1024)]
QUICK = [(1, 8, 1024), (1, 8, 32768), (4, 4, 1024)]
TARGETS = {(1, 8, 32768): 0.3, (32, 8, 4096): 2.0, (256, 4, 1024): 3.0}  # ms, the steady GPU path
FLAT = ((1, 8, 1024), (1, 8, 32768), 1.3)  # the 32k row at most 1.3x the 1k row


def rope() -> RopeSpec:
    return RopeSpec.from_hf_config({"model_type": "llama", "rope_theta": 1e5, "head_dim": HEAD_DIM,
                                    "hidden_size": HEAD_DIM * NUM_Q_HEADS, "num_attention_heads": NUM_Q_HEADS})


class Groups:
    """G groups of N lanes, their block tables growing as vLLM's do (the prompt's full blocks shared)."""

    def __init__(self, groups: int, workers: int, view: int, bs: int = BLOCK_SIZE) -> None:
        self.bs, self.prompt = bs, view // 2
        gen = (view - self.prompt) // workers
        self.lens: list[list[int]] = []
        self.tables: list[list[list[int]]] = []
        self.slots: list[list[tuple[int, int]]] = []
        self.next_block = 0
        for g in range(groups):
            shared = self._take(self.prompt // bs)
            lens = [self.prompt + gen] * workers
            self.lens.append(lens)
            self.tables.append([shared + self._take(-(-n // bs) - len(shared)) for n in lens])
            self.slots.append([(g * workers + w, 1) for w in range(workers)])

    def _take(self, n: int) -> list[int]:
        self.next_block += n
        return list(range(self.next_block - n, self.next_block))

    def step(self) -> None:
        """Every lane writes one token (a new block when its last one is full)."""
        for lens, tables in zip(self.lens, self.tables):
            for w, table in enumerate(tables):
                lens[w] += 1
                if lens[w] > len(table) * self.bs:
                    table.extend(self._take(1))

    def columns(self) -> tuple[SegmentColumns, array]:
        columns, tokens = SegmentColumns(), array("q")
        for lens, tables, slots in zip(self.lens, self.tables, self.slots):
            base = columns.add_tables(tables, slots)
            for w in range(len(tables)):
                if columns.add_contiguous(w, self.prompt, lens, base):
                    tokens.append(len(tokens))
        return columns, tokens


def one_round(groups: int, workers: int, view: int, steps: int) -> dict[str, list[float]]:
    spec = rope()
    world = Groups(groups, workers, view)
    steady = StepPlanner(BLOCK_SIZE, spec, "cpu", num_kv_heads=NUM_KV_HEADS)
    rebuild = StepPlanner(BLOCK_SIZE, spec, "cpu", num_kv_heads=NUM_KV_HEADS)
    times: dict[str, list[float]] = {"gpu_steady": [], "gpu_rebuild": [], "cpu": [], "columns": []}
    for i in range(steps):
        world.step()
        t0 = time.perf_counter()
        columns, tokens = world.columns()
        t1 = time.perf_counter()
        steady.plan(columns, tokens)
        t2 = time.perf_counter()
        rebuild.forget_shape()  # the structure changed: a plan from scratch (lane table kept)
        rebuild.plan(columns, tokens)
        t3 = time.perf_counter()
        cpu_plan.plan_csr([], BLOCK_SIZE, spec, len(tokens), (columns, tokens))
        t4 = time.perf_counter()
        if i >= 2:  # the first steps upload every lane's table
            for name, t in (("columns", t1 - t0), ("gpu_steady", t2 - t1), ("gpu_rebuild", t3 - t2), ("cpu", t4 - t3)):
                times[name].append(t * 1e3)
    if steady.num_rebuilt != 1:  # the steady planner kept its first step's structure for every later step
        raise AssertionError(f"the steady planner rebuilt {steady.num_rebuilt} plans")
    return times


def plan(llm, args) -> dict:
    """Host ms a decode step's plan takes on each path (see the module docstring); ``llm`` is unused."""
    torch.set_num_threads(1)
    configs = QUICK if args.quick else FULL
    samples: dict[tuple, dict[str, list[float]]] = {config: {} for config in configs}
    for _ in range(args.rounds):  # every row once a round, in turn: a slow spell of the machine hits them all
        for config in configs:
            for name, values in one_round(*config, args.steps).items():
                samples[config].setdefault(name, []).append(statistics.median(values))
    rows = []
    for (groups, workers, view), by_name in samples.items():
        ms = {name: statistics.median(values) for name, values in by_name.items()}
        rows.append({"groups": groups, "workers": workers, "view_tokens": view, "rows": groups * workers,
                     **{f"{k}_ms": v for k, v in ms.items()},
                     "cpu_over_gpu_steady": ms["cpu"] / ms["gpu_steady"]})
        print(rows[-1], flush=True)
    by = {(r["groups"], r["workers"], r["view_tokens"]): r for r in rows}
    targets = [{"rows": f"{g} x {n} at {v}", "target_ms": t, "ms": by[(g, n, v)]["gpu_steady_ms"],
                "met": by[(g, n, v)]["gpu_steady_ms"] <= t} for (g, n, v), t in TARGETS.items() if (g, n, v) in by]
    short, long, ratio = FLAT
    if short in by and long in by:
        got = by[long]["gpu_steady_ms"] / by[short]["gpu_steady_ms"]
        targets.append({"rows": "1 x 8: 32k over 1k", "target_ratio": ratio, "ratio": got, "met": got <= ratio})
    return {"benchmark": "plan", "machine": c.machine(), "block_size": BLOCK_SIZE, "rounds": args.rounds,
            "steps": args.steps, "results": rows, "targets": targets, "torch_threads": 1}
